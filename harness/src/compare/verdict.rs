//! Judging joined rows: each changed metric against its margin (regression, improvement,
//! within margin or not gated), status changes, one-sided points, and the next baseline.
use super::join::{key, Key};
use super::margin::{Margins, Metric};
use crate::record::{Phase, Record, Status};
use crate::vocab::Component;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// How a change compares with its margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Grew beyond the margin (or a point that was ok failed).
    Regression,
    /// Shrank beyond the margin (or a point that failed is now ok).
    Improvement,
    /// Changed within the margin.
    Within,
    /// Not gated (no margin for this metric on this backend, or a cross-runtime report).
    Ungated,
}

/// One metric of one joined row that changed.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub point_id: String,
    pub phase: Option<Phase>,
    pub step: Option<u64>,
    pub component: Option<Component>,
    pub metric: Metric,
    pub baseline: u64,
    pub new: u64,
    pub delta: i128,
    pub pct: f64,
    /// The margin's allowance in bytes on this baseline (absent when not gated).
    pub allowed: Option<u64>,
    pub verdict: Verdict,
}

/// A row whose status changed (for example ok → oom).
#[derive(Clone, Debug, Serialize)]
pub struct StatusChange {
    pub point_id: String,
    pub phase: Option<Phase>,
    pub step: Option<u64>,
    pub baseline: Option<Status>,
    pub new: Option<Status>,
    pub verdict: Verdict,
}

/// Points with rows on one side only, with how many rows.
#[derive(Clone, Debug, Serialize)]
pub struct OneSided {
    pub point_id: String,
    pub rows: usize,
}

/// The whole comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub joined_rows: usize,
    pub regressions: usize,
    pub improvements: usize,
    /// Changes, worst first: regressions (largest growth first), improvements beyond margin
    /// (largest shrink first), then changes within margins or not gated (largest first).
    pub changes: Vec<Change>,
    pub status_changes: Vec<StatusChange>,
    pub only_in_baseline: Vec<OneSided>,
    pub only_in_new: Vec<OneSided>,
}

fn pct(base: u64, delta: i128) -> f64 {
    if base == 0 {
        if delta == 0 {
            0.0
        } else {
            f64::INFINITY.copysign(delta as f64)
        }
    } else {
        delta as f64 / base as f64 * 100.0
    }
}

fn status_rank(s: Option<Status>) -> bool {
    s == Some(Status::Ok)
}

/// Compares `new` against `base`. With `gate = false` (cross-runtime) every change is
/// reported as [`Verdict::Ungated`], the metrics are [`Metric::CROSS`] (with each phase's own
/// peak) and the changes keep NEW's row order (a per-phase table).
pub fn compare(
    base: &HashMap<Key, &Record>,
    new_rows: &[Record],
    margins: &Margins,
    gate: bool,
) -> Report {
    let mut rep = Report::default();
    let mut seen: std::collections::HashSet<&Key> = std::collections::HashSet::new();
    let mut new_only: BTreeMap<String, usize> = BTreeMap::new();
    for n in new_rows {
        let k = key(n);
        let Some((bk, b)) = base.get_key_value(&k) else {
            *new_only.entry(n.point_id.clone()).or_default() += 1;
            continue;
        };
        seen.insert(bk);
        rep.joined_rows += 1;
        if b.status != n.status {
            let verdict = match (status_rank(b.status), status_rank(n.status), gate) {
                (_, _, false) => Verdict::Ungated,
                (true, false, _) => Verdict::Regression,
                (false, true, _) => Verdict::Improvement,
                _ => Verdict::Within,
            };
            rep.status_changes.push(StatusChange {
                point_id: n.point_id.clone(),
                phase: n.phase,
                step: n.step,
                baseline: b.status,
                new: n.status,
                verdict,
            });
            continue;
        }
        let metrics: &[Metric] = if gate { &Metric::ALL } else { &Metric::CROSS };
        for &metric in metrics {
            let (Some(bv), Some(nv)) = (metric.get(b), metric.get(n)) else {
                continue;
            };
            let delta = nv as i128 - bv as i128;
            if delta == 0 {
                continue;
            }
            let margin = margins.get(metric, b.backend).filter(|_| gate);
            let allowed = margin.map(|m| m.allowed(bv));
            let verdict = match allowed {
                None => Verdict::Ungated,
                Some(a) if delta.unsigned_abs() <= a as u128 => Verdict::Within,
                Some(_) if delta > 0 => Verdict::Regression,
                Some(_) => Verdict::Improvement,
            };
            rep.changes.push(Change {
                point_id: n.point_id.clone(),
                phase: n.phase,
                step: n.step,
                component: n.component,
                metric,
                baseline: bv,
                new: nv,
                delta,
                pct: pct(bv, delta),
                allowed,
                verdict,
            });
        }
    }
    let mut base_only: BTreeMap<String, usize> = BTreeMap::new();
    for (k, _) in base.iter().filter(|(k, _)| !seen.contains(k)) {
        *base_only.entry(k.0.clone()).or_default() += 1;
    }
    let one_sided = |m: BTreeMap<String, usize>| {
        m.into_iter()
            .map(|(point_id, rows)| OneSided { point_id, rows })
            .collect()
    };
    rep.only_in_baseline = one_sided(base_only);
    rep.only_in_new = one_sided(new_only);
    let count = |v: Verdict| {
        rep.changes.iter().filter(|c| c.verdict == v).count()
            + rep.status_changes.iter().filter(|c| c.verdict == v).count()
    };
    rep.regressions = count(Verdict::Regression);
    rep.improvements = count(Verdict::Improvement);
    if !gate {
        return rep;
    }
    // Worst first: regressions by growth, improvements by shrink, the rest by size.
    rep.changes.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then_with(|| match a.verdict {
                Verdict::Regression => b.delta.cmp(&a.delta),
                Verdict::Improvement => a.delta.cmp(&b.delta),
                _ => b.delta.unsigned_abs().cmp(&a.delta.unsigned_abs()),
            })
            .then_with(|| a.point_id.cmp(&b.point_id))
    });
    rep.status_changes.sort_by_key(|c| c.verdict);
    rep
}

/// The next baseline: the new run's rows in its order, except that a row whose every gated
/// metric moved by at most a third of its margin (and whose status did not change) keeps the
/// baseline's row, so that the baseline does not churn on noise. Rows only in the baseline are
/// dropped: the new run defines the grid.
pub fn next_baseline(
    base: &HashMap<Key, &Record>,
    new_rows: &[Record],
    margins: &Margins,
) -> Vec<Record> {
    new_rows
        .iter()
        .map(|n| {
            let Some(b) = base.get(&key(n)) else {
                return n.clone();
            };
            let quiet = b.status == n.status
                && Metric::ALL.into_iter().all(|m| {
                    match (m.get(b), m.get(n), margins.get(m, b.backend)) {
                        (Some(bv), Some(nv), Some(margin)) => {
                            (nv as i128 - bv as i128).unsigned_abs() * 3
                                <= margin.allowed(bv) as u128
                        }
                        (bv, nv, Some(_)) => bv == nv,
                        (_, _, None) => true,
                    }
                });
            if quiet {
                (*b).clone()
            } else {
                n.clone()
            }
        })
        .collect()
}
