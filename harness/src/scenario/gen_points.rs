//! Generation points (mode = "generate"): a scenario's tables expanded in order, and their
//! checks against each model before anything is measured.
use crate::error::bad_file;
use crate::model::diffusion::GenShape;
use crate::model::diffusion::GenSource;
use crate::scenario::Spec;
use crate::vocab::{Attention, Mode, Precision, VaeDecode};
use anyhow::Result;
use std::path::Path;

/// One expanded generation point.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenPoint {
    pub id: String,
    pub source: String,
    pub model_id: String,
    pub precision: Precision,
    /// None: the model's default.
    pub vae_precision: Option<Precision>,
    pub attention: Attention,
    pub shape: GenShape,
    pub repeat: usize,
    /// The index of the `[sweep]` table the point comes from (for error lines).
    pub table: usize,
}

/// The generation points of a scenario, in table order (model, precision, attention,
/// resolution, frames, batch, cfg, decode, VAE precision). Ids name the frames (`/f9`) when
/// the table sets `frames`.
pub fn expand(spec: &Spec) -> Vec<GenPoint> {
    let mut v = Vec::new();
    for (table, s) in spec
        .sweep
        .0
        .iter()
        .enumerate()
        .filter(|(_, s)| s.mode.contains(&Mode::Generate))
    {
        let sources = s.source.as_ref().unwrap_or(&spec.model.source).to_vec();
        let vae_p: Vec<Option<Precision>> = if s.vae_precision.is_empty() {
            vec![None]
        } else {
            s.vae_precision.iter().copied().map(Some).collect()
        };
        for src in &sources {
            let default_cfg = GenSource::parse(src).map_or(true, |g| g.default_cfg());
            let model_id = src.rsplit([':', '/']).next().unwrap_or(src).to_string();
            for &precision in &s.precision {
                for &attention in &s.attention {
                    for &resolution in &s.resolution {
                        for &frames in s.frames.as_deref().unwrap_or(&[1]) {
                            for &batch in &s.batch {
                                for &cfg in s.cfg.as_deref().unwrap_or(&[default_cfg]) {
                                    for &vae_decode in &s.vae_decode {
                                        for &vp in &vae_p {
                                            for repeat in 0..s.repeats {
                                                let f = match s.frames {
                                                    Some(_) => format!("/f{frames}"),
                                                    None => String::new(),
                                                };
                                                let mut id = format!(
                                                "{model_id}/generate/{precision}/{resolution}{f}/b{batch}/{}/{vae_decode}",
                                                if cfg { "cfg" } else { "nocfg" }
                                            );
                                                if vae_decode == VaeDecode::Tiled {
                                                    id += &format!("-t{}o{}", s.tile, s.overlap);
                                                }
                                                if let Some(p) = vp {
                                                    id += &format!("/vae-{p}");
                                                }
                                                if attention != Attention::Eager {
                                                    id += &format!("/{attention}");
                                                }
                                                if s.repeats > 1 {
                                                    id += &format!("/r{repeat}");
                                                }
                                                v.push(GenPoint {
                                                    id,
                                                    source: src.clone(),
                                                    model_id: model_id.clone(),
                                                    precision,
                                                    vae_precision: vp,
                                                    attention,
                                                    shape: GenShape {
                                                        batch: batch as usize,
                                                        resolution,
                                                        frames,
                                                        cfg,
                                                        steps: s.denoise_steps,
                                                        vae_decode,
                                                        tile: s.tile,
                                                        overlap: s.overlap,
                                                    },
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
                }
            }
        }
    }
    v
}

/// Checks every point against its model before measuring (the resolution's factor, frames,
/// CFG, the decode, the attention; a video model needs `frames`): one line naming the file,
/// the line and the key, exit 2.
pub fn check(path: &Path, text: &str, spec: &Spec, points: &[GenPoint]) -> Result<()> {
    use crate::model::diffusion::{BadPoint, PointInput};
    for p in points {
        let src = GenSource::parse(&p.source)
            .map_err(|e| bad_file(path, format!("[model] source: {e}")))?;
        let pipe = src.pipeline(p.precision.dtype(), p.vae_precision.map(|v| v.dtype()))?;
        let frames_set = spec.sweep.0[p.table].frames.is_some();
        let missing_frames = match pipe.temporal_factor() {
            Some(t) if !frames_set => Err(BadPoint {
                input: PointInput::Frames,
                problem: format!(
                    "`frames` is missing: {} is a video model (frames {t}k+1, e.g. [{}, {}])",
                    pipe.name(),
                    t + 1,
                    2 * t + 1
                ),
            }),
            _ => Ok(()),
        };
        let checked = missing_frames
            .and_then(|()| pipe.check(&p.shape))
            .and_then(|()| pipe.check_attention(p.attention));
        if let Err(e) = checked {
            let msg = format!("[sweep] {}", e.problem);
            return Err(
                match crate::scenario::spec::key_line(text, p.table, e.input.key()) {
                    Some(line) => bad_file(path, format!("line {line}: {msg}")),
                    None => bad_file(path, msg),
                },
            );
        }
    }
    Ok(())
}
