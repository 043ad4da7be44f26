//! Training steps: `forward`, `backward`, `optimizer` and `step_total` rows per step.
//!
//! - The batch is split into `grad_accum` micro-batches; each micro-batch's loss is divided by
//!   their number, so the accumulated gradients equal the full batch's.
//! - `backward` keeps only the trainable variables' gradients (candle's GradStore also holds
//!   zero-filled entries for untracked inputs); at its end the live bytes are the gradients.
//! - `optimizer` creates the optimizer state on the first step (like PyTorch's lazy init:
//!   AdamW's m and v in the variables' dtype), steps, and drops the gradients: at its end the
//!   live bytes are weights plus optimizer state.
//! - `checkpointing = layer` keeps only each layer's input in forward and recomputes each
//!   layer in backward with the vector-Jacobian trick: backward of `(layer(x) · g).sum()`.
//!
//! The step sees a micro-batch as a [`MicroBatch`] (input stage, re-runnable layers, loss): a
//! language model's token batch ([`run`]) or a diffusion denoiser's flow-matching batch
//! (`workload/finetune.rs`), both through [`run_steps`].
use crate::meter::{Meter, PhaseMemory};
use crate::model::Trainable;
use crate::record::Phase;
use crate::vocab::{Checkpointing, Optimizer as Opt};
use crate::workload::inference::PhaseResult;
use anyhow::{anyhow, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW, SGD};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct TrainSpec {
    pub batch: usize,
    pub seq: usize,
    pub optimizer: Opt,
    pub checkpointing: Checkpointing,
    pub grad_accum: usize,
    pub steps: usize,
    pub lr: f64,
}

enum AnyOpt {
    Sgd(SGD),
    AdamW(AdamW),
    /// vramlab-kernels' in-place AdamW.
    Fused(vramlab_kernels::AdamWState),
}

impl AnyOpt {
    fn new(kind: Opt, vars: Vec<Var>, lr: f64) -> Result<Self> {
        Ok(match kind {
            Opt::Sgd => AnyOpt::Sgd(SGD::new(vars, lr)?),
            Opt::Adamw => AnyOpt::AdamW(AdamW::new(
                vars,
                ParamsAdamW {
                    lr,
                    weight_decay: 0.0,
                    ..Default::default()
                },
            )?),
            Opt::AdamwFused => AnyOpt::Fused(vramlab_kernels::AdamWState::new(
                vars,
                vramlab_kernels::AdamWParams {
                    lr,
                    weight_decay: 0.0,
                    ..Default::default()
                },
            )?),
            // The scenario admits only the three above (`Optimizer::is_scenario_choice`).
            other => anyhow::bail!("optimizer `{other}` is not one vramlab's candle training runs"),
        })
    }
    fn step(&mut self, g: &GradStore) -> Result<()> {
        match self {
            AnyOpt::Sgd(o) => o.step(g)?,
            AnyOpt::AdamW(o) => o.step(g)?,
            AnyOpt::Fused(o) => o.step(g)?,
        }
        Ok(())
    }
}

/// Seeded token ids (batch, seq + 1): inputs are the first `seq`, targets the next.
pub fn batch_ids(
    vocab: usize,
    batch: usize,
    seq: usize,
    seed: u64,
    dev: &candle_core::Device,
) -> Result<(Tensor, Tensor)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<u32> = (0..batch * (seq + 1))
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let all = Tensor::from_vec(ids, (batch, seq + 1), dev)?;
    Ok((
        all.narrow(1, 0, seq)?.contiguous()?,
        all.narrow(1, 1, seq)?.contiguous()?,
    ))
}

/// Adds the gradients of `vars` found in `g` into `acc` (which holds nothing else).
fn accumulate(acc: &mut GradStore, g: &GradStore, vars: &[Var]) -> Result<()> {
    for v in vars {
        if let Some(t) = g.get(v.as_tensor()) {
            let sum = match acc.remove(v.as_tensor()) {
                Some(prev) => (prev + t)?,
                None => t.clone(),
            };
            acc.insert(v.as_tensor(), sum);
        }
    }
    Ok(())
}

