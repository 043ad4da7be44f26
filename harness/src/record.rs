//! The one CSV row type (ARCHITECTURE.md §5). Column names are stable API; bytes are raw integers.
//! Columns a row does not use are empty.
//!
//! Versions: 1 is the design schema; 2 adds `attention` (eager|flash) after `kernels`; 3 adds
//! `kv_window` (model|full, inference rows) after `kv_cache`. Readers accept every version: a
//! version-1 row reads with `attention = "eager"` (the only attention version 1 had), and an
//! inference row before version 3 with `kv_window = "full"` (earlier versions never capped a
//! cache at a window). 4 adds `compute` (f32|f16|bf16) after `precision`: a quantized point's
//! compute dtype (empty for dense precisions, which compute in their own; so older rows need
//! nothing filled). 5 adds `qmatmul` (auto|dequantize) after `compute`: a quantized point's
//! product path (empty for dense rows; older quantized rows ran candle's `QMatMul`, read as
//! `auto`). 6 adds the generation columns (docs/src/guides/generation.md): `resolution`, `frames`,
//! `cfg`, `vae_decode`, `vae_precision` after `pool_release`, and `component`, `peak_phase` after
//! `phase` (empty on other rows, so older rows need nothing filled).
use serde::{Deserialize, Serialize};

pub const SCHEMA_VERSION: u32 = 6;

/// The oldest schema version readers still accept.
pub const OLDEST_SCHEMA_VERSION: u32 = 1;

use crate::vocab::{
    Attention, Backend, Checkpointing, Component, Compute, Kernels, KvKind, KvWindow, MeterKind,
    Mode, Optimizer, PoolRelease, Precision, QMatmul, Resolution, Trainable, VaeDecode,
};
pub use crate::vocab::{Phase, Status};

/// `#[serde(default)]`: a CSV of an older schema version, which lacks later columns, still reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    pub schema_version: u32,
    pub run_id: String,
    pub point_id: String,
    pub started_at: String,
    pub vramlab_version: String,
    pub git_rev: String,
    pub backend: Backend,
    pub device_name: String,
    pub driver_version: String,
    pub cuda_version: String,
    pub candle_version: String,
    pub model_id: String,
    pub architecture: String,
    pub param_count: u64,
    pub weight_source: String,
    pub mode: Mode,
    pub precision: Precision,
    /// A quantized precision's compute dtype; empty for dense ones. Absent before version 4.
    pub compute: Option<Compute>,
    /// A quantized point's product path; empty for dense ones. Absent before version 5.
    pub qmatmul: Option<QMatmul>,
    pub batch: u64,
    pub context: u64,
    pub prompt_len: Option<u64>,
    pub decode_steps: Option<u64>,
    /// Inference rows only.
    pub kv_cache: Option<KvKind>,
    /// Inference rows only. Absent before version 3 (read as `full`).
    pub kv_window: Option<KvWindow>,
    /// `none` on inference rows.
    pub optimizer: Optimizer,
    /// Training rows only.
    pub checkpointing: Option<Checkpointing>,
    pub grad_accum: Option<u64>,
    /// Training rows only.
    pub trainable: Option<Trainable>,
    pub kernels: Kernels,
    /// Absent from version-1 files (read as `eager`, the default).
    pub attention: Attention,
    /// CUDA rows only.
    pub pool_release: Option<PoolRelease>,
    /// Generation rows only (`WxH` of the output image). Absent before version 6.
    pub resolution: Option<Resolution>,
    /// Generation rows: output frames per video (1 for an image model).
    pub frames: Option<u64>,
    /// Generation rows: classifier-free guidance (the denoiser runs on a doubled batch).
    pub cfg: Option<bool>,
    pub vae_decode: Option<VaeDecode>,
    /// Generation rows: the VAE's dtype (f32 for SDXL's force_upcast by default).
    pub vae_precision: Option<Precision>,
    pub scenario_hash: String,
    pub meter: MeterKind,
    pub phase: Option<Phase>,
    /// Generation `load` rows: the component loaded.
    pub component: Option<Component>,
    /// Generation `total` rows: the phase that holds the point's peak.
    pub peak_phase: Option<Phase>,
    pub step: Option<u64>,
    pub kv_tokens: Option<u64>,
    pub baseline_allocated: Option<u64>,
    pub peak_allocated: Option<u64>,
    pub end_allocated: Option<u64>,
    pub baseline_reserved: Option<u64>,
    pub peak_reserved: Option<u64>,
    pub device_used: Option<u64>,
    pub non_pool: Option<u64>,
    pub feature_weight_bytes: Option<u64>,
    pub feature_kv_bytes: Option<u64>,
    pub feature_act_bytes: Option<u64>,
    pub feature_logits_bytes: Option<u64>,
    pub feature_optimizer_bytes: Option<u64>,
    pub elapsed_ms: Option<f64>,
    pub status: Option<Status>,
    pub message: String,
}

