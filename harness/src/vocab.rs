//! The one vocabulary: every enum the scenario, the CSV, the fit, the estimate and the CLI
//! share. A leaf module (it uses no other module of the crate). Each enum reads and writes
//! one spelling everywhere: serde (scenario TOML, CSV, JSON), `Display`/`FromStr` (strum) and
//! `as_str`, so no string is ever parsed back into meaning by hand.
use candle_core::DType;
use serde::{Deserialize, Serialize};

/// A vocabulary enum: the shared derives (serde and strum with one spelling, `serialize_all`
/// = serde's `rename_all`), and `as_str`. Extra derives go in the attributes before it.
macro_rules! vocab {
    ($(#[$m:meta])* case = $case:literal; pub enum $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(
            Clone,
            Copy,
            Debug,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            Serialize,
            Deserialize,
            strum::Display,
            strum::EnumString,
            strum::IntoStaticStr,
            strum::EnumIter,
        )]
        #[serde(rename_all = $case)]
        #[strum(serialize_all = $case)]
        pub enum $name { $($body)* }

        impl $name {
            /// The one spelling (serde, `Display`, `FromStr`).
            pub fn as_str(&self) -> &'static str {
                self.into()
            }
        }
    };
}

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

// `Default` on `Mode`, `Precision` and `MeterKind` only gives `Record::default()` (the base
// rows are built from, and the source of the column list) a value: every written row sets them.

vocab! {
    /// What a point runs.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Mode {
        /// A decoder's prefill, then decode steps with a growing KV cache.
        #[default]
        Infer,
        /// Forward, backward and the optimizer's update.
        Train,
        /// An encoder's inference: one forward over the batch, no cache.
        Encode,
        /// An image pipeline: text encoders, denoising steps, the VAE decode
        /// (docs/src/guides/generation.md).
        Generate,
    }
}

vocab! {
    /// How weights, gradients, optimizer state and activations are stored.
    #[derive(Default, clap::ValueEnum)]
    case = "kebab-case";
    pub enum Precision {
        #[default]
        F32,
        F16,
        Bf16,
        /// f32 master weights (the variables), bf16 compute (training only).
        MixedBf16,
        /// f32 master weights, f16 compute (training only).
        MixedF16,
        /// GGUF weights kept in the types the file stores them in (candle `QTensor`s, multiplied
        /// through `QMatMul`); activations and KV in the point's `compute` dtype (inference only).
        Native,
        /// GGUF weights re-quantized at load to Q4_0 (18 B per 32 weights), then as `native`.
        #[serde(rename = "q4_0")]
        #[strum(serialize = "q4_0")]
        #[value(name = "q4_0")]
        Q4_0,
        /// Q4_1: 20 B per 32 weights.
        #[serde(rename = "q4_1")]
        #[strum(serialize = "q4_1")]
        #[value(name = "q4_1")]
        Q4_1,
        /// Q5_0: 22 B per 32 weights.
        #[serde(rename = "q5_0")]
        #[strum(serialize = "q5_0")]
        #[value(name = "q5_0")]
        Q5_0,
        /// Q5_1: 24 B per 32 weights.
        #[serde(rename = "q5_1")]
        #[strum(serialize = "q5_1")]
        #[value(name = "q5_1")]
        Q5_1,
        /// Q8_0: 34 B per 32 weights.
        #[serde(rename = "q8_0")]
        #[strum(serialize = "q8_0")]
        #[value(name = "q8_0")]
        Q8_0,
        /// Q4_K: 144 B per 256 weights.
        #[serde(rename = "q4k")]
        #[strum(serialize = "q4k")]
        #[value(name = "q4k")]
        Q4k,
        /// Q5_K: 176 B per 256 weights.
        #[serde(rename = "q5k")]
        #[strum(serialize = "q5k")]
        #[value(name = "q5k")]
        Q5k,
        /// Q6_K: 210 B per 256 weights.
        #[serde(rename = "q6k")]
        #[strum(serialize = "q6k")]
        #[value(name = "q6k")]
        Q6k,
        /// Q8_K: 292 B per 256 weights.
        #[serde(rename = "q8k")]
        #[strum(serialize = "q8k")]
        #[value(name = "q8k")]
        Q8k,
    }
}

