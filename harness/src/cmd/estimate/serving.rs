//! `vramlab estimate --runtime vllm`: vLLM's startup figures for a dense decoder on one GPU
//! ([`crate::estimate::serving`]), as a table or `--json`'s `serving` object.
use super::Args;
use crate::emulate::serving::{self as vllm, EmulatedServing};
use crate::error::InputError;
use crate::estimate::serving::{self, Serving, ServingQuery};
use crate::vocab::{KvCacheDtype, Mode, Precision};
use anyhow::Result;
use serde::Serialize;
use std::fmt::Write;

/// The serving estimate of a query.
#[derive(Serialize)]
pub struct ServingReport {
    pub runtime: &'static str,
    /// Where the figures come from.
    pub source: String,
    pub model: ServingModel,
    pub gpu: ServingGpu,
    pub serving: Serving,
    /// With --emulate: vLLM's own startup on the emulated card.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulated: Option<EmulatedServing>,
    pub notes: Vec<String>,
}

#[derive(Serialize)]
pub struct ServingModel {
    pub name: String,
    pub architecture: &'static str,
    pub params: u64,
    pub precision: Precision,
    pub kv_cache_dtype: KvCacheDtype,
}

#[derive(Serialize)]
pub struct ServingGpu {
    pub name: String,
    pub total_bytes: u64,
    pub gpu_memory_utilization: f64,
}

/// The source line every serving estimate carries.
const SOURCE: &str = "analytic: vLLM 0.33's startup rules (v1/worker/gpu_worker.py, \
v1/core/kv_cache_planning.py), weights, sampler state and KV exact, the other buffers and the \
CUDA-graph pool fitted on emulated vLLM startups (vramlab fit --vllm); under tensor parallelism \
one rank's figures, NCCL's own buffers not counted";

fn refuse(msg: impl Into<String>) -> anyhow::Error {
    InputError::arg(msg.into()).into()
}

