//! `estimate`: the memory a configuration needs, category by category (ARCHITECTURE.md §9), from
//! analytic formulas or from constants that `fit` measured.
//!
//! Training follows the ZeRO paper's accounting: per parameter, weights + gradients +
//! optimizer state (mixed precision with AdamW: 4 + 4 + 8 = 16 B here, since our f32 master
//! weights take the gradients, ARCHITECTURE.md §8), divided over `gpus` by the sharding stage.
//! Activations per GPU follow Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes per layer at 16 bits,
//! without the 5·a·s/h score term under flash attention.
pub mod generate;
pub mod model;

use crate::checked::Checked;
pub use crate::checked::Overflow;
use crate::features::{self as feat, Features, InferShape, TrainShape};
pub use crate::fit::Runtime;
use crate::fit::{self, Constants, GroupKey, Target, TrainGroup};
use crate::model::{Config, KvKind};
use crate::record::Phase;
pub use model::{resolve, Resolved};
use serde::Serialize;

/// CUDA context with the runtime's kernels loaded, outside any allocator: 512 MiB, the order of
/// the "non-torch memory" vLLM logs at start-up on CUDA ≥ 11.7 with lazy module loading
/// (vllm/worker/worker.py, `non_torch_allocations`); the 1343 MiB HF measured on CUDA 11.2
/// (transformers docs, model_memory_anatomy.md) predates lazy loading.
pub const CUDA_CONTEXT: u64 = 512 << 20;
/// cuBLAS workspace per handle: PyTorch's documented default `CUBLAS_WORKSPACE_CONFIG`
/// `:4096:2:16:8` (2 × 4096 KiB + 8 × 16 KiB; PyTorch docs, "Reproducibility" / CUDA
/// semantics, cuBLAS workspaces).
pub const CUBLAS_WORKSPACE: u64 = 2 * (4096 << 10) + 8 * (16 << 10);
/// Candle's pool reserve on CUDA, until a device session measures it: one large segment of
/// slack, the 20 MiB `kLargeBuffer` of PyTorch's c10/cuda/CUDACachingAllocator.cpp (requests
/// of 1–10 MiB are served from 20 MiB segments). PyTorch's reserve is fitted instead
/// ([`REFERENCE_RESERVE`]).
pub const ALLOCATOR_ROUNDING: u64 = 20 << 20;

/// The caching allocator's reserve `estimate` applies to torch on CUDA without a
/// `--constants` file that carries one: `vramlab fit` on this repository's emulated sweep of
/// four models' inference and training (docs/src/results/emulated.md; PyTorch's own allocator
/// on the emulated GPU), built into the binary.
pub const REFERENCE_RESERVE: (&str, &str) = (
    "results/emulated/a100-80gb-emu-reserve-llm.constants.toml",
    include_str!("../../../results/emulated/a100-80gb-emu-reserve-llm.constants.toml"),
);

/// The built-in reserve fits ([`REFERENCE_RESERVE`]), parsed once.
pub fn reference_reserve() -> &'static Constants {
    static C: std::sync::OnceLock<Constants> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        Constants::parse(
            std::path::Path::new(REFERENCE_RESERVE.0),
            REFERENCE_RESERVE.1,
        )
        .expect("the committed reference reserve parses")
    })
}

/// The device a query is for: CUDA GPUs (the catalog), or the CPU (candle's CPU backend, to
/// check an estimate against `vramlab sweep` on this machine).
pub use crate::vocab::Backend;
pub use crate::vocab::{
    Attention, Compute, KvWindow, Mode, Optimizer, OptimizerImpl, Precision, Trainable,
};
use crate::vocab::{Checkpointing, Ops};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
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
    pub sharding: Sharding,
    pub gpus: u64,
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
}

impl Query {
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
            sharding: Sharding::Ddp,
            gpus: 1,
            attention: Attention::Flash,
            kv_cache: KvKind::Preallocated,
            kv_window: KvWindow::Model,
            runtime: Runtime::Torch,
            backend: Backend::Cuda,
            optimizer_impl: OptimizerImpl::Foreach,
            compute: Compute::F32,
            weight_bytes: None,
        }
    }
}

impl Query {
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

/// Bytes per category, per GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub weights: u64,
    /// Transient 16-bit copies of f32 master weights (mixed precision).
    pub weight_copies: u64,
    pub kv: u64,
    pub activations: u64,
    pub logits: u64,
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
    /// allocated). Torch: a fitted ratio of the allocated bytes ([`fit::reserve`]); candle:
    /// [`ALLOCATOR_ROUNDING`], unmeasured.
    pub allocator_reserve: u64,
    /// Where the figures come from: "analytic" or the fitted group.
    pub source: String,
    /// Where the reserve comes from.
    pub reserve_source: String,
}

