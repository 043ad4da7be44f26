//! Workloads: what runs inside measured phases.
pub mod finetune;
pub mod ft_points;
pub mod gen_points;
pub mod generate;
pub mod inference;
pub mod training;
pub mod warmup;

use crate::meter::{Meter, PhaseMemory};
use crate::record::Phase;
use crate::scenario::{Mode, Spec};
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

/// Every point id of `spec`, in measuring order, whatever its mode: a generation scenario's
/// points, else its fine-tuning points and its language-model grid.
pub fn point_ids(spec: &Spec) -> Vec<String> {
    if spec
        .sweep
        .0
        .iter()
        .any(|s| s.mode.contains(&Mode::Generate))
    {
        return gen_points::expand(spec).into_iter().map(|p| p.id).collect();
    }
    let mut ids: Vec<String> = ft_points::expand(spec).into_iter().map(|p| p.id).collect();
    ids.extend(crate::scenario::expand(spec).into_iter().map(|p| p.id));
    ids
}
