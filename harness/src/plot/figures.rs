//! Which rows make which figures: the rows grouped by origin (model, runtime, backend,
//! device), the figures each group allows, and the helpers the figure kinds share.
use super::generation::{decode_pixels, gen_phases};
use super::inference::{kv_curve, sweep_axis};
use super::parity::{parity, runtimes};
use super::training::train_phases;
use super::{Figure, Kind};
use crate::export::csv::Table;
use crate::fit::Constants;
use crate::record::{Phase, Record, Status};
use crate::units::GIB;
use crate::vocab::Runtime;
use std::collections::BTreeMap;

pub(super) fn gib(b: u64) -> f64 {
    b as f64 / GIB
}

/// A record with the runtime of its file.
pub(super) struct Row<'a> {
    pub(super) r: &'a Record,
    pub(super) runtime: Runtime,
}

pub(super) fn ok(r: &Record) -> bool {
    r.status == Some(Status::Ok)
}

pub(super) fn phase_name(p: Option<Phase>) -> String {
    p.map(|p| p.to_string()).unwrap_or_default()
}

/// "SmolLM2 · candle · cpu · AMD EPYC".
fn origin(r: &Record, runtime: Runtime) -> String {
    format!(
        "{} · {runtime} · {} · {}",
        r.model_id, r.backend, r.device_name
    )
}

pub(super) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Every figure the inputs allow; `constants` adds the parity plot.
pub fn figures(tables: &[Table], constants: Option<&Constants>) -> Vec<Figure> {
    let rows: Vec<Row> = tables
        .iter()
        .flat_map(|t| {
            t.records.iter().map(|r| Row {
                r,
                runtime: r.meter.runtime(),
            })
        })
        .collect();
    // One set of figures per (model, runtime, backend, device).
    let mut by_origin: BTreeMap<String, Vec<&Row>> = BTreeMap::new();
    for row in &rows {
        by_origin
            .entry(origin(row.r, row.runtime))
            .or_default()
            .push(row);
    }
    let mut out = Vec::new();
    for (title, rs) in &by_origin {
        let recs: Vec<&Record> = rs.iter().map(|x| x.r).collect();
        let stem = slug(&format!(
            "{}-{}-{}",
            recs[0].model_id, rs[0].runtime, recs[0].backend
        ));
        out.extend(sweep_axis(&recs, title, &stem, Kind::Context));
        out.extend(sweep_axis(&recs, title, &stem, Kind::Batch));
        out.extend(kv_curve(&recs, title, &stem));
        out.extend(train_phases(&recs, title, &stem));
        out.extend(gen_phases(&recs, title, &stem));
        out.extend(decode_pixels(&recs, title, &stem));
        if let Some(c) = constants {
            out.extend(parity(&recs, c, title, &stem));
        }
    }
    out.extend(runtimes(&rows));
    out
}

/// What was resident at the start, then how much each later peak raised the running maximum
/// (GiB): a stack whose height is the largest peak.
pub(super) fn stack(start: u64, peaks: &[u64]) -> Vec<f64> {
    let mut top = start;
    let mut seg = vec![gib(start)];
    for &peak in peaks {
        seg.push(gib(peak.saturating_sub(top)));
        top = top.max(peak);
    }
    seg
}

/// Labels for point ids: the parts of each id that differ between them.
pub(super) fn varying_labels(ids: &[String]) -> Vec<String> {
    let parts: Vec<Vec<&str>> = ids.iter().map(|c| c.split('/').collect()).collect();
    let varying: Vec<usize> = (0..parts[0].len())
        .filter(|&j| parts.iter().any(|p| p.get(j) != parts[0].get(j)))
        .collect();
    parts
        .iter()
        .map(|p| {
            varying
                .iter()
                .filter_map(|&j| p.get(j).copied())
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect()
}
