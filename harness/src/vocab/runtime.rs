//! The runtime and device side of a row: the backend, the runtime that measured it, the op
//! implementations it ran with (kernels, attention), the CUDA pool's release and the meter.
use serde::Serialize;

vocab! {
    /// The device kind a row ran on (the `backend` column; `estimate --backend`).
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Backend {
        /// CUDA GPUs.
        Cuda,
        /// The CPU (candle's CPU backend, or the torch probe on CPU).
        #[default]
        Cpu,
    }
}

vocab! {
    /// Which implementation of RMSNorm/LayerNorm, RoPE, SwiGLU and softmax a model runs:
    /// compositions of candle ops (`reference`) or vramlab-kernels' fused ops with a hand-written
    /// backward (`fused`).
    #[derive(Default)]
    case = "lowercase";
    pub enum Kernels {
        #[default]
        Reference,
        Fused,
    }
}

vocab! {
    /// How a model computes attention: `eager` materializes the b·heads·s² scores and
    /// probabilities (and keeps them for the backward); `flash` is vramlab-kernels' tiled
    /// attention, which keeps only the output and a log-sum-exp per row.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Attention {
        #[default]
        Eager,
        /// vramlab-kernels' flash attention on candle; FlashAttention on torch (also vLLM).
        Flash,
        /// PyTorch `scaled_dot_product_attention` (flash or memory-efficient kernel): no scores
        /// saved for the backward. The torch probe's `--attention sdpa`; not a candle op.
        Sdpa,
        /// candle-transformers' sliced attention (generation's UNet): the scores of a slice
        /// of the heads at a time.
        Sliced,
    }
}

/// The op implementations a point runs with (the `kernels` and `attention` axes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Ops {
    pub kernels: Kernels,
    pub attention: Attention,
}

vocab! {
    /// Scenario option `pool_release`: what the CUDA pool does with freed memory at a
    /// synchronization.
    #[derive(Default)]
    case = "lowercase";
    pub enum PoolRelease {
        /// Keep everything (release threshold u64::MAX), like PyTorch's caching allocator.
        #[default]
        Keep,
        /// Give freed memory back to the driver (release threshold 0), CUDA's default.
        Release,
    }
}

impl PoolRelease {
    /// The `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` value.
    pub fn threshold(&self) -> u64 {
        match self {
            PoolRelease::Keep => u64::MAX,
            PoolRelease::Release => 0,
        }
    }
}

vocab! {
    /// How a row's memory was read (the `meter` column).
    #[derive(Default)]
    case = "kebab-case";
    pub enum MeterKind {
        /// vramlab's counting global allocator (CPU, candle).
        #[default]
        CpuAlloc,
        /// The preloaded counting allocator (CPU, the torch probe).
        CpuPreload,
        /// The CUDA memory pool's high-water marks.
        CudaPool,
        /// The same pool attributes read through the same code on an emulated GPU (vramlab's
        /// CUDA build under the stub runtime, `device = "emu:GPU"`): allocated exact by rule,
        /// reserved modelled. Never passes for a measured row.
        CudaPoolEmulated,
        /// `cuMemGetInfo` differences (no pool).
        CudaMeminfo,
        /// `torch.cuda` statistics (the torch probe on a GPU).
        TorchCuda,
        /// `torch.cuda` statistics on an emulated GPU (`vramlab emulate`): PyTorch's own
        /// allocator over a stub CUDA runtime, no device. Never passes for a measured row.
        TorchEmulated,
    }
}

impl MeterKind {
    /// The runtime whose rows this meter reads: the torch probe's meters, or candle's.
    pub fn runtime(&self) -> Runtime {
        match self {
            MeterKind::CpuPreload | MeterKind::TorchCuda | MeterKind::TorchEmulated => {
                Runtime::Torch
            }
            MeterKind::CpuAlloc
            | MeterKind::CudaPool
            | MeterKind::CudaPoolEmulated
            | MeterKind::CudaMeminfo => Runtime::Candle,
        }
    }

    /// Whether rows of this meter come from the emulated GPU (any runtime): their own source,
    /// which `fit`, `compare`, `merge` and `bundle` keep apart from measured rows.
    pub fn is_emulated(&self) -> bool {
        matches!(self, MeterKind::TorchEmulated | MeterKind::CudaPoolEmulated)
    }

