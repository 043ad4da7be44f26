//! The training figure: each point's step peak built up phase by phase.
use super::rows::{ok, stack, varying_labels};
use super::{Chart, Figure, Kind};
use crate::record::{Phase, Record};
use crate::vocab::Mode;

/// Per training point, the last step's allocated peak built up phase by phase: what was
/// resident at the step's start, then what the forward, the backward and the optimizer step
/// each raised the peak by. The stack's height is the step's peak (`step_total`).
pub(super) fn train_phases(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
    let train: Vec<&Record> = recs
        .iter()
        .copied()
        .filter(|r| ok(r) && r.mode == Mode::Train)
        .collect();
    let mut points: Vec<&str> = Vec::new();
    for r in &train {
        if !points.contains(&r.point_id.as_str()) {
            points.push(&r.point_id);
        }
    }
    let names = ["resident at step start", "forward", "backward", "optimizer"];
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut categories = Vec::new();
    for id in points {
        let rs: Vec<&&Record> = train.iter().filter(|r| r.point_id == id).collect();
        let Some(last) = rs.iter().filter_map(|r| r.step).max() else {
            continue;
        };
        let get = |ph: Phase| {
            rs.iter()
                .find(|r| r.phase == Some(ph) && r.step == Some(last))
                .map(|r| {
                    (
                        r.baseline_allocated.unwrap_or(0),
                        r.peak_allocated.unwrap_or(0),
                    )
                })
        };
        let (Some(f), Some(b), Some(o)) = (
            get(Phase::Forward),
            get(Phase::Backward),
            get(Phase::Optimizer),
        ) else {
            continue;
        };
        for (v, s) in values.iter_mut().zip(stack(f.0, &[f.1, b.1, o.1])) {
            v.push(s);
        }
        categories.push(id.to_string());
    }
    if categories.is_empty() {
        return None;
    }
    let categories = varying_labels(&categories);
    Some(Figure {
        kind: Kind::TrainPhases,
        stem: format!("{stem}-{}", Kind::TrainPhases.slug()),
        title: format!("training step peak by phase — {title}"),
        x_desc: "point (the parts of its id that differ)".into(),
        y_desc: "peak allocated (GiB)".into(),
        chart: Chart::Bars {
            categories,
            series: names.iter().map(|n| n.to_string()).zip(values).collect(),
            stacked: true,
        },
    })
}
