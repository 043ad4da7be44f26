//! vLLM's own engine startup on the emulated GPU: `LLM(...)` with `load_format="dummy"` from a
//! config.json, at a serving query's settings, run under `vramlab emulate --gpu` (this binary),
//! and the figures its startup lines print ([`super::vllm`]). `estimate --runtime vllm
//! --emulate` prints them beside the analytic estimate; `validate --emulate` beside a published
//! vLLM startup.
use crate::error::InputError;
use crate::estimate::serving::ServingQuery;
use crate::gpu::Gpu;
use crate::vocab::Precision;
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

fn refuse(msg: impl Into<String>) -> anyhow::Error {
    InputError::arg(msg.into()).into()
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
pub fn config_json(model: &str) -> Result<String> {
    if let Some((_, text)) = crate::estimate::model::PRESETS
        .iter()
        .find(|(n, _)| *n == model)
    {
        return Ok(text.to_string());
    }
    let p = Path::new(model);
    let file = if p.is_dir() {
        p.join("config.json")
    } else {
        p.to_path_buf()
    };
    if file.file_name().and_then(|n| n.to_str()) == Some("config.json") && file.is_file() {
        return Ok(std::fs::read_to_string(&file)?);
    }
    Err(refuse(format!(
        "vLLM on the emulated GPU: {model} is not a preset or a local config.json (vLLM builds \
         the model from its config.json)"
    )))
}

/// The vLLM stack's Python: `explicit` (--python), else `$VRAMLAB_VLLM_PYTHON`, else the venv
/// `scripts/torch-env.sh --stack vllm-0.33` installs.
pub fn python(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("VRAMLAB_VLLM_PYTHON") {
        return Ok(p.into());
    }
    let cache = std::env::var_os("VRAMLAB_TORCH_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/vramlab-torch"),
        PathBuf::from,
    );
    let p = cache.join("stacks/vllm-0.33/venv/bin/python");
    if p.is_file() {
        return Ok(p);
    }
    Err(refuse(format!(
        "vLLM on the emulated GPU needs vLLM: {} is missing (`scripts/torch-env.sh --stack \
         vllm-0.33` installs it; or give --python or $VRAMLAB_VLLM_PYTHON)",
        p.display()
    )))
}

/// Runs vLLM's `LLM(...)` at the query's settings under `vramlab emulate --gpu` (this binary)
/// and reads its startup lines.
pub fn startup(
    python: &Path,
    gpu: &Gpu,
    config_json: &str,
    q: &ServingQuery,
    precision: Precision,
    timeout: Option<std::time::Duration>,
) -> Result<EmulatedServing> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("config.json"), config_json)?;
    let program = format!(
        "from vllm import LLM\nLLM(model={:?}, load_format='dummy', dtype='{}', \
         max_model_len={}, gpu_memory_utilization={}, enforce_eager={}, \
         skip_tokenizer_init=True, max_num_batched_tokens={}, max_num_seqs={}, \
         kv_cache_dtype='{}', tensor_parallel_size={})\n",
        dir.path().to_str().expect("a temporary path is UTF-8"),
        match precision {
            Precision::F32 => "float32",
            Precision::F16 => "float16",
            _ => "bfloat16",
        },
        q.max_model_len,
        q.utilization,
        if q.cuda_graphs { "False" } else { "True" },
        q.max_num_batched_tokens,
        q.max_num_seqs,
        if q.kv_bytes == 1 { "fp8" } else { "auto" },
        q.tensor_parallel,
    );
    let report = dir.path().join("report.json");
    let timeout = match timeout {
        Some(d) => format!("{}s", d.as_secs().max(1)),
        None => "0".into(),
    };
    eprintln!("running vLLM's startup on the emulated {} ...", gpu.key);
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([
            "emulate",
            "--gpu",
            &gpu.key,
            "--devices",
            &q.tensor_parallel.to_string(),
            "--timeout",
            &timeout,
            "--json-out",
        ])
        .arg(&report)
        .arg("--")
        .arg(python)
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
    // One process prints the KV tokens (the engine core: with tensor parallelism a process of
    // its own, on no device), the worker of rank 0 the memory lines.
    let entries = j["vllm"].as_array().cloned().unwrap_or_default();
    let first = |key: &str| {
        entries
            .iter()
            .map(|p| &p[key])
            .find(|v| !v.is_null())
            .cloned()
    };
    let v = entries
        .iter()
        .find(|p| p["kv_tokens"].is_u64())
        .ok_or_else(|| {
            // vLLM's own reason: its refusal is a ValueError (one request of max_model_len
            // does not fit, naming the largest length that does), else the last line.
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| l.contains("ValueError: "))
                .map(str::to_string)
                .or_else(|| super::last_line(&out.stderr))
                .unwrap_or_default();
            anyhow::anyhow!(
                "vLLM's startup on the emulated {} printed no KV cache size (status {}): {}",
                gpu.key,
                j["status"],
                last.trim()
            )
        })?;
    let (kv_tokens, max_concurrency) = (
        v["kv_tokens"].as_u64().unwrap_or_default(),
        v["max_concurrency"].as_f64().unwrap_or_default(),
    );
    Ok(EmulatedServing {
        gpu: gpu.key.clone(),
        available_kv_bytes: first("available_kv_bytes")
            .and_then(|b| b.as_i64())
            .unwrap_or_default(),
        kv_tokens,
        max_concurrency,
        weights_bytes: first("weights_bytes").and_then(|b| b.as_i64()),
        activation_peak_bytes: first("activation_peak_bytes").and_then(|b| b.as_i64()),
        report: j,
    })
}
