//! The serving estimate in vLLM's own terms (issue 43): what vLLM 0.33's engine startup prints
//! for a dense decoder on one GPU, from the config and the card.
//!
//! vLLM sizes its KV cache at startup (`v1/worker/gpu_worker.py`,
//! `determine_available_memory`): it requests `ceil(total × gpu_memory_utilization)` bytes,
//! runs a profile forward of `max_num_batched_tokens` tokens and a sampler pass over
//! `max_num_seqs` rows, and gives the KV cache what the request leaves after the weights, the
//! buffers that stay (`consumed`) and the profile's transient peak (`peak activation`). The
//! terms, each named as vLLM's worker line names it:
//! - **weights**: every parameter at the checkpoint dtype, the vocabulary padded to 64 rows
//!   (exact; vLLM fuses q/k/v and gate/up); and the caching allocator's rounding of their
//!   blocks (exact by PyTorch's rule);
//! - **sampler state**: the penalties' `output_bin_counts` (`max_num_seqs` × vocab, int32) and
//!   `prompt_bin_mask` (`max_num_seqs` × ⌈vocab / 32⌉, int32), `v1/worker/gpu/sample/penalties.py`
//!   (exact);
//! - **rotary cache**: the cos/sin cache of every position, one for all layers
//!   (`rotary_embedding/base.py`, `cos_sin_cache`: `max_position_embeddings` × the rotary
//!   width, in the model's dtype; `get_rope` shares it) (exact);
//! - **other buffers**: the model runner's input buffers and per-request sampling buffers:
//!   [`Fitted::other_fixed`] and [`Fitted::other_per_seq`], fitted;
//! - **activation peak**: the larger of the forward's and the sampler's. The forward (attention
//!   skipped in the profile run) peaks in the MLP with the hidden state and the residual, the
//!   fused gate/up output and SiLU-and-mul's output live: N·e·(2h + 3I). The sampler holds the
//!   last hidden states (N·h·e), the logits (S·V·e) and their f32 copy (S·V·4);
//! - **CUDA graphs** (unless eager): vLLM's estimate of their memory, subtracted before the KV
//!   cache is sized: the captures and 1 MiB a FULL graph beyond the first exact, the capture
//!   pool fitted ([`super::cudagraphs`]).
//!
//! Then, as `v1/core/kv_cache_planning.py` and `kv_cache_utils.py` count: blocks of 16 tokens
//! over every layer's K and V, `blocks = available // (16 × bytes per token)`, KV tokens
//! `int(blocks / ⌈L / 16⌉ × L)` and maximum concurrency `blocks / ⌈L / 16⌉` at
//! `max_model_len` L. A request of L tokens needs ⌈L / 16⌉ blocks; where they do not fit,
//! vLLM refuses to start and names the largest length that does.
use super::cudagraphs::{self, Captures, GRAPH_FEATURES};
use crate::gpu::Gpu;
use crate::model::Config;
use serde::Serialize;

/// vLLM's KV block size (tokens), the CUDA default of `cache_config.block_size`.
pub const BLOCK_TOKENS: u64 = 16;

/// The serving estimate's fitted terms, bytes: what vLLM's startup leaves that no rule of its
/// code gives in closed form. `vramlab fit --vllm STARTUPS.tsv` fits them on emulated vLLM
/// startups and reports each model's error held out ([`super::serving_fit`]); [`FITTED`] is
/// its answer on the committed corpus (`results/emulated/vllm-0.33-startups.tsv`,
/// `scripts/vllm-serving-grid.sh`), which a test re-derives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Fitted {
    /// The model runner's input buffers and per-request sampling buffers that stay allocated
    /// beside the weights, the rotary cache and the sampler state after the profile run: this
    /// much, plus [`Fitted::other_per_seq`] per `max_num_seqs`.
    pub other_fixed: u64,
    /// See [`Fitted::other_fixed`].
    pub other_per_seq: u64,
    /// The pool of vLLM's profiling capture of its CUDA graphs: bytes per unit of each term of
    /// [`cudagraphs::features`].
    pub graph_pool: [f64; GRAPH_FEATURES],
}

