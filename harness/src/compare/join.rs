//! Matching two CSVs' rows: the checks that they can be compared at all (schema, scenario,
//! device, runtime) and the index of rows by their join key.
use crate::error::bad_file;
use crate::export::csv::Table;
use crate::record::{Phase, Record};
use crate::vocab::Component;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// The join key of a row: its point, phase, step and component (a generation point has a
/// `load` row per component).
pub type Key = (String, Option<Phase>, Option<u64>, Option<Component>);

pub fn key(r: &Record) -> Key {
    (r.point_id.clone(), r.phase, r.step, r.component)
}

/// What makes the inputs unusable unless the user allows it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Allow {
    pub scenario_change: bool,
    pub device_change: bool,
    pub cross_runtime: bool,
}

fn distinct<T: Ord>(it: impl Iterator<Item = T>) -> BTreeSet<T> {
    it.collect()
}

fn show<T: std::fmt::Display>(s: &BTreeSet<T>) -> String {
    s.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that two CSVs can be compared: the same schema, scenario, backend and device, and
/// runtime (or two runtimes with `cross_runtime`). Every refusal is a one-line input error
/// naming the new file.
pub fn check_compatible(
    base: (&Path, &Table),
    new: (&Path, &Table),
    allow: Allow,
) -> anyhow::Result<()> {
    let (bp, b) = base;
    let (np, n) = new;
    for (p, t) in [base, new] {
        if t.records.is_empty() {
            return Err(bad_file(p, "no rows to compare"));
        }
    }
    let runtimes = |t: &Table| distinct(t.records.iter().map(|r| r.meter.runtime()));
    let (br, nr) = (runtimes(b), runtimes(n));
    if allow.cross_runtime {
        if br == nr {
            return Err(bad_file(
                np,
                format!(
                    "--cross-runtime compares two runtimes, but both files are {}",
                    show(&br)
                ),
            ));
        }
    } else if br != nr {
        return Err(bad_file(
            np,
            format!(
                "runtime {} differs from {}'s {} (use --cross-runtime for a candle-vs-torch table)",
                show(&nr),
                bp.display(),
                show(&br)
            ),
        ));
    }
    let versions = |t: &Table| distinct(t.records.iter().map(|r| r.schema_version));
    let (bv, nv) = (versions(b), versions(n));
    if !allow.cross_runtime && (bv != nv || b.columns != n.columns) {
        let missing: Vec<&String> = b
            .columns
            .iter()
            .filter(|c| !n.columns.contains(c))
            .collect();
        let extra: Vec<&String> = n
            .columns
            .iter()
            .filter(|c| !b.columns.contains(c))
            .collect();
        return Err(bad_file(
            np,
            format!(
                "schema mismatch with {}: schema_version {} vs {}; columns missing {missing:?}, extra {extra:?}{}",
                bp.display(),
                show(&bv),
                show(&nv),
                if missing.is_empty() && extra.is_empty() { " (or in another order)" } else { "" }
            ),
        ));
    }
    let hashes = |t: &Table| distinct(t.records.iter().map(|r| r.scenario_hash.clone()));
    if !allow.scenario_change && hashes(b) != hashes(n) {
        return Err(bad_file(
            np,
            format!(
                "scenario hash {} differs from {}'s {} (another scenario; --allow-scenario-change compares anyway)",
                show(&hashes(n)),
                bp.display(),
                show(&hashes(b))
            ),
        ));
    }
    // Emulated rows are their own source: beside measured ones only as a device change
    // (a device run's real-vs-emulated table), never silently.
    let emulated = |t: &Table| distinct(t.records.iter().map(|r| r.meter.is_emulated()));
    if !allow.device_change && emulated(b) != emulated(n) {
        let says = |t: &Table| {
            if emulated(t).contains(&true) {
                "emulated"
            } else {
                "measured"
            }
        };
        return Err(bad_file(
            np,
            format!(
                "its rows are {}, {}'s are {}: emulated and measured rows are compared only with --allow-device-change",
                says(n),
                bp.display(),
                says(b)
            ),
        ));
    }
    let devices = |t: &Table| {
        distinct(
            t.records
                .iter()
                .map(|r| format!("({}, {})", r.backend, r.device_name)),
        )
    };
    if !allow.device_change && devices(b) != devices(n) {
        return Err(bad_file(
            np,
            format!(
                "backend/device {} differs from {}'s {} (--allow-device-change compares anyway)",
                show(&devices(n)),
                bp.display(),
                show(&devices(b))
            ),
        ));
    }
    Ok(())
}

/// Indexes rows by key; a key seen twice is an input error naming the point.
pub fn index<'a>(p: &Path, t: &'a Table) -> anyhow::Result<HashMap<Key, &'a Record>> {
    let mut m = HashMap::new();
    for r in &t.records {
        if m.insert(key(r), r).is_some() {
            return Err(bad_file(
                p,
                format!(
                    "two rows for point `{}` phase {:?} step {:?} component {:?}",
                    r.point_id, r.phase, r.step, r.component
                ),
            ));
        }
    }
    Ok(m)
}