/// What a quantized precision does with a GGUF's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantized {
    /// Keep each tensor in its stored type.
    Native,
    /// Re-quantize every matrix to this type.
    To(candle_core::quantized::GgmlDType),
}

impl Precision {
    /// The dense precision of a float dtype (f32 for any other).
    pub fn of_dense(d: DType) -> Precision {
        match d {
            DType::F16 => Precision::F16,
            DType::BF16 => Precision::Bf16,
            _ => Precision::F32,
        }
    }
    /// The dtype weights (and, in training, gradients and optimizer state) are stored in. A
    /// quantized precision's dense tensors (norms) and activations use the point's `compute`
    /// axis instead: see [`Precision::dtypes`]; here they answer f32, `compute`'s default.
    pub fn dtype(&self) -> DType {
        self.dtypes(Compute::F32).0
    }
    /// The dtype activations are computed in (f32 for a quantized precision: see
    /// [`Precision::dtypes`]).
    pub fn compute_dtype(&self) -> DType {
        self.dtypes(Compute::F32).1
    }
    /// (dense weights, activations and KV) dtypes of a point at this precision, `compute`
    /// being the point's compute axis (what a quantized precision's dense tensors and
    /// activations use; a dense precision ignores it).
    pub fn dtypes(&self, compute: Compute) -> (DType, DType) {
        match self {
            Precision::F32 => (DType::F32, DType::F32),
            Precision::F16 => (DType::F16, DType::F16),
            Precision::Bf16 => (DType::BF16, DType::BF16),
            Precision::MixedBf16 => (DType::F32, DType::BF16),
            Precision::MixedF16 => (DType::F32, DType::F16),
            _ => (compute.dtype(), compute.dtype()),
        }
    }
    /// For a quantized precision, what it does with a GGUF's weights.
    pub fn quantized(&self) -> Option<Quantized> {
        use candle_core::quantized::GgmlDType as G;
        let to = match self {
            Precision::F32
            | Precision::F16
            | Precision::Bf16
            | Precision::MixedBf16
            | Precision::MixedF16 => return None,
            Precision::Native => return Some(Quantized::Native),
            Precision::Q4_0 => G::Q4_0,
            Precision::Q4_1 => G::Q4_1,
            Precision::Q5_0 => G::Q5_0,
            Precision::Q5_1 => G::Q5_1,
            Precision::Q8_0 => G::Q8_0,
            Precision::Q4k => G::Q4K,
            Precision::Q5k => G::Q5K,
            Precision::Q6k => G::Q6K,
            Precision::Q8k => G::Q8K,
        };
        Some(Quantized::To(to))
    }
    pub fn is_quantized(&self) -> bool {
        self.quantized().is_some()
    }
    pub fn is_mixed(&self) -> bool {
        matches!(self, Precision::MixedBf16 | Precision::MixedF16)
    }
    /// Bytes per element of stored weights, gradients and optimizer state.
    pub fn weight_bytes(&self) -> u64 {
        self.dtype().size_in_bytes() as u64
    }
    /// Bytes per element of activations, KV and logits.
    pub fn act_bytes(&self) -> u64 {
        self.compute_dtype().size_in_bytes() as u64
    }
}

vocab! {
    /// The dtype a quantized point computes in (activations, KV cache, dense tensors).
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Compute {
        #[default]
        F32,
        F16,
        Bf16,
    }
}

impl Compute {
    pub fn dtype(&self) -> DType {
        match self {
            Compute::F32 => DType::F32,
            Compute::F16 => DType::F16,
            Compute::Bf16 => DType::BF16,
        }
    }
}

