//! Runs points: loads each (model, precision) once, warms up, measures every point of the
//! group, and writes each record the moment it is measured. Owns the progress bar.
use crate::export::Exporter;
use crate::features::{self, InferShape};
use crate::meter::{measure, Meter};
use crate::model::{weights, Config, Llama, Source};
use crate::record::{Phase, Record, Status, SCHEMA_VERSION};
use crate::scenario::Point;
use crate::workload::{inference, warmup};
use anyhow::Result;
use candle_core::Device;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;

/// Fields shared by every record of a run.
#[derive(Clone, Debug, Default)]
pub struct RunContext {
    pub run_id: String,
    pub scenario_hash: String,
    pub backend: String,
    pub device_name: String,
    pub driver_version: String,
    pub cuda_version: String,
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
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn progress_bar(len: usize) -> ProgressBar {
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

impl Runner<'_> {
    fn base_record(&self, p: &Point, prep: &Prepared) -> Record {
        let c = &self.ctx;
        Record {
            schema_version: SCHEMA_VERSION,
            run_id: c.run_id.clone(),
            point_id: p.id.clone(),
            started_at: now_rfc3339(),
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("VRAMLAB_GIT_REV").into(),
            backend: c.backend.clone(),
            device_name: c.device_name.clone(),
            driver_version: c.driver_version.clone(),
            cuda_version: c.cuda_version.clone(),
            candle_version: env!("VRAMLAB_CANDLE").into(),
            model_id: p.model_id.clone(),
            architecture: prep.config.architecture.as_str().into(),
            param_count: prep.config.param_count(),
            weight_source: prep.source.kind().into(),
            mode: p.mode.as_str().into(),
            precision: p.precision.as_str().into(),
            batch: p.batch as u64,
            context: p.context as u64,
            prompt_len: Some(p.prompt_len as u64),
            decode_steps: Some(p.decode_steps as u64),
            kv_cache: p.kv_cache.as_str().into(),
            optimizer: "none".into(),
            checkpointing: String::new(),
            grad_accum: None,
            trainable: String::new(),
            kernels: "reference".into(),
            pool_release: String::new(),
            scenario_hash: c.scenario_hash.clone(),
            meter: self.meter.kind().into(),
            ..Default::default()
        }
    }

    /// Runs `points` (grouped by model and precision, as `scenario::expand` orders them).
    /// Returns the count of points per status.
    pub fn run(
        &mut self,
        points: &[Point],
        models: &BTreeMap<String, Prepared>,
    ) -> Result<BTreeMap<String, usize>> {
        let bar = progress_bar(points.len());
        // All keys exist before the first measurement: a map node allocated mid-sweep would
        // shift every later baseline.
        let mut counts: BTreeMap<String, usize> =
            ["ok", "error"].iter().map(|k| (k.to_string(), 0)).collect();
        let mut i = 0;
        while i < points.len() {
            let (src, prec) = (&points[i].source, points[i].precision);
            let n = points[i..]
                .iter()
                .take_while(|p| &p.source == src && p.precision == prec)
                .count();
            let group = &points[i..i + n];
            i += n;
            let prep = &models[src];
            let dtype = prec.dtype();
            warmup::device(&self.device, dtype)?;
            if let Source::Synthetic(_) = prep.source {
                bar.set_message(format!(
                    "writing synthetic weights for {}",
                    group[0].model_id
                ));
                crate::model::synth::materialize(&prep.source, &prep.config, dtype)?;
            }
            bar.set_message(format!("loading {} ({})", group[0].model_id, prec.as_str()));
            let device = self.device.clone();
            let (model, load_mem, load_ms) = measure(self.meter.as_mut(), || {
                let t = weights::load(&prep.source, &prep.config, dtype, &device, |_, _| {})?;
                Llama::new(&prep.config, t, dtype)
            })?;
            warmup::model(&model, group.iter().map(|p| p.batch).min().unwrap_or(1))?;
            for p in group {
                bar.set_message(p.id.clone());
                let shape = InferShape {
                    batch: p.batch,
                    context: p.context,
                    prompt_len: p.prompt_len,
                    kv: p.kv_cache,
                    dtype_bytes: dtype.size_in_bytes(),
                };
                let base = self.base_record(p, prep);
                let row = |phase: Phase, kv_tokens: usize| {
                    let f = features::infer(&prep.config, &shape, phase, kv_tokens);
                    Record {
                        phase: Some(phase),
                        feature_weight_bytes: Some(f.weight_bytes),
                        feature_kv_bytes: Some(f.kv_bytes),
                        feature_act_bytes: Some(f.act_bytes),
                        feature_logits_bytes: Some(f.logits_bytes),
                        feature_optimizer_bytes: Some(f.optimizer_bytes),
                        ..base.clone()
                    }
                };
                let mut load = row(Phase::Load, 0);
                load.set_memory(&load_mem);
                load.elapsed_ms = Some(load_ms);
                load.status = Some(Status::Ok);
                load.message =
                    "weights loaded once per (model, precision); shared by the group".into();
                self.exporter.write(&load)?;
                drop(load);

                let spec = inference::InferSpec {
                    batch: p.batch,
                    context: p.context,
                    prompt_len: p.prompt_len,
                    decode_steps: p.decode_steps,
                    decode_every: p.decode_every,
                    kv: p.kv_cache,
                };
                let exporter = &mut *self.exporter;
                let mut last_phase = Phase::Prefill;
                let res = inference::run(&model, &spec, self.meter.as_mut(), &mut |r| {
                    let mut rec = row(r.phase, r.kv_tokens as usize);
                    rec.step = r.step;
                    rec.kv_tokens = Some(r.kv_tokens);
                    rec.set_memory(&r.mem);
                    rec.elapsed_ms = Some(r.elapsed_ms);
                    rec.status = Some(Status::Ok);
                    last_phase = r.phase;
                    exporter.write(&rec)
                });
                let status = match res {
                    Ok(()) => "ok",
                    Err(e) => {
                        let mut rec = row(last_phase, 0);
                        rec.status = Some(Status::Error);
                        rec.message = crate::error::one_line(&e);
                        self.exporter.write(&rec)?;
                        bar.println(format!("error at {}: {}", p.id, rec.message));
                        "error"
                    }
                };
                *counts.get_mut(status).expect("pre-filled") += 1;
                bar.inc(1);
            }
            drop(model);
        }
        bar.finish_and_clear();
        counts.retain(|_, n| *n > 0);
        Ok(counts)
    }
}