    /// Whether rows of this meter read a CUDA memory pool (and carry `pool_release`).
    pub fn reads_pool(&self) -> bool {
        matches!(self, MeterKind::CudaPool | MeterKind::CudaPoolEmulated)
    }
}

vocab! {
    /// The software that ran the measured workloads: their uncertain terms (activations saved
    /// per layer, logits path, optimizer transients, allocator) differ.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Runtime {
        /// vramlab's own candle workloads (`vramlab sweep`).
        #[default]
        Candle,
        /// PyTorch + transformers (the torch probe, `vramlab/probe`).
        Torch,
        /// vLLM's serving engine (0.33): `vramlab estimate --runtime vllm` answers in its
        /// terms (estimate only: no sweep measures it; `vramlab emulate` runs vLLM itself).
        Vllm,
    }
}

vocab! {
    /// vLLM's KV cache dtype (`--kv-cache-dtype`): `auto` keeps the model's dtype, `fp8` one
    /// byte a value (e4m3).
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum KvCacheDtype {
        #[default]
        Auto,
        Fp8,
    }
}

vocab! {
    /// A pinned software stack of the torch environment, one venv each
    /// (`scripts/torch-env.sh --stack NAME`, under `$VRAMLAB_TORCH_CACHE`, default
    /// `~/.cache/vramlab-torch`): the axis for regression-testing a runtime version on the
    /// emulated GPU.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Stack {
        /// torch 2.15.0 (CUDA 13.2 build), transformers 5.24.0, diffusers 0.42.1, peft 0.21.2.
        #[default]
        Default,
        /// torch 2.2.2 (CUDA 12.1 build), transformers 4.39.3, peft 0.11.1, accelerate 0.32.1,
        /// diffusers 0.22.0.
        #[serde(rename = "torch-2.2")]
        #[strum(serialize = "torch-2.2")]
        #[value(name = "torch-2.2")]
        Torch22,
        /// torch 1.10.2 (CUDA 10.2 build), transformers 4.16.2, on CPython 3.9: the stack of
        /// transformers' January 2022 training guide, for the peer programs
        /// (`validate --emulate`, `vramlab emulate`); the probe needs torch 2.2 or newer.
        #[serde(rename = "torch-1.10")]
        #[strum(serialize = "torch-1.10")]
        #[value(name = "torch-1.10")]
        Torch110,
    }
}

impl Stack {
    /// Whether the stack's peft keeps LoRA adapters in f32 on a 16-bit model and casts each
    /// adapter's input to f32 (`autocast_adapter_dtype`, peft ≥ 0.12: the default stack's
    /// 0.21; torch-2.2 pins 0.11, torch-1.10 none).
    pub fn peft_f32_adapters(self) -> bool {
        self == Stack::Default
    }
    /// The transformers major version the stack pins (5, 4, 4).
    pub fn transformers_major(self) -> u64 {
        match self {
            Stack::Default => 5,
            Stack::Torch22 | Stack::Torch110 => 4,
        }
    }
    /// Whether the stack's transformers has a one-layer `StaticCache` (4.39: a single K and V
    /// tensor that every layer would share when passed as `past_key_values`), so the torch
    /// probe cannot run a preallocated cache under it.
    pub fn one_layer_static_cache(self) -> bool {
        self != Stack::Default
    }
    /// The torch release the stack pins, as (major, minor).
    pub fn torch(self) -> (u64, u64) {
        match self {
            Stack::Default => (2, 15),
            Stack::Torch22 => (2, 2),
            Stack::Torch110 => (1, 10),
        }
    }
    /// Why the torch probe (a sweep's `stack`, `estimate --stack`) cannot run under this stack;
    /// `None` where it can. torch-1.10 holds the peer programs' stack only: the probe and the
    /// reserve fits need torch 2.2's APIs.
    pub fn without_probe(self) -> Option<String> {
        match self {
            Stack::Torch110 => Some(format!(
                "stack `{self}` runs the published programs only (`validate --emulate`, \
                 `vramlab emulate`): the torch probe and the fitted reserve need torch 2.2 or newer"
            )),
            Stack::Default | Stack::Torch22 => None,
        }
    }
    /// The stack's venv under the torch cache folder, as `scripts/torch-env.sh` lays it out.
    pub fn venv(self, cache: &std::path::Path) -> std::path::PathBuf {
        match self {
            Stack::Default => cache.join("venv"),
            other => cache.join("stacks").join(other.as_str()).join("venv"),
        }
    }
}