impl Breakdown {
    /// NVML's "used" on a GPU (the driver's view, what runs out): the sum of the rows; an
    /// [`Overflow`] past 2^64 B ([`estimate`] returns only breakdowns whose total fits). The
    /// GPU verdicts use this figure.
    pub fn total(&self) -> Result<u64, Overflow> {
        self.sum_without(&[], "total")
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
            ("weight copies (16-bit)", self.weight_copies),
            ("KV cache", self.kv),
            ("activations", self.activations),
            ("logits", self.logits),
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

/// Inference features of the point (`features::infer`, what `sweep` writes into the CSV), for
/// the `total` phase with the prompt filling the context.
pub fn infer_features(c: &Config, q: &Query) -> Result<Features, Overflow> {
    // A count past usize (a 32-bit target) is an overflow too.
    let size = |v: u64| usize::try_from(v).map_err(|_| Overflow::new("activations"));
    let shape = InferShape {
        batch: size(q.batch)?,
        context: size(q.context)?,
        prompt_len: size(q.context)?,
        kv: q.kv_cache,
        kv_window: q.kv_window,
        dtype_bytes: size(q.act_bytes())?,
    };
    let f = feat::infer(c, &shape, Phase::Total, shape.context)?;
    Ok(Features {
        weight_bytes: q.weight_bytes.unwrap_or(f.weight_bytes),
        ..f
    })
}

fn analytic_infer(c: &Config, q: &Query) -> Result<Breakdown, Overflow> {
    let w = q.act_bytes();
    let f = infer_features(c, q)?;
    let bs = Checked::from(q.batch) * q.context;
    // The largest per-layer transient of the prefill: the MLP intermediates (gate, up and
    // their product) plus f32 norm copies, or the materialized attention scores with their
    // f32 softmax copies.
    let mlp = bs * (Checked::new(3) * c.intermediate_size * w + Checked::new(8) * c.hidden_size);
    let scores = match q.attention {
        Attention::Flash | Attention::Sdpa => Checked::ZERO,
        Attention::Eager | Attention::Sliced => bs * c.num_heads * q.context * (w + 8),
    };
    Ok(Breakdown {
        weights: f.weight_bytes,
        kv: f.kv_bytes,
        activations: mlp.max(scores).bytes("activations")?,
        logits: (Checked::from(q.batch) * c.vocab_size * 4u64).bytes("logits")?,
        source: "analytic".into(),
        ..device_terms(q)
    })
}

/// How much of a layer's activations the backward recomputes instead of keeping
/// (Korthikanti et al. §4–5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    /// Everything the backward needs is kept.
    None,
    /// The attention core (scores, softmax, dropout) is recomputed: the 5·a·s/h term goes.
    Selective,
    /// Only each layer's input is kept (2·s·b·h at 16 bits); the layer is recomputed.
    Full,
}

/// Activation bytes one transformer layer keeps for the backward, per GPU, by Korthikanti et
/// al. ("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
/// Table 2) at 16-bit activations with 1-byte dropout masks, scaled by `act_bytes / 2` for
/// other widths: s·b·h·(10 + 24/t + 5·a·s/(h·t)) under `t`-way tensor parallelism, with the 10
/// (layer norms and dropout outputs, replicated across the tensor-parallel group) also divided
/// by `t` under sequence parallelism; selective recomputation drops the score term, full
/// recomputation keeps only the layer's input (2·s·b·h, divided by `t` under sequence
/// parallelism). `scores` is false when the attention kernel never materializes them (flash,
/// SDPA), which is the selective case.
#[allow(clippy::too_many_arguments)] // the formula's own variables
pub fn layer_activations(
    c: &Config,
    batch: u64,
    seq: u64,
    act_bytes: u64,
    scores: bool,
    recompute: Recompute,
    tp: u64,
    sequence_parallel: bool,
) -> Checked {
    let (b, s, t) = (batch, seq, tp.max(1));
    let sbh = Checked::from(s) * b * c.hidden_size;
    let replicated = if sequence_parallel {
        sbh * 10u64 / t
    } else {
        sbh * 10u64
    };
    let at16 = match recompute {
        Recompute::Full => sbh * 2u64 / if sequence_parallel { t } else { 1 },
        Recompute::Selective => replicated + sbh * 24u64 / t,
        Recompute::None => {
            let score = if scores {
                Checked::new(5) * c.num_heads * s * s * b / t
            } else {
                Checked::ZERO
            };
            replicated + sbh * 24u64 / t + score
        }
    };
    at16 * act_bytes / 2
}

/// What torch autocast (AMP: f32 weights, 16-bit compute) keeps per layer beyond
/// Korthikanti's all-16-bit accounting, following transformers' layer code: the residual
/// stream stays f32 (the weights and embeddings are f32), so both layer norms save f32 inputs
/// (+2·s·b·h each); softmax is on autocast's float32 list, so the saved attention
/// probabilities are f32 (+2·a·s²·b) when the scores are materialized; and autocast casts a
/// non-leaf input afresh for every matmul (its cast cache holds only leaf weights), so
/// separate q, k and v projections save three 16-bit copies of their input, two more than the
/// formula's one (+4·s·b·h; none with a fused qkv projection).
fn autocast_extra(c: &Config, b: u64, s: u64, scores: bool) -> Checked {
    let sbh = Checked::from(s) * b * c.hidden_size;
    let norms = sbh * 4u64;
    let casts = if c.fused_qkv {
        Checked::ZERO
    } else {
        sbh * 4u64
    };
    let softmax = if scores {
        Checked::new(2) * c.num_heads * s * s * b
    } else {
        Checked::ZERO
    };
    norms + casts + softmax
}

/// Per-GPU model states (weights, 16-bit weight copies, gradients, optimizer state) of
/// training `t` of `p` parameters (`adapters` of them LoRA adapters outside `p`), following the
/// ZeRO paper (Rajbhandari et al., arXiv:1910.02054, §3 and Figure 1). Under data parallelism
/// (DDP) mixed precision is torch AMP's layout: f32 weights, f32 gradients and f32 Adam
/// moments (4 + 4 + 8 B per parameter) plus autocast's 16-bit copies of the weights. Under a
/// ZeRO stage it is DeepSpeed's: 16-bit weights and gradients (2 + 2 B) and an optimizer state
/// of K = 12 B (f32 master weights and both moments); stage 1 shards the optimizer state,
/// stage 2 also the gradients, stage 3 (= FSDP) also the weights, each over `gpus`.
pub fn model_states(p: u64, t: u64, adapters: u64, q: &Query) -> Result<Breakdown, Overflow> {
    let n = q.gpus.max(1);
    let shard = |bytes: Checked, sharded: bool, figure: &str| {
        if sharded { bytes.div_ceil(n) } else { bytes }.bytes(figure)
    };
    let (s1, s2, s3) = match q.sharding {
        Sharding::Ddp => (false, false, false),
        Sharding::Zero1 => (true, false, false),
        Sharding::Zero2 => (true, true, false),
        Sharding::Zero3 | Sharding::Fsdp => (true, true, true),
    };
    let zero_mixed = q.precision.is_mixed() && q.sharding != Sharding::Ddp;
    let wb = q.state_bytes();
    // Stored weight and gradient bytes per parameter: 16-bit under a ZeRO stage's mixed
    // precision, where the f32 master copy is part of the optimizer state.
    let (w, g) = if zero_mixed { (2u64, 2u64) } else { (wb, wb) };
    // Under a ZeRO stage's mixed precision the state also holds the f32 master weights.
    let master = if zero_mixed { wb } else { 0 };
    let opt_per_param = match q.optimizer {
        o if o.is_adamw() => 2 * wb + master,
        o if o.is_sgd() => master,
        _ => 0,
    };
    let (p, t) = (Checked::from(p), Checked::from(t));
    let grads = if q.optimizer.updates() {
        t * g
    } else {
        Checked::ZERO
    };
    // A quantized base (QLoRA) is its exact block bytes; the adapters are dense.
    let base = q.weight_bytes.map_or(p * w, Checked::from);
    Ok(Breakdown {
        weights: shard(base + Checked::from(adapters) * w, s3, "weights")?,
        weight_copies: if q.precision.is_mixed() && !zero_mixed {
            shard(p * 2u64, s3, "weight copies")?
        } else {
            0
        },
        gradients: shard(grads, s2, "gradients")?,
        optimizer: shard(t * opt_per_param, s1, "optimizer state")?,
        ..Default::default()
    })
}

fn analytic_train(c: &Config, q: &Query) -> Result<Breakdown, Overflow> {
    // All parameters, the updated ones (gradients and optimizer state follow them) and the
    // LoRA adapters.
    let feat::Counts {
        params: p,
        trainable: t,
        adapters,
        ..
    } = feat::counts(c, q.trainable)?;
    let states = model_states(p, t, adapters, q)?;
    let (b, s) = (q.batch, q.context);
    let aw = q.act_bytes();
    let scores = q.attention == Attention::Eager;
    let layers = c.num_layers;
    let amp = q.runtime == Runtime::Torch && q.precision.is_mixed();
    let per_layer = layer_activations(c, b, s, aw, scores, Recompute::None, 1, false)
        + if amp {
            autocast_extra(c, b, s, scores)
        } else {
            Checked::ZERO
        };
    // Under autocast the residual stream, and so each checkpointed layer input, is f32.
    let input = layer_activations(c, b, s, aw, scores, Recompute::Full, 1, false)
        * if amp { 2u64 } else { 1 };
    let activations = if q.checkpointing == Checkpointing::Layer {
        // Every layer's input, plus the one layer being recomputed.
        input * layers + per_layer
    } else {
        per_layer * layers
    };
    let activations = activations.bytes("activations")?;
    // Decoders' LM head: logits in the compute dtype and their f32 log-softmax. Encoders
    // train through a pooled head (a sequence classifier, or vramlab's pooled regression):
    // no per-token logits.
    let logits = match c.architecture.role() {
        crate::model::arch::Role::Decoder => Checked::from(b) * s * c.vocab_size * (aw + 4),
        crate::model::arch::Role::Encoder => Checked::ZERO,
    }
    .bytes("logits")?;
    // The step's transient, over this GPU's share of the updated parameters.
    let transient = if states.optimizer == 0 {
        Checked::ZERO
    } else {
        let updated = if q.sharding == Sharding::Ddp {
            t
        } else {
            t.div_ceil(q.gpus.max(1))
        };
        step_transient(c, q, updated)?
    };
    Ok(Breakdown {
        activations,
        logits,
        step_transient: transient
            .saturating_sub(Checked::from(activations) + logits)
            .bytes("optimizer step transient")?,
        source: "analytic".into(),
        ..device_terms(q)
    }
    .with_states(&states))
}

impl Breakdown {
    /// This breakdown with the model-state rows of `states`.
    fn with_states(self, states: &Breakdown) -> Breakdown {
        Breakdown {
            weights: states.weights,
            weight_copies: states.weight_copies,
            gradients: states.gradients,
            optimizer: states.optimizer,
            ..self
        }
    }
}

/// The AdamW step's transient bytes over `t` updated parameters (ARCHITECTURE.md §9): candle-nn's
/// about 14 × the largest tensor (measured on CPU, docs/src/results/cpu-train-smollm2-kernels.md);
/// torch foreach 1 × the parameter bytes (the `_foreach_sqrt` of v); for-loop one temporary of the
/// largest tensor; fused none. SGD keeps no state and has no transient here.
fn step_transient(c: &Config, q: &Query, t: u64) -> Result<Checked, Overflow> {
    let wb = q.state_bytes();
    let largest = Checked::from(feat::counts(c, q.trainable)?.largest_tensor.min(t)) * wb;
    Ok(match q.runtime_optimizer() {
        Optimizer::Adamw => largest * 14u64,
        Optimizer::AdamwForeach => Checked::from(t) * wb,
        Optimizer::AdamwForLoop => largest,
        // In place, one kernel (vramlab-kernels' on candle, `fused=True` on torch); SGD
        // keeps no state.
        Optimizer::AdamwFused
        | Optimizer::None
        | Optimizer::Sgd
        | Optimizer::SgdForeach
        | Optimizer::SgdForLoop
        | Optimizer::SgdFused => Checked::ZERO,
    })
}

/// The device rows of a query: the sourced defaults on CUDA, none on the CPU.
fn device_terms(q: &Query) -> Breakdown {
    match q.backend {
        Backend::Cuda => Breakdown {
            cuda_context: CUDA_CONTEXT,
            cublas_workspace: CUBLAS_WORKSPACE,
            ..Default::default()
        },
        Backend::Cpu => Breakdown::default(),
    }
}

/// Gradient bytes of a training query (unsharded: fits know one GPU).
pub fn grad_bytes(c: &Config, q: &Query) -> Result<u64, Overflow> {
    if !q.optimizer.updates() {
        Ok(0)
    } else {
        (Checked::from(feat::trainable_params(c, q.trainable)?) * q.state_bytes())
            .bytes("gradients")
    }
}

/// Training features of the point (`features::train`, what `sweep` writes into the CSV).
pub fn train_features(c: &Config, q: &Query) -> Result<Features, Overflow> {
    let size = |v: u64| usize::try_from(v).map_err(|_| Overflow::new("activations"));
    let shape = TrainShape {
        batch: size(q.batch)?,
        seq: size(q.context)?,
        weight_bytes: size(q.state_bytes())?,
        compute_bytes: size(q.act_bytes())?,
        adamw: q.optimizer.is_adamw(),
        trainable: q.trainable,
    };
    feat::train(c, &shape, Phase::StepTotal)
}

/// The group of fitted constants that answers a query on `backend`: for inference the `total`
/// phase of the same architecture, precision and cache kind; for training the `step_total`
/// phase of the same architecture, precision, optimizer, checkpointing and kind of trainable
/// set. None for a sharded training job (the fits know one GPU) or no optimizer.
pub fn group_key(c: &Config, q: &Query, backend: Backend) -> Option<GroupKey> {
    let (kv_cache, train, phase) = match q.mode {
        // Encoders have no fitted groups yet: analytic only.
        Mode::Encode | Mode::Generate => return None,
        Mode::Infer => (Some(q.kv_cache), None, Phase::Total),
        Mode::Train => {
            if q.gpus > 1 && q.sharding != Sharding::Ddp || !q.optimizer.updates() {
                return None;
            }
            let group = TrainGroup {
                optimizer: q.runtime_optimizer(),
                checkpointing: q.checkpointing,
                trainable: q.trainable.kind(),
                first_step: false,
            };
            (None, Some(group), Phase::StepTotal)
        }
    };
    Some(GroupKey {
        architecture: c.architecture.name().to_string(),
        backend,
        precision: q.precision,
        mode: q.mode,
        kv_cache,
        train,
        ops: Ops::default(),
        phase,
    })
}

/// The terms of a query in a phase, by the definitions `fit` uses for CSV rows.
pub fn query_terms(c: &Config, q: &Query, phase: Phase) -> Result<fit::Terms, Overflow> {
    Ok(match q.mode {
        Mode::Infer | Mode::Encode | Mode::Generate => fit::terms(
            &infer_features(c, q)?,
            q.batch,
            q.context,
            q.context,
            q.act_bytes(),
        ),
        // The steady state: every step after the first holds the optimizer state throughout;
        // gradients are live from the backward on.
        Mode::Train => fit::train_terms(
            &train_features(c, q)?,
            q.batch,
            q.context,
            1,
            true,
            q.act_bytes(),
            if phase == Phase::Forward {
                0
            } else {
                grad_bytes(c, q)?
            },
        ),
    })
}

/// The fitted group for a query ([`group_key`]) on the constants' own backend, with the
/// query's terms in that group's phase. For training, a step's peak is the largest of its
/// phases' peaks (that is how `step_total` is measured), so where the forward, backward and
/// optimizer groups are all fitted, the phase predicting the most answers; else the
/// `step_total` group. An overflow: the query's terms exceed 64-bit bytes.
pub fn fitted_group<'a>(
    c: &'a Constants,
    cfg: &Config,
    q: &Query,
) -> Result<Option<(&'a fit::GroupFit, fit::Terms)>, Overflow> {
    let Some(key) = group_key(cfg, q, c.backend) else {
        return Ok(None);
    };
    let at = |g: &'a fit::GroupFit| Ok((g, query_terms(cfg, q, g.key.phase)?));
    if q.mode == Mode::Train {
        let phases: Option<Vec<_>> = fit::STEP_PHASES
            .iter()
            .map(|ph| {
                let k = GroupKey {
                    phase: *ph,
                    ..key.clone()
                };
                c.find(&k, Target::PeakAllocated)
            })
            .collect();
        if let Some(p) = phases {
            let p = p.into_iter().map(at).collect::<Result<Vec<_>, _>>()?;
            return Ok(p
                .into_iter()
                .max_by(|a, b| a.0.model.predict(&a.1).total_cmp(&b.0.model.predict(&b.1))));
        }
    }
    c.find(&key, Target::PeakAllocated).map(at).transpose()
}

