//! `vramlab merge`: combine the CSVs of a sharded sweep (or of resumed runs) into one CSV and
//! one manifest. Rows are kept byte for byte; the inputs must agree on schema, scenario hash
//! and weights.
use crate::compare::{self, Key};
use crate::error::bad_file;
use crate::export::manifest::Manifest;
use crate::record::{Record, Status};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One input: its rows (parsed and raw), header and manifest.
struct Input {
    path: PathBuf,
    columns: Vec<String>,
    records: Vec<Record>,
    raw: Vec<csv::StringRecord>,
    manifest: Value,
}

fn load(path: &Path) -> Result<Input> {
    let table = crate::export::csv::read_table(path)?;
    let mut rd = csv::Reader::from_path(path).map_err(|e| bad_file(path, e))?;
    let raw = rd
        .records()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_file(path, e))?;
    let mpath = Manifest::path_for(path);
    let manifest: Value = std::fs::read_to_string(&mpath)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            bad_file(
                &mpath,
                "missing or unreadable manifest (merge needs one beside each CSV)",
            )
        })?;
    Ok(Input {
        path: path.to_path_buf(),
        columns: table.columns,
        records: table.records,
        raw,
        manifest,
    })
}

/// The weights a manifest names: model id → sha256.
fn weights(m: &Value) -> BTreeMap<String, String> {
    m["weights"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["model_id"].as_str().unwrap_or_default().to_string(),
                w["sha256"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// What a merge did.
#[derive(Debug, Default)]
pub struct Summary {
    pub rows: usize,
    pub points: usize,
    pub duplicates_removed: usize,
}

/// Merges `inputs` into `out` (and its manifest). Errors are one line naming the file(s).
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<Summary> {
    let ins: Vec<Input> = inputs.iter().map(|p| load(p)).collect::<Result<_>>()?;
    let first = &ins[0];
    let hash = |i: &Input| {
        i.manifest["scenario_hash"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for i in &ins {
        if i.columns != first.columns {
            return Err(bad_file(
                &i.path,
                format!(
                    "schema mismatch with {}: the columns differ",
                    first.path.display()
                ),
            ));
        }
        if let Some(r) = i.records.iter().find(|r| r.scenario_hash != hash(i)) {
            return Err(bad_file(
                &i.path,
                format!(
                    "row of `{}` has scenario hash {}, its manifest says {}",
                    r.point_id,
                    r.scenario_hash,
                    hash(i)
                ),
            ));
        }
        if hash(i) != hash(first) {
            return Err(bad_file(
                &i.path,
                format!(
                    "scenario hash {} differs from {}'s {}",
                    hash(i),
                    first.path.display(),
                    hash(first)
                ),
            ));
        }
        let emulated = |i: &Input| i.records.iter().any(|r| r.meter.is_emulated());
        if emulated(i) != emulated(first) {
            return Err(bad_file(
                &i.path,
                format!(
                    "emulated and measured rows in one merge (with {}): merge each source separately",
                    first.path.display()
                ),
            ));
        }
        if i.manifest["schema_version"] != first.manifest["schema_version"] {
            return Err(bad_file(
                &i.path,
                format!("schema_version differs from {}'s", first.path.display()),
            ));
        }
        let (wi, wf) = (weights(&i.manifest), weights(&first.manifest));
        if let Some((m, h)) = wi.iter().find(|(m, h)| wf.get(*m).is_some_and(|g| g != *h)) {
            return Err(bad_file(
                &i.path,
                format!(
                    "weights of {m} (sha256 {h}) differ from {}'s",
                    first.path.display()
                ),
            ));
        }
    }

    // Rows by key; exact duplicates dropped, conflicting ones refused.
    let mut seen: HashMap<Key, (usize, &csv::StringRecord)> = HashMap::new();
    let mut rows: Vec<(&Record, &csv::StringRecord)> = Vec::new();
    let mut dups = 0;
    for (n, i) in ins.iter().enumerate() {
        for (r, raw) in i.records.iter().zip(&i.raw) {
            let key = compare::key(r);
            match seen.get(&key) {
                Some((_, prev)) if *prev == raw => dups += 1,
                Some((m, _)) => {
                    return Err(bad_file(
                        &i.path,
                        format!(
                            "point `{}` (phase {:?}, step {:?}, component {:?}) is also in {} with other figures; keep one of the two",
                            r.point_id,
                            r.phase,
                            r.step,
                            r.component,
                            ins[*m].path.display()
                        ),
                    ))
                }
                None => {
                    seen.insert(key, (n, raw));
                    rows.push((r, raw));
                }
            }
        }
    }
    // In the scenario's grid order when the manifest's scenario parses; input order otherwise.
    let text = first.manifest["scenario_text"].as_str().unwrap_or_default();
    let order: HashMap<String, usize> = crate::scenario::Spec::parse(&first.path, text)
        .map(|s| {
            crate::scenario::point_ids(&s)
                .into_iter()
                .enumerate()
                .map(|(i, id)| (id, i))
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by_key(|(r, _)| order.get(&r.point_id).copied().unwrap_or(usize::MAX));

    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("csv.part");
    {
        let mut w =
            csv::Writer::from_path(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        w.write_record(&first.columns)?;
        for (_, raw) in &rows {
            w.write_record(*raw)?;
        }
        w.flush()?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;

    // Status per point: ok unless a row says otherwise.
    let mut status: BTreeMap<&str, Status> = BTreeMap::new();
    for (r, _) in &rows {
        let s = status.entry(&r.point_id).or_insert(Status::Ok);
        if let Some(x) = r.status.filter(|x| *x != Status::Ok) {
            *s = x;
        }
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in status.values() {
        *counts.entry(format!("{s:?}").to_lowercase()).or_default() += 1;
    }
    let mut m = first.manifest.clone();
    let shards: Vec<Value> = ins
        .iter()
        .map(|i| {
            json!({
                "csv": i.path,
                "run_id": i.manifest["run_id"],
                "shard": i.manifest["shard"],
                "host": i.manifest["host"],
                "device_name": i.manifest["device_name"],
                "started_at": i.manifest["started_at"],
                "finished_at": i.manifest["finished_at"],
                "points": i.manifest["points"],
                "status_counts": i.manifest["status_counts"],
            })
        })
        .collect();
    let field = |k: &'static str| ins.iter().filter_map(move |i| i.manifest[k].as_str());
    m["started_at"] = json!(field("started_at").min());
    m["finished_at"] = json!(field("finished_at").max());
    let mut ids: Vec<&str> = field("run_id").collect();
    ids.dedup();
    m["run_id"] = json!(ids.join("+"));
    m["csv"] = json!(out);
    m["points"] = json!(status.len());
    m["status_counts"] = json!(counts);
    m["shards"] = json!(shards);
    if let Some(o) = m.as_object_mut() {
        o.remove("shard");
    }
    let mp = Manifest::path_for(out);
    std::fs::write(&mp, serde_json::to_string_pretty(&m)?)
        .with_context(|| format!("writing {}", mp.display()))?;
    Ok(Summary {
        rows: rows.len(),
        points: status.len(),
        duplicates_removed: dups,
    })
}
