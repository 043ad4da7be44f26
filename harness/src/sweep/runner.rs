//! Runs points: loads each (model, precision) once, warms up, measures every point of the
//! group, and writes each record the moment it is measured. Owns the progress bar.
use crate::export::Exporter;
use crate::features::{self, InferShape};
use crate::meter::Meter;
use crate::model::trainable::{to_vars, trainable_model};
use crate::model::{weights, Config, InferenceModel, Source};
use crate::record::{Phase, Record, Status, SCHEMA_VERSION};
use crate::scenario::Point;
use crate::vocab::{Backend, Mode, Optimizer, PoolRelease};
use crate::vocab::{LoraTargets, Ops, Trainable};
use crate::workload::inference::{self, PhaseResult};
use crate::workload::{training, warmup};
use anyhow::Result;
use candle_core::{Device, Var};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;

/// Fields shared by every record of a run.
#[derive(Clone, Debug, Default)]
pub struct RunContext {
    pub run_id: String,
    pub scenario_hash: String,
    pub backend: Backend,
    pub device_name: String,
    pub driver_version: String,
    pub cuda_version: String,
    /// The `pool_release` column (empty where no pool is read).
    pub pool_release: Option<PoolRelease>,
}

/// A model source resolved before any measuring.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub source: Source,
    pub config: Config,
}

pub struct Runner<'a> {
    pub device: Device,
    pub meter: Box<dyn Meter>,
    pub exporter: &'a mut dyn Exporter,
    pub ctx: RunContext,
    /// Show a progress bar (off in workers: the parent draws it).
    pub progress: bool,
    /// Warm up each point at its own shapes instead of the group at its largest (set for a
    /// worker restarted after the group's warm-up ran out of memory).
    pub point_warmup: bool,
}

pub use crate::record::now_rfc3339;