/// One micro-batch bound to its model: the input stage, a stack of layers that can be run
/// (and re-run, for checkpointing) one at a time, and the head with its scalar f32 loss.
pub trait MicroBatch {
    fn num_layers(&self) -> usize;
    /// The first layer's input.
    fn embed(&self) -> Result<Tensor>;
    fn layer(&self, i: usize, x: &Tensor) -> Result<Tensor>;
    fn loss(&self, x: &Tensor) -> Result<Tensor>;
    /// The whole forward pass and its loss.
    fn forward_loss(&self) -> Result<Tensor> {
        let mut x = self.embed()?;
        for i in 0..self.num_layers() {
            x = self.layer(i, &x)?;
        }
        self.loss(&x)
    }
}

/// A language model's token micro-batch (inputs and next-token targets).
struct Tokens<'a> {
    m: &'a dyn Trainable,
    ids: Tensor,
    targets: Tensor,
}

impl MicroBatch for Tokens<'_> {
    fn num_layers(&self) -> usize {
        self.m.num_layers()
    }
    fn embed(&self) -> Result<Tensor> {
        Ok(self.m.embed(&self.ids)?)
    }
    fn layer(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        Ok(self.m.layer(i, x)?)
    }
    fn loss(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.m.loss(x, &self.targets)?)
    }
    fn forward_loss(&self) -> Result<Tensor> {
        Ok(self.m.forward_loss(&self.ids, &self.targets)?)
    }
}

/// What the forward phase leaves for the backward phase.
enum Saved {
    /// The loss with its whole graph.
    Full(Tensor),
    /// Checkpointed: the layers' inputs, the top hidden state (a variable) and the loss of
    /// the head on it.
    Layers {
        inputs: Vec<Tensor>,
        top: Var,
        loss: Tensor,
    },
}

fn forward(m: &dyn MicroBatch, ckpt: Checkpointing, scale: f64) -> Result<Saved> {
    Ok(match ckpt {
        Checkpointing::None => Saved::Full((m.forward_loss()? * scale)?),
        Checkpointing::Layer => {
            let mut inputs = Vec::with_capacity(m.num_layers());
            let mut x = m.embed()?.detach();
            for i in 0..m.num_layers() {
                let y = m.layer(i, &x)?.detach();
                inputs.push(x);
                x = y;
            }
            let top = Var::from_tensor(&x)?;
            drop(x);
            let loss = (m.loss(top.as_tensor())? * scale)?;
            Saved::Layers { inputs, top, loss }
        }
    })
}

/// Runs backward and adds the trainable variables' gradients into `acc`. Returns the loss.
fn backward(m: &dyn MicroBatch, saved: Saved, vars: &[Var], acc: &mut GradStore) -> Result<f32> {
    match saved {
        Saved::Full(loss) => {
            let value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            let g = loss.backward()?;
            drop(loss);
            accumulate(acc, &g, vars)?;
            Ok(value)
        }
        Saved::Layers {
            mut inputs,
            top,
            loss,
        } => {
            let value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            let mut g = loss.backward()?;
            drop(loss);
            let mut up = g
                .remove(top.as_tensor())
                .ok_or_else(|| anyhow!("no gradient reached the top hidden state"))?;
            accumulate(acc, &g, vars)?;
            drop((g, top));
            for i in (0..m.num_layers()).rev() {
                let x = Var::from_tensor(&inputs.pop().expect("one input per layer"))?;
                let y = m.layer(i, x.as_tensor())?;
                let s = (y * &up)?.sum_all()?;
                let mut g = s.backward()?;
                drop(s);
                up = g
                    .remove(x.as_tensor())
                    .ok_or_else(|| anyhow!("no gradient reached layer {i}'s input"))?;
                accumulate(acc, &g, vars)?;
            }
            let s = (m.embed()? * &up)?.sum_all()?;
            if s.track_op() {
                accumulate(acc, &s.backward()?, vars)?;
            }
            Ok(value)
        }
    }
}

/// Loss and accumulated gradients of the trainable `vars` over `n` micro-batches of
/// (`ids`, `targets`), without measuring: what one step's forward and backward phases compute.
pub fn gradients(
    model: &dyn Trainable,
    vars: &[Var],
    ids: &Tensor,
    targets: &Tensor,
    ckpt: Checkpointing,
    n: usize,
) -> Result<(f32, GradStore)> {
    let mb = ids.dim(0)? / n;
    let mut acc = GradStore::default();
    let mut loss = 0.0;
    for k in 0..n {
        let m = Tokens {
            m: model,
            ids: ids.narrow(0, k * mb, mb)?,
            targets: targets.narrow(0, k * mb, mb)?,
        };
        let saved = forward(&m, ckpt, 1.0 / n as f64)?;
        loss += backward(&m, saved, vars, &mut acc)?;
    }
    Ok((loss, acc))
}