/// Estimates a query. Weights, KV cache, gradients and optimizer state are always the
/// analytic (exact) bytes; where a fitted group applies, it supplies only the uncertain rows
/// (runtime constant, activations, logits), each term at its fitted coefficient or, where the
/// group could not identify it, at the analytic prior the fit held it at (and subtracted:
/// the fitted constant is consistent with it). Device rows are the sourced defaults.
///
/// An [`Overflow`] when a row or the total exceeds 2^64 B: a breakdown returned is one whose
/// [`Breakdown::total`] fits.
pub fn estimate(
    c: &Config,
    q: &Query,
    constants: Option<&Constants>,
) -> Result<Breakdown, Overflow> {
    let e = with_reserve(fitted(c, q, constants)?, q, constants)?;
    e.total()?;
    Ok(e)
}

/// `e` with the allocator's reserve over its allocated bytes (CUDA only): torch's from the
/// constants' own reserve fits where they carry them (a torch fit on CUDA), else the built-in
/// reference ([`REFERENCE_RESERVE`]); candle's [`ALLOCATOR_ROUNDING`].
pub fn with_reserve(
    e: Breakdown,
    q: &Query,
    constants: Option<&Constants>,
) -> Result<Breakdown, Overflow> {
    let class = fit::reserve::ReserveClass::new(q.mode, q.checkpointing, q.trainable);
    with_reserve_of(e, q, constants, class)
}

