//! A sweep's output: the CSV's path, its lock, the resume of an earlier run into it, and the
//! manifest beside it.
use super::supervisor::{self, SweepPoint};
use crate::error::bad_file;
use crate::export::csv::CsvExporter;
use crate::export::manifest::{Host, Manifest, Versions, WeightInfo};
use crate::vocab::Backend;
use anyhow::Result;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The output CSV: `--out`, else `results/<scenario name>.csv`; it must end in `.csv`.
pub fn path(out: Option<&Path>, name: &str) -> Result<PathBuf> {
    let out = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("results").join(format!("{name}.csv")));
    if out.extension().and_then(|e| e.to_str()) != Some("csv") {
        return Err(crate::error::InputError::arg(format!(
            "--out {}: must end in .csv",
            out.display()
        ))
        .into());
    }
    Ok(out)
}

/// An exclusive advisory lock (`flock`) on `.NAME.csv.lock` beside the output, held for the
/// life of the sweep: a second sweep into the same CSV would interleave its rows with this
/// one's (and `--fresh` would delete them under it). The kernel drops the lock when the
/// process ends, however it ends; the empty file stays (git-ignored).
pub fn lock(out: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| bad_file(dir, format!("cannot create: {e}")))?;
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let path = dir.join(format!(".{name}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| bad_file(&path, format!("cannot open the output's lock file: {e}")))?;
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(bad_file(
            out,
            "another vramlab sweep is writing this output; wait for it to finish or choose another --out",
        ));
    }
    Ok(f)
}

/// How an output is opened: `--fresh` removes it, `--resume` needs it; else an existing output
/// of the same scenario and shard is resumed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Open {
    pub fresh: bool,
    pub resume: bool,
}

/// Opens `out` for a run of `points`: an existing output of the same scenario (and shard) is
/// resumed: the rows of points it did not finish are dropped and the ids of those it did come
/// back. A new output is created empty.
pub fn resume_or_create<P: SweepPoint>(
    out: &Path,
    open: Open,
    shard: Option<String>,
    scenario_hash: &str,
    points: &[P],
) -> Result<HashSet<String>> {
    if out.exists() && open.fresh {
        std::fs::remove_file(out)?;
    }
    if open.resume && !out.exists() {
        return Err(bad_file(
            out,
            "--resume: there is no earlier output to resume",
        ));
    }
    if !out.exists() {
        CsvExporter::create(out)?;
        return Ok(HashSet::new());
    }
    let mpath = Manifest::path_for(out);
    let old: serde_json::Value = std::fs::read_to_string(&mpath)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            bad_file(
                &mpath,
                "missing or unreadable: cannot resume; use --fresh to overwrite",
            )
        })?;
    let old_hash = old["scenario_hash"].as_str().unwrap_or("");
    let old_shard = old["shard"].as_str().map(str::to_string);
    if old_shard != shard {
        return Err(bad_file(
            out,
            format!(
                "was written by shard {}, this run is shard {}; use --fresh to overwrite it or another --out",
                old_shard.as_deref().unwrap_or("none"),
                shard.as_deref().unwrap_or("none")
            ),
        ));
    }
    if old_hash != scenario_hash {
        return Err(bad_file(
            out,
            format!("was written by scenario hash {old_hash}, this scenario's is {scenario_hash}; use --fresh to overwrite it or another --out"),
        ));
    }
    let rows = crate::export::csv::read(out)?;
    let done = supervisor::finished(&rows, points);
    let redo = supervisor::drop_unfinished(out, &rows, &done)?;
    eprintln!(
        "resuming {}: {} of {} points done{}",
        out.display(),
        done.len(),
        points.len(),
        if redo.is_empty() {
            String::new()
        } else {
            format!(", re-running {} partial", redo.len())
        }
    );
    Ok(done)
}

/// What the manifest of a new run says before any point is measured.
pub struct ManifestIn<'a> {
    pub run_id: &'a str,
    pub started_at: String,
    pub out: &'a Path,
    pub scenario: &'a Path,
    pub scenario_hash: &'a str,
    pub text: &'a str,
    pub backend: Backend,
    pub device: &'a str,
    pub device_name: String,
    pub weights: Vec<WeightInfo>,
    pub points: usize,
    pub shard: Option<String>,
    pub capacity: Option<u64>,
}

/// The manifest of a run (written by the caller; finished when the run ends).
pub fn manifest(m: ManifestIn<'_>) -> Manifest {
    Manifest {
        schema_version: crate::record::SCHEMA_VERSION,
        run_id: m.run_id.to_string(),
        started_at: m.started_at,
        finished_at: None,
        csv: m.out.to_path_buf(),
        scenario_path: m.scenario.to_path_buf(),
        scenario_hash: m.scenario_hash.to_string(),
        scenario_text: m.text.to_string(),
        backend: m.backend,
        device: m.device.to_string(),
        device_name: m.device_name,
        gpu: None,
        pool: serde_json::json!(null),
        runtime: format!("candle-{}", env!("VRAMLAB_CANDLE")),
        stack: None,
        probe: None,
        versions: Versions::current(),
        host: Host::current(),
        weights: m.weights,
        points: m.points,
        shard: m.shard,
        shards: Vec::new(),
        capacity_bytes: m.capacity,
        status_counts: BTreeMap::new(),
        workers_started: 0,
    }
}

/// The final status of each of `points` in `out` (`missing` for a point with no final row),
/// counted.
pub fn status_counts<P: SweepPoint>(out: &Path, points: &[P]) -> Result<BTreeMap<String, usize>> {
    let rows = crate::export::csv::read(out)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in points {
        let status = rows
            .iter()
            .rev()
            .find(|r| r.point_id == p.id() && supervisor::is_final(r, p))
            .and_then(|r| r.status)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|| "missing".into());
        *counts.entry(status).or_insert(0) += 1;
    }
    Ok(counts)
}
