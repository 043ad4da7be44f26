//! `vramlab estimate --runtime vllm`: vLLM's startup figures for a dense decoder on one GPU
//! ([`crate::estimate::serving`]), as a table or `--json`'s `serving` object.
use super::Args;
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
v1/core/kv_cache_planning.py), weights, sampler state and KV exact, the other buffers fitted on \
emulated vLLM startups; eager engine, one GPU";

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
    if !a.enforce_eager {
        return Err(refuse(
            "--runtime vllm: add --enforce-eager (the memory of vLLM's CUDA graphs is not \
             modelled yet; the estimate is of an eager engine)",
        ));
    }
    if a.gpus != 1 {
        return Err(refuse(
            "--runtime vllm: one GPU only (tensor parallelism is not modelled yet)",
        ));
    }
    if !(a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0) {
        return Err(refuse(format!(
            "--gpu-memory-utilization must be in (0, 1], got {}",
            a.gpu_memory_utilization
        )));
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
    let weight_bytes = match precision {
        Precision::Bf16 | Precision::F16 => 2,
        Precision::F32 => 4,
        p => {
            return Err(refuse(format!(
                "--runtime vllm serves bf16, f16 or f32 weights, not --precision {p}"
            )))
        }
    };
    let (default_tokens, default_seqs) = serving::serve_defaults(&gpu);
    let q = ServingQuery {
        utilization: a.gpu_memory_utilization,
        max_model_len: a
            .max_model_len
            .unwrap_or(cfg.max_position_embeddings as u64),
        max_num_batched_tokens: a.max_num_batched_tokens.unwrap_or(default_tokens),
        max_num_seqs: a.max_num_seqs.unwrap_or(default_seqs),
        weight_bytes,
        kv_bytes: match a.kv_cache_dtype {
            KvCacheDtype::Auto => weight_bytes,
            KvCacheDtype::Fp8 => 1,
        },
    };
    if q.max_model_len == 0 || q.max_num_batched_tokens == 0 || q.max_num_seqs == 0 {
        return Err(refuse(
            "--max-model-len, --max-num-batched-tokens and --max-num-seqs must be at least 1",
        ));
    }
    // Absurd sizes: beyond these no GPU holds a step (and the byte products stay in 64 bits).
    for (flag, value, max) in [
        (
            "--max-model-len",
            q.max_model_len,
            crate::estimate::MAX_CONTEXT,
        ),
        (
            "--max-num-batched-tokens",
            q.max_num_batched_tokens,
            crate::estimate::MAX_CONTEXT,
        ),
        ("--max-num-seqs", q.max_num_seqs, crate::estimate::MAX_BATCH),
    ] {
        if value > max {
            return Err(refuse(format!("{flag} {value} is larger than {max}")));
        }
    }
    let s = serving::serving(cfg, &gpu, &q);
    let mut notes = Vec::new();
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

/// vLLM's own figures from its startup on the emulated GPU.
#[derive(Serialize)]
pub struct EmulatedServing {
    pub gpu: String,
    pub available_kv_bytes: i64,
    pub kv_tokens: u64,
    pub max_concurrency: f64,
    /// "Model loading took", as printed (0.01 GiB).
    pub weights_bytes: Option<i64>,
    /// The worker's "peak activation", as printed.
    pub activation_peak_bytes: Option<i64>,
    /// The full `vramlab emulate --json` report of the run.
    pub report: serde_json::Value,
}

/// The config.json of a preset or a local model, for vLLM's `load_format="dummy"`.
fn config_json(model: &str) -> Result<String> {
    if let Some((_, text)) = crate::estimate::model::PRESETS
        .iter()
        .find(|(n, _)| *n == model)
    {
        return Ok(text.to_string());
    }
    let p = std::path::Path::new(model);
    let file = if p.is_dir() {
        p.join("config.json")
    } else {
        p.to_path_buf()
    };
    if file.file_name().and_then(|n| n.to_str()) == Some("config.json") && file.is_file() {
        return Ok(std::fs::read_to_string(&file)?);
    }
    Err(refuse(format!(
        "--runtime vllm --emulate: {model} is not a preset or a local config.json (vLLM builds \
         the model from its config.json)"
    )))
}

/// The vLLM stack's Python: --python, else `$VRAMLAB_VLLM_PYTHON`, else the venv
/// `scripts/torch-env.sh --stack vllm-0.33` installs.
fn vllm_python(a: &Args) -> Result<std::path::PathBuf> {
    if let Some(p) = &a.python {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("VRAMLAB_VLLM_PYTHON") {
        return Ok(p.into());
    }
    let cache = std::env::var_os("VRAMLAB_TORCH_CACHE").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/vramlab-torch")
        },
        std::path::PathBuf::from,
    );
    let p = cache.join("stacks/vllm-0.33/venv/bin/python");
    if p.is_file() {
        return Ok(p);
    }
    Err(refuse(format!(
        "--runtime vllm --emulate needs vLLM: {} is missing (`scripts/torch-env.sh --stack \
         vllm-0.33` installs it; or give --python or $VRAMLAB_VLLM_PYTHON)",
        p.display()
    )))
}

