//! The report of `vramlab estimate`: one value per query holding everything the output shows,
//! built by [`super::llm`] or [`super::generation`] and rendered by [`super::text`] or
//! [`super::json`]. Fields marked `serde(skip)` are shown by the text only.
use crate::emulate::query::Emulated;
use crate::estimate::generate::{GenGpuFit, GenQuery, PhaseEstimate};
use crate::estimate::{FormatFit, GpuFit, Precision, Query};
use crate::vocab::Phase;
use serde::Serialize;

/// An estimate, of an LLM query or of a generation pipeline.
pub enum Report {
    Llm(Box<LlmReport>),
    Generation(Box<GenReport>),
    Serving(Box<super::serving::ServingReport>),
}

/// One row of a table: a name and its bytes.
#[derive(Serialize)]
pub struct Row {
    pub name: String,
    pub bytes: u64,
}

impl Row {
    /// The rows of `(name, bytes)` pairs.
    pub fn all<S: ToString>(rows: &[(S, u64)]) -> Vec<Row> {
        rows.iter()
            .map(|(name, bytes)| Row {
                name: name.to_string(),
                bytes: *bytes,
            })
            .collect()
    }
}

/// The model of an LLM report: its name, architecture, parameter counts, the normalized config
/// written back as `config.json` and, for a Hub model, its checkpoint's stored bytes.
#[derive(Serialize)]
pub struct ModelJson {
    pub name: String,
    pub architecture: &'static str,
    /// Every stored parameter (what the weights row holds).
    pub params: u64,
    /// The parameters a token runs through: `params` less the experts it is not routed to
    /// (equal to `params` for a dense model).
    pub active_params: u64,
    pub config: serde_json::Value,
    /// A Hub model's safetensors bytes as stored (its index's `metadata.total_size`, or its
    /// single file's size): shown beside the estimate, in none of its figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
}

/// An LLM query's estimate (its `--json` keys in this order).
#[derive(Serialize)]
pub struct LlmReport {
    pub model: ModelJson,
    pub query: Query,
    pub headroom: f64,
    pub source: String,
    pub constants: String,
    pub breakdown: Vec<Row>,
    /// NVML's "used": every row (the CUDA context included); the figure the GPU verdicts use.
    pub total_bytes: u64,
    /// The tensors at the peak (PyTorch's `max_memory_allocated`).
    pub allocated_bytes: u64,
    /// The allocator's pool at the peak (PyTorch's `max_memory_reserved`).
    pub reserved_bytes: u64,
    /// NVML's "used" (= `total_bytes`).
    pub nvml_bytes: u64,
    /// NVML's "used" with the allocator reserve at the ends of its fitted range (its error on
    /// reserved, held out by model); equal to `nvml_bytes` where the reserve has no range.
    pub nvml_low_bytes: u64,
    pub nvml_high_bytes: u64,
    /// Which figure `smallest_gpu_gb` and `gpu` judge by: always `nvml_high_bytes` (a verdict
    /// between `nvml_low_bytes` and it is borderline).
    pub verdict_figure: &'static str,
    /// Where the allocator reserve comes from (empty on the CPU).
    pub reserve_source: String,
    pub smallest_gpu_gb: Option<u64>,
    pub smallest_gpu_examples: Option<&'static str>,
    pub gpu: Option<GpuFit>,
    /// A borderline verdict on `--gpu`: the `vramlab estimate … --emulate` command that settles
    /// it under PyTorch's own allocator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settle_with: Option<String>,
    /// A quantized precision's weights: bytes, bits per weight, and the kept types.
    pub weights: Option<QuantWeights>,
    /// `--best-format`: every format's fit, most bits first, and the one chosen.
    pub best_format: Option<BestFormat>,
    pub notes: Vec<String>,
    /// `--emulate GPU`: PyTorch's figures on the emulated GPU, integer bytes, judged at the
    /// query's headroom.
    pub emulated: Option<EmulatedFit>,
    /// `--offload`: each rank's shards of weights, gradients and optimizer state in host
    /// memory (in no GPU figure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_offloaded_bytes: Option<u64>,
    /// The model's `max_position_embeddings`.
    #[serde(skip)]
    pub max_position_embeddings: u64,
    /// Training: weights + gradients + optimizer state per GPU.
    #[serde(skip)]
    pub model_states_bytes: Option<u64>,
    /// Training: activations + logits per GPU, which no FSDP degree shards.
    #[serde(skip)]
    pub unsharded_bytes: Option<u64>,
    /// The largest class of the catalog, GB.
    #[serde(skip)]
    pub largest_gpu_gb: u64,
}

/// `--emulate GPU`'s run, and its verdict at the same headroom of the same card bytes as the
/// analytic one.
#[derive(Serialize)]
pub struct EmulatedFit {
    #[serde(flatten)]
    pub run: Emulated,
    /// The emulated card's total less the headroom (`crate::gpu::budget`).
    pub budget_bytes: u64,
    /// The run's NVML-equivalent "used" within `budget_bytes` (and the run did not run out).
    pub fits_with_headroom: bool,
}

/// `--best-format`'s answer.
#[derive(Serialize)]
pub struct BestFormat {
    pub gpu: String,
    pub budget_bytes: u64,
    /// The format with the most bits per weight that fits; None if none does.
    pub best: Option<Precision>,
    pub formats: Vec<FormatFit>,
}

/// The weights of a quantized precision, from the GGUF's tensor types or the block formula.
#[derive(Serialize)]
pub struct QuantWeights {
    pub bytes: u64,
    /// bytes × 8 / parameters, scales and the dense norms included.
    pub bits_per_weight: f64,
    /// (type, tensors, bytes) per kept type.
    pub types: Vec<(&'static str, usize, u64)>,
    /// A checkpoint's `quantization_config` format (or QLoRA's NF4 base); None for GGUF types.
    pub format: Option<crate::model::quant::Format>,
    /// What vLLM holds of an MXFP4 checkpoint on the `--gpu`, its experts padded to its
    /// kernel's tiles; None elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmWeights>,
}

/// vLLM's weights of an MXFP4 checkpoint on a GPU ([`crate::estimate::vllm`]).
#[derive(Serialize)]
pub struct VllmWeights {
    pub kernel: &'static str,
    pub hidden: u64,
    pub intermediate: u64,
    pub bytes: u64,
}

/// The model of a generation report.
#[derive(Serialize)]
pub struct GenModelJson {
    pub name: &'static str,
    pub architecture: &'static str,
    pub params: u64,
}

/// A generation pipeline's estimate (docs/src/guides/generation.md).
#[derive(Serialize)]
pub struct GenReport {
    pub model: GenModelJson,
    pub query: GenQuery,
    /// Images the denoiser runs per pass (twice the batch with classifier-free guidance).
    pub denoiser_batch: u64,
    pub headroom: f64,
    pub constants: String,
    /// Every exact tensor.
    pub exact: Vec<Row>,
    /// The peak phase's composition.
    pub breakdown: Vec<Row>,
    pub phases: Vec<PhaseEstimate>,
    pub peak_phase: Phase,
    pub total_bytes: u64,
    /// Each GPU class of the catalog.
    pub gpus: Vec<GenGpuFit>,
    pub notes: Vec<String>,
    /// The pipeline's precision.
    #[serde(skip)]
    pub precision: Precision,
    /// Device rows added to every phase (CUDA context, cuBLAS workspace, allocator rounding).
    #[serde(skip)]
    pub device: Vec<Row>,
    /// A video model (the GPU table has a frames column).
    #[serde(skip)]
    pub video: bool,
}
