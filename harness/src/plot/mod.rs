//! `vramlab plot`: figures from calibration CSVs, drawn with plotters as SVG and as PNG (the
//! PNG text uses the DejaVu Sans font shipped in `harness/assets/fonts`, so no system font is
//! needed). Axes are in GiB; titles name the model, runtime, backend and device.
//!
//! [`figures`] turns records into [`Figure`]s (pure data, tested): `figures.rs` picks the rows
//! and the helpers every figure shares, one file per figure kind builds it (`inference.rs`,
//! `training.rs`, `generation.rs`, `parity.rs`); [`render`] (`draw.rs`) draws one.

mod draw;
mod figures;
mod generation;
mod inference;
mod parity;
mod rows;
mod training;

pub use draw::{register_font, render};
pub use figures::figures;

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