/// The fitted terms of vLLM 0.33 on the emulated GPU (`vramlab fit --vllm
/// results/emulated/vllm-0.33-startups.tsv`; docs/src/guides/serving.md).
pub const FITTED: Fitted = Fitted {
    other_fixed: 83188583,
    other_per_seq: 74708,
    graph_pool: [
        47108266.69129563,
        4.335037890500922,
        3.369274235415941,
        40347701.72232903,
        0.0,
        3.57011262422968,
    ],
};

/// A serving query: the model's settings as `vllm serve` takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct ServingQuery {
    /// `--gpu-memory-utilization`.
    pub utilization: f64,
    /// `--max-model-len` (tokens).
    pub max_model_len: u64,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u64,
    /// `--max-num-seqs`.
    pub max_num_seqs: u64,
    /// The weights' bytes per element (the checkpoint's dtype).
    pub weight_bytes: u64,
    /// The KV cache's bytes per element (`--kv-cache-dtype`: auto = the weights', fp8 = 1).
    pub kv_bytes: u64,
    /// `--tensor-parallel-size`: the ranks, one GPU each (1 unless [`ServingQuery::on_ranks`]).
    pub tensor_parallel: u64,
    /// Whether vLLM captures CUDA graphs (its default; `--enforce-eager` turns them off).
    pub cuda_graphs: bool,
}

impl ServingQuery {
    /// A query from `vllm serve`'s settings, checked: the utilization in (0, 1], the lengths
    /// and the sequence count at least 1 and within what any GPU could hold (beyond
    /// [`crate::estimate::MAX_CONTEXT`] tokens or [`crate::estimate::MAX_BATCH`] sequences no
    /// card holds a step, and the byte products stay in 64 bits). The error names the
    /// `vllm serve` flag. The one constructor of `estimate --runtime vllm` and of `validate`'s
    /// vLLM rows.
    pub fn new(
        utilization: f64,
        (max_model_len, max_num_batched_tokens, max_num_seqs): (u64, u64, u64),
        weight_bytes: u64,
        kv_bytes: u64,
    ) -> Result<ServingQuery, String> {
        if !(utilization > 0.0 && utilization <= 1.0) {
            return Err(format!(
                "--gpu-memory-utilization must be in (0, 1], got {utilization}"
            ));
        }
        use crate::estimate::{MAX_BATCH, MAX_CONTEXT};
        for (flag, value, max) in [
            ("--max-model-len", max_model_len, MAX_CONTEXT),
            (
                "--max-num-batched-tokens",
                max_num_batched_tokens,
                MAX_CONTEXT,
            ),
            ("--max-num-seqs", max_num_seqs, MAX_BATCH),
        ] {
            if value == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
            if value > max {
                return Err(format!("{flag} {value} is larger than {max}"));
            }
        }
        Ok(ServingQuery {
            utilization,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            weight_bytes,
            kv_bytes,
            tensor_parallel: 1,
            cuda_graphs: true,
        })
    }

    /// The query with CUDA graphs (`vllm serve`'s default) or eager (`--enforce-eager`).
    pub fn eager(self, enforce_eager: bool) -> ServingQuery {
        ServingQuery {
            cuda_graphs: !enforce_eager,
            ..self
        }
    }

    /// The query on `tp` tensor-parallel ranks of `cfg`, checked as vLLM checks the model's
    /// shapes against `--tensor-parallel-size` ([`Shards::of`]); the error is one line.
    pub fn on_ranks(self, cfg: &Config, tp: u64) -> Result<ServingQuery, String> {
        Shards::of(cfg, tp)?;
        Ok(ServingQuery {
            tensor_parallel: tp,
            ..self
        })
    }
}

