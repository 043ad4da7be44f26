//! Drawing a [`Figure`] with plotters, as SVG and as PNG, with the shipped font.
use super::{Chart, Figure, Style};
use anyhow::Result;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The font every figure's text uses (Bitstream Vera licence, see LICENSE-DejaVu.txt).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

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
