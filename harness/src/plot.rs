//! `vramlab plot`: figures from calibration CSVs, drawn with plotters as SVG and as PNG (the
//! PNG text uses the DejaVu Sans font shipped in `harness/assets/fonts`, so no system font is
//! needed). Axes are in GiB; titles name the model, runtime, backend and device.
//!
//! [`figures`] turns records into [`Figure`]s (pure data, tested), [`render`] draws one.
use crate::export::csv::Table;
use crate::fit::{Constants, GroupKey, Target};
use crate::record::{Phase, Record, Status};
use crate::terms::record_terms;
use crate::units::GIB;
use crate::vocab::{KvKind, Mode, Runtime};
use anyhow::Result;
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The font every figure's text uses (Bitstream Vera licence, see LICENSE-DejaVu.txt).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Line,
    Points,
    Dashed,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

#[derive(Clone, Debug)]
pub enum Chart {
    /// x/y series.
    Xy(Vec<Series>),
    /// Bars per category: one value per (series, category); stacked or side by side.
    Bars {
        categories: Vec<String>,
        series: Vec<(String, Vec<f64>)>,
        stacked: bool,
    },
}

/// What a figure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Context,
    Batch,
    KvCurve,
    TrainPhases,
    Parity,
    Runtimes,
    GenPhases,
    DecodePixels,
}