/// The most tensor-parallel ranks a query may name (vLLM's largest NVLink domains are 72 GPUs).
pub const MAX_TENSOR_PARALLEL: u64 = 1024;

/// What one tensor-parallel rank of vLLM holds of a dense decoder's layers
/// (`model_executor/layers/linear.py`, `vocab_parallel_embedding.py`): the query heads, the
/// gated MLP's intermediate width and the vocabulary's padded rows split evenly; the KV heads
/// split too, or, with more ranks than KV heads, replicated so that each rank holds one
/// (`QKVParallelLinear`'s `num_kv_head_replicas`). Norms are whole on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shards {
    pub ranks: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub intermediate: u64,
    /// The embedding's (and an untied head's) rows: the vocabulary padded to
    /// [`VOCAB_PADDING`], over the ranks.
    pub vocab_rows: u64,
}

impl Shards {
    /// A rank's shards of `cfg` over `tp` ranks, or vLLM's refusal: the heads (and the KV heads,
    /// or the ranks by them), the intermediate width and the padded vocabulary must divide.
    pub fn of(cfg: &Config, tp: u64) -> Result<Shards, String> {
        if tp == 0 || tp > MAX_TENSOR_PARALLEL {
            return Err(format!(
                "--tensor-parallel-size must be in 1..={MAX_TENSOR_PARALLEL}, got {tp}"
            ));
        }
        let (heads, kv, inter) = (
            cfg.num_heads as u64,
            cfg.num_kv_heads as u64,
            cfg.intermediate_size as u64,
        );
        let vocab = (cfg.vocab_size as u64).div_ceil(VOCAB_PADDING) * VOCAB_PADDING;
        let kv_splits = if tp >= kv {
            tp.is_multiple_of(kv)
        } else {
            kv.is_multiple_of(tp)
        };
        let why = if !heads.is_multiple_of(tp) {
            Some(format!("its {heads} attention heads"))
        } else if !kv_splits {
            Some(format!("its {kv} KV heads (nor are they a divisor of it)"))
        } else if !inter.is_multiple_of(tp) {
            Some(format!("its intermediate size {inter}"))
        } else if !vocab.is_multiple_of(tp) {
            Some(format!("its vocabulary padded to {vocab} rows"))
        } else {
            None
        };
        if let Some(what) = why {
            return Err(format!(
                "--tensor-parallel-size {tp} does not divide {what}, as vLLM requires"
            ));
        }
        Ok(Shards {
            ranks: tp,
            q_heads: heads / tp,
            kv_heads: (kv / tp).max(1),
            intermediate: inter / tp,
            vocab_rows: vocab / tp,
        })
    }
}

/// The bytes per element vLLM loads a dense checkpoint's weights in (bf16, f16 or f32), or
/// `None` for a precision it does not serve this way.
pub fn weight_bytes(p: crate::vocab::Precision) -> Option<u64> {
    use crate::vocab::Precision;
    match p {
        Precision::Bf16 | Precision::F16 => Some(2),
        Precision::F32 => Some(4),
        _ => None,
    }
}

/// The KV cache's bytes per element under `--kv-cache-dtype` (auto: the weights').
pub fn kv_bytes(d: crate::vocab::KvCacheDtype, weight_bytes: u64) -> u64 {
    match d {
        crate::vocab::KvCacheDtype::Auto => weight_bytes,
        crate::vocab::KvCacheDtype::Fp8 => 1,
    }
}

/// vLLM 0.33's `vllm serve` defaults for a GPU (`engine/arg_utils.py`,
/// `_set_default_max_num_seqs_and_batched_tokens_args`): (max_num_batched_tokens,
/// max_num_seqs). 160 GiB or more: 16,384 and 1,024; 70 GiB or more and not an A100: 8,192 and
/// 1,024; else 2,048 and 256.
pub fn serve_defaults(gpu: &Gpu) -> (u64, u64) {
    const GIB: u64 = 1 << 30;
    let a100 = gpu.name.to_lowercase().contains("a100");
    if gpu.total_bytes >= 160 * GIB {
        (16_384, 1_024)
    } else if gpu.total_bytes >= 70 * GIB && !a100 {
        (8_192, 1_024)
    } else {
        (2_048, 256)
    }
}

