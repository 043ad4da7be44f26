//! Generation figures: each point's peak built up phase by phase, and the VAE decode's peak
//! against output pixels.
use super::rows::{gib, ok, stack, varying_labels};
use super::{Chart, Figure, Kind, Series, Style};
use crate::record::{Phase, Record};
use crate::vocab::Mode;
use std::collections::BTreeMap;

/// The ok generation rows of `recs`, and their point ids in order.
fn generation<'a>(recs: &[&'a Record]) -> (Vec<&'a Record>, Vec<String>) {
    let gen: Vec<&Record> = recs
        .iter()
        .copied()
        .filter(|r| ok(r) && r.mode == Mode::Generate)
        .collect();
    let mut ids: Vec<String> = Vec::new();
    for r in &gen {
        if !ids.contains(&r.point_id) {
            ids.push(r.point_id.clone());
        }
    }
    (gen, ids)
}

/// Per generation point, its peak built up phase by phase: what was resident before the text
/// encode (the weights), then what the text encode, the denoising steps and the VAE decode each
/// raised the peak by. The stack's height is the point's peak; the phase that adds the last
/// segment holds it.
pub(super) fn gen_phases(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
    let (gen, ids) = generation(recs);
    let names = [
        "resident before text_encode",
        "text_encode",
        "denoise",
        "vae_decode",
    ];
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut categories = Vec::new();
    for id in ids {
        let rs: Vec<&&Record> = gen.iter().filter(|r| r.point_id == id).collect();
        let peak = |ph: Phase| {
            rs.iter()
                .filter(|r| r.phase == Some(ph))
                .filter_map(|r| r.peak_allocated)
                .max()
        };
        let start = rs
            .iter()
            .find(|r| r.phase == Some(Phase::TextEncode))
            .and_then(|r| r.baseline_allocated);
        let (Some(start), Some(t), Some(d), Some(v)) = (
            start,
            peak(Phase::TextEncode),
            peak(Phase::Denoise),
            peak(Phase::VaeDecode),
        ) else {
            continue;
        };
        for (col, s) in values.iter_mut().zip(stack(start, &[t, d, v])) {
            col.push(s);
        }
        categories.push(id);
    }
    if categories.is_empty() {
        return None;
    }
    Some(Figure {
        kind: Kind::GenPhases,
        stem: format!("{stem}-{}", Kind::GenPhases.slug()),
        title: format!("generation peak by phase — {title}"),
        x_desc: "point (the parts of its id that differ)".into(),
        y_desc: "peak allocated (GiB)".into(),
        chart: Chart::Bars {
            categories: varying_labels(&categories),
            series: names.iter().map(|n| n.to_string()).zip(values).collect(),
            stacked: true,
        },
    })
}

/// The VAE decode's peak over its baseline against the output pixels of the batch (millions),
/// one series per precision and decode kind: a line for `full`, flat for `sliced` and `tiled`
/// apart from the output.
pub(super) fn decode_pixels(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
    let (gen, _) = generation(recs);
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in gen.iter().filter(|r| r.phase == Some(Phase::VaeDecode)) {
        let (Some(res), Some(decode), Some(peak), Some(base)) = (
            r.resolution,
            r.vae_decode,
            r.peak_allocated,
            r.baseline_allocated,
        ) else {
            continue;
        };
        let px = (res.pixels() as u64 * r.batch) as f64 / 1e6;
        series
            .entry(format!("{} {decode}", r.precision))
            .or_default()
            .push((px, gib(peak.saturating_sub(base))));
    }
    if series.values().all(|p| p.len() < 2) {
        return None;
    }
    Some(Figure {
        kind: Kind::DecodePixels,
        stem: format!("{stem}-{}", Kind::DecodePixels.slug()),
        title: format!("VAE decode peak vs output pixels — {title}"),
        x_desc: "output pixels of the batch (millions)".into(),
        y_desc: "decode peak over its baseline (GiB)".into(),
        chart: Chart::Xy(
            series
                .into_iter()
                .map(|(name, mut points)| {
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name,
                        points,
                        style: Style::Points,
                    }
                })
                .collect(),
        ),
    })
}
