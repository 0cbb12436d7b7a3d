//! The synthetic scenarios' measurements: [`scenario`] (what a run
//! measures), [`matrix`] (the one loop every scenario family runs its cells
//! through, and the versioned results envelope), [`level`] (one load level
//! and its ledger), [`sweep`] (calibration, levels, repeats), [`step`]
//! (settling after changes), [`recovery`] (how long the service takes to
//! come back after a flood).
pub mod level;
pub mod matrix;
pub mod recovery;
pub mod scenario;
pub mod step;
pub mod sweep;
