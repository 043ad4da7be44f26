//! The regression gate behind `vramlab compare`: join two calibration CSVs on
//! (point_id, phase, step) and judge every memory metric against its noise margin, modelled on
//! PyTorch's `pr_time_benchmarks` (an expected-results file with a margin per metric, checked
//! both ways).
//!
//! `margin` holds the metrics and their noise margins, `join` checks that two CSVs can be
//! compared and matches their rows by key, `verdict` judges each change against its margin
//! (and picks the next baseline), `by_phase` sums the changes up per phase, `render` prints the
//! report. Everything is re-exported here.
mod by_phase;
mod join;
mod margin;
mod render;
mod verdict;

pub use by_phase::{by_phase, PhaseChange};
pub use join::{check_compatible, index, key, Allow, Key};
pub use margin::{default_margin, Backend, Margin, Margins, Metric};
pub use render::{render, render_by_phase};
pub use verdict::{compare, next_baseline, Change, OneSided, Report, StatusChange, Verdict};
