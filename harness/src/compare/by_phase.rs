//! The comparison summed up per phase: for each (phase, metric) of the changed values, how many
//! changed, how many beyond their margin either way, the median change and the largest one.
//! What a new runtime or software stack does to each phase of a scenario, in a few rows instead
//! of one per point (`vramlab compare --by-phase`).
use super::margin::Metric;
use super::verdict::{Change, Report, Verdict};
use crate::vocab::Phase;
use serde::Serialize;
use std::collections::BTreeMap;

/// One phase's changes of one metric.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseChange {
    pub phase: Option<Phase>,
    pub metric: Metric,
    /// Values of this phase and metric that changed at all.
    pub changed: usize,
    pub regressions: usize,
    pub improvements: usize,
    /// The median of the changes in percent of the baseline.
    pub median_pct: f64,
    /// The change of largest absolute size in bytes (its point, step, figures and verdict).
    pub largest: Change,
}

/// The report's changes grouped by (phase, metric), phases in the order a point runs them.
pub fn by_phase(rep: &Report) -> Vec<PhaseChange> {
    let mut groups: BTreeMap<(Option<Phase>, Metric), Vec<&Change>> = BTreeMap::new();
    for c in &rep.changes {
        groups.entry((c.phase, c.metric)).or_default().push(c);
    }
    groups
        .into_iter()
        .map(|((phase, metric), cs)| {
            let mut pcts: Vec<f64> = cs.iter().map(|c| c.pct).collect();
            pcts.sort_by(f64::total_cmp);
            let n = pcts.len();
            let median_pct = if n % 2 == 1 {
                pcts[n / 2]
            } else {
                (pcts[n / 2 - 1] + pcts[n / 2]) / 2.0
            };
            let count = |v: Verdict| cs.iter().filter(|c| c.verdict == v).count();
            PhaseChange {
                phase,
                metric,
                changed: n,
                regressions: count(Verdict::Regression),
                improvements: count(Verdict::Improvement),
                median_pct,
                largest: (*cs
                    .iter()
                    .max_by_key(|c| c.delta.unsigned_abs())
                    .expect("a group has a change"))
                .clone(),
            }
        })
        .collect()
}
