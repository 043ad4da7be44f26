//! vLLM's own startup lines, as the Python boot matched them in the process that logged them
//! (`vramlab/_emulate.py`, `_VLLM_LINES`; vllm 0.33's `v1/worker/gpu/model_runner.py`,
//! `v1/worker/gpu_worker.py` and `v1/core/kv_cache_utils.py`): the figures an inference team
//! reads off a real startup, per process, beside the allocator's.
use serde::{Deserialize, Serialize};

const GIB: f64 = (1u64 << 30) as f64;

/// A GiB figure as vLLM printed it (`format_gib`: rounded to two decimals). Kept as printed;
/// [`Gib::bytes`] is its value in bytes, to vLLM's rounding (±5.4 MB).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Gib(pub String);

impl Gib {
    /// The printed figure in bytes (negative where vLLM printed a negative budget); `None`
    /// for a figure that is not a decimal.
    pub fn bytes(&self) -> Option<i64> {
        let v: f64 = self.0.parse().ok()?;
        v.is_finite().then(|| (v * GIB).round() as i64)
    }
}

/// One of vLLM's startup lines, with the figures it prints.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// "Model loading took 15.0 GiB memory and 13.65 seconds".
    WeightsLoaded {
        gib: Gib,
        seconds: String,
        text: String,
    },
    /// "Available KV cache memory: 54.05 GiB".
    AvailableKv { gib: Gib, text: String },
    /// "GPU KV cache size: 442,752 tokens, Maximum concurrency for 8,192 tokens per request:
    /// 54.05x".
    KvCache {
        pool: String,
        tokens: u64,
        max_model_len: u64,
        concurrency: String,
        text: String,
    },
    /// The worker's summary: "Actual usage is 15.61 GiB for consumed memory (weights +
    /// non-torch), 1.62 GiB for peak activation, and 0.0 GiB for CUDAGraph memory".
    MemoryProfile {
        consumed_gib: Gib,
        activation_gib: Gib,
        cudagraph_gib: Gib,
        text: String,
    },
    /// "Graph capturing finished in 5 secs, took 0.38 GiB".
    GraphCapture {
        seconds: String,
        gib: Gib,
        text: String,
    },
    /// "CUDA graph pool memory: 0.38 GiB (actual), 0.40 GiB (estimated)".
    GraphPool {
        gib: Gib,
        estimated_gib: Gib,
        text: String,
    },
}

/// What one process of vLLM printed at startup.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Startup {
    pub lines: Vec<Line>,
    /// The available KV cache memory exactly, in bytes: the worker's own
    /// `determine_available_memory()` (the line rounds it to 0.01 GiB).
    pub available_kv_bytes: Option<i64>,
    /// The KV cache's block size in tokens (`cache_config.block_size`).
    pub block_size: Option<u64>,
}

impl Startup {
    pub fn weights(&self) -> Option<&Gib> {
        self.lines.iter().find_map(|l| match l {
            Line::WeightsLoaded { gib, .. } => Some(gib),
            _ => None,
        })
    }

    pub fn available_kv(&self) -> Option<&Gib> {
        self.lines.iter().find_map(|l| match l {
            Line::AvailableKv { gib, .. } => Some(gib),
            _ => None,
        })
    }

    /// KV tokens, the max_model_len it was counted at, and the maximum concurrency.
    pub fn kv_cache(&self) -> Option<(u64, u64, &str)> {
        self.lines.iter().find_map(|l| match l {
            Line::KvCache {
                tokens,
                max_model_len,
                concurrency,
                ..
            } => Some((*tokens, *max_model_len, concurrency.as_str())),
            _ => None,
        })
    }

    /// The profile's non-KV terms: consumed (weights and non-torch), the activation peak and
    /// CUDA-graph memory.
    pub fn profile(&self) -> Option<(&Gib, &Gib, &Gib)> {
        self.lines.iter().find_map(|l| match l {
            Line::MemoryProfile {
                consumed_gib,
                activation_gib,
                cudagraph_gib,
                ..
            } => Some((consumed_gib, activation_gib, cudagraph_gib)),
            _ => None,
        })
    }