vocab! {
    /// How a quantized point's linear layers multiply by their quantized weights (the
    /// `qmatmul` axis; quantized precisions only).
    ///
    /// What candle 0.11.1's `QMatMul` (`QMatMul::QTensor`, `xs.apply_op1_no_bwd(qtensor)`)
    /// does on its own (`auto`), from `candle-core-0.11.1/src/quantized/`:
    /// - `QMatMul::from_arc` dequantizes at construction only an F32/F16/BF16 `QTensor` (to
    ///   f32), or every type when `CANDLE_DEQUANTIZE_ALL` (f32) / `CANDLE_DEQUANTIZE_ALL_F16`
    ///   (f16) is set; vramlab builds `QMatMul::QTensor` directly and keeps such matrices dense.
    /// - CPU (`mod.rs` `CustomOp1::cpu_fwd`, `k_quants::matmul`): never dequantizes a weight,
    ///   for any type or batch size. f32 activations are quantized into the weight's vec-dot
    ///   type (Q8_1: 36 B per 32 inputs for Q4_0/Q4_1; Q8_0 for Q5_x/Q8_0; Q8_K, 292 B per 256,
    ///   for the K types) in a thread-local scratch of m × k/block blocks that only grows and
    ///   is kept; bf16 activations are first widened to f32 (m × k × 4 B) and the product made
    ///   into an f32 buffer (m × n × 4 B) before narrowing; f16 activations take
    ///   `k_quants::matmul_f16`, which allocates its m × k/block blocks per call. On x86 with
    ///   AVX2/AVX-VNNI/AVX-512-VNNI, Q4_K (any m), Q6_K (m > 1) and Q8_0 (not plain AVX2)
    ///   weights with n a multiple of the tile and k of 256 are repacked once, at their
    ///   first product, into a copy cached inside the `QTensor` and kept (`repack_x86.rs`):
    ///   persistent, roughly the weight's size, not a per-call transient.
    /// - CUDA (`cuda.rs` `QCudaStorage::fwd`): each `QTensor` is padded by 512 weights' worth
    ///   of blocks. Q4_0–Q8_0 and Q2_K–Q6_K with f32/f16/bf16 activations run MMVQ for
    ///   b·m ≤ 8 and MMQ above, quantizing the activations to Q8_1 in a per-device
    ///   workspace that only grows (non-f32 activations first converted to f32,
    ///   m × k × 4 B); other types fall back to `mul_mat_vec_via_q8_1` (b·m ≤ 8) or
    ///   `mul_mat_via_q8_1`. A weight is dequantized to f32 (an n × k × 4 B transient, freed
    ///   after the call) only under `set_force_dmmv(true)` with b·m > 1.
    ///
    /// So `auto` never holds a dequantized weight; `dequantize` makes the transient that
    /// runtimes which do dequantize (and candle under `set_force_dmmv`) pay, to compare.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum QMatmul {
        /// candle's `QMatMul` on the quantized blocks (above).
        #[default]
        Auto,
        /// Each product dequantizes the weight to the compute dtype (n × k × its bytes; on CPU
        /// f16 and bf16 go through f32 first, n × k × 6 B at the cast), multiplies densely,
        /// and frees it.
        Dequantize,
    }
}

vocab! {
    /// The optimizer a row ran: a scenario's choice (`sgd`, `adamw`, `adamw-fused`), `none` for
    /// inference rows, and on the torch probe the `torch.optim` implementation it forced
    /// (`adamw-foreach`, …; `adamw-fused` is `AdamW(fused=True)` there).
    #[derive(Default, clap::ValueEnum)]
    case = "kebab-case";
    pub enum Optimizer {
        /// No optimizer: an inference or encode row.
        #[default]
        None,
        /// Plain SGD (no state).
        Sgd,
        /// candle-nn's AdamW (allocates temporaries of several times each parameter tensor).
        Adamw,
        /// An in-place fused AdamW with no temporaries: vramlab-kernels' on candle,
        /// `torch.optim.AdamW(fused=True)` on the torch probe.
        AdamwFused,
        /// `torch.optim.AdamW(foreach=True)`: the multi-tensor path.
        AdamwForeach,
        /// `torch.optim.AdamW(foreach=False)`: one parameter at a time.
        AdamwForLoop,
        /// `torch.optim.SGD(foreach=True)`.
        SgdForeach,
        /// `torch.optim.SGD(foreach=False)`.
        SgdForLoop,
        /// `torch.optim.SGD(fused=True)`.
        SgdFused,
    }
}

