//! Fine-tuning points (mode = "train" on a diffusion pipeline): a scenario's tables expanded
//! in order, and their checks against each denoiser before anything is measured.
use crate::error::bad_file;
use crate::model::diffusion::denoiser::{config_of, FtModel};
use crate::model::diffusion::GenSource;
use crate::scenario::spec::{is_pipeline_source, key_line};
use crate::scenario::Spec;
use crate::vocab::{Attention, Checkpointing, Mode, Optimizer, Precision, Resolution, Trainable};
use anyhow::Result;
use std::path::Path;

/// One fine-tuning point.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FtPoint {
    pub id: String,
    pub source: String,
    pub model_id: String,
    pub precision: Precision,
    pub attention: Attention,
    pub resolution: Resolution,
    /// A video model's frames (the table's `frames`; None for an image model).
    pub frames: Option<usize>,
    pub batch: usize,
    pub optimizer: Optimizer,
    pub trainable: Trainable,
    pub checkpointing: Checkpointing,
    pub grad_accum: usize,
    pub steps: usize,
    pub lr: f64,
    pub repeat: usize,
    /// The index of the `[sweep]` table the point comes from (for error lines).
    pub table: usize,
}

/// The fine-tuning points of a scenario (its `mode = ["train"]` tables on diffusion
/// pipelines), in table order
/// (source, precision, attention, resolution, frames, batch, optimizer, trainable,
/// checkpointing, accumulation).
pub fn expand(spec: &Spec) -> Vec<FtPoint> {
    let mut v = Vec::new();
    for (table, s) in spec.sweep.0.iter().enumerate() {
        let sources = s.source.as_ref().unwrap_or(&spec.model.source).to_vec();
        if !s.mode.contains(&Mode::Train) || !sources.iter().all(|s| is_pipeline_source(s)) {
            continue;
        }
        let mut axes = Vec::new();
        for src in &sources {
            for &precision in &s.precision {
                for &attention in &s.attention {
                    for &resolution in &s.resolution {
                        let frames: Vec<Option<usize>> = match &s.frames {
                            Some(f) => f.iter().map(|&f| Some(f)).collect(),
                            None => vec![None],
                        };
                        for &frames in &frames {
                            for &batch in &s.batch {
                                axes.push((src, precision, attention, resolution, frames, batch));
                            }
                        }
                    }
                }
            }
        }
        for (src, precision, attention, resolution, frames, batch) in axes {
            let model_id = src.rsplit([':', '/']).next().unwrap_or(src).to_string();
            for &optimizer in &s.optimizer {
                for &trainable in &s.trainable {
                    for &checkpointing in &s.checkpointing {
                        for &ga in &s.grad_accum {
                            for repeat in 0..s.repeats {
                                let f = frames.map_or(String::new(), |f| format!("/f{f}"));
                                let mut id = format!(
                                    "{model_id}/train/{precision}/{resolution}{f}/b{batch}/{optimizer}/{checkpointing}/ga{ga}/{trainable}"
                                );
                                if attention != Attention::Eager {
                                    id += &format!("/{attention}");
                                }
                                if s.repeats > 1 {
                                    id += &format!("/r{repeat}");
                                }
                                v.push(FtPoint {
                                    id,
                                    source: src.clone(),
                                    model_id: model_id.clone(),
                                    precision,
                                    attention,
                                    resolution,
                                    frames,
                                    batch: batch as usize,
                                    optimizer,
                                    trainable,
                                    checkpointing,
                                    grad_accum: ga as usize,
                                    steps: s.train_steps,
                                    lr: s.lr,
                                    repeat,
                                    table,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

/// Checks every point before measuring: the model (Wan only), the resolution (a multiple of
/// 16), frames (4k + 1), LoRA. One line naming the file, the line and the key.
pub fn check(path: &Path, text: &str, points: &[FtPoint]) -> Result<()> {
    for p in points {
        let at = |key: &str, msg: String| match key_line(text, p.table, key) {
            Some(line) => bad_file(path, format!("line {line}: [sweep] {msg}")),
            None => bad_file(path, format!("[sweep] {msg}")),
        };
        let src = GenSource::parse(&p.source)
            .map_err(|e| bad_file(path, format!("[model] source: {e}")))?;
        let model = config_of(&src).map_err(|e| at("mode", crate::error::one_line(&e)))?;
        let r = p.resolution;
        match (&model, p.frames) {
            (FtModel::Wan(_), frames) => {
                if !r.width.is_multiple_of(16) || !r.height.is_multiple_of(16) {
                    return Err(at(
                        "resolution",
                        format!("resolution `{r}` is not a multiple of 16 (Wan's VAE stride 8 × patch 2)"),
                    ));
                }
                let Some(f) = frames else {
                    return Err(at(
                        "frames",
                        "`frames` is missing: Wan2.1 is a video model (frames 4k+1, e.g. [5, 9])"
                            .into(),
                    ));
                };
                if f == 0 || !(f - 1).is_multiple_of(4) {
                    return Err(at(
                        "frames",
                        format!(
                            "frames {f} is not 4k + 1 (Wan's VAE keeps the first frame, then 4 per latent frame)"
                        ),
                    ));
                }
            }
            (FtModel::Sd(c), frames) => {
                // The latents halve at each downsampler and must double back exactly.
                let m = c.vae.scale() << (c.unet.block_out_channels.len() - 1);
                if !r.width.is_multiple_of(m) || !r.height.is_multiple_of(m) {
                    return Err(at(
                        "resolution",
                        format!("resolution `{r}` is not a multiple of {m} (the VAE's stride × the UNet's downsamplers)"),
                    ));
                }
                if frames.is_some() {
                    return Err(at(
                        "frames",
                        "`frames` on Stable Diffusion: an image model has none".into(),
                    ));
                }
                if p.checkpointing == Checkpointing::Layer {
                    return Err(at(
                        "checkpointing",
                        "checkpointing `layer` on Stable Diffusion: the UNet's skips cross its levels, so it is not a stack of layers to re-run (use `none`)".into(),
                    ));
                }
            }
        }
        if !matches!(p.trainable, Trainable::Lora(_)) {
            return Err(at(
                "trainable",
                format!(
                    "trainable `{}`: a denoiser is fine-tuned with LoRA only (`lora-rN`)",
                    p.trainable
                ),
            ));
        }
    }
    Ok(())
}
