//! Which rows make which figures: the rows grouped by origin (model, runtime, backend,
//! device), and the figures each group allows.
use super::generation::{decode_pixels, gen_phases};
use super::inference::{kv_curve, sweep_axis};
use super::parity::{parity, runtimes};
use super::rows::{slug, Row};
use super::training::train_phases;
use super::{Figure, Kind};
use crate::export::csv::Table;
use crate::fit::Constants;
use crate::record::Record;
use crate::vocab::Runtime;
use std::collections::BTreeMap;

/// "SmolLM2 · candle · cpu · AMD EPYC".
fn origin(r: &Record, runtime: Runtime) -> String {
    format!(
        "{} · {runtime} · {} · {}",
        r.model_id, r.backend, r.device_name
    )
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
