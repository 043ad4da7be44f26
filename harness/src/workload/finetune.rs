//! LoRA fine-tuning of a video denoiser (issue 17's mode = "train" on a generation model):
//! Wan2.1's DiT, as musubi-tuner and DiffSynth-Studio train it.
//!
//! - The latents (b, 16, (frames − 1)/4 + 1, H/8, W/8) and the umT5 text embeddings
//!   (b, 512, 4096) are cached beforehand, as those trainers do: a step loads only the
//!   transformer (one `load` row) and the cached inputs are seeded tensors made before the
//!   first step (resident, outside every phase).
//! - Flow matching: per sample a seeded t in (0, 1), x_t = (1 − t)·x0 + t·noise; the model
//!   (timestep 1000·t) predicts the velocity, target = noise − x0, MSE loss in f32.
//! - LoRA (`trainable = "lora-rN"`) on every dense layer of every block — self- and
//!   cross-attention q, k, v, o and the feed-forward's two linears — musubi-tuner's Wan
//!   default (all `nn.Linear` of WanAttentionBlock); the base weights are plain tensors (no
//!   variable, no gradient). α = [`crate::model::nn::LORA_ALPHA`] as in the LLM path.
//! - The steps are the LLM path's ([`training::run_steps`]): forward, backward, optimizer and
//!   step_total rows per step; AdamW, SGD or the fused AdamW on the adapters only; gradient
//!   accumulation; `checkpointing = "layer"` re-runs one DiT block at a time.
//!
//! SD and FLUX are refused: their denoisers are candle-transformers' modules, which have no
//! LoRA injection point.
use super::generate::{run_points, GenSource};
use super::training::{self, MicroBatch, TrainSpec};
use crate::error::bad_file;
use crate::meter::{Meter, PhaseMemory};
use crate::model::nn::Lora;
use crate::model::pipeline::{self, record};
use crate::model::wan::{self, WanConfig, WanTransformerConfig};
use crate::model::wan_dit::{Cond, WanDit};
use crate::record::{Phase, Record, Status};
use crate::scenario::spec::{is_pipeline_source, key_line, NO_LORA_REASON};
use crate::scenario::Spec;
use crate::vocab::{
    Attention, Checkpointing, Component, GenModel, Mode, Optimizer, Precision, Resolution,
    Trainable,
};
use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// One fine-tuning point.
#[derive(Clone, Debug, PartialEq)]
pub struct FtPoint {
    pub id: String,
    pub source: String,
    pub model_id: String,
    pub precision: Precision,
    pub attention: Attention,
    pub resolution: Resolution,
    pub frames: usize,
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

impl FtPoint {
    fn train_spec(&self) -> TrainSpec {
        TrainSpec {
            batch: self.batch,
            seq: wan::TEXT_LEN,
            optimizer: self.optimizer,
            checkpointing: self.checkpointing,
            grad_accum: self.grad_accum,
            steps: self.steps,
            lr: self.lr,
        }
    }
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
                        for &frames in s.frames.as_deref().unwrap_or_default() {
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
                                let mut id = format!(
                                    "{model_id}/train/{precision}/{resolution}/f{frames}/b{batch}/{optimizer}/{checkpointing}/ga{ga}/{trainable}"
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

/// The Wan config of a fine-tuning source: the published 1.3B for `synthetic:`, a WanPipeline
/// directory's `transformer/config.json`; any other pipeline is refused ([`NO_LORA_REASON`]).
pub fn config_of(src: &GenSource) -> Result<WanTransformerConfig> {
    match src {
        GenSource::Synthetic(GenModel::Wan21T2v13b) => Ok(WanConfig::t2v_1_3b().transformer),
        GenSource::Synthetic(m) => Err(crate::error::InputError::arg(format!(
            "mode = \"train\" on `{m}`: {NO_LORA_REASON}"
        ))
        .into()),
        GenSource::Diffusers(dir) => {
            let index = dir.join("model_index.json");
            let class = pipeline::read_json::<serde_json::Value>(&index)?["_class_name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if class != "WanPipeline" {
                return Err(bad_file(
                    &index,
                    format!("`_class_name` `{class}`: mode = \"train\": {NO_LORA_REASON}"),
                ));
            }
            pipeline::read_json(&dir.join("transformer/config.json"))
        }
    }
}

/// The transformer's stored tensors (diffusers names and shapes).
pub fn shapes(c: &WanTransformerConfig) -> pipeline::Shapes {
    record(|vb| WanDit::new(c, vb, Attention::Eager).map(|_| ()))
}

/// The directory holding the transformer of `src` in `dtype`: a diffusers directory as it
/// is, or (synthetic) `transformer/` written once under `$VRAMLAB_MODELS/synthetic-gen/`.
fn prepare(src: &GenSource, c: &WanTransformerConfig, dtype: DType) -> Result<PathBuf> {
    match src {
        GenSource::Diffusers(dir) => Ok(dir.clone()),
        GenSource::Synthetic(m) => {
            let root = PathBuf::from(
                crate::model::source::expand_env("${VRAMLAB_MODELS}")
                    .map_err(crate::error::InputError::arg)?,
            );
            let dir = root.join("synthetic-gen").join(format!(
                "{}-{}-transformer",
                m.as_str(),
                dtype.as_str()
            ));
            pipeline::write_config(&dir, Component::Transformer, c)?;
            let file = pipeline::weights_file(&dir, Component::Transformer);
            if !file.exists() {
                crate::model::synth::write_tensors(
                    shapes(c),
                    dtype,
                    crate::model::synth::SEED,
                    &file,
                )?;
            }
            Ok(dir)
        }
    }
}

/// Checks every point before measuring: the model (Wan only), the resolution (a multiple of
/// 16), frames (4k + 1), LoRA. One line naming the file, the line and the key.
fn check(path: &Path, text: &str, points: &[FtPoint]) -> Result<()> {
    for p in points {
        let at = |key: &str, msg: String| match key_line(text, p.table, key) {
            Some(line) => bad_file(path, format!("line {line}: [sweep] {msg}")),
            None => bad_file(path, format!("[sweep] {msg}")),
        };
        let src = GenSource::parse(&p.source)
            .map_err(|e| bad_file(path, format!("[model] source: {e}")))?;
        config_of(&src).map_err(|e| at("mode", crate::error::one_line(&e)))?;
        let r = p.resolution;
        if !r.width.is_multiple_of(16) || !r.height.is_multiple_of(16) {
            return Err(at(
                "resolution",
                format!("resolution `{r}` is not a multiple of 16 (Wan's VAE stride 8 × patch 2)"),
            ));
        }
        if p.frames == 0 || !(p.frames - 1).is_multiple_of(4) {
            return Err(at(
                "frames",
                format!(
                    "frames {} is not 4k + 1 (Wan's VAE keeps the first frame, then 4 per latent frame)",
                    p.frames
                ),
            ));
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

/// `vramlab sweep` of a scenario whose tables are all `mode = "train"` on a diffusion
/// pipeline: measures each point in this process (the transformer loaded per point), writes
/// each row as it is measured and the manifest beside the CSV. `open` opens the output once
/// the scenario is checked (creating or resuming it) and returns the finished points' ids.
pub fn sweep(
    scenario: &Path,
    spec: &Spec,
    text: &str,
    out: &Path,
    dry_run: bool,
    open: impl FnOnce(&HashSet<String>) -> Result<HashSet<String>>,
) -> Result<()> {
    let points = expand(spec);
    let ids: Vec<String> = points.iter().map(|p| p.id.clone()).collect();
    let checked = || check(scenario, text, &points);
    run_points(
        scenario,
        spec,
        text,
        out,
        dry_run,
        &ids,
        checked,
        open,
        |i, run| {
            let p = &points[i];
            let src = GenSource::parse(&p.source).map_err(crate::error::InputError::arg)?;
            let cfg = config_of(&src)?;
            let dtype = p.precision.dtype();
            let dir = prepare(&src, &cfg, dtype)?;
            run.weights(&p.model_id, &p.source, || {
                pipeline::weights_files(&dir, Component::Transformer)
            })?;
            let base = Record {
                architecture: "wan".into(),
                param_count: wan::transformer_params(&cfg),
                weight_source: src.kind().into(),
                mode: Mode::Train,
                precision: p.precision,
                batch: p.batch as u64,
                context: wan::TEXT_LEN as u64,
                optimizer: p.optimizer,
                checkpointing: Some(p.checkpointing),
                grad_accum: Some(p.grad_accum as u64),
                trainable: Some(p.trainable),
                attention: p.attention,
                resolution: Some(p.resolution),
                frames: Some(p.frames as u64),
                ..run.base(&p.id, &p.model_id)
            };
            run.meter.trim()?;
            let rows = measure_point(&cfg, &dir, p, &run.dev, run.meter.as_mut(), &base);
            run.write_point(&base, rows)
        },
    )
}

/// Loads the transformer (a `load` row), attaches the adapters and runs the steps.
fn measure_point(
    cfg: &WanTransformerConfig,
    dir: &Path,
    p: &FtPoint,
    dev: &Device,
    meter: &mut dyn Meter,
    base: &Record,
) -> Result<Vec<Record>> {
    let dtype = p.precision.dtype();
    let (mut dit, load_mem, load_ms) = super::phase(meter, Phase::Load, || {
        let vb = pipeline::var_builder(dir, Component::Transformer, dtype, dev)?;
        Ok(WanDit::new(cfg, vb, p.attention)?)
    })?;
    let Trainable::Lora(rank) = p.trainable else {
        return Err(anyhow!("{}: LoRA only (checked before)", p.id));
    };
    let vars = attach_lora(&mut dit, rank, dtype, dev)?;
    let lora_params: usize = vars.iter().map(|v| v.elem_count()).sum();
    let (w, lora) = (
        wan::transformer_params(cfg) * dtype.size_in_bytes() as u64,
        (lora_params * dtype.size_in_bytes()) as u64,
    );
    let state = match p.optimizer {
        Optimizer::Adamw | Optimizer::AdamwFused => 2 * lora,
        _ => 0,
    };
    let row = |phase: Phase, mem: &PhaseMemory, ms: f64| {
        let mut r = Record {
            phase: Some(phase),
            elapsed_ms: Some(ms),
            status: Some(Status::Ok),
            feature_weight_bytes: Some(w + lora),
            feature_optimizer_bytes: Some(state),
            ..base.clone()
        };
        r.set_memory(mem);
        r
    };
    let mut load = row(Phase::Load, &load_mem, load_ms);
    load.component = Some(Component::Transformer);
    load.feature_weight_bytes = Some(w);
    load.message = format!("lora_params={lora_params}");
    let mut rows = vec![load];
    let inputs = Inputs::new(cfg, p, dtype, dev)?;
    crate::supervisor::mark_phase(Phase::Warmup);
    warm_up(&dit, &inputs, p.grad_accum)?;
    run(
        &dit,
        &vars,
        &inputs,
        &p.train_spec(),
        meter,
        &mut |r, loss| {
            let mut rec = row(r.phase, &r.mem, r.elapsed_ms);
            rec.step = r.step;
            rec.message = format!("loss={loss:.6}");
            rows.push(rec);
            Ok(())
        },
    )?;
    Ok(rows)
}

/// Rank-`rank` LoRA adapters (PEFT's init, `model::trainable::lora_adapters`) on every block
/// linear of `dit`, in `dtype` on `dev`: the trainable variables, A then B per layer.
pub fn attach_lora(dit: &mut WanDit, rank: u32, dtype: DType, dev: &Device) -> Result<Vec<Var>> {
    let mut layers = dit.linears_mut();
    let mut targets = Vec::with_capacity(layers.len());
    for (name, l) in &layers {
        let crate::model::nn::Weight::Dense(w) = &l.w else {
            return Err(anyhow!("{name}: LoRA on a quantized weight"));
        };
        let (o, i) = w.dims2()?;
        targets.push((name.clone(), i, o));
    }
    let adapters = crate::model::trainable::lora_adapters(&targets, rank, dtype, dev)?;
    let mut by_name: HashMap<String, Var> = adapters.iter().cloned().collect();
    for (name, l) in layers.iter_mut() {
        let [a, b] = crate::model::nn::lora_names(name);
        let take = |n: &str, m: &mut HashMap<String, Var>| {
            m.remove(n).ok_or_else(|| anyhow!("no adapter `{n}`"))
        };
        let (a, b) = (take(&a, &mut by_name)?, take(&b, &mut by_name)?);
        l.lora = Some(Lora {
            a: a.as_tensor().clone(),
            b: b.as_tensor().clone(),
        });
    }
    Ok(adapters.into_iter().map(|(_, v)| v).collect())
}

/// The cached inputs of a point: clean latents x0, noise, timesteps t in (0, 1) and text
/// embeddings, seeded, in the transformer's dtype (t in f32).
pub struct Inputs {
    pub x0: Tensor,
    pub noise: Tensor,
    pub t: Tensor,
    pub text: Tensor,
}

impl Inputs {
    /// Latents (b, in_channels, (frames − 1)/4 + 1, H/8, W/8), text (b, 512, text_dim).
    pub fn new(c: &WanTransformerConfig, p: &FtPoint, dtype: DType, dev: &Device) -> Result<Self> {
        let r = p.resolution;
        let shape = (
            p.batch,
            c.in_channels,
            (p.frames - 1) / 4 + 1,
            r.height / 8,
            r.width / 8,
        );
        Self::of_shape(shape, (p.batch, wan::TEXT_LEN, c.text_dim), dtype, dev)
    }

    pub fn of_shape(
        latents: (usize, usize, usize, usize, usize),
        text: (usize, usize, usize),
        dtype: DType,
        dev: &Device,
    ) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(11);
        let t: Vec<f32> = (0..latents.0)
            .map(|_| rng.random_range(0.001f32..0.999))
            .collect();
        let t = Tensor::from_vec(t, latents.0, dev)?;
        // Standard normal values from the seeded generator (Box–Muller): candle's CPU `randn`
        // draws from an unseeded thread generator, so the loss would change from run to run.
        let mut randn = |s: &[usize]| -> Result<Tensor> {
            let n = s.iter().product::<usize>();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    let (u1, u2) = (1.0 - rng.random::<f32>(), rng.random::<f32>());
                    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
                })
                .collect();
            Ok(Tensor::from_vec(v, s, dev)?.to_dtype(dtype)?)
        };
        let (b, c, f, h, w) = latents;
        Ok(Inputs {
            x0: randn(&[b, c, f, h, w])?,
            noise: randn(&[b, c, f, h, w])?,
            t,
            text: randn(&[text.0, text.1, text.2])?,
        })
    }
}

/// One flow-matching micro-batch: the noisy latents' hidden states come from the patch
/// embedding, the blocks run on them under the conditioning, the head's prediction is
/// compared with the velocity target.
struct FlowBatch<'a> {
    dit: &'a WanDit,
    x_t: Tensor,
    cond: Cond,
    target: Tensor,
}

impl MicroBatch for FlowBatch<'_> {
    fn num_layers(&self) -> usize {
        self.dit.num_blocks()
    }
    fn embed(&self) -> Result<Tensor> {
        Ok(self.dit.embed(&self.x_t)?)
    }
    fn layer(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        Ok(self.dit.block(i, x, &self.cond)?)
    }
    fn loss(&self, x: &Tensor) -> Result<Tensor> {
        let pred = self.dit.head(x, &self.cond)?.to_dtype(DType::F32)?;
        let target = self.target.to_dtype(DType::F32)?;
        Ok((pred - target)?.sqr()?.mean_all()?)
    }
}

/// Micro-batch `k` of `n`: x_t = (1 − t)·x0 + t·noise, target = noise − x0, the conditioning
/// at timestep 1000·t.
fn flow_batch<'a>(dit: &'a WanDit, inp: &Inputs, k: usize, n: usize) -> Result<FlowBatch<'a>> {
    let mb = inp.x0.dim(0)? / n;
    let part = |t: &Tensor| t.narrow(0, k * mb, mb);
    let (x0, noise, t) = (part(&inp.x0)?, part(&inp.noise)?, part(&inp.t)?);
    let dt = x0.dtype();
    let tb = t.to_dtype(dt)?.reshape((mb, 1, 1, 1, 1))?;
    let x_t = (x0.broadcast_mul(&(tb.neg()? + 1.0)?)? + noise.broadcast_mul(&tb)?)?;
    let target = (&noise - &x0)?;
    let cond = dit.condition(&x_t, &(t * 1000.0)?, &part(&inp.text)?)?;
    Ok(FlowBatch {
        dit,
        x_t,
        cond,
        target,
    })
}

/// One unmeasured forward and backward of micro-batch 0 (its gradients dropped, no optimizer
/// step): candle's CPU gemm keeps a buffer per thread and shape class, which would otherwise
/// stay in the first measured step's figures (4.4 MB in the 1.3B's step-1 gradients).
fn warm_up(dit: &WanDit, inputs: &Inputs, n: usize) -> Result<()> {
    let m = flow_batch(dit, inputs, 0, n.max(1))?;
    drop(m.forward_loss()?.backward()?);
    Ok(())
}

/// `spec.steps` LoRA steps of `dit` (adapters `vars`) on the cached `inputs`: the LLM path's
/// phases and rows ([`training::run_steps`]). Returns each step's loss.
pub fn run(
    dit: &WanDit,
    vars: &[Var],
    inputs: &Inputs,
    spec: &TrainSpec,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(super::inference::PhaseResult, f32) -> Result<()>,
) -> Result<Vec<f32>> {
    let n = spec.grad_accum.max(1);
    training::run_steps(vars, spec, meter, emit, &|k| {
        Ok(Box::new(flow_batch(dit, inputs, k, n)?))
    })
}