    /// The CUDA graph pool: the worker's pool line ("actual"), else what the last capture took
    /// ("Graph capturing finished": vLLM captures once to profile, once for real).
    pub fn graph_pool(&self) -> Option<&Gib> {
        self.lines
            .iter()
            .find_map(|l| match l {
                Line::GraphPool { gib, .. } => Some(gib),
                _ => None,
            })
            .or_else(|| {
                self.lines.iter().rev().find_map(|l| match l {
                    Line::GraphCapture { gib, .. } => Some(gib),
                    _ => None,
                })
            })
    }

    /// The report's JSON: each figure in bytes (as printed, and exact where the worker gave
    /// it), with vLLM's lines as printed.
    pub fn json(&self) -> serde_json::Value {
        let bytes = |g: Option<&Gib>| g.and_then(Gib::bytes);
        let kv = self.kv_cache();
        let profile = self.profile();
        serde_json::json!({
            "weights_bytes": bytes(self.weights()),
            "non_kv_bytes": profile.and_then(|(c, a, g)| Some(c.bytes()? + a.bytes()? + g.bytes()?)),
            "activation_peak_bytes": profile.and_then(|(_, a, _)| a.bytes()),
            "available_kv_bytes": self.available_kv_bytes.or_else(|| bytes(self.available_kv())),
            "available_kv_exact": self.available_kv_bytes.is_some(),
            "kv_tokens": kv.map(|k| k.0),
            "max_model_len": kv.map(|k| k.1),
            "max_concurrency": kv.and_then(|k| k.2.parse::<f64>().ok()),
            "block_size": self.block_size,
            "cuda_graph_bytes": bytes(self.graph_pool()),
            "lines": self.lines.iter().map(|l| match l {
                Line::WeightsLoaded { text, .. }
                | Line::AvailableKv { text, .. }
                | Line::KvCache { text, .. }
                | Line::MemoryProfile { text, .. }
                | Line::GraphCapture { text, .. }
                | Line::GraphPool { text, .. } => text.clone(),
            }).collect::<Vec<_>>(),
        })
    }

    /// The table's lines, one figure each, as vLLM printed it.
    pub fn table(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(g) = self.weights() {
            out.push(format!("model weights loading      {} GiB", g.0));
        }
        if let Some((c, a, g)) = self.profile() {
            out.push(format!(
                "non-KV memory              {} GiB weights and non-torch, {} GiB activation peak, {} GiB CUDA graphs",
                c.0, a.0, g.0
            ));
        }
        match (self.available_kv(), self.available_kv_bytes) {
            (Some(g), Some(b)) => out.push(format!(
                "available KV cache memory  {} GiB ({b} bytes)",
                g.0
            )),
            (Some(g), None) => out.push(format!("available KV cache memory  {} GiB", g.0)),
            (None, Some(b)) => out.push(format!("available KV cache memory  {b} bytes")),
            (None, None) => {}
        }
        if let Some((tokens, len, conc)) = self.kv_cache() {
            out.push(format!(
                "KV cache size              {tokens} tokens{}",
                self.block_size
                    .map_or(String::new(), |b| format!(" (blocks of {b})"))
            ));
            out.push(format!(
                "maximum concurrency        {conc}x at {len} tokens per request"
            ));
        }
        if let Some(g) = self.graph_pool() {
            out.push(format!("CUDA graph pool            {} GiB", g.0));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_s_lines_read_as_typed_figures() {
        let doc = r#"{"lines": [
            {"kind": "weights_loaded", "text": "Model loading took 15.0 GiB memory and 13.6 seconds", "gib": "15.0", "seconds": "13.6"},
            {"kind": "available_kv", "text": "Available KV cache memory: 54.05 GiB", "gib": "54.05"},
            {"kind": "kv_cache", "text": "GPU KV cache size: 442,752 tokens, ...", "pool": "GPU", "tokens": 442752, "max_model_len": 8192, "concurrency": "54.05"}
        ], "available_kv_bytes": 58033544295, "block_size": 16}"#;
        let s: Startup = serde_json::from_str(doc).unwrap();
        assert_eq!(s.weights().unwrap().bytes(), Some(15 << 30));
        assert_eq!(s.kv_cache().map(|k| (k.0, k.1)), Some((442_752, 8192)));
        let j = s.json();
        assert_eq!(j["available_kv_bytes"], 58_033_544_295i64);
        assert_eq!(j["kv_tokens"], 442_752);
        assert_eq!(j["max_concurrency"], 54.05);
        assert!(j["cuda_graph_bytes"].is_null());
        assert_eq!(Gib("-1.5".into()).bytes(), Some(-(3 << 29)));
    }
}