/// The report of `a` (`--runtime vllm`).
pub fn report(a: &Args) -> Result<ServingReport> {
    if a.mode != Mode::Infer {
        return Err(refuse(format!(
            "--runtime vllm is vLLM's serving engine: --mode infer only (got {})",
            a.mode
        )));
    }
    if a.gpus != 1 {
        return Err(refuse(
            "--runtime vllm: give the ranks with --tensor-parallel-size (--gpus is training's)",
        ));
    }
    let Some(gpu_name) = &a.gpu else {
        return Err(refuse(
            "--runtime vllm needs --gpu (vLLM sizes its KV cache from the card's memory)",
        ));
    };
    let gpu = match crate::gpu::by_name(gpu_name) {
        Some(g) => crate::gpu::resolve(Some(&g.key), None),
        None => match crate::units::parse_size(gpu_name) {
            Ok(bytes) => crate::gpu::resolve(None, Some(bytes)),
            Err(_) => Err(format!(
                "unknown --gpu `{gpu_name}` (`vramlab gpus` lists every name; or a size like 48gb)"
            )),
        },
    }
    .map_err(|e| refuse(format!("--runtime vllm: {e}")))?;
    let resolved = crate::estimate::resolve(&a.model)?;
    let cfg = &resolved.config;
    if resolved.gguf.is_some() || resolved.quant.is_some() {
        return Err(refuse(format!(
            "--runtime vllm: {} is a quantized checkpoint; vLLM's quantized kernels are not \
             modelled yet (dense bf16, f16 or f32 weights only)",
            resolved.name
        )));
    }
    if let Some(why) = serving::unsupported(cfg) {
        return Err(refuse(format!("--runtime vllm: {why}")));
    }
    let precision = a.precision.unwrap_or(Precision::Bf16);
    let Some(weight_bytes) = serving::weight_bytes(precision) else {
        return Err(refuse(format!(
            "--runtime vllm serves bf16, f16 or f32 weights, not --precision {precision}"
        )));
    };
    let (default_tokens, default_seqs) = serving::serve_defaults(&gpu);
    let q = ServingQuery::new(
        a.gpu_memory_utilization,
        (
            a.max_model_len
                .unwrap_or(cfg.max_position_embeddings as u64),
            a.max_num_batched_tokens.unwrap_or(default_tokens),
            a.max_num_seqs.unwrap_or(default_seqs),
        ),
        weight_bytes,
        serving::kv_bytes(a.kv_cache_dtype, weight_bytes),
    )
    .map(|q| q.eager(a.enforce_eager))
    .and_then(|q| q.on_ranks(cfg, a.tensor_parallel_size))
    .map_err(|e| refuse(format!("--runtime vllm: {e}")))?;
    let s = serving::serving(cfg, &gpu, &q);
    let mut notes = Vec::new();
    if q.tensor_parallel > 1 {
        notes.push(format!(
            "{} ranks, one {} each: every figure is one rank's. NCCL's own buffers and vLLM's \
             all-reduce workspaces are not counted (real NCCL allocates them outside PyTorch, \
             in vLLM's non-torch memory; the emulated NCCL holds none), so on real GPUs the \
             available KV cache is smaller by their size: published vLLM 0.19 startups of \
             Llama-3.1-8B and Qwen2.5-7B on 2 and 4 H100s show 1.8 to 1.9 GiB more non-torch \
             memory a rank than on one (results/peers/published.json)",
            q.tensor_parallel, gpu.key
        ));
    }
    if q.tensor_parallel > 1 && q.cuda_graphs {
        notes.push(
            "the CUDA-graph term is fitted on one-GPU startups; each rank captures its own \
             graphs, taken here as one GPU's (--enforce-eager for the tested eager figures)"
                .into(),
        );
    }
    if !s.fits {
        notes.push(format!(
            "vLLM would not start: one request of {} tokens needs {} of KV cache, more than the \
             {} available; the largest --max-model-len that fits is {}",
            s.max_model_len,
            crate::units::gb_gib(
                q.max_model_len.div_ceil(serving::BLOCK_TOKENS)
                    * serving::BLOCK_TOKENS
                    * s.kv_bytes_per_token
            ),
            crate::units::gb_gib(s.available_kv_bytes.max(0) as u64),
            s.max_model_len_fits
        ));
    }
    let emulated = match &a.emulate {
        Some(g) => Some(emulate(a, g, &gpu, &q, precision)?),
        None => None,
    };
    Ok(ServingReport {
        runtime: "vllm",
        source: SOURCE.into(),
        model: ServingModel {
            name: resolved.name.clone(),
            architecture: cfg.architecture.name(),
            params: cfg.param_count(),
            precision,
            kv_cache_dtype: a.kv_cache_dtype,
        },
        gpu: ServingGpu {
            name: gpu.key.clone(),
            total_bytes: gpu.total_bytes,
            gpu_memory_utilization: q.utilization,
        },
        serving: s,
        emulated,
        notes,
    })
}

/// Runs vLLM's `LLM(...)` at the query's settings on the emulated `--emulate` card, one per
/// tensor-parallel rank.
fn emulate(
    a: &Args,
    name: &str,
    gpu: &crate::gpu::Gpu,
    q: &ServingQuery,
    precision: Precision,
) -> Result<EmulatedServing> {
    if crate::gpu::by_name(name).map(|g| g.key) != Some(gpu.key.clone()) {
        return Err(refuse(format!(
            "--runtime vllm: --emulate {name} must name the --gpu card ({})",
            gpu.key
        )));
    }
    if q.tensor_parallel > crate::emulate::MAX_DEVICES {
        return Err(refuse(format!(
            "--runtime vllm: --emulate runs at most {} ranks (emulated cards), not \
             --tensor-parallel-size {}",
            crate::emulate::MAX_DEVICES,
            q.tensor_parallel
        )));
    }
    let python = vllm::python(a.python.as_deref())?;
    vllm::startup(
        &python,
        gpu,
        &vllm::config_json(&a.model)?,
        q,
        precision,
        a.emulate_timeout.0,
    )
}