/// [`with_reserve`] for the runs of `class` (a loaded model: [`fit::reserve::ReserveClass::LOAD`]).
pub fn with_reserve_of(
    e: Breakdown,
    q: &Query,
    constants: Option<&Constants>,
    class: fit::reserve::ReserveClass,
) -> Result<Breakdown, Overflow> {
    let (reserve, how) = match (q.backend, q.runtime) {
        (Backend::Cpu, _) => {
            return Ok(Breakdown {
                allocator_reserve: 0,
                ..e
            })
        }
        (Backend::Cuda, Runtime::Candle) => (
            ALLOCATOR_ROUNDING,
            "candle's pool on CUDA is not measured yet: one 20 MiB segment assumed".to_string(),
        ),
        (Backend::Cuda, Runtime::Torch) => {
            let (path, k) = match constants.filter(|k| !k.reserve.is_empty()) {
                Some(k) => ("--constants", k),
                None => (REFERENCE_RESERVE.0, reference_reserve()),
            };
            let (ratio, how) =
                fit::reserve::reserve_ratio(&k.reserve, class).expect("a reserve file has classes");
            let bytes = Checked::from_f64((e.allocated()? as f64 * ratio).ceil())
                .bytes("allocator reserve")?;
            (bytes, format!("fitted on {} ({path}): {how}", k.device))
        }
    };
    Ok(Breakdown {
        allocator_reserve: reserve,
        reserve_source: how,
        ..e
    })
}

/// [`estimate`]'s rows without the allocator's reserve, before the total is checked.
fn fitted(c: &Config, q: &Query, constants: Option<&Constants>) -> Result<Breakdown, Overflow> {
    let mut e = match q.mode {
        Mode::Infer => analytic_infer(c, q)?,
        // One forward over the batch: no cache, no LM head.
        Mode::Encode | Mode::Generate => Breakdown {
            kv: 0,
            logits: 0,
            ..analytic_infer(c, q)?
        },
        Mode::Train => analytic_train(c, q)?,
    };
    let fitted = match constants {
        Some(k) => fitted_group(k, c, q)?,
        None => None,
    };
    let Some((g, x)) = fitted else {
        return Ok(e);
    };
    e.source = format!(
        "fitted {} ({}, {} model)",
        g.key.label(),
        g.target.as_str(),
        g.model.kind()
    );
    // Bytes of `terms` in the resident part and the active candidate.
    let part = |terms: &[&str], resident_const: bool| -> Checked {
        let idx = |t: &str| fit::TERMS.iter().position(|n| *n == t).expect("term");
        let mut sum = 0.0;
        for t in terms {
            if *t != "const" || resident_const {
                sum += g.model.get(t) * x[idx(t)];
            }
        }
        if let Some(c) = g.model.active(&x) {
            for t in terms {
                if *t != "const" || !resident_const {
                    sum += c.get(*t).copied().unwrap_or(0.0) * x[idx(t)];
                }
            }
        }
        Checked::from_f64(sum)
    };
    // The fitted phases (forward, backward, optimizer) already carry the step's transient.
    e.step_transient = 0;
    e.runtime_constant = part(&["const"], true).bytes("runtime constant")?;
    e.activations = part(&["act", "attn"], true).bytes("activations")?;
    // The head family's constant (a converted weight) belongs with the logits.
    e.logits = part(&["logits", "const"], false).bytes("logits")?;
    Ok(e)
}

/// A GPU memory class of the catalog, with example products and the `--gpu` names it answers to.
pub struct GpuClass {
    pub gb: u64,
    pub examples: &'static str,
    pub names: &'static [&'static str],
}

pub const CATALOG: &[GpuClass] = &[
    GpuClass {
        gb: 24,
        examples: "RTX 4090, RTX 3090, L4, A10",
        names: &["rtx4090", "rtx3090", "l4", "a10"],
    },
    GpuClass {
        gb: 32,
        examples: "RTX 5090, V100-32GB",
        names: &["rtx5090", "v100-32"],
    },
    GpuClass {
        gb: 40,
        examples: "A100-40GB",
        names: &["a100-40"],
    },
    GpuClass {
        gb: 48,
        examples: "L40S, RTX 6000 Ada, A6000",
        names: &["l40s", "l40", "rtx6000-ada", "a6000"],
    },
    GpuClass {
        gb: 80,
        examples: "H100-80GB, A100-80GB, H800",
        names: &["h100-80", "h100", "a100-80", "h800"],
    },
    GpuClass {
        gb: 94,
        examples: "H100 NVL",
        names: &["h100-nvl"],
    },
    GpuClass {
        gb: 141,
        examples: "H200",
        names: &["h200"],
    },
    GpuClass {
        gb: 180,
        examples: "B200",
        names: &["b200"],
    },
    GpuClass {
        gb: 192,
        examples: "MI300X",
        names: &["mi300x"],
    },
];

/// A `--gpu` name ("h100-80", "l4", …) or a size ("80gb", "80").
pub fn gpu_by_name(name: &str) -> Option<(String, u64)> {
    let n = name.to_ascii_lowercase();
    if let Some(c) = CATALOG.iter().find(|c| c.names.contains(&n.as_str())) {
        return Some((n, c.gb * 1_000_000_000));
    }
    let digits = n.trim_end_matches("gb");
    digits
        .parse::<u64>()
        .ok()
        .filter(|&g| g > 0)
        // A size past 2^64 B is no GPU.
        .and_then(|g| Some((format!("{g} GB"), g.checked_mul(1_000_000_000)?)))
}

/// Usable bytes of a GPU after the headroom fraction.
pub fn budget(gpu_bytes: u64, headroom: f64) -> u64 {
    (gpu_bytes as f64 * (1.0 - headroom)) as u64
}

/// The smallest catalog class whose budget holds `total`.
pub fn smallest_gpu(total: u64, headroom: f64) -> Option<&'static GpuClass> {
    CATALOG
        .iter()
        .find(|c| total <= budget(c.gb * 1_000_000_000, headroom))
}

/// The largest value in 1..=hi for which `fits` holds (monotone), or 0.
pub fn largest(hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, hi);
    if fits(hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// What the estimate says about one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuFit {
    pub gpu: String,
    pub gpu_bytes: u64,
    pub budget_bytes: u64,
    pub fits: bool,
    pub largest_batch: u64,
    pub largest_context: u64,
    /// vLLM-style: tokens the KV budget holds (inference only).
    pub kv_capacity_tokens: Option<u64>,
    /// Sequences of `context` tokens the KV budget holds at once (each holding the tokens its
    /// cache keeps: at most the sliding window under `--kv-window model`).
    pub max_concurrency: Option<f64>,
    /// Training that does not fit: the smallest FSDP (ZeRO-3) degree that does.
    pub min_fsdp_gpus: Option<u64>,
}

/// Largest batch searched.
pub const MAX_BATCH: u64 = 1 << 20;
/// Largest context searched.
pub const MAX_CONTEXT: u64 = 1 << 24;
/// Largest FSDP degree searched.
pub const MAX_GPUS: u64 = 4096;

