//! LoRA fine-tuning of a denoiser (mode = "train" on a generation model): Wan2.1's
//! DiT, as musubi-tuner and DiffSynth-Studio train it, and Stable Diffusion 1.x/2.x's UNet, as
//! diffusers' `train_text_to_image_lora.py` does.
//!
//! - The latents and the text embeddings are cached beforehand, as those trainers do: a step
//!   loads only the denoiser (one `load` row) and the cached inputs are seeded tensors made
//!   before the first step (resident, outside every phase). Wan: latents
//!   (b, 16, (frames − 1)/4 + 1, H/8, W/8), umT5 embeddings (b, 512, 4096). SD: VAE latents
//!   (b, 4, H/8, W/8) standing for the scaled ones (× scaling_factor, about unit variance),
//!   CLIP embeddings (b, 77, cross_attention_dim).
//! - Wan, flow matching: per sample a seeded t in (0, 1), x_t = (1 − t)·x0 + t·noise; the model
//!   (timestep 1000·t) predicts the velocity, target = noise − x0, MSE loss in f32.
//! - SD, the DDPM epsilon objective: per sample a seeded timestep in 0..1000, ᾱ of the
//!   scaled-linear schedule (β from 0.00085 to 0.012), noisy = √ᾱ·x0 + √(1 − ᾱ)·noise; the UNet
//!   predicts the noise, MSE loss in f32.
//! - LoRA (`trainable = "lora-rN"`): Wan on every dense layer of every block — self- and
//!   cross-attention q, k, v, o and the feed-forward's two linears — musubi-tuner's Wan
//!   default (all `nn.Linear` of WanAttentionBlock); SD on every attention's `to_q`, `to_k`,
//!   `to_v`, `to_out.0` (the diffusers script's PEFT targets). The base weights are plain
//!   tensors (no variable, no gradient). α = [`crate::model::nn::LORA_ALPHA`] as in the LLM
//!   path.
//! - The steps are the LLM path's ([`training::run_steps`]): forward, backward, optimizer and
//!   step_total rows per step; AdamW, SGD or the fused AdamW on the adapters only; gradient
//!   accumulation; `checkpointing = "layer"` re-runs one DiT block at a time (Wan only: the
//!   UNet's skips cross its levels, so it is refused for SD).
//!
//! FLUX and SDXL are refused
//! ([`NO_LORA_REASON`](crate::model::diffusion::denoiser::NO_LORA_REASON)).
use super::training::{self, MicroBatch, TrainSpec};
use crate::meter::{Meter, PhaseMemory};
use crate::model::diffusion as pipeline;
use crate::model::diffusion::denoiser::{Denoiser, FtModel};
use crate::model::diffusion::sd::SdUnet;
use crate::model::diffusion::wan::{Cond, WanDit};
use crate::model::diffusion::GenSource;
use crate::model::nn::{Linear, Lora};
use crate::record::{Phase, Record, Status};
use crate::scenario::ft_points::FtPoint;
use crate::vocab::{Optimizer, Trainable};
use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Shape, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The training spec of point `p` on `model`.
fn train_spec(p: &FtPoint, model: &FtModel) -> TrainSpec {
    TrainSpec {
        batch: p.batch,
        seq: model.text_len(),
        optimizer: p.optimizer,
        checkpointing: p.checkpointing,
        grad_accum: p.grad_accum,
        steps: p.steps,
        lr: p.lr,
    }
}

/// The directory holding the denoiser of `src` in `dtype`: a diffusers directory as it is,
/// or (synthetic) its component written once under `$VRAMLAB_MODELS/synthetic-gen/`.
pub fn prepare(src: &GenSource, model: &FtModel, dtype: DType) -> Result<PathBuf> {
    match src {
        GenSource::Diffusers(dir) => Ok(dir.clone()),
        GenSource::Synthetic(m) => {
            let root = PathBuf::from(
                crate::model::source::expand_env("${VRAMLAB_MODELS}")
                    .map_err(crate::error::InputError::arg)?,
            );
            let comp = model.component();
            let dir = root.join("synthetic-gen").join(format!(
                "{}-{}-{}",
                m.as_str(),
                dtype.as_str(),
                comp.as_str()
            ));
            model.write_config(&dir)?;
            let file = pipeline::weights_file(&dir, comp);
            if !file.exists() {
                crate::model::synth::write_tensors(
                    model.shapes(),
                    dtype,
                    crate::model::synth::SEED,
                    &file,
                )?;
            }
            Ok(dir)
        }
    }
}