/// The table: vLLM's startup figures in its own words, each in GiB as vLLM prints them and in
/// bytes.
pub fn render(out: &mut String, r: &ServingReport) -> std::fmt::Result {
    let s = &r.serving;
    let gib = |b: u64| format!("{} GiB", crate::units::gib(b));
    writeln!(
        out,
        "vLLM serving estimate: {} ({} parameters, {}) on {} ({}), gpu_memory_utilization {}",
        r.model.name,
        crate::units::grouped(r.model.params),
        r.model.precision,
        r.gpu.name,
        gib(r.gpu.total_bytes),
        r.gpu.gpu_memory_utilization
    )?;
    writeln!(
        out,
        "max_model_len {}, max_num_batched_tokens {}, max_num_seqs {}, KV cache {}{}",
        s.max_model_len,
        s.max_num_batched_tokens,
        s.max_num_seqs,
        r.model.kv_cache_dtype,
        match s.tensor_parallel {
            1 => String::new(),
            t => format!(", tensor_parallel_size {t} (one rank's figures)"),
        }
    )?;
    match &s.cuda_graphs {
        Some(c) => writeln!(
            out,
            "CUDA graphs: {} PIECEWISE (1 to {} tokens) and {} FULL decode graphs (up to {})",
            c.sizes.len(),
            c.largest(),
            c.full_graphs,
            c.largest_full()
        )?,
        None => writeln!(out, "eager (--enforce-eager): no CUDA graphs")?,
    }
    let rows = [
        ("requested (total × utilization)", s.requested_bytes),
        ("model weights", s.weights_bytes),
        (
            "allocator rounding of the weights",
            s.weights_rounding_bytes,
        ),
        ("rotary cache (cos/sin)", s.rotary_cache_bytes),
        ("sampler state (penalties)", s.sampler_state_bytes),
        ("other buffers (fitted)", s.other_buffers_bytes),
        ("peak activation (profile run)", s.activation_peak_bytes),
        ("CUDA graphs (vLLM's estimate)", s.cuda_graph_bytes),
        ("non-KV memory", s.non_kv_bytes),
    ];
    for (name, bytes) in rows {
        writeln!(out, "  {name:<34} {:>14} B  {}", grouped(bytes), gib(bytes))?;
    }
    let avail = s.available_kv_bytes;
    writeln!(
        out,
        "  {:<34} {:>14} B  {}",
        "available KV cache memory",
        match avail < 0 {
            true => format!("-{}", grouped(avail.unsigned_abs())),
            false => grouped(avail as u64),
        },
        match avail < 0 {
            true => format!("-{}", gib(avail.unsigned_abs())),
            false => gib(avail as u64),
        }
    )?;
    writeln!(
        out,
        "GPU KV cache size: {} tokens ({} blocks of {}, {} B a token); maximum concurrency for \
         {} tokens per request: {:.2}x",
        grouped(s.kv_tokens),
        grouped(s.kv_blocks),
        serving::BLOCK_TOKENS,
        grouped(s.kv_bytes_per_token),
        grouped(s.max_model_len),
        s.max_concurrency
    )?;
    writeln!(
        out,
        "fits: {}",
        if s.fits {
            "yes".to_string()
        } else {
            format!(
                "no (the largest --max-model-len that fits: {})",
                s.max_model_len_fits
            )
        }
    )?;
    if let Some(e) = &r.emulated {
        writeln!(
            out,
            "emulated (vLLM 0.33 itself on the emulated {}): available KV cache memory {} B, \
             {} tokens, {:.2}x; estimate {:+.3}% in tokens",
            e.gpu,
            grouped(e.available_kv_bytes.max(0) as u64),
            grouped(e.kv_tokens),
            e.max_concurrency,
            (s.kv_tokens as f64 / e.kv_tokens.max(1) as f64 - 1.0) * 100.0
        )?;
    }
    writeln!(out, "source: {}", r.source)?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

fn grouped(b: u64) -> String {
    crate::units::grouped(b)
}