impl Kind {
    pub fn slug(self) -> &'static str {
        match self {
            Kind::Context => "context",
            Kind::Batch => "batch",
            Kind::KvCurve => "kv-curve",
            Kind::TrainPhases => "train-phases",
            Kind::Parity => "parity",
            Kind::Runtimes => "candle-vs-torch",
            Kind::GenPhases => "gen-phases",
            Kind::DecodePixels => "decode-pixels",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Figure {
    pub kind: Kind,
    /// File name without extension.
    pub stem: String,
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub chart: Chart,
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB
}

/// A record with the runtime of its file.
struct Row<'a> {
    r: &'a Record,
    runtime: Runtime,
}

fn ok(r: &Record) -> bool {
    r.status == Some(Status::Ok)
}

fn phase_name(p: Option<Phase>) -> String {
    p.map(|p| p.to_string()).unwrap_or_default()
}

/// "SmolLM2 · candle · cpu · AMD EPYC".
fn origin(r: &Record, runtime: Runtime) -> String {
    format!(
        "{} · {runtime} · {} · {}",
        r.model_id, r.backend, r.device_name
    )
}

fn slug(s: &str) -> String {
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

/// Peak allocated of the inference `total` rows against context (at the smallest batch) or
/// batch (at the largest context), one series per precision and KV cache kind.
fn sweep_axis(recs: &[&Record], title: &str, stem: &str, kind: Kind) -> Option<Figure> {
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
fn kv_curve(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
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

/// Per training point, the last step's allocated peak built up phase by phase: what was
/// resident at the step's start, then what the forward, the backward and the optimizer step
/// each raised the peak by. The stack's height is the step's peak (`step_total`).
fn train_phases(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
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

/// What was resident at the start, then how much each later peak raised the running maximum
/// (GiB): a stack whose height is the largest peak.
fn stack(start: u64, peaks: &[u64]) -> Vec<f64> {
    let mut top = start;
    let mut seg = vec![gib(start)];
    for &peak in peaks {
        seg.push(gib(peak.saturating_sub(top)));
        top = top.max(peak);
    }
    seg
}

/// Labels for point ids: the parts of each id that differ between them.
fn varying_labels(ids: &[String]) -> Vec<String> {
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
fn gen_phases(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
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
fn decode_pixels(recs: &[&Record], title: &str, stem: &str) -> Option<Figure> {
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

/// Predicted (fitted constants) against measured peak allocated, one series per phase, with
/// the y = x line and ±1% and ±5% bands.
fn parity(recs: &[&Record], c: &Constants, title: &str, stem: &str) -> Option<Figure> {
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
fn runtimes(rows: &[Row]) -> Option<Figure> {
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

fn e<E: std::fmt::Display>(err: E) -> anyhow::Error {
    anyhow::anyhow!("drawing: {err}")
}

/// The legend every chart draws, in its upper-left corner.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    f: &Figure,
) -> Result<()> {
    root.fill(&WHITE).map_err(e)?;
    let title_font = (FAMILY, 17).into_font();
    let mut b = ChartBuilder::on(&root);
    b.caption(&f.title, title_font)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72);
    match &f.chart {
        Chart::Xy(series) => {
            let pts = series.iter().flat_map(|s| s.points.iter());
            let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
            for &(x, y) in pts {
                x0 = x0.min(x);
                x1 = x1.max(x);
                y1 = y1.max(y);
            }
            if x0 >= x1 {
                x1 = x0 + 1.0;
            }
            let pad = (x1 - x0) * 0.04;
            let mut chart = b
                .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..(y1 * 1.08).max(1e-6))
                .map_err(e)?;
            chart
                .configure_mesh()
                .x_desc(&f.x_desc)
                .y_desc(&f.y_desc)
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 14))
                .draw()
                .map_err(e)?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let anno = match s.style {
                    Style::Line => chart
                        .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
                        .map_err(e)?,
                    Style::Dashed => chart
                        .draw_series(DashedLineSeries::new(
                            s.points.clone(),
                            6,
                            4,
                            color.stroke_width(1),
                        ))
                        .map_err(e)?,
                    Style::Points => chart
                        .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(e)?,
                };
                anno.label(&s.name).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
                });
            }
            legend(&mut chart)?;
        }
        Chart::Bars {
            categories,
            series,
            stacked,
        } => {
            let n = categories.len();
            let top = (0..n)
                .map(|i| {
                    let col = series.iter().map(|(_, v)| v[i]);
                    if *stacked {
                        col.sum::<f64>()
                    } else {
                        col.fold(0.0, f64::max)
                    }
                })
                .fold(0.0, f64::max);
            let mut chart = b
                .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..(top * 1.25).max(1e-6))
                .map_err(e)?;
            let cats = categories.clone();
            let fmt = move |x: &f64| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    cats.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            };
            chart
                .configure_mesh()
                .x_labels(n.max(1))
                .x_label_formatter(&fmt)
                .disable_x_mesh()
                .x_desc(&f.x_desc)
                .y_desc(&f.y_desc)
                .label_style((FAMILY, 12))
                .axis_desc_style((FAMILY, 14))
                .draw()
                .map_err(e)?;
            let k = series.len() as f64;
            let mut base = vec![0f64; n];
            for (j, (name, vals)) in series.iter().enumerate() {
                let color = Palette99::pick(j).to_rgba();
                let rects: Vec<Rectangle<(f64, f64)>> = vals
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let x = i as f64;
                        let (l, r, y0) = if *stacked {
                            (x - 0.35, x + 0.35, base[i])
                        } else {
                            let w = 0.7 / k;
                            let l = x - 0.35 + w * j as f64;
                            (l, l + w * 0.95, 0.0)
                        };
                        Rectangle::new([(l, y0), (r, y0 + v)], color.filled())
                    })
                    .collect();
                if *stacked {
                    for (b, v) in base.iter_mut().zip(vals) {
                        *b += v;
                    }
                }
                chart
                    .draw_series(rects)
                    .map_err(e)?
                    .label(name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                    });
            }
            legend(&mut chart)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Registers the shipped font (once per process).
pub fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    anyhow::ensure!(ok, "the shipped font DejaVuSans.ttf could not be loaded");
    Ok(())
}

/// Draws `f` into `dir` as STEM.svg and STEM.png; returns both paths.
pub fn render(f: &Figure, dir: &Path) -> Result<Vec<PathBuf>> {
    register_font()?;
    let size = (1100, 680);
    let svg = dir.join(format!("{}.svg", f.stem));
    draw(SVGBackend::new(&svg, size).into_drawing_area(), f)?;
    let png = dir.join(format!("{}.png", f.stem));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), f)?;
    Ok(vec![svg, png])
}
