//! Numeric formats: how weights, gradients, optimizer state and activations are stored
//! ([`Precision`]), what a quantized precision does with a GGUF ([`Quantized`]), the dtype a
//! quantized point computes in ([`Compute`]) and how it multiplies ([`QMatmul`]).
use candle_core::DType;

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
