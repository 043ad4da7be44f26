//! Inference figures: peak allocated against context or batch, and the KV cache over decode.
use super::rows::{gib, ok};
use super::{Chart, Figure, Kind, Series, Style};
use crate::record::{Phase, Record};
use crate::vocab::{KvKind, Mode};
use std::collections::{BTreeMap, BTreeSet};

/// Peak allocated of the inference `total` rows against context (at the smallest batch) or
/// batch (at the largest context), one series per precision and KV cache kind.
pub(super) fn sweep_axis(recs: &[&Record], title: &str, stem: &str, kind: Kind) -> Option<Figure> {
    let totals: Vec<&Record> = recs
        .iter()
        .copied()
        .filter(|r| ok(r) && r.mode == Mode::Infer && r.phase == Some(Phase::Total))
        .collect();
    let (fixed_name, fixed, axis): (&str, u64, fn(&Record) -> u64) = match kind {
        Kind::Context => ("batch", totals.iter().map(|r| r.batch).min()?, |r| {
            r.context
        }),
        _ => ("context", totals.iter().map(|r| r.context).max()?, |r| {
            r.batch
        }),
    };
    let at: Vec<&Record> = totals
        .into_iter()
        .filter(|r| match kind {
            Kind::Context => r.batch == fixed,
            _ => r.context == fixed,
        })
        .collect();
    if at.iter().map(|r| axis(r)).collect::<BTreeSet<_>>().len() < 2 {
        return None;
    }
    let mut series: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    for r in at {
        let e = series
            .entry(format!(
                "{} {}",
                r.precision,
                r.kv_cache.map_or("", |k| k.as_str())
            ))
            .or_default()
            .entry(axis(r))
            .or_default();
        *e = (*e).max(r.peak_allocated.unwrap_or(0));
    }
    let (x_desc, what) = match kind {
        Kind::Context => ("context (tokens)", "context"),
        _ => ("batch (sequences)", "batch"),
    };
    Some(Figure {
        kind,
        stem: format!("{stem}-{}", kind.slug()),
        title: format!("peak allocated vs {what} ({fixed_name} {fixed}) — {title}"),
        x_desc: x_desc.into(),
        y_desc: "peak allocated (GiB)".into(),
        chart: Chart::Xy(
            series
                .into_iter()
                .map(|(name, pts)| Series {
                    name,
                    points: pts.into_iter().map(|(x, y)| (x as f64, gib(y))).collect(),
                    style: Style::Line,
                })
                .collect(),
        ),
    })
}

/// Allocated (end of step) and reserved (peak) over decode steps for the largest inference
/// point of the first precision, one pair of series per KV cache kind.
pub(super) fn kv_curve(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
    let decode: Vec<&Record> = recs
        .iter()
        .copied()
        .filter(|r| ok(r) && r.phase == Some(Phase::Decode) && r.kv_tokens.is_some())
        .collect();
    let precision = decode.iter().map(|r| r.precision).min()?;
    let (b, c) = decode
        .iter()
        .filter(|r| r.precision == precision)
        .map(|r| (r.batch, r.context))
        .max_by_key(|(b, c)| (b * c, *b))?;
    let mut series = Vec::new();
    let kinds: BTreeSet<Option<KvKind>> = decode.iter().map(|r| r.kv_cache).collect();
    for kv in kinds {
        let pts: Vec<&Record> = decode
            .iter()
            .copied()
            .filter(|r| {
                r.precision == precision && r.batch == b && r.context == c && r.kv_cache == kv
            })
            .collect();
        // The first repeat only.
        let Some(id) = pts.first().map(|r| r.point_id.clone()) else {
            continue;
        };
        let pts: Vec<&Record> = pts.into_iter().filter(|r| r.point_id == id).collect();
        for (label, get) in [
            (
                "allocated",
                (|r: &Record| r.end_allocated) as fn(&Record) -> Option<u64>,
            ),
            ("reserved", |r: &Record| r.peak_reserved),
        ] {
            series.push(Series {
                name: format!("{label} ({})", kv.map_or("", |k| k.as_str())),
                points: pts
                    .iter()
                    .filter_map(|r| Some((r.kv_tokens? as f64, gib(get(r)?))))
                    .collect(),
                style: if label == "allocated" {
                    Style::Line
                } else {
                    Style::Dashed
                },
            });
        }
    }
    if series.is_empty() {
        return None;
    }
    Some(Figure {
        kind: Kind::KvCurve,
        stem: format!("{stem}-{}", Kind::KvCurve.slug()),
        title: format!("KV cache over decode ({precision} b{b} c{c}) — {title}"),
        x_desc: "live KV tokens per sequence".into(),
        y_desc: "bytes (GiB): allocated at step end, reserved peak".into(),
        chart: Chart::Xy(series),
    })
}