/// The columns a row of schema `version` must have: every column of this version less those
/// added after `version` (which read as empty and are filled by [`Record::upgrade`]).
pub fn columns_of(version: u32) -> Vec<String> {
    columns()
        .into_iter()
        .filter(|c| added_in(c) <= version)
        .collect()
}

/// The columns added after version 1, with the schema version that added each.
const ADDED: [(&str, u32); 11] = [
    ("attention", 2),
    ("kv_window", 3),
    ("compute", 4),
    ("qmatmul", 5),
    ("resolution", 6),
    ("frames", 6),
    ("cfg", 6),
    ("vae_decode", 6),
    ("vae_precision", 6),
    ("component", 6),
    ("peak_phase", 6),
];

/// The schema version that added `column` (1 for the original columns).
pub fn added_in(column: &str) -> u32 {
    ADDED
        .iter()
        .find(|(a, _)| *a == column)
        .map_or(OLDEST_SCHEMA_VERSION, |(_, v)| *v)
}

impl Record {
    /// Fills what a row of an older schema version lacks with what that version meant.
    /// (A version-1 row's missing `attention` already reads as `eager`, the default.)
    pub fn upgrade(&mut self) {
        if self.schema_version < 3 && self.kv_window.is_none() && self.kv_cache.is_some() {
            self.kv_window = Some(KvWindow::Full);
        }
        if self.schema_version < 5 && self.qmatmul.is_none() && self.compute.is_some() {
            self.qmatmul = Some(QMatmul::Auto);
        }
    }

    /// Fills the memory columns from a measured phase.
    pub fn set_memory(&mut self, m: &crate::meter::PhaseMemory) {
        self.baseline_allocated = Some(m.baseline_allocated);
        self.peak_allocated = Some(m.peak_allocated);
        self.end_allocated = Some(m.end_allocated);
        self.baseline_reserved = Some(m.baseline_reserved);
        self.peak_reserved = Some(m.peak_reserved);
        self.device_used = Some(m.device_used);
        self.non_pool = Some(m.non_pool);
    }
}

/// The column names, in order, as `vramlab sweep` writes them.
pub fn columns() -> Vec<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(Record::default())
        .expect("serializing a default record");
    let bytes = w.into_inner().expect("in-memory writer");
    let text = String::from_utf8(bytes).expect("utf-8");
    text.lines()
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect()
}

/// Now, as the rows' and manifests' timestamps write it (RFC 3339, whole seconds, UTC).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_the_design_schema() {
        let expected = "schema_version, run_id, point_id, started_at, vramlab_version, git_rev,
backend, device_name, driver_version, cuda_version, candle_version,
model_id, architecture, param_count, weight_source,
mode, precision, compute, qmatmul, batch, context, prompt_len, decode_steps,
kv_cache, kv_window, optimizer, checkpointing, grad_accum,
trainable, kernels, attention, pool_release,
resolution, frames, cfg, vae_decode, vae_precision,
scenario_hash, meter,
phase, component, peak_phase, step, kv_tokens,
baseline_allocated, peak_allocated, end_allocated, baseline_reserved, peak_reserved, device_used, non_pool,
feature_weight_bytes, feature_kv_bytes, feature_act_bytes, feature_logits_bytes, feature_optimizer_bytes,
elapsed_ms, status, message";
        let want: Vec<String> = expected.split(',').map(|s| s.trim().to_string()).collect();
        assert_eq!(columns(), want);
    }
}
