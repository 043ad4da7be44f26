//! The query `estimate` answers ([`Query`]): one configuration's mode, precision, shape,
//! training and sharding choices, runtime and device, and the vocabulary its fields take.
use crate::fit::Runtime;
use crate::model::config::MlaCache;
use crate::model::quant::Checkpoint;
use crate::model::{Config, KvKind};
use serde::Serialize;

/// The device a query is for: CUDA GPUs (the catalog), or the CPU (candle's CPU backend, to
/// check an estimate against `vramlab sweep` on this machine).
pub use crate::vocab::Backend;
use crate::vocab::Checkpointing;
pub use crate::vocab::{
    Attention, Compute, KvWindow, LoraTargets, Mode, Optimizer, OptimizerImpl, Precision, Stack,
    Trainable,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Sharding {
    Ddp,
    Zero1,
    Zero2,
    Zero3,
    Fsdp,
}

/// One configuration to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Query {
    pub mode: Mode,
    pub precision: Precision,
    pub batch: u64,
    pub context: u64,
    pub optimizer: Optimizer,
    pub checkpointing: Checkpointing,
    pub trainable: Trainable,
    /// The modules LoRA adapts (`--lora-targets`; the architecture's default, peft's).
    pub lora_targets: LoraTargets,
    /// LoRA adapters as peft ≥ 0.12 keeps them on a 16-bit model: in f32, each adapter saving
    /// its input cast to f32 ([`Stack::peft_f32_adapters`]). False: adapters in the
    /// activations' dtype, as vramlab's own `lora-rN` (and the emulated calibration corpus,
    /// whose probe added them as forward hooks).
    pub peft_f32_adapters: bool,
    /// LoRA dropout (peft's `lora_dropout` > 0): each adapter keeps its dropout's mask, and
    /// 16-bit adapters their dropout's output (`model::saved::llama_saved_per_token_in`).
    pub lora_dropout: bool,
    pub sharding: Sharding,
    pub gpus: u64,
    /// FSDP's CPU offload: each rank's parameter, gradient and optimizer-state shards live in
    /// host memory, and the optimizer steps on the CPU (FSDP/ZeRO-3 over 2 or more GPUs).
    pub offload: bool,
    pub attention: Attention,
    pub kv_cache: KvKind,
    /// Whether a sliding-window model's KV cache is capped at its window (`model`, as vLLM
    /// and HF allocate it) or holds every token (`full`).
    pub kv_window: KvWindow,
    pub runtime: Runtime,
    pub backend: Backend,
    /// torch only (candle-nn's AdamW has one implementation).
    pub optimizer_impl: OptimizerImpl,
    /// A quantized precision's compute dtype (activations, KV); dense ones compute in their own.
    pub compute: Compute,
    /// The exact weight bytes of a quantized precision (block bytes per tensor type, from a
    /// GGUF's tensor table or a re-quantization's block formula); `None`: params × dtype bytes.
    pub weight_bytes: Option<u64>,
    /// The pinned software stack (torch on CUDA): whose emulated runs the built-in allocator
    /// reserve was fitted on, and whose transformers holds what it holds.
    pub stack: Stack,
    /// Another stack's built-in reserve fit instead of `stack`'s (`validate` judges rows of
    /// the torch-2.2 stack with the default fit: its own, of three smaller models, does not
    /// reach their shapes).
    #[serde(skip)]
    pub reserve_stack: Option<Stack>,
    /// The card's compute capability (`--gpu`), by which torch sizes its cuBLAS workspace
    /// ([`crate::estimate::cublas_workspace`]); `None`: no card named, the largest size.
    pub compute_capability: Option<(u32, u32)>,
    /// The per-matmul dequantization buffer of a checkpoint format that multiplies by a
    /// dequantized copy of each weight (0 otherwise): [`Query::with_checkpoint`].
    pub dequant_bytes: u64,
}

impl Query {
    /// How a multi-head-latent-attention cache holds a token: the compressed latent (vLLM,
    /// SGLang, transformers ≥ 5, and vramlab's own), or K and V expanded to every head
    /// (transformers 4.x, the older stacks under `runtime` torch).
    pub fn mla_cache(&self) -> MlaCache {
        match self.runtime {
            Runtime::Torch if self.stack.transformers_major() < 5 => MlaCache::Expanded,
            _ => MlaCache::Latent,
        }
    }
    /// Bytes per element of activations, KV and logits.
    pub fn act_bytes(&self) -> u64 {
        self.precision.dtypes(self.compute).1.size_in_bytes() as u64
    }
    /// Bytes per element of dense weights, gradients and optimizer state: the precision's
    /// dtype, or for a quantized base (QLoRA) the compute dtype its adapters are kept in.
    pub fn state_bytes(&self) -> u64 {
        self.precision.dtypes(self.compute).0.size_in_bytes() as u64
    }
}

impl Default for Query {
    fn default() -> Self {
        Query {
            mode: Mode::Infer,
            precision: Precision::Bf16,
            batch: 1,
            context: 4096,
            optimizer: Optimizer::Adamw,
            checkpointing: Checkpointing::None,
            trainable: Trainable::Full,
            lora_targets: LoraTargets::DEFAULT,
            peft_f32_adapters: true,
            lora_dropout: false,
            sharding: Sharding::Ddp,
            gpus: 1,
            offload: false,
            attention: Attention::Flash,
            kv_cache: KvKind::Preallocated,
            kv_window: KvWindow::Model,
            runtime: Runtime::Torch,
            backend: Backend::Cuda,
            optimizer_impl: OptimizerImpl::Foreach,
            compute: Compute::F32,
            weight_bytes: None,
            stack: Stack::Default,
            reserve_stack: None,
            compute_capability: None,
            dequant_bytes: 0,
        }
    }
}

impl Query {
    /// This query with the weights of `cfg` loaded in checkpoint format `k` (a
    /// `quantization_config`, or QLoRA's NF4 base): their exact bytes, the dense tensors at
    /// [`Query::state_bytes`], and the format's dequantization buffer in the compute dtype.
    /// An error names the first tensor the format cannot store.
    pub fn with_checkpoint(&self, cfg: &Config, k: &Checkpoint) -> Result<Query, String> {
        let plan = k.plan(cfg, self.state_bytes())?;
        Ok(Query {
            weight_bytes: Some(plan.bytes()),
            dequant_bytes: plan.dequant_bytes(self.act_bytes()),
            ..*self
        })
    }

    /// The optimizer as the query's runtime runs it: on torch, `sgd` and `adamw` take
    /// `--optimizer-impl` (`adamw` + `foreach` = `adamw-foreach`, what the torch probe's rows
    /// record); everything else as given.
    pub fn runtime_optimizer(&self) -> Optimizer {
        match (self.runtime, self.optimizer) {
            (Runtime::Torch, o @ (Optimizer::Sgd | Optimizer::Adamw)) => {
                o.torch(self.optimizer_impl)
            }
            (_, o) => o,
        }
    }
}