/// vLLM's startup figures for a query, in bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Serving {
    /// `ceil(total × gpu_memory_utilization)`.
    pub requested_bytes: u64,
    pub weights_bytes: u64,
    /// PyTorch's caching allocator's rounding of the weights' blocks (segments of 10 MiB and
    /// more round up to 2 MiB).
    pub weights_rounding_bytes: u64,
    /// The rotary cos/sin cache: `max_position_embeddings` × head_dim in the weights' dtype,
    /// whole on every rank.
    pub rotary_cache_bytes: u64,
    pub sampler_state_bytes: u64,
    pub other_buffers_bytes: u64,
    pub activation_peak_bytes: u64,
    /// "Estimated CUDA graph memory", which vLLM subtracts before sizing the KV cache (0 when
    /// eager): the fitted pool of its profiling capture and 1 MiB a FULL graph beyond the first
    /// ([`super::cudagraphs`]).
    pub cuda_graph_bytes: u64,
    /// The CUDA graphs vLLM captures: PIECEWISE at every size, FULL up to `max_num_seqs`
    /// (none when eager).
    pub cuda_graphs: Option<Captures>,
    /// Everything but the KV cache: weights and their rounding, the rotary cache, sampler
    /// state, other buffers, activation peak, CUDA graphs.
    pub non_kv_bytes: u64,
    /// What vLLM gives the KV cache (negative: the rest does not fit the request).
    pub available_kv_bytes: i64,
    /// K and V of every layer, one token.
    pub kv_bytes_per_token: u64,
    pub kv_blocks: u64,
    /// "GPU KV cache size: N tokens".
    pub kv_tokens: u64,
    /// "Maximum concurrency for L tokens per request".
    pub max_concurrency: f64,
    pub max_model_len: u64,
    pub max_num_batched_tokens: u64,
    pub max_num_seqs: u64,
    /// The tensor-parallel ranks: every figure above is one rank's (the KV tokens and the
    /// concurrency are the engine's, which each rank's cache holds its heads of).
    pub tensor_parallel: u64,
    /// Whether one request of `max_model_len` fits (vLLM starts).
    pub fits: bool,
    /// The largest `max_model_len` whose one request fits: whole blocks of what the KV cache
    /// holds (vLLM's estimate where it refuses, which searches up to `max_model_len` only).
    pub max_model_len_fits: u64,
}

/// vLLM's vocabulary padding (`DEFAULT_VOCAB_PADDING_SIZE`, `vocab_parallel_embedding.py`):
/// the embedding's and the head's rows round up to a multiple of 64.
pub const VOCAB_PADDING: u64 = 64;

/// The elements of each weight tensor one rank of vLLM allocates for a dense decoder
/// ([`Shards`]; on one GPU, the whole model): the embedding and an untied head (rows padded to
/// [`VOCAB_PADDING`]), and per layer the fused q/k/v (and its bias), o, the fused gate/up,
/// down, the two norms (and Qwen3's q/k norms), then the final norm.
pub fn vllm_weight_tensors(cfg: &Config, s: &Shards) -> Vec<u64> {
    let h = cfg.hidden_size as u64;
    let hd = cfg.head_dim as u64;
    let (q, kv) = (s.q_heads * hd, s.kv_heads * hd);
    let inter = s.intermediate;
    let vocab = s.vocab_rows;
    let mut t = vec![vocab * h];
    if !cfg.tie_word_embeddings {
        t.push(vocab * h);
    }
    for _ in 0..cfg.num_layers {
        t.extend([(q + 2 * kv) * h, h * q, 2 * inter * h, h * inter, h, h]);
        if cfg.qkv_bias {
            t.push(q + 2 * kv);
        }
        if cfg.qk_norm {
            t.extend([cfg.head_dim as u64; 2]);
        }
    }
    t.push(h);
    t
}