/// The envelope and summed time of one phase kind over a step (micro-batches interleave
/// forward and backward, so each kind is measured several times).
#[derive(Default)]
struct Span {
    mem: Option<PhaseMemory>,
    ms: f64,
}

impl Span {
    fn measure<T>(
        &mut self,
        meter: &mut dyn Meter,
        phase: Phase,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let (out, mem, ms) = super::phase(meter, phase, f)?;
        self.ms += ms;
        self.mem = Some(self.mem.map_or(mem, |m| PhaseMemory::span(&m, &[mem])));
        Ok(out)
    }
}

/// Runs `spec.steps` optimizer steps of `model` on a fixed seeded batch, handing each phase
/// to `emit` with the step's loss. `vars` are the trainable variables.
pub fn run(
    model: &dyn Trainable,
    vars: &[Var],
    spec: &TrainSpec,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(PhaseResult, f32) -> Result<()>,
) -> Result<Vec<f32>> {
    let dev = vars
        .first()
        .map(|v| v.device().clone())
        .unwrap_or(candle_core::Device::Cpu);
    let mb = spec.batch / spec.grad_accum.max(1);
    let (ids, targets) = batch_ids(model.config().vocab_size, spec.batch, spec.seq, 7, &dev)?;
    run_steps(vars, spec, meter, emit, &|k| {
        Ok(Box::new(Tokens {
            m: model,
            ids: ids.narrow(0, k * mb, mb)?,
            targets: targets.narrow(0, k * mb, mb)?,
        }))
    })
}

/// A step's micro-batch `k` (of `spec.grad_accum`), built inside the forward phase.
pub type MicroBatches<'a> = dyn Fn(usize) -> Result<Box<dyn MicroBatch + 'a>> + 'a;

/// Runs `spec.steps` optimizer steps over the micro-batches `micro` builds (each built in its
/// forward phase, kept through its backward), handing each phase to `emit` with the step's
/// loss. `vars` are the trainable variables.
pub fn run_steps(
    vars: &[Var],
    spec: &TrainSpec,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(PhaseResult, f32) -> Result<()>,
    micro: &MicroBatches<'_>,
) -> Result<Vec<f32>> {
    let n = spec.grad_accum.max(1);
    let mut opt: Option<AnyOpt> = None;
    let mut losses = Vec::with_capacity(spec.steps);
    for step in 1..=spec.steps as u64 {
        let mut acc = GradStore::default();
        let (mut fwd, mut bwd, mut opt_span) = (Span::default(), Span::default(), Span::default());
        let mut loss = 0.0f32;
        let t_step = Instant::now();
        for k in 0..n {
            let (m, saved) = fwd.measure(meter, Phase::Forward, || {
                let m = micro(k)?;
                let saved = forward(m.as_ref(), spec.checkpointing, 1.0 / n as f64)?;
                Ok((m, saved))
            })?;
            loss += bwd.measure(meter, Phase::Backward, || {
                let l = backward(m.as_ref(), saved, vars, &mut acc)?;
                drop(m);
                Ok(l)
            })?;
        }
        opt_span.measure(meter, Phase::Optimizer, || {
            if opt.is_none() {
                opt = Some(AnyOpt::new(spec.optimizer, vars.to_vec(), spec.lr)?);
            }
            opt.as_mut().expect("created above").step(&acc)?;
            drop(std::mem::take(&mut acc));
            Ok(())
        })?;
        let (fwd_ms, bwd_ms, opt_ms) = (fwd.ms, bwd.ms, opt_span.ms);
        let (fwd, bwd, opt_mem) = (
            fwd.mem.expect("n >= 1"),
            bwd.mem.expect("n >= 1"),
            opt_span.mem.expect("measured"),
        );
        let total = PhaseMemory::span(&fwd, &[bwd, opt_mem]);
        for (phase, mem, ms) in [
            (Phase::Forward, fwd, fwd_ms),
            (Phase::Backward, bwd, bwd_ms),
            (Phase::Optimizer, opt_mem, opt_ms),
            (
                Phase::StepTotal,
                total,
                t_step.elapsed().as_secs_f64() * 1e3,
            ),
        ] {
            emit(
                PhaseResult {
                    phase,
                    step: Some(step),
                    kv_tokens: 0,
                    mem,
                    elapsed_ms: ms,
                },
                loss,
            )?;
        }
        losses.push(loss);
    }
    Ok(losses)
}
