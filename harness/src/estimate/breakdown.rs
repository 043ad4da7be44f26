//! [`Breakdown`]: the bytes of an estimate per category, per GPU, and the figures summed from
//! them (total, reserved, allocated).
use crate::checked::{Checked, Overflow};
use serde::Serialize;

/// Bytes per category, per GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub weights: u64,
    /// Buffers the runtime keeps beside the parameters: transformers 4.x's per-layer rotary
    /// caches (`Architecture::transformers4_buffers_per_layer`); 0 elsewhere.
    pub buffers: u64,
    /// Transient 16-bit copies of f32 master weights (mixed precision).
    pub weight_copies: u64,
    /// A checkpoint format that multiplies by a dequantized copy of each weight (AWQ, GPTQ,
    /// bitsandbytes 4-bit without a fused kernel): the largest quantized matrix in the compute
    /// dtype, one product at a time (`model::quant::Format::dequantizes_per_matmul`).
    pub dequant: u64,
    pub kv: u64,
    pub activations: u64,
    pub logits: u64,
    /// FSDP full shard's unsharded copies on each rank at the backward's peak, beyond its
    /// shards: the root unit's parameters and gradient and the layers around the one computed
    /// (`train::fsdp_gathered`); 0 on one GPU and under DDP, ZeRO-1 and ZeRO-2.
    pub gathered: u64,
    pub gradients: u64,
    pub optimizer: u64,
    /// The optimizer step's transient beyond the backward's activations and logits: a training
    /// peak is the larger of the backward (states + activations + logits) and the step
    /// (states + the implementation's transient), so only the excess adds.
    pub step_transient: u64,
    /// The runtime constant: 0 analytically; a fit's constant where one applies.
    pub runtime_constant: u64,
    /// Device terms (CUDA queries only; sourced defaults, see the constants above).
    pub cuda_context: u64,
    pub cublas_workspace: u64,
    /// The allocator's reserve: what its pool holds beyond the tensors (reserved −
    /// allocated). Torch: the fitted reserve model of the run's class
    /// ([`fit::reserve`](crate::fit::reserve)); candle:
    /// [`ALLOCATOR_ROUNDING`](super::ALLOCATOR_ROUNDING), unmeasured.
    pub allocator_reserve: u64,
    /// The ends of the reserve's range, from the fit's error on reserved (held out by model):
    /// in no row or sum; [`Breakdown::total_low`] and [`Breakdown::total_high`] use them.
    #[serde(skip)]
    pub allocator_reserve_low: u64,
    #[serde(skip)]
    pub allocator_reserve_high: u64,
    /// FSDP's CPU offload (`--offload`): the rank's shards of weights, gradients and optimizer
    /// state, held in host memory instead; in no GPU figure (0 without offload).
    pub host_offloaded: u64,
    /// Where the figures come from: "analytic" or the fitted group.
    pub source: String,
    /// Where the reserve comes from.
    pub reserve_source: String,
}

impl Breakdown {
    /// NVML's "used" on a GPU (the driver's view, what runs out): the sum of the rows; an
    /// [`Overflow`] past 2^64 B ([`estimate`](super::estimate()) returns only breakdowns whose
    /// total fits). The GPU verdicts judge its range ([`Breakdown::total_low`],
    /// [`Breakdown::total_high`]).
    pub fn total(&self) -> Result<u64, Overflow> {
        self.sum_without(&[], "total")
    }
    /// [`Breakdown::total`] with the reserve at the low end of its range: a GPU whose budget lies
    /// between this and [`Breakdown::total_high`] is a borderline verdict.
    pub fn total_low(&self) -> Result<u64, Overflow> {
        Ok(self.total()? - self.allocator_reserve
            + self.allocator_reserve_low.min(self.allocator_reserve))
    }
    /// [`Breakdown::total`] with the reserve at the high end of its range (the fit's worst
    /// under-prediction): what a conservative verdict judges.
    pub fn total_high(&self) -> Result<u64, Overflow> {
        (Checked::from(self.total()? - self.allocator_reserve)
            + self.allocator_reserve_high.max(self.allocator_reserve))
        .bytes("total")
    }
    /// The allocator's reserved pool at the peak: the tensors plus its reserve, without the
    /// CUDA context (PyTorch's `max_memory_reserved`).
    pub fn reserved(&self) -> Result<u64, Overflow> {
        self.sum_without(&["CUDA context"], "reserved")
    }
    /// The tensors at the peak (PyTorch's `max_memory_allocated`).
    pub fn allocated(&self) -> Result<u64, Overflow> {
        self.sum_without(&["CUDA context", "allocator reserve"], "allocated")
    }
    /// The sum of the rows not named in `skip`.
    fn sum_without(&self, skip: &[&str], figure: &str) -> Result<u64, Overflow> {
        self.rows()
            .iter()
            .filter(|(name, _)| !skip.contains(name))
            .map(|(_, b)| *b)
            .sum::<Checked>()
            .bytes(figure)
    }
    /// The table rows, in display order.
    pub fn rows(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("weights", self.weights),
            ("model buffers", self.buffers),
            ("weight copies (16-bit)", self.weight_copies),
            ("dequantization buffer", self.dequant),
            ("KV cache", self.kv),
            ("activations", self.activations),
            ("logits", self.logits),
            ("FSDP gathered (unsharded)", self.gathered),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer),
            ("optimizer step transient", self.step_transient),
            ("runtime constant", self.runtime_constant),
            ("CUDA context", self.cuda_context),
            ("cuBLAS workspace", self.cublas_workspace),
            ("allocator reserve", self.allocator_reserve),
        ]
    }
}

impl Breakdown {
    /// This breakdown with the model-state rows of `states`.
    pub(super) fn with_states(self, states: &Breakdown) -> Breakdown {
        Breakdown {
            weights: states.weights,
            weight_copies: states.weight_copies,
            gradients: states.gradients,
            optimizer: states.optimizer,
            host_offloaded: states.host_offloaded,
            ..self
        }
    }
}