impl Optimizer {
    /// Whether it keeps AdamW's two moments per parameter.
    pub fn is_adamw(&self) -> bool {
        matches!(
            self,
            Optimizer::Adamw
                | Optimizer::AdamwFused
                | Optimizer::AdamwForeach
                | Optimizer::AdamwForLoop
        )
    }
    /// Whether it is SGD (no state), in any implementation.
    pub fn is_sgd(&self) -> bool {
        matches!(
            self,
            Optimizer::Sgd | Optimizer::SgdForeach | Optimizer::SgdForLoop | Optimizer::SgdFused
        )
    }
    /// Whether it updates parameters at all (not `none`).
    pub fn updates(&self) -> bool {
        *self != Optimizer::None
    }
    /// What a scenario may ask for (the torch implementations are the probe's
    /// `--torch-optim`, `none` is what inference rows record).
    pub fn is_scenario_choice(&self) -> bool {
        matches!(
            self,
            Optimizer::Sgd | Optimizer::Adamw | Optimizer::AdamwFused
        )
    }
    /// The torch implementation of this optimizer (`adamw` + `foreach` = `adamw-foreach`);
    /// `none` stays `none`.
    pub fn torch(&self, imp: OptimizerImpl) -> Optimizer {
        match (self.is_adamw(), self.is_sgd(), imp) {
            (true, _, OptimizerImpl::Foreach) => Optimizer::AdamwForeach,
            (true, _, OptimizerImpl::ForLoop) => Optimizer::AdamwForLoop,
            (true, _, OptimizerImpl::Fused) => Optimizer::AdamwFused,
            (_, true, OptimizerImpl::Foreach) => Optimizer::SgdForeach,
            (_, true, OptimizerImpl::ForLoop) => Optimizer::SgdForLoop,
            (_, true, OptimizerImpl::Fused) => Optimizer::SgdFused,
            (false, false, _) => Optimizer::None,
        }
    }
}

vocab! {
    /// How a torch optimizer step runs over the parameters (its transient differs,
    /// ARCHITECTURE.md §9).
    #[derive(clap::ValueEnum)]
    case = "kebab-case";
    pub enum OptimizerImpl {
        /// torch's multi-tensor path (the CUDA default): `_foreach_sqrt` of v allocates one
        /// temporary per parameter at once ≈ 1 × the trainable parameter bytes.
        Foreach,
        /// One parameter at a time: temporaries of the largest tensor only.
        ForLoop,
        /// `fused=True`: one kernel, no temporaries (≈ 0).
        Fused,
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
    /// Activation checkpointing of a training point.
    case = "lowercase";
    pub enum Checkpointing {
        None,
        /// Keep each layer's input only; recompute the layer in backward.
        Layer,
    }
}

/// What a training point updates: `full`, `frozen-embeddings`, or `lora-rN` (rank-N LoRA
/// adapters on the architecture's LoRA targets, base weights frozen).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Trainable {
    Full,
    FrozenEmbeddings,
    Lora(u32),
}

/// The largest LoRA rank a scenario may ask for.
pub const MAX_LORA_RANK: u32 = 4096;

impl std::str::FromStr for Trainable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Trainable::Full),
            "frozen-embeddings" => Ok(Trainable::FrozenEmbeddings),
            _ => match s.strip_prefix("lora-r").map(str::parse::<u32>) {
                Some(Ok(r)) if (1..=MAX_LORA_RANK).contains(&r) => Ok(Trainable::Lora(r)),
                Some(_) => Err(format!(
                    "LoRA rank in `{s}` must be an integer from 1 to {MAX_LORA_RANK}"
                )),
                None => Err(format!(
                    "unknown trainable set `{s}`, expected `full`, `frozen-embeddings` or `lora-rN` (e.g. `lora-r8`)"
                )),
            },
        }
    }
}

/// serde through text for a type with `Display` and `FromStr<Err = String>`: the
/// `TryFrom<String>`/`Into<String>` pair that `#[serde(try_from = "String", into = "String")]`
/// needs.
macro_rules! serde_as_text {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}
pub(crate) use serde_as_text;

/// An image size in pixels, written `WxH` (`512x512`): the `resolution` axis and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Resolution {
    pub width: usize,
    pub height: usize,
}

impl Resolution {
    pub fn pixels(&self) -> usize {
        self.width * self.height
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl std::str::FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("resolution `{s}` must be WIDTHxHEIGHT in pixels, e.g. 512x512");
        let (w, h) = s.split_once('x').ok_or_else(bad)?;
        let (width, height) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
        if width == 0 || height == 0 {
            return Err(bad());
        }
        Ok(Resolution { width, height })
    }
}