pub fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} points, ETA {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The fields of a point's rows that do not depend on the phase.
pub fn base_record(
    c: &RunContext,
    meter: crate::vocab::MeterKind,
    p: &Point,
    prep: &Prepared,
) -> Record {
    {
        let train = p.mode == Mode::Train;
        let infer = p.mode == Mode::Infer;
        Record {
            schema_version: SCHEMA_VERSION,
            run_id: c.run_id.clone(),
            point_id: p.id.clone(),
            started_at: now_rfc3339(),
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("VRAMLAB_GIT_REV").into(),
            backend: c.backend,
            device_name: c.device_name.clone(),
            driver_version: c.driver_version.clone(),
            cuda_version: c.cuda_version.clone(),
            candle_version: env!("VRAMLAB_CANDLE").into(),
            model_id: p.model_id.clone(),
            architecture: prep.config.architecture.name().into(),
            param_count: prep.config.param_count(),
            weight_source: prep.source.kind().into(),
            mode: p.mode,
            precision: p.precision,
            compute: p.compute,
            qmatmul: p.qmatmul,
            batch: p.batch as u64,
            context: p.context as u64,
            prompt_len: infer.then_some(p.prompt_len as u64),
            decode_steps: infer.then_some(p.decode_steps as u64),
            kv_cache: infer.then_some(p.kv_cache),
            kv_window: infer.then_some(p.kv_window),
            optimizer: if train {
                p.train.optimizer
            } else {
                Optimizer::None
            },
            checkpointing: train.then_some(p.train.checkpointing),
            grad_accum: train.then_some(p.train.grad_accum as u64),
            trainable: train.then_some(p.train.trainable),
            kernels: p.ops.kernels,
            attention: p.ops.attention,
            pool_release: c.pool_release,
            scenario_hash: c.scenario_hash.clone(),
            meter,
            ..Default::default()
        }
    }
}

impl Runner<'_> {
    /// Runs `points` (grouped by model, precision and mode, as `scenario::expand` orders
    /// them). Returns the count of points per status.
    /// `group_of(p)` gives every point of the grid that shares `p`'s weights (the warm-up
    /// covers their largest shapes).
    pub fn run(
        &mut self,
        points: &[Point],
        models: &BTreeMap<String, Prepared>,
        group_of: &dyn Fn(&Point) -> Vec<Point>,
    ) -> Result<BTreeMap<String, usize>> {
        let bar = if self.progress {
            progress_bar(points.len())
        } else {
            ProgressBar::hidden()
        };
        // Every point's base record (strings: run id, git revision, versions, model id...)
        // exists before the floor is taken: otherwise their lengths, which differ from build
        // to build and machine to machine, would shift every figure by a few bytes.
        let bases: Vec<Record> = points
            .iter()
            .map(|p| base_record(&self.ctx, self.meter.kind(), p, &models[&p.source]))
            .collect();
        // A quantized group's exact weight bytes and load message, from the GGUF's tensor
        // table (a re-quantization whose blocks do not fit a tensor fails here, before any
        // measuring).
        let mut quant: BTreeMap<String, QuantGroup> = BTreeMap::new();
        for p in points {
            if let (Some(q), Source::Gguf(path)) =
                (p.precision.quantized(), &models[&p.source].source)
            {
                if !quant.contains_key(&p.id) {
                    let g = QuantGroup::of(path, &models[&p.source].config, q, p.dtypes().1)?;
                    for o in points
                        .iter()
                        .filter(|o| crate::scenario::grid::same_group(o, p))
                    {
                        quant.insert(o.id.clone(), g.clone());
                    }
                }
            }
        }
        crate::meter::alloc::set_floor();
        // All keys exist before the first measurement: a map node allocated mid-sweep would
        // shift every later baseline.
        let mut counts: BTreeMap<String, usize> = ["ok", "oom", "error"]
            .iter()
            .map(|k| (k.to_string(), 0))
            .collect();
        let mut i = 0;
        while i < points.len() {
            let first = &points[i];
            let n = points[i..]
                .iter()
                .take_while(|p| crate::scenario::grid::same_group(p, first))
                .count();
            let group = &points[i..i + n];
            i += n;
            let prep = &models[&first.source];
            let (dtype, compute) = first.dtypes();
            warmup::device(&self.device, compute)?;
            bar.set_message(format!(
                "loading {} ({})",
                first.model_id,
                first.precision.as_str()
            ));
            let device = self.device.clone();
            let train = first.mode == Mode::Train;
            // The load runs under the capacity; a device OOM here fails the whole group at
            // once (every point shares these weights), without a reload per point.
            let load = crate::workload::phase(self.meter.as_mut(), Phase::Load, || {
                if let (Some(q), Source::Gguf(path)) = (first.precision.quantized(), &prep.source) {
                    let (t, qt) = crate::model::gguf::load_quantized(
                        path,
                        &prep.config,
                        q,
                        compute,
                        &device,
                        |_, _| {},
                    )?;
                    return Ok(Loaded::Model(
                        prep.config.architecture.inference_quantized(
                            &prep.config,
                            t,
                            qt,
                            first.qmatmul.unwrap_or_default(),
                            compute,
                        )?,
                    ));
                }
                let t = weights::load(&prep.source, &prep.config, dtype, &device, |_, _| {})?;
                Ok(if train {
                    Loaded::Vars(to_vars(t)?)
                } else {
                    Loaded::Model(
                        prep.config
                            .architecture
                            .inference(&prep.config, t, compute)?,
                    )
                })
            });
            let group_bases = &bases[i - n..i];
            let (mut loaded, load_mem, load_ms) = match load {
                Ok(l) => l,
                Err(e) if crate::device::is_oom(&e) => {
                    let msg = format!(
                        "out of memory in load (the group's {n} points were not run): {}",
                        crate::error::one_line(&e)
                    );
                    bar.println(format!("oom loading {}: {msg}", first.model_id));
                    for (p, base) in group.iter().zip(group_bases) {
                        self.exporter
                            .write(&failed(base, Phase::Load, Status::Oom, &msg))?;
                        *counts.get_mut("oom").expect("pre-filled") += 1;
                        crate::progress::point_done(&p.id);
                        bar.inc(1);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Warm up at the largest shapes of the whole group (`group_of` may be wider than
            // the points this worker runs), so every run of a point sees the same state. The
            // warm-up runs under the capacity like everything else: if it runs out of memory,
            // each point is warmed up at its own shapes instead, so the points that fit are
            // still measured and the others are recorded `oom` in phase `warmup`.
            let whole = group_of(first);
            let mut per_point = self.point_warmup;
            if !per_point {
                crate::progress::mark_phase(Phase::Warmup);
                match warm_up(&prep.config, &loaded, &whole) {
                    Ok(()) => {}
                    Err(e) if crate::device::is_oom(&e) => {
                        bar.println(format!(
                            "the warm-up at the group's largest shapes ran out of memory; warming up per point ({})",
                            crate::error::one_line(&e)
                        ));
                        per_point = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            for (p, base) in group.iter().zip(group_bases) {
                bar.set_message(p.id.clone());
                if per_point {
                    crate::progress::mark_phase(Phase::Warmup);
                    if let Err(e) = warm_up(&prep.config, &loaded, std::slice::from_ref(p)) {
                        if !crate::device::is_oom(&e) {
                            return Err(e);
                        }
                        let msg = format!(
                            "out of memory in warmup at this point's shapes: {}",
                            crate::error::one_line(&e)
                        );
                        bar.println(format!("oom at {}: {msg}", p.id));
                        self.exporter
                            .write(&failed(base, Phase::Warmup, Status::Oom, &msg))?;
                        *counts.get_mut("oom").expect("pre-filled") += 1;
                        crate::progress::point_done(&p.id);
                        bar.inc(1);
                        continue;
                    }
                }
                let quant = quant.get(&p.id);
                let row = |phase: Phase, kv_tokens: usize| -> Result<Record> {
                    let f = point_features(
                        &prep.config,
                        p,
                        phase,
                        kv_tokens,
                        quant.map(|q| q.weight_bytes),
                        LoraTargets::DEFAULT,
                    )?;
                    Ok(Record {
                        phase: Some(phase),
                        feature_weight_bytes: Some(f.weight_bytes),
                        feature_kv_bytes: Some(f.kv_bytes),
                        feature_act_bytes: Some(f.act_bytes),
                        feature_logits_bytes: Some(f.logits_bytes),
                        feature_optimizer_bytes: Some(f.optimizer_bytes),
                        ..base.clone()
                    })
                };
                // What the allocator caches goes back before the point's first phase, so its
                // reserved figures do not carry a larger earlier point's.
                self.meter.trim()?;
                let mut load = row(Phase::Load, 0)?;
                load.set_memory(&load_mem);
                load.elapsed_ms = Some(load_ms);
                load.status = Some(Status::Ok);
                load.message =
                    "weights loaded once per (model, precision, mode); shared by the group".into();
                if let Some(q) = quant {
                    load.message += &format!("; {}", q.message);
                }
                if per_point {
                    load.message += "; warmed up at this point's shapes (the group's warm-up at its largest shapes ran out of memory)";
                }
                self.exporter.write(&load)?;
                drop(load);

                let exporter = &mut *self.exporter;
                let mut emit = |r: PhaseResult, loss: Option<f32>| {
                    let mut rec = row(r.phase, r.kv_tokens as usize)?;
                    rec.step = r.step;
                    if p.mode == Mode::Infer {
                        rec.kv_tokens = Some(r.kv_tokens);
                    }
                    if let Some(l) = loss {
                        rec.message = format!("loss={l:.6}");
                    }
                    rec.set_memory(&r.mem);
                    rec.elapsed_ms = Some(r.elapsed_ms);
                    rec.status = Some(Status::Ok);
                    exporter.write(&rec)
                };
                let res = match &mut loaded {
                    Loaded::Model(InferenceModel::Decoder(model)) => {
                        model.set_ops(p.ops).and_then(|()| {
                            inference::run(
                                model.as_ref(),
                                &infer_spec(p),
                                self.meter.as_mut(),
                                &mut |r| emit(r, None),
                            )
                        })
                    }
                    Loaded::Model(InferenceModel::Encoder(model)) => inference::encode(
                        model.as_ref(),
                        p.batch,
                        p.context,
                        self.meter.as_mut(),
                        &mut |r| emit(r, None),
                    ),
                    Loaded::Vars(vars) => {
                        run_training(&prep.config, vars, p, self.meter.as_mut(), &mut |r, l| {
                            emit(r, Some(l))
                        })
                    }
                };
                let status = match res {
                    Ok(()) => "ok",
                    Err(e) => {
                        let oom = crate::device::is_oom(&e);
                        // The phase that was running, not the last one that wrote a row.
                        let mut rec = row(crate::progress::running_phase(), 0)?;
                        rec.status = Some(if oom { Status::Oom } else { Status::Error });
                        rec.message = crate::error::one_line(&e);
                        self.exporter.write(&rec)?;
                        bar.println(format!(
                            "{} at {}: {}",
                            if oom { "oom" } else { "error" },
                            p.id,
                            rec.message
                        ));
                        if oom {
                            "oom"
                        } else {
                            "error"
                        }
                    }
                };
                *counts.get_mut(status).expect("pre-filled") += 1;
                crate::progress::point_done(&p.id);
                bar.inc(1);
            }
            drop(loaded);
        }
        bar.finish_and_clear();
        counts.retain(|_, n| *n > 0);
        Ok(counts)
    }
}

/// The row of a point that never reached a measured phase (`oom` in load or warm-up).
fn failed(base: &Record, phase: Phase, status: Status, message: &str) -> Record {
    Record {
        phase: Some(phase),
        status: Some(status),
        message: message.into(),
        ..base.clone()
    }
}

/// Warms up what a group loaded at the largest shapes among `points` (the whole group, or one
/// point when the group's warm-up ran out of memory).
fn warm_up(cfg: &Config, loaded: &Loaded, points: &[Point]) -> Result<()> {
    let max = |f: &dyn Fn(&Point) -> usize| points.iter().map(f).max().unwrap_or(1);
    match loaded {
        Loaded::Model(InferenceModel::Decoder(m)) => {
            warmup::decoder(m.as_ref(), max(&|p| p.batch), max(&|p| p.prompt_len))
        }
        Loaded::Model(InferenceModel::Encoder(m)) => {
            warmup::encoder(m.as_ref(), max(&|p| p.batch), max(&|p| p.context))
        }
        Loaded::Vars(v) => {
            let mut sets: Vec<(Trainable, Ops)> =
                points.iter().map(|p| (p.train.trainable, p.ops)).collect();
            sets.sort_by_key(|(t, o)| (t.label(), o.kernels, o.attention));
            sets.dedup();
            warmup::training(
                cfg,
                v,
                points
                    .first()
                    .map(|p| p.precision.compute_dtype())
                    .unwrap_or(candle_core::DType::F32),
                (
                    max(&|p| p.batch / p.train.grad_accum.max(1)),
                    max(&|p| p.context),
                ),
                &sets,
            )
        }
    }
}

/// A quantized group's weight bytes (exact: GGUF blocks × block bytes per tensor type, plus
/// the dense tensors in the compute dtype) and what its load row says about them.
#[derive(Clone, Debug)]
struct QuantGroup {
    weight_bytes: u64,
    message: String,
}

impl QuantGroup {
    fn of(
        path: &std::path::Path,
        cfg: &Config,
        q: crate::vocab::Quantized,
        compute: candle_core::DType,
    ) -> Result<Self> {
        use crate::model::gguf::{self, Kept};
        let plan = gguf::plan(path, cfg, q)?;
        let kept = gguf::plan_types(&plan, compute)
            .iter()
            .map(|(ty, n, b)| format!("{n} {ty} = {b} B"))
            .collect::<Vec<_>>()
            .join(", ");
        let matrices: Vec<String> = plan
            .iter()
            .filter(|t| t.kept == Kept::Dense && t.shape.len() > 1)
            .map(|t| format!("{} ({})", t.gguf, gguf::type_name(t.file)))
            .collect();
        let mut message = format!(
            "weights as kept: {kept} (quantized ones in candle QTensors; the {} ones are the 1-D norms and biases",
            compute.as_str()
        );
        if !matrices.is_empty() {
            message += &format!(
                ", and matrices the file stores unquantized, loaded dense: {}",
                matrices.join(", ")
            );
        }
        message.push(')');
        let weight_bytes = gguf::plan_bytes(&plan, compute);
        Ok(QuantGroup {
            weight_bytes,
            message,
        })
    }
}

/// What a group loads: a ready inference model, or the weights as training variables.
enum Loaded {
    Model(InferenceModel),
    Vars(Vec<(String, Var)>),
}

fn run_training(
    cfg: &Config,
    vars: &[(String, Var)],
    p: &Point,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(PhaseResult, f32) -> Result<()>,
) -> Result<()> {
    let (model, trainable) = trainable_model(
        cfg,
        vars,
        p.train.trainable,
        p.precision.compute_dtype(),
        p.ops,
    )?;
    let spec = training::TrainSpec {
        batch: p.batch,
        seq: p.context,
        optimizer: p.train.optimizer,
        checkpointing: p.train.checkpointing,
        grad_accum: p.train.grad_accum,
        steps: p.train.steps,
        lr: p.train.lr,
    };
    training::run(model.as_ref(), &trainable, &spec, meter, emit)?;
    Ok(())
}

/// The `feature_*` figures of point `p`'s row at `phase`, with `kv_tokens` live in its cache
/// (ARCHITECTURE.md §9): what every sweep row records, and what `vramlab features` prints for
/// the torch probe's rows. `quant_weight`: a quantized group's exact weight bytes
/// ([`quant_weight_bytes`]), which replace the dense figure. `targets`: the modules a `lora-rN`
/// point adapts (a sweep's: [`LoraTargets::DEFAULT`]).
pub fn point_features(
    cfg: &Config,
    p: &Point,
    phase: Phase,
    kv_tokens: usize,
    quant_weight: Option<u64>,
    targets: LoraTargets,
) -> Result<features::Features> {
    let f = match p.mode {
        Mode::Train => features::train(cfg, &train_shape(p, targets), phase),
        Mode::Infer => features::infer(cfg, &infer_shape(p), phase, kv_tokens),
        // Generation points run in workload::generate, not here.
        Mode::Encode | Mode::Generate => features::encode(
            cfg,
            p.batch,
            p.context,
            p.precision.dtype().size_in_bytes(),
            phase,
        ),
    };
    let mut f = f.map_err(|e| anyhow::anyhow!("point {}, {phase}: features: {e}", p.id))?;
    if let Some(w) = quant_weight {
        f.weight_bytes = w;
    }
    Ok(f)
}

/// The exact weight bytes of a quantized point's group (GGUF blocks × block bytes per tensor
/// type, plus the dense tensors in the compute dtype); `None` for a dense point.
pub fn quant_weight_bytes(prep: &Prepared, p: &Point) -> Result<Option<u64>> {
    match (p.precision.quantized(), &prep.source) {
        (Some(q), Source::Gguf(path)) => Ok(Some(
            QuantGroup::of(path, &prep.config, q, p.dtypes().1)?.weight_bytes,
        )),
        _ => Ok(None),
    }
}

fn infer_shape(p: &Point) -> InferShape {
    InferShape {
        batch: p.batch,
        context: p.context,
        prompt_len: p.prompt_len,
        kv: p.kv_cache,
        kv_window: p.kv_window,
        dtype_bytes: p.dtypes().1.size_in_bytes(),
        mla: Default::default(),
    }
}

fn infer_spec(p: &Point) -> inference::InferSpec {
    inference::InferSpec {
        batch: p.batch,
        context: p.context,
        prompt_len: p.prompt_len,
        decode_steps: p.decode_steps,
        decode_every: p.decode_every,
        kv: p.kv_cache,
        kv_window: p.kv_window,
    }
}

fn train_shape(p: &Point, targets: LoraTargets) -> features::TrainShape {
    features::TrainShape {
        batch: p.batch,
        seq: p.context,
        weight_bytes: p.precision.dtype().size_in_bytes(),
        compute_bytes: p.precision.compute_dtype().size_in_bytes(),
        adamw: matches!(
            p.train.optimizer,
            crate::vocab::Optimizer::Adamw | crate::vocab::Optimizer::AdamwFused
        ),
        trainable: p.train.trainable,
        targets,
    }
}
