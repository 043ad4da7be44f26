//! The per-point summary table printed after a sweep (read back from the CSV, so it shows
//! exactly what was written).
use crate::export::csv::read;
use crate::record::{Phase, Status};
use crate::units::{gb, gib};
use anyhow::Result;
use std::path::Path;

pub fn print(csv: &Path) -> Result<()> {
    let rows = read(csv)?;
    println!(
        "{:<52} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  status",
        "point", "weights", "weights", "peak", "peak", "peak RSS", "peak RSS"
    );
    println!(
        "{:<52} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "", "GB", "GiB", "alloc GB", "alloc GiB", "GB", "GiB"
    );
    let mut seen = std::collections::BTreeSet::new();
    for r in &rows {
        let last = matches!(r.phase, Some(Phase::Total)) || r.status != Some(Status::Ok);
        if !last || !seen.insert(r.point_id.clone()) {
            continue;
        }
        let w = r.feature_weight_bytes.unwrap_or(0);
        let pa = r.peak_allocated.unwrap_or(0);
        let pr = r.peak_reserved.unwrap_or(0);
        let status = match r.status {
            Some(Status::Ok) => "ok".to_string(),
            _ => format!("{:?}: {}", r.status, r.message),
        };
        println!(
            "{:<52} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {status}",
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
