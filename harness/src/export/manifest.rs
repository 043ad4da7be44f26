//! `NAME.manifest.json` beside each CSV: host, scenario text, versions, pool settings and a
//! hash of the weights (docs/src/reference/csv.md).
use anyhow::Result;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize)]
pub struct Versions {
    pub vramlab: String,
    pub git_rev: String,
    pub rustc: String,
    pub candle: String,
    pub cudarc: String,
    pub cuda_driver: String,
    pub cuda_runtime: String,
}

impl Versions {
    pub fn current() -> Self {
        Versions {
            vramlab: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("VRAMLAB_GIT_REV").into(),
            rustc: env!("VRAMLAB_RUSTC").into(),
            candle: env!("VRAMLAB_CANDLE").into(),
            cudarc: env!("VRAMLAB_CUDARC").into(),
            cuda_driver: String::new(),
            cuda_runtime: String::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Host {
    pub hostname: String,
    pub os: String,
    pub cpu: String,
    pub cpus: usize,
    pub mem_total_bytes: u64,
}

impl Host {
    pub fn current() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let meminfo = read("/proc/meminfo");
        let mem_total_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        Host {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            os: read("/proc/sys/kernel/osrelease").trim().to_string(),
            cpu: cpu_name(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_total_bytes,
        }
    }
}

/// The CPU model name from /proc/cpuinfo.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "cpu".into())
}

#[derive(Clone, Debug, Serialize)]
pub struct WeightInfo {
    pub model_id: String,
    pub source: String,
    pub files: Vec<PathBuf>,
    pub bytes: u64,
    pub sha256: String,
    /// True when `sha256` came from the weight-hash cache (files unchanged in size and mtime
    /// since they were hashed; see `export::hash_cache`), false when this run computed it.
    pub sha256_cached: bool,
}

/// sha256 over the concatenated bytes of `files`, and their total size.
pub fn hash_files(files: &[PathBuf]) -> Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut r = std::fs::File::open(f)?;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
            h.update(&buf[..n]);
        }
    }
    Ok((format!("{:x}", h.finalize()), total))
}

#[derive(Clone, Debug, Serialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub run_id: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub csv: PathBuf,
    pub scenario_path: PathBuf,
    pub scenario_hash: String,
    pub scenario_text: String,
    pub backend: crate::vocab::Backend,
    pub device: String,
    pub device_name: String,
    /// GPU facts (name, total memory, driver, runtime, compute capability) on CUDA.
    pub gpu: Option<serde_json::Value>,
    pub pool: serde_json::Value,
    pub runtime: String,
    /// The software stack of a `runtime = "torch"` sweep (the torch probe's environment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<crate::vocab::Stack>,
    /// The torch probe's settings and versions (attention, optimizer implementation, python,
    /// torch, transformers, diffusers, CUDA runtime) in a `runtime = "torch"` sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<serde_json::Value>,
    pub versions: Versions,
    pub host: Host,
    pub weights: Vec<WeightInfo>,
    pub points: usize,
    /// `--shard K/N` when the sweep ran one shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// What `vramlab merge` combined: one entry per input (csv, run_id, host, shard, times).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<serde_json::Value>,
    /// `--capacity` in bytes, when the sweep ran under a budget.
    pub capacity_bytes: Option<u64>,
    pub status_counts: std::collections::BTreeMap<String, usize>,
    /// Worker processes this run started: one per group of points sharing weights, plus one
    /// after each worker that died (out of memory under `--capacity`, a crash).
    pub workers_started: usize,
}

impl Manifest {
    /// `results/NAME.csv` → `results/NAME.manifest.json`.
    pub fn path_for(csv: &Path) -> PathBuf {
        csv.with_extension("manifest.json")
    }

    pub fn write(&self) -> Result<()> {
        let p = Self::path_for(&self.csv);
        let tmp = p.with_extension("json.part");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(tmp, p)?;
        Ok(())
    }
}
