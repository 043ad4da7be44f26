//! The per-point summary table printed after a sweep (read back from the CSV, so it shows
//! exactly what was written).
use crate::export::csv::read;
use crate::record::{Phase, Record, Status};
use crate::units::{gb, gib};
use anyhow::Result;
use std::path::Path;

pub fn print(csv: &Path) -> Result<()> {
    let rows = read(csv)?;
    let width = rows
        .iter()
        .map(|r| r.point_id.len())
        .max()
        .unwrap_or(5)
        .max(5);
    // Reserved is the process's resident set on the CPU, the caching pool's bytes on a GPU.
    let held = if rows.iter().all(|r| r.backend == crate::vocab::Backend::Cpu) {
        "peak RSS"
    } else {
        "peak resv"
    };
    println!(
        "{:<width$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  status",
        "point", "weights", "weights", "peak", "peak", held, held
    );
    println!(
        "{:<width$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "", "GB", "GiB", "alloc GB", "alloc GiB", "GB", "GiB"
    );
    // One line per point: its peak over everything (the envelope rows `total` and
    // `step_total`), or its failure.
    let mut ids: Vec<&str> = Vec::new();
    let mut last: std::collections::HashMap<&str, Record> = std::collections::HashMap::new();
    for r in &rows {
        let envelope = matches!(r.phase, Some(Phase::Total) | Some(Phase::StepTotal));
        if !(envelope || r.status != Some(Status::Ok)) {
            continue;
        }
        let e = last.entry(r.point_id.as_str()).or_insert_with(|| {
            ids.push(r.point_id.as_str());
            r.clone()
        });
        if e.status == Some(Status::Ok)
            && (r.status != Some(Status::Ok) || r.peak_allocated > e.peak_allocated)
        {
            *e = r.clone();
        }
    }
    for id in ids {
        let r = &last[id];
        let w = r.feature_weight_bytes.unwrap_or(0);
        let pa = r.peak_allocated.unwrap_or(0);
        let pr = r.peak_reserved.unwrap_or(0);
        let status = match (r.status, r.peak_phase) {
            // Generation points: the phase that holds the peak.
            (Some(Status::Ok), Some(p)) => format!("ok (peak in {p})"),
            (Some(Status::Ok), None) => "ok".to_string(),
            (Some(st), _) => format!("{st}: {}", r.message),
            (None, _) => format!("no status: {}", r.message),
        };
        println!(
            "{:<width$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {status}",
            r.point_id,
            gb(w),
            gib(w),
            gb(pa),
            gib(pa),
            gb(pr),
            gib(pr)
        );
    }
    Ok(())
}