serde_as_text!(Resolution);

serde_as_text!(Trainable);

impl std::fmt::Display for Trainable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trainable::Full => f.write_str("full"),
            Trainable::FrozenEmbeddings => f.write_str("frozen-embeddings"),
            Trainable::Lora(r) => write!(f, "lora-r{r}"),
        }
    }
}

impl Trainable {
    /// The scenario and CSV spelling.
    pub fn label(&self) -> String {
        self.to_string()
    }

    /// The kind of set, without a LoRA rank: what fitted groups share.
    pub fn kind(&self) -> TrainableKind {
        match self {
            Trainable::Full => TrainableKind::Full,
            Trainable::FrozenEmbeddings => TrainableKind::FrozenEmbeddings,
            Trainable::Lora(_) => TrainableKind::Lora,
        }
    }
}

vocab! {
    /// A trainable set without its LoRA rank (the rank only scales the adapters).
    case = "kebab-case";
    pub enum TrainableKind {
        Full,
        FrozenEmbeddings,
        Lora,
    }
}

vocab! {
    /// The two KV caches (ARCHITECTURE.md §4).
    #[derive(clap::ValueEnum)]
    case = "lowercase";
    pub enum KvKind {
        /// One (batch, n_kv, capacity, head_dim) tensor per layer for K and V, allocated once.
        Preallocated,
        /// Exact-fit growth by concatenation.
        Growing,
    }
}

vocab! {
    /// How many tokens a KV cache keeps for a sliding-window model (Mistral): `model` caps it at
    /// the model's window (a ring buffer of min(context, window) tokens, as vLLM and HF do),
    /// `full` keeps every token. The same for models without a window.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum KvWindow {
        #[default]
        Model,
        Full,
    }
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
            MeterKind::CpuAlloc | MeterKind::CudaPool | MeterKind::CudaMeminfo => Runtime::Candle,
        }
    }
}

vocab! {
    /// The software that ran the measured workloads: their uncertain terms (activations saved
    /// per layer, logits path, optimizer transients, allocator) differ.
    #[derive(clap::ValueEnum)]
    case = "lowercase";
    pub enum Runtime {
        /// vramlab's own candle workloads (`vramlab sweep`).
        Candle,
        /// PyTorch + transformers (`scripts/torch_probe`).
        Torch,
    }
}

vocab! {
    /// A measured phase (ARCHITECTURE.md §4), in the order a point runs them.
    case = "snake_case";
    pub enum Phase {
        Load,
        /// The warm-up before a group's (or a point's) first measured phase. Only `oom`/`error`
        /// rows carry it: the warm-up itself is not measured.
        Warmup,
        Prefill,
        Decode,
        Total,
        Forward,
        Backward,
        Optimizer,
        StepTotal,
        /// Generation: the text encoders' forward.
        TextEncode,
        /// Generation: one denoiser step (a row per step).
        Denoise,
        /// Generation: the VAE decode of the final latents.
        VaeDecode,
    }
}

vocab! {
    /// How a generation point decodes its latents (docs/src/guides/generation.md).
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum VaeDecode {
        /// The whole batch at once.
        #[default]
        Full,
        /// One image of the batch at a time.
        Sliced,
        /// Overlapping spatial tiles, one at a time, blended into the output.
        Tiled,
    }
}

vocab! {
    /// A component of a generation pipeline: diffusers' directory names.
    case = "snake_case";
    pub enum Component {
        TextEncoder,
        #[serde(rename = "text_encoder_2")]
        #[strum(serialize = "text_encoder_2")]
        TextEncoder2,
        Unet,
        /// A DiT denoiser (FLUX, Wan).
        Transformer,
        Vae,
    }
}