/// What PyTorch's caching allocator reserves beyond a block of `bytes`: a request of 10 MiB or
/// more (`kMinLargeAlloc`) gets a segment of its own, rounded up to 2 MiB (`kRoundLarge`);
/// smaller ones share segments (none counted here).
pub fn large_block_waste(bytes: u64) -> u64 {
    const ROUND: u64 = 2 << 20;
    if bytes >= 10 << 20 {
        bytes.div_ceil(ROUND) * ROUND - bytes
    } else {
        0
    }
}

/// Why a model has no serving estimate yet: one line.
pub fn unsupported(cfg: &Config) -> Option<String> {
    let arch = cfg.architecture.name();
    let llama_like = !cfg.learned_positions
        && cfg.hidden_act == crate::model::config::HiddenAct::Silu
        && cfg.gemma.is_none()
        && cfg.llama4.is_none()
        && cfg.vision.is_none()
        && !cfg.attention_sinks;
    if cfg.moe.is_some() {
        return Some(format!(
            "{arch}: vLLM's fused MoE workspace is not modelled yet (dense decoders only)"
        ));
    }
    if cfg.mla.is_some() {
        return Some(format!(
            "{arch}: MLA's latent cache in vLLM is not modelled yet"
        ));
    }
    if (0..cfg.num_layers).any(|i| cfg.layer_span(i).is_some()) {
        return Some(format!(
            "{arch}: sliding-window or chunked layers (vLLM's hybrid KV cache groups) are not \
             modelled yet"
        ));
    }
    if cfg.architecture.role() == crate::model::arch::Role::Encoder {
        return Some(format!("{arch} is an encoder: vLLM serves decoders"));
    }
    if !llama_like {
        return Some(format!(
            "{arch}: only the llama family's decoders (rotary positions, gated SiLU MLP) are \
             modelled yet"
        ));
    }
    None
}

/// vLLM's startup figures for `cfg` on `gpu` under `q`: one rank's, each rank on a `gpu` of
/// its own (all ranks hold the same, and vLLM sizes every rank's cache by the smallest).
/// A rank's forward holds the hidden state and the residual whole and its shard of the MLP;
/// the sampler gathers the whole vocabulary's logits on every rank.
pub fn serving(cfg: &Config, gpu: &Gpu, q: &ServingQuery) -> Serving {
    serving_with(cfg, gpu, q, &FITTED)
}

