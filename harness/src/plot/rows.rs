//! The helpers every figure kind shares: which rows count (`ok`), a row with its file's runtime,
//! GiB, labels and the stacked-bar segments. The figure kinds import these; `figures.rs` imports
//! the kinds, so nothing imports back up.
use crate::record::{Phase, Record, Status};
use crate::units::GIB;
use crate::vocab::Runtime;

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