/// Runs vLLM's `LLM(...)` at the query's settings under `vramlab emulate --gpu` (this binary)
/// and reads its startup lines.
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
    let python = vllm_python(a)?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("config.json"), config_json(&a.model)?)?;
    let program = format!(
        "from vllm import LLM\nLLM(model={:?}, load_format='dummy', dtype='{}', \
         max_model_len={}, gpu_memory_utilization={}, enforce_eager=True, \
         skip_tokenizer_init=True, max_num_batched_tokens={}, max_num_seqs={}, \
         kv_cache_dtype='{}')\n",
        dir.path().to_str().expect("a temporary path is UTF-8"),
        match precision {
            Precision::F32 => "float32",
            Precision::F16 => "float16",
            _ => "bfloat16",
        },
        q.max_model_len,
        q.utilization,
        q.max_num_batched_tokens,
        q.max_num_seqs,
        if q.kv_bytes == 1 { "fp8" } else { "auto" },
    );
    let report = dir.path().join("report.json");
    let timeout = match a.emulate_timeout.0 {
        Some(d) => format!("{}s", d.as_secs().max(1)),
        None => "0".into(),
    };
    eprintln!("running vLLM's startup on the emulated {} ...", gpu.key);
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([
            "emulate",
            "--gpu",
            &gpu.key,
            "--timeout",
            &timeout,
            "--json-out",
        ])
        .arg(&report)
        .arg("--")
        .arg(&python)
        .args(["-c", &program])
        .output()?;
    let read = std::fs::read(&report).ok();
    let j: serde_json::Value = match read.as_deref().map(serde_json::from_slice) {
        Some(Ok(j)) => j,
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            anyhow::bail!(
                "vLLM's startup on the emulated {} failed: {}",
                gpu.key,
                err.lines().last().unwrap_or("no output")
            )
        }
    };
    let v = j["vllm"]
        .as_array()
        .and_then(|l| l.iter().find(|p| p["kv_tokens"].is_u64()))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "vLLM's startup on the emulated {} printed no KV cache size (status {})",
                gpu.key,
                j["status"]
            )
        })?;
    Ok(EmulatedServing {
        gpu: gpu.key.clone(),
        available_kv_bytes: v["available_kv_bytes"].as_i64().unwrap_or_default(),
        kv_tokens: v["kv_tokens"].as_u64().unwrap_or_default(),
        max_concurrency: v["max_concurrency"].as_f64().unwrap_or_default(),
        weights_bytes: v["weights_bytes"].as_i64(),
        activation_peak_bytes: v["activation_peak_bytes"].as_i64(),
        report: j,
    })
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
        "max_model_len {}, max_num_batched_tokens {}, max_num_seqs {}, KV cache {}",
        s.max_model_len, s.max_num_batched_tokens, s.max_num_seqs, r.model.kv_cache_dtype
    )?;
    let rows = [
        ("requested (total × utilization)", s.requested_bytes),
        ("model weights", s.weights_bytes),
        (
            "allocator rounding of the weights",
            s.weights_rounding_bytes,
        ),
        ("sampler state (penalties)", s.sampler_state_bytes),
        ("other buffers (fitted)", s.other_buffers_bytes),
        ("peak activation (profile run)", s.activation_peak_bytes),
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