/// Loads the denoiser (a `load` row), attaches the adapters and runs the steps.
pub fn measure_point(
    model: &FtModel,
    dir: &Path,
    p: &FtPoint,
    dev: &Device,
    meter: &mut dyn Meter,
    base: &Record,
) -> Result<Vec<Record>> {
    let dtype = p.precision.dtype();
    let (mut net, load_mem, load_ms) = super::phase(meter, Phase::Load, || {
        let vb = pipeline::var_builder(dir, model.component(), dtype, dev)?;
        model.load(vb, p.attention)
    })?;
    let Trainable::Lora(rank) = p.trainable else {
        return Err(anyhow!("{}: LoRA only (checked before)", p.id));
    };
    let vars = attach_adapters(net.lora_targets_mut(), rank, dtype, dev)?;
    let lora_params: usize = vars.iter().map(|v| v.elem_count()).sum();
    let (w, lora) = (
        model.params() * dtype.size_in_bytes() as u64,
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
    load.component = Some(model.component());
    load.feature_weight_bytes = Some(w);
    load.message = format!("lora_params={lora_params}");
    let mut rows = vec![load];
    let (latents, text) = model.input_shapes(p.batch, p.resolution, p.frames);
    let inputs = Inputs::of_shape(latents, text, dtype, dev)?;
    crate::progress::mark_phase(Phase::Warmup);
    warm_up((&net).into(), &inputs, p.grad_accum)?;
    run(
        &net,
        &vars,
        &inputs,
        &train_spec(p, model),
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
    attach_adapters(dit.linears_mut(), rank, dtype, dev)
}

/// Rank-`rank` LoRA adapters (PEFT's init) on the named `layers`, in `dtype` on `dev`: the
/// trainable variables, A then B per layer.
pub fn attach_adapters(
    mut layers: Vec<(String, &mut Linear)>,
    rank: u32,
    dtype: DType,
    dev: &Device,
) -> Result<Vec<Var>> {
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

/// The cached inputs of a point: clean latents x0, noise, t in (0, 1) per sample (Wan's
/// flow time; SD's timestep is ⌊1000·t⌋) and text embeddings, seeded, in the denoiser's
/// dtype (t in f32).
pub struct Inputs {
    pub x0: Tensor,
    pub noise: Tensor,
    pub t: Tensor,
    pub text: Tensor,
}

impl Inputs {
    /// Latents of shape `latents` (batch first), text embeddings (b, tokens, dim).
    pub fn of_shape(
        latents: impl Into<Shape>,
        text: (usize, usize, usize),
        dtype: DType,
        dev: &Device,
    ) -> Result<Self> {
        let latents: Shape = latents.into();
        let b = latents.dims()[0];
        let mut rng = StdRng::seed_from_u64(11);
        let t: Vec<f32> = (0..b).map(|_| rng.random_range(0.001f32..0.999)).collect();
        let t = Tensor::from_vec(t, b, dev)?;
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
        Ok(Inputs {
            x0: randn(latents.dims())?,
            noise: randn(latents.dims())?,
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

/// One DDPM micro-batch of the UNet: noisy latents, their timesteps and the text; the
/// prediction is compared with the noise.
struct NoiseBatch<'a> {
    unet: &'a SdUnet,
    noisy: Tensor,
    timesteps: Tensor,
    text: Tensor,
    target: Tensor,
}

impl MicroBatch for NoiseBatch<'_> {
    /// The whole UNet is one layer (its skips cross the levels).
    fn num_layers(&self) -> usize {
        1
    }
    fn embed(&self) -> Result<Tensor> {
        Ok(self.noisy.clone())
    }
    fn layer(&self, _i: usize, x: &Tensor) -> Result<Tensor> {
        Ok(self.unet.forward(x, &self.timesteps, &self.text)?)
    }
    fn loss(&self, x: &Tensor) -> Result<Tensor> {
        let target = self.target.to_dtype(DType::F32)?;
        Ok((x.to_dtype(DType::F32)? - target)?.sqr()?.mean_all()?)
    }
}

/// ᾱ at each of SD's 1000 training timesteps: the cumulative product of 1 − β, β of the
/// scaled-linear schedule (√β evenly spaced from √0.00085 to √0.012; diffusers'
/// DDPMScheduler of SD 1.x/2.x).
pub fn alphas_cumprod() -> Vec<f64> {
    let (a, b, n) = (0.00085f64.sqrt(), 0.012f64.sqrt(), 1000);
    let mut acc = 1.0;
    (0..n)
        .map(|i| {
            let beta = (a + (b - a) * i as f64 / (n - 1) as f64).powi(2);
            acc *= 1.0 - beta;
            acc
        })
        .collect()
}

/// Micro-batch `k` of `n`: timestep ⌊1000·t⌋, noisy = √ᾱ·x0 + √(1 − ᾱ)·noise, target = noise.
fn noise_batch<'a>(unet: &'a SdUnet, inp: &Inputs, k: usize, n: usize) -> Result<NoiseBatch<'a>> {
    let mb = inp.x0.dim(0)? / n;
    let part = |t: &Tensor| t.narrow(0, k * mb, mb);
    let (x0, noise, t) = (part(&inp.x0)?, part(&inp.noise)?, part(&inp.t)?);
    let ac = alphas_cumprod();
    let steps: Vec<usize> = t
        .to_vec1::<f32>()?
        .iter()
        .map(|&t| ((t * 1000.0) as usize).min(999))
        .collect();
    let coef = |f: &dyn Fn(f64) -> f64| -> Result<Tensor> {
        let v: Vec<f32> = steps.iter().map(|&s| f(ac[s]) as f32).collect();
        Ok(Tensor::from_vec(v, (mb, 1, 1, 1), x0.device())?.to_dtype(x0.dtype())?)
    };
    let noisy = (x0.broadcast_mul(&coef(&|a| a.sqrt())?)?
        + noise.broadcast_mul(&coef(&|a| (1.0 - a).sqrt())?)?)?;
    let timesteps = Tensor::from_vec(
        steps.iter().map(|&s| s as f32).collect::<Vec<_>>(),
        mb,
        x0.device(),
    )?;
    Ok(NoiseBatch {
        unet,
        noisy,
        timesteps,
        text: part(&inp.text)?,
        target: noise,
    })
}

/// Micro-batch `k` of `n` of the denoiser's objective.
fn micro_batch<'a>(
    net: Denoiser<'a>,
    inp: &Inputs,
    k: usize,
    n: usize,
) -> Result<Box<dyn MicroBatch + 'a>> {
    Ok(match net {
        Denoiser::Wan(d) => Box::new(flow_batch(d, inp, k, n)?),
        Denoiser::Sd(u) => Box::new(noise_batch(u, inp, k, n)?),
    })
}

/// One unmeasured forward and backward of micro-batch 0 (its gradients dropped, no optimizer
/// step): candle's CPU gemm keeps a buffer per thread and shape class, which would otherwise
/// stay in the first measured step's figures (4.4 MB in the 1.3B's step-1 gradients).
fn warm_up(net: Denoiser, inputs: &Inputs, n: usize) -> Result<()> {
    let m = micro_batch(net, inputs, 0, n.max(1))?;
    drop(m.forward_loss()?.backward()?);
    Ok(())
}

/// `spec.steps` LoRA steps of the denoiser `net` (adapters `vars`) on the cached `inputs`:
/// the LLM path's phases and rows ([`training::run_steps`]). Returns each step's loss.
pub fn run<'a>(
    net: impl Into<Denoiser<'a>>,
    vars: &[Var],
    inputs: &Inputs,
    spec: &TrainSpec,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(super::inference::PhaseResult, f32) -> Result<()>,
) -> Result<Vec<f32>> {
    let n = spec.grad_accum.max(1);
    let net = net.into();
    training::run_steps(vars, spec, meter, emit, &|k| micro_batch(net, inputs, k, n))
}