vocab! {
    /// The generation models vramlab knows the published configs of (`synthetic:NAME`,
    /// `estimate --model`).
    #[derive(clap::ValueEnum)]
    case = "lowercase";
    pub enum GenModel {
        /// runwayml/stable-diffusion-v1-5
        Sd15,
        /// stabilityai/stable-diffusion-2-1
        Sd21,
        /// stabilityai/stable-diffusion-xl-base-1.0
        Sdxl,
        /// black-forest-labs/FLUX.1-dev (guidance-distilled DiT)
        #[serde(rename = "flux-dev")]
        #[strum(serialize = "flux-dev")]
        #[value(name = "flux-dev")]
        FluxDev,
        /// black-forest-labs/FLUX.1-schnell (timestep-distilled: no guidance embedding)
        #[serde(rename = "flux-schnell")]
        #[strum(serialize = "flux-schnell")]
        #[value(name = "flux-schnell")]
        FluxSchnell,
        /// Wan-AI/Wan2.1-T2V-1.3B-Diffusers (text to video)
        #[serde(rename = "wan2.1-t2v-1.3b")]
        #[strum(serialize = "wan2.1-t2v-1.3b")]
        #[value(name = "wan2.1-t2v-1.3b")]
        Wan21T2v13b,
    }
}

vocab! {
    /// How a row ended.
    case = "lowercase";
    pub enum Status {
        Ok,
        Oom,
        Error,
        Skipped,
    }
}

/// serde for an `Option` of a vocabulary value where no null exists (constants TOML): `None`
/// is written and read as the empty string, a value as its one spelling.
pub mod blank {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        text.parse()
            .map(Some)
            .map_err(|e| D::Error::custom(format!("`{text}`: {e}")))
    }
}

impl GenModel {
    /// Whether `mode = "train"` fine-tunes its denoiser with LoRA (Wan2.1's DiT, SD 1.5/2.1's
    /// UNet; not FLUX's transformer nor SDXL's UNet).
    pub fn trains(self) -> bool {
        matches!(
            self,
            GenModel::Wan21T2v13b | GenModel::Sd15 | GenModel::Sd21
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// serde's spelling (what the CSV and the scenario read) is `Display`'s and `FromStr`'s.
    fn same<T>(values: &[T])
    where
        T: Serialize + std::fmt::Display + FromStr + PartialEq + std::fmt::Debug,
        <T as FromStr>::Err: std::fmt::Debug,
    {
        for v in values {
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(json.as_str().unwrap(), v.to_string(), "{v:?}");
            assert_eq!(&T::from_str(&v.to_string()).unwrap(), v);
        }
    }

    fn all<T: strum::IntoEnumIterator>() -> Vec<T> {
        T::iter().collect()
    }

    #[test]
    fn one_spelling_everywhere() {
        same(&all::<Backend>());
        same(&all::<Mode>());
        same(&all::<Precision>());
        same(&all::<Optimizer>());
        same(&all::<OptimizerImpl>());
        same(&all::<Kernels>());
        same(&all::<Attention>());
        same(&all::<Checkpointing>());
        same(&all::<TrainableKind>());
        same(&all::<Compute>());
        same(&all::<QMatmul>());
        assert_eq!(Precision::Q4_0.as_str(), "q4_0");
        assert_eq!(Precision::Q4k.as_str(), "q4k");
        same(&[
            Trainable::Full,
            Trainable::FrozenEmbeddings,
            Trainable::Lora(8),
        ]);
        same(&all::<KvKind>());
        same(&all::<KvWindow>());
        same(&all::<PoolRelease>());
        same(&all::<MeterKind>());
        same(&all::<Runtime>());
        same(&all::<Phase>());
        same(&all::<Status>());
        assert_eq!(Phase::StepTotal.as_str(), "step_total");
        assert_eq!(Optimizer::AdamwFused.as_str(), "adamw-fused");
        assert_eq!(Optimizer::AdamwForLoop.as_str(), "adamw-for-loop");
        assert_eq!(Optimizer::None.as_str(), "none");
        assert!("lora-r0".parse::<Trainable>().is_err());
    }

    /// What the torch probe writes (`{optimizer}-{impl}`) reads back as the vocabulary's
    /// implementation variant.
    #[test]
    fn torch_optimizers() {
        for o in [Optimizer::Sgd, Optimizer::Adamw] {
            for i in all::<OptimizerImpl>() {
                let t = o.torch(i);
                assert_eq!(t.to_string(), format!("{o}-{i}"));
                assert_eq!((t.is_adamw(), t.is_sgd()), (o.is_adamw(), o.is_sgd()));
                assert!(!t.is_scenario_choice() || t == Optimizer::AdamwFused);
            }
        }
        assert_eq!(Optimizer::None.torch(OptimizerImpl::Fused), Optimizer::None);
    }
}
