//! How long a class's service takes to answer, from the gate's buckets
//! (bpf/gate/delay.h: the gate stamps a flow's request as it admits it,
//! the egress learner times the service's answer to that flow). Pure
//! logic over the counts: totals, the counts between two readings, and
//! quantiles read off power-of-two buckets.
//!
//! A delay is the receive path, the wait in the socket and the service's
//! work for the request: the queue delay a client sees. Bucket 0 holds
//! delays under 2^SHIFT0 ns (32.8 us), bucket i (1 and up) those from
//! 2^(SHIFT0 + i - 1) to under 2^(SHIFT0 + i) ns, the last everything
//! longer. A quantile is given as its bucket's upper edge: never below the
//! truth, at most twice it.
use serde::{Deserialize, Serialize};

use crate::bpf_intf::{SLUICE_DELAY_BUCKETS, SLUICE_DELAY_SHIFT0};

pub const BUCKETS: usize = SLUICE_DELAY_BUCKETS as usize;

/// Answers timed, their summed delay and their buckets (totals since the
/// gate was loaded, or the counts between two of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Delays {
    /// Answers timed.
    pub samples: u64,
    /// Their delays summed, ns.
    pub sum_ns: u64,
    /// Answers per bucket: the first under 32.8 us, bucket i from 2^(14+i) to under 2^(15+i) ns, the last 0.54 s and over.
    pub buckets: [u64; BUCKETS],
}

impl Delays {
    /// What was counted between `old` and `self` (a counter that went
    /// back, a reloaded gate's, counts from 0).
    pub fn since(&self, old: &Delays) -> Delays {
        let d = |a: u64, b: u64| if b >= a { b - a } else { b };
        let mut buckets = [0; BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            *b = d(old.buckets[i], self.buckets[i]);
        }
        Delays { samples: d(old.samples, self.samples), sum_ns: d(old.sum_ns, self.sum_ns), buckets }
    }

    /// Both counts together (two classes', say).
    pub fn plus(&self, o: &Delays) -> Delays {
        Delays {
            samples: self.samples + o.samples,
            sum_ns: self.sum_ns + o.sum_ns,
            buckets: std::array::from_fn(|i| self.buckets[i] + o.buckets[i]),
        }
    }

    /// The `q` quantile (0..=1) in ms, as its bucket's upper edge (the last
    /// bucket has none: its lower edge, marked by the caller as "over");
    /// None with no answer timed.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let n: u64 = self.buckets.iter().sum();
        if n == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: the smallest count that reaches q of n.
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(edge_ms(i));
            }
        }
        Some(edge_ms(BUCKETS - 1))
    }

    /// The mean delay in ms (None with no answer timed).
    pub fn mean_ms(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.sum_ns as f64 / self.samples as f64 / 1e6)
    }
}

/// Bucket `i`'s upper edge in ms (the last bucket: its lower edge).
pub fn edge_ms(i: usize) -> f64 {
    edge_ns(i) as f64 / 1e6
}

/// The same in seconds (divided once: 32768 ns is 3.2768e-5 s, not that less a rounding).
pub fn edge_secs(i: usize) -> f64 {
    edge_ns(i) as f64 / 1e9
}

fn edge_ns(i: usize) -> u64 {
    1u64 << (SLUICE_DELAY_SHIFT0 as usize + i.min(BUCKETS - 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(counts: &[(usize, u64)]) -> Delays {
        let mut d = Delays::default();
        for &(i, c) in counts {
            d.buckets[i] = c;
            d.samples += c;
        }
        d
    }

    #[test]
    fn quantiles_are_their_buckets_upper_edges() {
        // 90 answers under 32.8 us, 9 in [1.05, 2.1) ms, one in [33.6, 67.1) ms.
        let d = with(&[(0, 90), (6, 9), (11, 1)]);
        assert_eq!(d.quantile_ms(0.5), Some(0.032768));
        assert_eq!(d.quantile_ms(0.9), Some(0.032768), "the 90th of 100 is still in bucket 0");
        assert_eq!(d.quantile_ms(0.95), Some(2.097152));
        assert_eq!(d.quantile_ms(0.99), Some(2.097152));
        assert_eq!(d.quantile_ms(1.0), Some(67.108864));
        assert_eq!(d.quantile_ms(0.0), Some(0.032768), "the smallest: the first answer's bucket");
        assert_eq!(Delays::default().quantile_ms(0.5), None, "nothing timed: no figure, not 0");
        assert_eq!(Delays::default().mean_ms(), None);
    }

    #[test]
    fn the_last_bucket_says_its_lower_edge() {
        let d = with(&[(BUCKETS - 1, 1)]);
        assert_eq!(d.quantile_ms(0.5), Some(edge_ms(BUCKETS - 2)));
        assert!(edge_ms(BUCKETS - 1) > 500.0, "over half a second: {}", edge_ms(BUCKETS - 1));
    }

    #[test]
    fn counts_between_readings_and_after_a_reload() {
        let a = Delays { sum_ns: 3_000_000, ..with(&[(0, 2), (5, 1)]) };
        let b = Delays { sum_ns: 5_000_000, ..with(&[(0, 4), (5, 1), (7, 1)]) };
        let d = b.since(&a);
        assert_eq!((d.samples, d.sum_ns), (3, 2_000_000));
        assert_eq!((d.buckets[0], d.buckets[5], d.buckets[7]), (2, 0, 1));
        assert_eq!(d.mean_ms(), Some(2_000_000.0 / 3.0 / 1e6));
        // A reloaded gate's counters start again: what it has counted is the change.
        assert_eq!(a.since(&b).samples, 3);
        let both = a.plus(&d);
        assert_eq!((both.samples, both.sum_ns, both.buckets[0], both.buckets[7]), (6, 5_000_000, 4, 1));
    }
}
