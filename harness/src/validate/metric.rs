//! What a published figure measures (the peers file's `metric` words), and so which of the
//! estimator's rows it includes.
use serde::Serialize;

/// What a published figure measures, and so which estimator rows it includes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// NVML "used" of the whole device (`nvidia-smi`): every tensor, the CUDA context and the
    /// caching allocator's reserve.
    NvmlUsed,
    /// `torch.cuda.max_memory_allocated`: live tensors only (no context, no reserve).
    MaxAllocated,
    /// `torch.cuda.max_memory_reserved`: the allocator's segments (no context).
    MaxReserved,
    /// A paper's formula for weights + gradients + optimizer state per device.
    ModelStates,
    /// A paper's formula for one transformer layer's saved activations per device.
    LayerActivations,
}

/// The leading phrase of each metric as collectors write it (case-insensitive).
pub(crate) const METRIC_PHRASES: &[(&str, Metric)] = &[
    ("nvidia-smi used", Metric::NvmlUsed),
    ("nvml used", Metric::NvmlUsed),
    ("torch.cuda.max_memory_allocated", Metric::MaxAllocated),
    ("torch.cuda.max_memory_reserved", Metric::MaxReserved),
    ("analytic model-state memory", Metric::ModelStates),
    (
        "analytic activation memory per transformer layer",
        Metric::LayerActivations,
    ),
];

impl Metric {
    pub fn parse(text: &str) -> Option<Metric> {
        let t = text.trim().to_ascii_lowercase();
        METRIC_PHRASES
            .iter()
            .find(|(p, _)| t.starts_with(p))
            .map(|(_, m)| *m)
    }
    /// Which terms the figure includes, for people.
    pub fn includes(&self) -> &'static str {
        match self {
            Metric::NvmlUsed => "all tensors + CUDA context + allocator reserve",
            Metric::MaxAllocated => "live tensors (no context, no reserve)",
            Metric::MaxReserved => "allocator segments (no context)",
            Metric::ModelStates => "formula: weights + gradients + optimizer state",
            Metric::LayerActivations => "formula: one layer's saved activations",
        }
    }
    /// Whether the figure counts an estimator row (by [`Breakdown::rows`] name).
    pub(crate) fn counts(&self, row: &str) -> bool {
        match self {
            Metric::NvmlUsed => true,
            // The cuBLAS workspace is a tensor of PyTorch's caching allocator.
            Metric::MaxAllocated => !matches!(
                row,
                "CUDA context" | "allocator reserve" | "allocator rounding"
            ),
            Metric::MaxReserved => row != "CUDA context",
            Metric::ModelStates => matches!(row, "weights" | "gradients" | "optimizer state"),
            Metric::LayerActivations => row == "activations",
        }
    }
}
