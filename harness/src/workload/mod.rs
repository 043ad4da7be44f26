//! Workloads: what runs inside measured phases.
pub mod finetune;
pub mod generate;
pub mod inference;
pub mod training;
pub mod warmup;

use crate::meter::{Meter, PhaseMemory};
use crate::record::Phase;
use anyhow::Result;

/// Runs `f` as the measured phase `phase`, the one way every workload (and the runner's load)
/// measures: marks the phase as running (so a failure's row names it), reads the meter around
/// `f`, and returns `f`'s value, the phase's memory and its wall time in ms.
pub fn phase<T>(
    meter: &mut dyn Meter,
    phase: Phase,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, PhaseMemory, f64)> {
    crate::progress::mark_phase(phase);
    crate::meter::measure(meter, f)
}
