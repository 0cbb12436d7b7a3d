//! Perturb and observe, the baseline: Macpherson's rate selection
//! ("Performing Under Overload", UNSW thesis, chapter 6, section 6.2), like a
//! solar panel's maximum power point tracker. Every tick `T` moves by a fixed
//! step; the direction is kept while the delivered rate rises, reversed when
//! it falls, and turned down when it is flat; it reverses at the caps. It
//! must keep moving to see the slope, so it always admits a little too much
//! or too little: `capacity` (the estimator ours uses) is kept beside it to
//! compare the two on the same runs.
use super::{Controller, CtlState, TickInput};

impl Controller {
    pub(super) fn pno(&mut self, s: &TickInput) -> f64 {
        if s.delivered < self.last_delivered {
            self.dir = -self.dir;
        } else if s.delivered == self.last_delivered {
            self.dir = -1.0;
        }
        let mut t = self.target + self.dir * self.tuning.pno_step;
        if t > self.tuning.max_pps || t < self.tuning.min_pps {
            t = t.clamp(self.tuning.min_pps, self.tuning.max_pps);
            self.dir = -self.dir;
        }
        self.state = if self.dir > 0.0 { CtlState::PnoUp } else { CtlState::PnoDown };
        t
    }
}
