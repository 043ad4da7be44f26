//! Helpers shared by the estimate's unit tests: the default query, presets, and the
//! estimate and GPU verdict of a representable query (the overflow checks unwrapped), and a
//! config's weights by shape.
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

/// The weights of a config's matrices and of its vectors (norms, biases), counted apart.
pub(super) fn matrices_and_vectors(cfg: &Config) -> (u64, u64) {
    let (mut matrices, mut vectors) = (0u64, 0u64);
    for (_, shape) in cfg.tensor_shapes() {
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        if shape.len() == 2 {
            matrices += n;
        } else {
            vectors += n;
        }
    }
    (matrices, vectors)
}
