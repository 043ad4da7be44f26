//! Figures that set one source against another: the fitted constants' predictions against
//! measured peaks (parity), and candle against torch per phase.
use super::rows::{gib, ok, phase_name, slug, Row};
use super::{Chart, Figure, Kind, Series, Style};
use crate::fit::{Constants, GroupKey, Target};
use crate::record::Record;
use crate::terms::record_terms;
use crate::units::GIB;
use crate::vocab::Runtime;
use std::collections::BTreeMap;

/// Predicted (fitted constants) against measured peak allocated, one series per phase, with
/// the y = x line and ±1% and ±5% bands.
pub(super) fn parity(recs: &[&Record], c: &Constants, title: &str, stem: &str) -> Option<Figure> {
    let mut by_phase: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut hi: f64 = 0.0;
    for r in recs {
        let (Some(key), Some(x), Some(y)) = (GroupKey::of(r), record_terms(r), r.peak_allocated)
        else {
            continue;
        };
        let Some(g) = c.find(&key, Target::PeakAllocated) else {
            continue;
        };
        let p = g.model.predict(&x).max(0.0);
        hi = hi.max(p).max(y as f64);
        by_phase
            .entry(phase_name(r.phase))
            .or_default()
            .push((gib(y), p / GIB));
    }
    if by_phase.is_empty() {
        return None;
    }
    let top = hi / GIB * 1.05;
    let line = |name: &str, k: f64, style| Series {
        name: name.into(),
        points: vec![(0.0, 0.0), (top, top * k)],
        style,
    };
    let mut series: Vec<Series> = by_phase
        .into_iter()
        .map(|(name, points)| Series {
            name,
            points,
            style: Style::Points,
        })
        .collect();
    series.push(line("predicted = measured", 1.0, Style::Line));
    for (name, k) in [("+1%", 1.01), ("-1%", 0.99), ("+5%", 1.05), ("-5%", 0.95)] {
        series.push(line(name, k, Style::Dashed));
    }
    Some(Figure {
        kind: Kind::Parity,
        stem: format!("{stem}-{}", Kind::Parity.slug()),
        title: format!("predicted vs measured peak allocated — {title}"),
        x_desc: "measured (GiB)".into(),
        y_desc: "predicted by the constants (GiB)".into(),
        chart: Chart::Xy(series),
    })
}

/// Candle against torch per phase for the largest point both measured (decode: its last row).
pub(super) fn runtimes(rows: &[Row]) -> Option<Figure> {
    let side = |rt: Runtime| -> BTreeMap<(String, String), &Record> {
        let mut m = BTreeMap::new();
        for x in rows.iter().filter(|x| x.runtime == rt && ok(x.r)) {
            // Later rows of a phase (decode steps) replace earlier ones: the last one stays.
            m.insert((x.r.point_id.clone(), phase_name(x.r.phase)), x.r);
        }
        m
    };
    let (candle, torch) = (side(Runtime::Candle), side(Runtime::Torch));
    let (id, _) = candle
        .iter()
        .filter(|(k, _)| torch.contains_key(*k))
        .map(|((id, _), r)| (id.clone(), r.peak_allocated.unwrap_or(0)))
        .max_by_key(|(id, p)| (*p, std::cmp::Reverse(id.clone())))?;
    let mut categories = Vec::new();
    let (mut c, mut t) = (Vec::new(), Vec::new());
    for ((pid, phase), r) in &candle {
        if *pid != id {
            continue;
        }
        let Some(tr) = torch.get(&(pid.clone(), phase.clone())) else {
            continue;
        };
        categories.push(phase.clone());
        c.push(gib(r.peak_allocated.unwrap_or(0)));
        t.push(gib(tr.peak_allocated.unwrap_or(0)));
    }
    let r = candle.values().find(|r| r.point_id == id)?;
    Some(Figure {
        kind: Kind::Runtimes,
        stem: slug(&format!("{}-{}", r.model_id, Kind::Runtimes.slug())),
        title: format!(
            "candle vs torch per phase ({}) — {} · {} · {}",
            id.split('/').skip(1).collect::<Vec<_>>().join("/"),
            r.model_id,
            r.backend,
            r.device_name
        ),
        x_desc: "phase".into(),
        y_desc: "peak allocated (GiB)".into(),
        chart: Chart::Bars {
            categories,
            series: vec![("candle".into(), c), ("torch".into(), t)],
            stacked: false,
        },
    })
}