/// What the estimate of `q` says about one GPU: an [`Overflow`] when `q`'s own estimate
/// overflows; a searched candidate that overflows does not fit.
pub fn gpu_fit(
    cfg: &Config,
    q: &Query,
    c: Option<&Constants>,
    gpu: &str,
    gpu_bytes: u64,
    headroom: f64,
) -> Result<GpuFit, Overflow> {
    let cap = budget(gpu_bytes, headroom);
    let fits = |q: &Query| fits_in(cfg, q, c, cap);
    let (kv_tokens, concurrency) = if q.mode == Mode::Infer {
        let e = estimate(cfg, q, c)?;
        // A KV row per token past 2^64 B holds no token.
        let per_token = cfg
            .kv_bytes_per_token(q.act_bytes() as usize)
            .get()
            .unwrap_or(u64::MAX);
        let tokens = cap.saturating_sub(e.total()? - e.kv) / per_token.max(1);
        let per_sequence = cfg.kv_tokens_held(q.context as usize, q.kv_window);
        (Some(tokens), Some(tokens as f64 / per_sequence as f64))
    } else {
        (None, None)
    };
    let ok = fits(q);
    let min_fsdp_gpus = (q.mode == Mode::Train && !ok)
        .then(|| {
            let sharded = |n: u64| Query {
                sharding: Sharding::Fsdp,
                gpus: n,
                ..*q
            };
            // Every sharded row shrinks as the degree grows: bisect for the first that fits.
            let n = (largest(MAX_GPUS, |n| !fits(&sharded(n))) + 1).max(2);
            (n <= MAX_GPUS).then_some(n)
        })
        .flatten();
    Ok(GpuFit {
        gpu: gpu.to_string(),
        gpu_bytes,
        budget_bytes: cap,
        fits: ok,
        largest_batch: largest(MAX_BATCH, |b| fits(&Query { batch: b, ..*q })),
        largest_context: largest(MAX_CONTEXT, |s| fits(&Query { context: s, ..*q })),
        kv_capacity_tokens: kv_tokens,
        max_concurrency: concurrency,
        min_fsdp_gpus,
    })
}

/// Whether the estimate of `q` fits `cap` bytes; one that overflows does not.
pub fn fits_in(cfg: &Config, q: &Query, c: Option<&Constants>, cap: u64) -> bool {
    estimate(cfg, q, c)
        .and_then(|e| e.total())
        .is_ok_and(|t| t <= cap)
}

/// The quantized formats `--best-format` weighs after the unquantized one (the GGUF's own
/// types, or a preset's bf16), roughly most bits first; the table is sorted by the bits per
/// weight each actually gets.
pub const BEST_FORMATS: [Precision; 6] = [
    Precision::Q8_0,
    Precision::Q6k,
    Precision::Q5k,
    Precision::Q4k,
    Precision::Q4_1,
    Precision::Q4_0,
];

/// One format of `--best-format`: its exact weights, the query's total with them, and
/// whether that fits the budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FormatFit {
    pub precision: Precision,
    /// None when the format is impossible for this model.
    pub weight_bytes: Option<u64>,
    pub bits_per_weight: Option<f64>,
    pub total_bytes: Option<u64>,
    pub fits: bool,
    /// Why the format cannot hold this model (a row that is not whole blocks).
    pub impossible: Option<String>,
}

