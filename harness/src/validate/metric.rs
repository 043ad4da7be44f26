//! What a published figure measures (a peers row's `metric`), and so which of the estimator's
//! rows it includes.
use serde::{Deserialize, Serialize};

/// What a published figure measures, and so which estimator rows it includes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
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
    /// vLLM's "Available KV cache memory" at engine startup: what the requested share of the
    /// card leaves after the weights, the profile run's activation peak and the buffers that
    /// stay (one GPU's).
    VllmAvailableKv,
}

impl Metric {
    /// Which terms the figure includes, for people.
    pub fn includes(&self) -> &'static str {
        match self {
            Metric::NvmlUsed => "all tensors + CUDA context + allocator reserve",
            Metric::MaxAllocated => "live tensors (no context, no reserve)",
            Metric::MaxReserved => "allocator segments (no context)",
            Metric::ModelStates => "formula: weights + gradients + optimizer state",
            Metric::LayerActivations => "formula: one layer's saved activations",
            Metric::VllmAvailableKv => {
                "vLLM's available KV cache: total × utilization − weights − activation peak − \
                 buffers"
            }
        }
    }
    /// The metric as a peers file spells it.
    pub fn as_str(&self) -> &'static str {
        self.into()
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
            Metric::VllmAvailableKv => row == super::serving::AVAILABLE_KV,
        }
    }
}