/// [`serving`] with the fitted terms `fitted` (what `vramlab fit --vllm` tries).
pub fn serving_with(cfg: &Config, gpu: &Gpu, q: &ServingQuery, fitted: &Fitted) -> Serving {
    let shards = Shards::of(cfg, q.tensor_parallel).expect("a query's ranks are checked");
    let (h, inter, vocab) = (
        cfg.hidden_size as u64,
        shards.intermediate,
        cfg.vocab_size as u64,
    );
    let (n, s, e) = (q.max_num_batched_tokens, q.max_num_seqs, q.weight_bytes);
    let requested = (gpu.total_bytes as f64 * q.utilization).ceil() as u64;
    let tensors = vllm_weight_tensors(cfg, &shards);
    let weights = tensors.iter().sum::<u64>() * e;
    let rounding = tensors
        .iter()
        .map(|&n| large_block_waste(n * e))
        .sum::<u64>();
    let rotary = cfg.max_position_embeddings as u64 * cfg.head_dim as u64 * e;
    let sampler_state = s * vocab * 4 + s * vocab.div_ceil(32) * 4;
    let forward = n * e * (2 * h + 3 * inter);
    let sampler = n * h * e + s * vocab * (e + 4);
    let activation = forward.max(sampler);
    let other = fitted.other_fixed + fitted.other_per_seq * s;
    let captures = q.cuda_graphs.then(|| cudagraphs::captures(gpu, n, s));
    let graph_bytes = captures.as_ref().map_or(0, |c| {
        cudagraphs::estimate(c, &fitted.graph_pool, &graph_features(cfg, gpu, c, e))
    });
    let non_kv = weights + rounding + rotary + sampler_state + other + activation + graph_bytes;
    let available = requested as i64 - non_kv as i64;
    let per_token = 2 * cfg.num_layers as u64 * shards.kv_heads * cfg.head_dim as u64 * q.kv_bytes;
    let block = BLOCK_TOKENS * per_token;
    let blocks = u64::try_from(available).map_or(0, |a| a / block);
    let per_request = q.max_model_len.div_ceil(BLOCK_TOKENS);
    let concurrency = blocks as f64 / per_request as f64;
    Serving {
        requested_bytes: requested,
        weights_bytes: weights,
        weights_rounding_bytes: rounding,
        rotary_cache_bytes: rotary,
        sampler_state_bytes: sampler_state,
        other_buffers_bytes: other,
        activation_peak_bytes: activation,
        cuda_graph_bytes: graph_bytes,
        cuda_graphs: captures,
        non_kv_bytes: non_kv,
        available_kv_bytes: available,
        kv_bytes_per_token: per_token,
        kv_blocks: blocks,
        kv_tokens: (concurrency * q.max_model_len as f64) as u64,
        max_concurrency: concurrency,
        max_model_len: q.max_model_len,
        max_num_batched_tokens: n,
        max_num_seqs: s,
        tensor_parallel: q.tensor_parallel,
        fits: available > 0 && blocks >= per_request,
        max_model_len_fits: blocks * BLOCK_TOKENS,
    }
}

/// The fitted graph pool's terms for `cfg`'s captures `c` on `gpu` at `e` bytes an element.
pub fn graph_features(cfg: &Config, gpu: &Gpu, c: &Captures, e: u64) -> [f64; GRAPH_FEATURES] {
    cudagraphs::features(gpu, c, cfg.hidden_size as u64, e)
}

#[cfg(test)]
mod tests {
    use super::ServingQuery;
    use crate::estimate::{MAX_BATCH, MAX_CONTEXT};

    #[test]
    fn a_query_is_checked_where_it_is_made() {
        let q = |u: f64, lens: (u64, u64, u64)| ServingQuery::new(u, lens, 2, 2);
        let ok = q(0.9, (4096, 2048, 256)).unwrap();
        assert_eq!(
            (ok.max_model_len, ok.max_num_batched_tokens, ok.max_num_seqs),
            (4096, 2048, 256)
        );
        assert!(q(1.0, (MAX_CONTEXT, MAX_CONTEXT, MAX_BATCH)).is_ok());
        for (u, lens, needle) in [
            (
                0.0,
                (1, 1, 1),
                "--gpu-memory-utilization must be in (0, 1], got 0",
            ),
            (1.5, (1, 1, 1), "--gpu-memory-utilization"),
            (f64::NAN, (1, 1, 1), "--gpu-memory-utilization"),
            (0.9, (0, 1, 1), "--max-model-len must be at least 1"),
            (
                0.9,
                (1, 0, 1),
                "--max-num-batched-tokens must be at least 1",
            ),
            (0.9, (1, 1, 0), "--max-num-seqs must be at least 1"),
            (0.9, (MAX_CONTEXT + 1, 1, 1), "--max-model-len"),
            (0.9, (1, 1, MAX_BATCH + 1), "is larger than"),
        ] {
            let e = q(u, lens).unwrap_err();
            assert!(e.contains(needle), "{u} {lens:?}: {e}");
        }
    }
}