/// Each candidate `(precision, exact weight bytes)` at the query `q` (its batch and context),
/// against `budget` bytes (already less the headroom): sorted by bits per weight, most first,
/// impossible formats last. `Ok(None)` weight bytes: a dense precision, at its dtype. The best
/// format is the first that fits.
pub fn format_fits(
    cfg: &Config,
    q: &Query,
    c: Option<&Constants>,
    candidates: &[(Precision, std::result::Result<Option<u64>, String>)],
    budget: u64,
) -> Vec<FormatFit> {
    let params = cfg.param_count().max(1) as f64;
    let mut out: Vec<FormatFit> = candidates
        .iter()
        .map(|(p, w)| {
            let query = |w: &Option<u64>| Query {
                precision: *p,
                weight_bytes: *w,
                ..*q
            };
            // A format whose estimate overflows cannot hold the query either.
            let total = w.as_ref().map_err(Clone::clone).and_then(|w| {
                let e = estimate(cfg, &query(w), c).map_err(|e| e.to_string())?;
                let total = e.total().map_err(|e| e.to_string())?;
                Ok((e.weights, total))
            });
            match total {
                Ok((weights, total)) => FormatFit {
                    precision: *p,
                    weight_bytes: Some(weights),
                    bits_per_weight: Some(weights as f64 * 8.0 / params),
                    total_bytes: Some(total),
                    fits: total <= budget,
                    impossible: None,
                },
                Err(why) => FormatFit {
                    precision: *p,
                    weight_bytes: None,
                    bits_per_weight: None,
                    total_bytes: None,
                    fits: false,
                    impossible: Some(why),
                },
            }
        })
        .collect();
    out.sort_by(|a, b| {
        let bits = |f: &FormatFit| f.bits_per_weight.unwrap_or(-1.0);
        bits(b).total_cmp(&bits(a))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::gb_gib;

    fn q() -> Query {
        Query::default()
    }

    // The queries here are all representable: these unwrap the overflow checks.
    fn estimate(c: &Config, q: &Query, k: Option<&Constants>) -> Breakdown {
        super::estimate(c, q, k).unwrap()
    }
    fn infer_features(c: &Config, q: &Query) -> Features {
        super::infer_features(c, q).unwrap()
    }
    fn model_states(p: u64, t: u64, adapters: u64, q: &Query) -> Breakdown {
        super::model_states(p, t, adapters, q).unwrap()
    }
    #[allow(clippy::too_many_arguments)]
    fn layer_activations(
        c: &Config,
        batch: u64,
        seq: u64,
        act_bytes: u64,
        scores: bool,
        recompute: Recompute,
        tp: u64,
        sequence_parallel: bool,
    ) -> u64 {
        let l = super::layer_activations(
            c,
            batch,
            seq,
            act_bytes,
            scores,
            recompute,
            tp,
            sequence_parallel,
        );
        l.get().unwrap()
    }
    fn gpu_fit(c: &Config, q: &Query, gpu: &str, bytes: u64) -> GpuFit {
        super::gpu_fit(c, q, None, gpu, bytes, 0.1).unwrap()
    }

    /// The normalized config of a preset.
    fn preset(name: &str) -> Config {
        resolve(name).unwrap().config
    }

    /// `--best-format` on llama-3.1-8b at batch 1, context 4096 (f32 compute) and a 16 GB GPU
    /// with 10 % headroom (14.4 GB): f32 (32.1 GB of weights) does not fit, Q8_0 does, and
    /// its weights are, by hand, every matrix at 34 B per 32 weights and every vector in f32.
    #[test]
    fn best_format_is_the_most_bits_that_fit() {
        let cfg = preset("llama-3.1-8b");
        let q = Query {
            context: 4096,
            ..Query::default()
        };
        let candidates: Vec<_> = std::iter::once(Precision::F32)
            .chain(BEST_FORMATS)
            .map(|p| {
                let w = match p.quantized() {
                    Some(crate::vocab::Quantized::To(t)) => {
                        crate::model::gguf::plan_config(&cfg, t).map(|plan| {
                            Some(crate::model::gguf::plan_bytes(
                                &plan,
                                candle_core::DType::F32,
                            ))
                        })
                    }
                    _ => Ok(None),
                };
                (p, w)
            })
            .collect();
        // A budget of exactly Q8_0's total: f32 cannot fit it, Q8_0 just does.
        let unbounded = format_fits(&cfg, &q, None, &candidates, u64::MAX);
        let budget = unbounded[1].total_bytes.unwrap();
        let fits = format_fits(&cfg, &q, None, &candidates, budget);
        let order: Vec<Precision> = fits.iter().map(|f| f.precision).collect();
        use Precision::*;
        // Bits per weight as obtained: f32 32, Q8_0 8.5, Q6_K 6.56, Q5_K 5.5, Q4_1 5, Q4_K and
        // Q4_0 4.5 (a tie, kept in candidate order), plus the f32 norms.
        assert_eq!(order, [F32, Q8_0, Q6k, Q5k, Q4_1, Q4k, Q4_0]);
        let (mut matrices, mut vectors) = (0u64, 0u64);
        for (_, shape) in cfg.tensor_shapes() {
            let n: u64 = shape.iter().map(|&d| d as u64).product();
            if shape.len() == 2 {
                matrices += n;
            } else {
                vectors += n;
            }
        }
        let q8 = &fits[1];
        assert_eq!(q8.weight_bytes, Some(matrices / 32 * 34 + vectors * 4));
        assert!(!fits[0].fits && q8.fits, "{fits:?}");
        assert_eq!(fits.iter().find(|f| f.fits).unwrap().precision, Q8_0);
        // Fewer bits never cost more.
        for w in fits.windows(2) {
            assert!(w[0].total_bytes >= w[1].total_bytes, "{w:?}");
        }
        // The total is the estimate of the query at that format.
        let e = estimate(
            &cfg,
            &Query {
                precision: Q8_0,
                weight_bytes: q8.weight_bytes,
                ..q
            },
            None,
        );
        assert_eq!(q8.total_bytes, Some(e.total().unwrap()));
    }

    #[test]
    fn design_guide_example_13b_bf16() {
        // Llama-2-13B's published config.json (the design guide's "13B").
        let json = serde_json::json!({"model_type": "llama", "vocab_size": 32000,
            "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 40,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false});
        let m = Config::from_json(std::path::Path::new("llama-2-13b"), &json).unwrap();
        // Embedding and head 2 · 32000 · 5120; per layer q, k, v, o 4 · 5120², gate, up,
        // down 3 · 5120 · 13824 and two norms; the final norm.
        let params =
            2 * 32_000 * 5120 + 40 * (4 * 5120 * 5120 + 3 * 5120 * 13_824 + 2 * 5120) + 5120;
        assert_eq!(params, 13_015_864_320);
        assert_eq!(m.param_count(), params);
        let e = estimate(&m, &q(), None);
        assert_eq!(e.weights, 2 * params);
        assert_eq!(gb_gib(e.weights), "26.0 GB (24.2 GiB)");
    }

    #[test]
    fn llama31_8b_kv_per_token_bf16() {
        let m = preset("presets/llama-3.1-8b");
        // 2 (K,V) · 32 layers · 8 kv heads · 128 head_dim · 2 B
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(2 * 32 * 8 * 128 * 2));
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(131_072));
        let e = estimate(
            &m,
            &Query {
                batch: 2,
                context: 1000,
                ..q()
            },
            None,
        );
        assert_eq!(e.kv, 131_072 * 2 * 1000);
    }

    #[test]
    fn inference_features_by_hand() {
        // SmolLM2-135M: 30 layers, 3 kv heads of 64, hidden 576, vocab 49152.
        let m = preset("smollm2-135m");
        let qq = Query {
            batch: 3,
            context: 200,
            ..q()
        };
        let f = infer_features(&m, &qq);
        assert_eq!(f.weight_bytes, 134_515_008 * 2);
        assert_eq!(f.kv_bytes, 2 * 30 * 3 * 64 * 2 * 200 * 3);
        assert_eq!(f.act_bytes, 3 * 200 * 576 * 30 * 2);
        assert_eq!(f.logits_bytes, 3 * 49_152 * 2);
        assert_eq!(f.optimizer_bytes, 0);
        let growing = Query {
            kv_cache: KvKind::Growing,
            ..qq
        };
        assert_eq!(infer_features(&m, &growing), f);
    }

    #[test]
    fn sliding_window_caps_the_kv_cache() {
        // Mistral-7B-v0.1: sliding_window 4096; 2 (K,V) · 32 layers · 8 kv heads · 128 · 2 B.
        let m = preset("mistral-7b-v0.1");
        assert_eq!(m.sliding_window, Some(4096));
        let per_token = 2 * 32 * 8 * 128 * 2;
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(per_token));
        let at = |context, kv_window| Query {
            batch: 2,
            context,
            kv_window,
            ..q()
        };
        let kv = |qq: Query| estimate(&m, &qq, None).kv;
        assert_eq!(kv(at(8192, KvWindow::Model)), 4096 * per_token * 2);
        assert_eq!(kv(at(8192, KvWindow::Full)), 8192 * per_token * 2);
        assert_eq!(kv(at(32_768, KvWindow::Model)), 4096 * per_token * 2);
        // Within the window the two agree.
        assert_eq!(kv(at(1000, KvWindow::Model)), 1000 * per_token * 2);
        assert_eq!(kv(at(1000, KvWindow::Full)), 1000 * per_token * 2);
        // A model without a window ignores the option.
        let llama = preset("llama-3.1-8b");
        let full = estimate(&llama, &at(8192, KvWindow::Full), None).kv;
        assert_eq!(estimate(&llama, &at(8192, KvWindow::Model), None).kv, full);
        // A capped cache holds more sequences of 8192 tokens in the same budget.
        let g = |w| gpu_fit(&m, &at(8192, w), "h100-80", 80_000_000_000);
        let (capped, uncapped) = (g(KvWindow::Model), g(KvWindow::Full));
        let tokens = capped.kv_capacity_tokens.unwrap();
        assert_eq!(capped.max_concurrency.unwrap(), tokens as f64 / 4096.0);
        assert!(capped.max_concurrency > uncapped.max_concurrency);
        assert!(capped.largest_batch > uncapped.largest_batch);
    }

    #[test]
    fn zero_stages_divide_the_right_states() {
        // Llama-3.2-1B: 1,235,814,400 parameters (estimate::model's published counts).
        let m = preset("llama-3.2-1b");
        let p = 1_235_814_400;
        assert_eq!(m.param_count(), p);
        let base = Query {
            mode: Mode::Train,
            precision: Precision::MixedBf16,
            gpus: 4,
            ..q()
        };
        let at = |s: Sharding| {
            estimate(
                &m,
                &Query {
                    sharding: s,
                    ..base
                },
                None,
            )
        };
        let (d, z1, z2, z3) = (
            at(Sharding::Ddp),
            at(Sharding::Zero1),
            at(Sharding::Zero2),
            at(Sharding::Zero3),
        );
        // DDP, torch AMP: 4 (f32 weights) + 4 (grads) + 8 (m, v) = 16 B/param, plus the
        // 16-bit weight copies. ZeRO, DeepSpeed's layout: 2 (16-bit weights) + 2 (16-bit
        // grads) + K = 12 (f32 master, m, v) = 16 B/param. The count divides by 8 exactly.
        assert_eq!(p % 8, 0);
        assert_eq!((d.weights, d.gradients, d.optimizer), (4 * p, 4 * p, 8 * p));
        assert_eq!(d.weight_copies, 2 * p);
        assert_eq!(
            (z1.weights, z1.gradients, z1.optimizer),
            (2 * p, 2 * p, 3 * p)
        );
        assert_eq!(
            (z2.weights, z2.gradients, z2.optimizer),
            (2 * p, p / 2, 3 * p)
        );
        assert_eq!(
            (z3.weights, z3.gradients, z3.optimizer),
            (p / 2, p / 2, 3 * p)
        );
        assert_eq!(z1.weight_copies + z2.weight_copies + z3.weight_copies, 0);
        assert_eq!(at(Sharding::Fsdp), z3);
        assert_eq!(d.activations, z3.activations);
    }

    #[test]
    fn zero_paper_figure_1() {
        // ZeRO (arXiv:1910.02054) Figure 1: Ψ = 7.5B, K = 12, N_d = 64; per-device model
        // states (2 + 2 + K)Ψ = 120 GB, P_os 2Ψ + 2Ψ + KΨ/N_d, P_os+g 2Ψ + (2 + K)Ψ/N_d,
        // P_os+g+p (2 + 2 + K)Ψ/N_d.
        let psi: u64 = 7_500_000_000;
        let states = |sharding, gpus| {
            let q = Query {
                mode: Mode::Train,
                precision: Precision::MixedF16,
                sharding,
                gpus,
                ..q()
            };
            let b = model_states(psi, psi, 0, &q);
            b.weights + b.gradients + b.optimizer
        };
        assert_eq!(states(Sharding::Ddp, 1), 16 * psi);
        assert_eq!(states(Sharding::Zero1, 64), 4 * psi + 12 * psi / 64);
        assert_eq!(states(Sharding::Zero2, 64), 2 * psi + 14 * psi / 64);
        assert_eq!(states(Sharding::Zero3, 64), 16 * psi / 64);
        assert_eq!(states(Sharding::Zero3, 64), 1_875_000_000);
    }

    #[test]
    fn korthikanti_table_2() {
        // Korthikanti et al. (arXiv:2205.05198) Table 2 with GPT-3 175B's h = 12288, a = 96,
        // s = 2048, b = 1, t = 8, at 16 bits.
        let m = gpt3_175b();
        let (s, b, h, a, t) = (2048u64, 1u64, 12288u64, 96u64, 8u64);
        let sbh = s * b * h;
        let l = |scores, r, tp, sp| layer_activations(&m, b, s, 2, scores, r, tp, sp);
        assert_eq!(
            l(true, Recompute::None, 1, false),
            sbh * 34 + 5 * a * s * s * b
        );
        assert_eq!(
            l(true, Recompute::None, t, false),
            sbh * 10 + sbh * 24 / t + 5 * a * s * s * b / t
        );
        assert_eq!(
            l(true, Recompute::None, t, true),
            sbh * 34 / t + 5 * a * s * s * b / t
        );
        assert_eq!(
            l(true, Recompute::Selective, t, false),
            sbh * 10 + sbh * 24 / t
        );
        assert_eq!(l(true, Recompute::Selective, t, true), sbh * 34 / t);
        assert_eq!(l(true, Recompute::Full, 1, false), 2 * sbh);
        // Flash attention keeps no scores: the selective figure.
        assert_eq!(
            l(false, Recompute::None, 1, false),
            l(true, Recompute::Selective, 1, false)
        );
        // f32 activations: twice the bytes.
        assert_eq!(
            layer_activations(&m, b, s, 4, true, Recompute::None, 1, false),
            2 * l(true, Recompute::None, 1, false)
        );
    }

    /// GPT-3 175B's shapes (Brown et al. 2020, Table 2.1) as a GPT-2 config.
    fn gpt3_175b() -> Config {
        let json = serde_json::json!({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 12288,
            "n_layer": 96, "n_head": 96, "n_positions": 2048});
        Config::from_json(std::path::Path::new("gpt3-175b"), &json).unwrap()
    }

    #[test]
    fn lora_and_frozen_embeddings_shrink_the_training_states() {
        let m = preset("llama-3.1-8b");
        // Per layer and rank: q (4096 → 4096) and v (4096 → 1024), A and B each.
        assert_eq!(
            feat::adapter_params(&m, Trainable::Lora(1)),
            Ok(32 * ((4096 + 4096) + (4096 + 1024)))
        );
        let lora = Query {
            mode: Mode::Train,
            precision: Precision::Bf16,
            trainable: Trainable::Lora(16),
            ..q()
        };
        let e = estimate(&m, &lora, None);
        // PEFT prints "trainable params: 6,815,744" for this configuration.
        let adapters = 6_815_744;
        assert_eq!(e.gradients, adapters * 2);
        assert_eq!(e.optimizer, adapters * 4);
        let params = m.param_count();
        assert_eq!(e.weights, (params + adapters) * 2);
        let frozen = estimate(
            &m,
            &Query {
                trainable: Trainable::FrozenEmbeddings,
                ..lora
            },
            None,
        );
        // Llama-3.1-8B's input embedding (128256 × 4096) is untied from its head.
        assert_eq!(
            feat::trainable_params(&m, Trainable::FrozenEmbeddings),
            Ok(params - 128_256 * 4096)
        );
        assert_eq!(frozen.gradients, (params - 128_256 * 4096) * 2);
        assert_eq!(frozen.weights, params * 2);
    }

    /// QLoRA, analytically: llama-3.1-8b's base at Q4_K's block bytes (every matrix 144 B
    /// per 256 weights, every vector in the f32 compute dtype), rank-16 adapters on q and v
    /// (6,815,744 parameters, PEFT's figure) in f32 with their f32 gradients and AdamW's two
    /// f32 moments; bf16 compute halves the adapters' bytes, not the base's blocks' share.
    #[test]
    fn qlora_base_at_block_bytes_adapters_in_the_compute_dtype() {
        let m = preset("llama-3.1-8b");
        let (mut matrices, mut vectors) = (0u64, 0u64);
        for (_, shape) in m.tensor_shapes() {
            let n: u64 = shape.iter().map(|&d| d as u64).product();
            if shape.len() == 2 {
                matrices += n;
            } else {
                vectors += n;
            }
        }
        let adapters = 6_815_744;
        for (compute, cb) in [(Compute::F32, 4), (Compute::Bf16, 2)] {
            let base = matrices / 256 * 144 + vectors * cb;
            let plan = crate::model::gguf::plan_config(&m, candle_core::quantized::GgmlDType::Q4K)
                .unwrap();
            let dtype = Precision::Q4k.dtypes(compute).1;
            assert_eq!(crate::model::gguf::plan_bytes(&plan, dtype), base);
            let e = estimate(
                &m,
                &Query {
                    mode: Mode::Train,
                    precision: Precision::Q4k,
                    compute,
                    weight_bytes: Some(base),
                    trainable: Trainable::Lora(16),
                    optimizer: Optimizer::Adamw,
                    ..q()
                },
                None,
            );
            assert_eq!(e.weights, base + adapters * cb, "{compute}");
            assert_eq!(e.gradients, adapters * cb, "{compute}");
            assert_eq!(e.optimizer, 2 * adapters * cb, "{compute}");
            assert_eq!(e.weight_copies, 0);
        }
    }

    #[test]
    fn korthikanti_activations() {
        let m = preset("llama-3.1-8b");
        let t = Query {
            mode: Mode::Train,
            batch: 2,
            context: 1024,
            ..q()
        };
        // 16-bit, flash: L · 34 · s · b · h
        assert_eq!(
            estimate(&m, &t, None).activations,
            32 * 34 * 1024 * 2 * 4096
        );
        let eager = Query {
            attention: Attention::Eager,
            ..t
        };
        let per_layer = 34 * 1024 * 2 * 4096 + 5 * 32 * 1024 * 1024 * 2;
        assert_eq!(estimate(&m, &eager, None).activations, 32 * per_layer);
        let ck = Query {
            checkpointing: Checkpointing::Layer,
            ..t
        };
        assert_eq!(
            estimate(&m, &ck, None).activations,
            32 * 1024 * 2 * 4096 * 2 + 34 * 1024 * 2 * 4096
        );
    }

    #[test]
    fn catalog_and_search() {
        assert_eq!(smallest_gpu(20_000_000_000, 0.1).unwrap().gb, 24);
        assert_eq!(smallest_gpu(22_000_000_000, 0.1).unwrap().gb, 32);
        assert!(smallest_gpu(190_000_000_000, 0.1).is_none());
        assert_eq!(gpu_by_name("H100-80").unwrap().1, 80_000_000_000);
        assert_eq!(gpu_by_name("48gb").unwrap().1, 48_000_000_000);
        assert!(gpu_by_name("toaster").is_none());
        assert!(gpu_by_name("18446744074gb").is_none());
        assert_eq!(largest(1000, |x| x * x <= 2000), 44);
        assert_eq!(largest(1000, |_| false), 0);
        assert_eq!(largest(1000, |_| true), 1000);
    }

    #[test]
    fn largest_batch_is_the_last_that_fits() {
        let m = preset("llama-3.1-8b");
        let g = gpu_fit(&m, &q(), "h100-80", 80_000_000_000);
        let total = |b: u64| {
            estimate(&m, &Query { batch: b, ..q() }, None)
                .total()
                .unwrap()
        };
        assert!(total(g.largest_batch) <= g.budget_bytes);
        assert!(total(g.largest_batch + 1) > g.budget_bytes);
        let tokens = g.kv_capacity_tokens.unwrap();
        assert!(tokens >= g.largest_batch * 4096);
    }

    /// Constants with absurd coefficients (KV 0, weights 0.1, a huge constant) for the llama
    /// inference `total` group and the three AdamW training phases.
    fn wild_constants() -> Constants {
        let mut group = Vec::new();
        let key = |mode, kv_cache, train, phase| GroupKey {
            architecture: "llama".into(),
            backend: Backend::Cuda,
            precision: Precision::Bf16,
            mode,
            kv_cache,
            train,
            ops: Ops::default(),
            phase,
        };
        let mut keys = vec![key(
            Mode::Infer,
            Some(KvKind::Preallocated),
            None,
            Phase::Total,
        )];
        let adamw = TrainGroup {
            optimizer: Optimizer::AdamwForeach,
            checkpointing: Checkpointing::None,
            trainable: crate::vocab::TrainableKind::Full,
            first_step: false,
        };
        for ph in fit::STEP_PHASES {
            keys.push(key(Mode::Train, None, Some(adamw), ph));
        }
        for k in keys {
            let coef = [
                ("const", 3e9),
                ("weight", 0.1),
                ("kv", 0.0),
                ("act", 9.0),
                ("logits", 5.0),
                ("attn", 1.0),
                ("optimizer", 0.0),
                ("grad", 0.0),
            ]
            .into_iter()
            .map(|(t, v)| (t.to_string(), v))
            .collect();
            group.push(fit::GroupFit {
                key: k,
                target: Target::PeakAllocated,
                rows: 9,
                points: 9,
                r2: 1.0,
                conservative: false,
                model: fit::Model {
                    coef,
                    ..Default::default()
                },
                kfold: None,
                loco: None,
            });
        }
        Constants {
            schema: fit::CONSTANTS_SCHEMA,
            vramlab_version: "test".into(),
            runtime: Runtime::Torch,
            backend: Backend::Cuda,
            device: "test".into(),
            models: vec![],
            fit_error: None,
            terms: fit::TERMS.iter().map(|t| t.to_string()).collect(),
            sources: vec![],
            group,
            generation: vec![],
            reserve: vec![],
        }
    }

    #[test]
    fn constants_never_change_the_exact_rows() {
        let m = preset("llama-3.1-8b");
        let c = wild_constants();
        let infer = Query {
            batch: 3,
            context: 2048,
            ..q()
        };
        let train = Query {
            mode: Mode::Train,
            batch: 2,
            context: 1024,
            ..q()
        };
        for query in [infer, train] {
            let (a, f) = (estimate(&m, &query, None), estimate(&m, &query, Some(&c)));
            assert!(f.source.starts_with("fitted"), "{}", f.source);
            assert_eq!(
                (a.weights, a.kv, a.gradients, a.optimizer, a.weight_copies),
                (f.weights, f.kv, f.gradients, f.optimizer, f.weight_copies)
            );
            // The fitted constant does answer the uncertain row.
            assert_eq!(f.runtime_constant, 3_000_000_000);
        }
        // Llama-3.1-8B at 2048 tokens × 3: 2 (K,V) · 32 layers · 8 kv heads · 128 · 2 B per token.
        assert_eq!(
            estimate(&m, &infer, Some(&c)).kv,
            2 * 32 * 8 * 128 * 2 * 2048 * 3
        );
    }

    #[test]
    fn a_training_peak_is_the_larger_of_backward_and_optimizer_step() {
        let m = preset("llama-3.1-8b");
        let t = Query {
            mode: Mode::Train,
            precision: Precision::MixedBf16,
            batch: 1,
            context: 128,
            ..q()
        };
        let at = |runtime, optimizer_impl| {
            estimate(
                &m,
                &Query {
                    runtime,
                    optimizer_impl,
                    ..t
                },
                None,
            )
        };
        let fused = at(Runtime::Torch, OptimizerImpl::Fused);
        let backward = fused.activations + fused.logits;
        assert_eq!(fused.step_transient, 0);
        // foreach: `_foreach_sqrt(v)` over every f32 parameter at once.
        let foreach = at(Runtime::Torch, OptimizerImpl::Foreach);
        let params = m.param_count();
        assert_eq!(
            foreach.step_transient,
            (params * 4).saturating_sub(backward)
        );
        let states =
            |e: &Breakdown| e.allocated().unwrap() - e.activations - e.logits - e.step_transient;
        assert_eq!(states(&foreach), states(&fused));
        assert_eq!(
            foreach.allocated().unwrap() - states(&foreach),
            backward.max(params * 4)
        );
        // candle-nn: ≈ 14 × the largest tensor (the 128256 × 4096 embedding, f32), over
        // candle's own backward (no autocast: all activations in the compute dtype).
        let candle = at(Runtime::Candle, OptimizerImpl::Foreach);
        assert!(candle.activations < fused.activations);
        assert_eq!(
            candle.step_transient,
            (14 * 128_256 * 4096 * 4u64).saturating_sub(candle.activations + candle.logits)
        );
        // At a long context the backward dominates and the step adds nothing.
        let long = estimate(
            &m,
            &Query {
                context: 65_536,
                ..t
            },
            None,
        );
        assert_eq!(long.step_transient, 0);
    }

    /// A query whose figures exceed 2^64 B is an overflow naming the figure, in every build
    /// profile (the arithmetic is checked, never wrapped or saturated); the searches treat an
    /// overflowing candidate as one that does not fit.
    #[test]
    fn figures_past_64_bits_are_an_overflow() {
        let m = preset("llama-3.1-8b");
        let huge = Query {
            batch: u64::MAX,
            ..q()
        };
        let e = super::estimate(&m, &huge, None).unwrap_err();
        assert_eq!(e.figure, "KV cache");
        assert!(!fits_in(&m, &huge, None, u64::MAX));
        let train = Query {
            mode: Mode::Train,
            context: u64::MAX,
            ..q()
        };
        assert_eq!(
            super::estimate(&m, &train, None).unwrap_err().figure,
            "activations"
        );
        // Every row fits, their sum does not.
        let rows = Breakdown {
            weights: u64::MAX - 1,
            kv: 2,
            ..Default::default()
        };
        assert_eq!(rows.total().unwrap_err().figure, "total");
        // Fitted coefficients past 2^64 B overflow instead of saturating.
        let mut c = wild_constants();
        for g in &mut c.group {
            g.model.coef.insert("const".into(), 1e30);
        }
        let e = super::estimate(&m, &q(), Some(&c)).unwrap_err();
        assert_eq!(e.figure, "runtime constant");
        // A representable query whose searches reach past 2^64 B: those candidates do not fit.
        let wide = Query {
            batch: 1 << 30,
            ..q()
        };
        let g = super::gpu_fit(&m, &wide, None, "h100-80", 80_000_000_000, 0.1).unwrap();
        assert!(!g.fits);
        assert_eq!((g.largest_context, g.kv_capacity_tokens), (0, Some(0)));
    }
}
