//! Helpers shared by the estimate's unit tests: the default query, presets, and the
//! estimate and GPU verdict of a representable query (the overflow checks unwrapped).
use super::{resolve, Breakdown, GpuFit, Query};
use crate::fit::Constants;
use crate::model::Config;

pub(super) fn q() -> Query {
    Query::default()
}

// The queries here are all representable: these unwrap the overflow checks.
pub(super) fn estimate(c: &Config, q: &Query, k: Option<&Constants>) -> Breakdown {
    super::estimate(c, q, k).unwrap()
}

pub(super) fn gpu_fit(c: &Config, q: &Query, gpu: &str, bytes: u64) -> GpuFit {
    super::gpu_fit(c, q, None, gpu, bytes, 0.1).unwrap()
}

/// The normalized config of a preset.
pub(super) fn preset(name: &str) -> Config {
    resolve(name).unwrap().config
}
