//! `vramlab features`: the analytic `feature_*` figures (ARCHITECTURE.md §9) of one point of a
//! scenario at the rows asked for, from the one definition every sweep row uses
//! ([`crate::sweep::runner::point_features`]). The torch probe asks for its rows' figures here,
//! so the features have no Python copy.
use crate::error::{bad_file, InputError};
use crate::model::Source;
use crate::record::Phase;
use crate::scenario::Spec;
use crate::sweep::runner::{point_features, quant_weight_bytes, Prepared};
use crate::vocab::LoraTargets;
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the figures were printed; 1 a failure reading the model; 2 bad \
input: an unreadable scenario, an unknown point, a row that is not PHASE[@KV_TOKENS], or a point \
whose figures sweep does not compute here (a generation or fine-tuning point)."
)]
pub struct Args {
    /// The scenario file (TOML) whose point to compute.
    pub scenario: PathBuf,
    /// The point's id (`vramlab sweep SCENARIO --dry-run` lists them).
    #[arg(long)]
    pub point: String,
    /// A row: its phase (load, prefill, decode, forward, backward, optimizer, step_total,
    /// total), and after `@` the tokens its KV cache holds at the phase's end (inference;
    /// 0 where omitted). Repeat for several rows.
    #[arg(long = "row", value_name = "PHASE[@KV_TOKENS]", required = true)]
    pub rows: Vec<String>,
    /// With a `lora-rN` training point: the modules the adapters sit on, as `estimate
    /// --lora-targets` writes them (`peft`, peft's default, is what a sweep's own LoRA adapts).
    #[arg(long, default_value = "peft", value_parser = |s: &str| s.parse::<LoraTargets>())]
    pub lora_targets: LoraTargets,
    /// Print JSON: one object per row, with the CSV's column names and integer bytes.
    #[arg(long)]
    pub json: bool,
}

/// One row's figures, under the CSV's column names.
#[derive(Serialize)]
struct RowJson {
    phase: Phase,
    kv_tokens: usize,
    feature_weight_bytes: u64,
    feature_kv_bytes: u64,
    feature_act_bytes: u64,
    feature_logits_bytes: u64,
    feature_optimizer_bytes: u64,
}

/// `PHASE[@KV_TOKENS]`.
fn parse_row(s: &str) -> Result<(Phase, usize)> {
    let (phase, kv) = s.split_once('@').unwrap_or((s, "0"));
    let bad = |why: String| InputError::arg(format!("--row {s}: {why}"));
    let phase: Phase = phase
        .parse()
        .map_err(|_| bad(format!("`{phase}` is not a phase")))?;
    let kv = kv
        .parse()
        .map_err(|_| bad(format!("`{kv}` is not a token count")))?;
    Ok((phase, kv))
}

pub fn run(a: Args) -> Result<()> {
    let rows = a
        .rows
        .iter()
        .map(|s| parse_row(s))
        .collect::<Result<Vec<_>>>()?;
    let (spec, _) = Spec::load(&a.scenario)?;
    let points = crate::scenario::expand(&spec);
    let Some(p) = points.iter().find(|p| p.id == a.point) else {
        let why = if crate::scenario::point_ids(&spec).contains(&a.point) {
            "is a generation or fine-tuning point: its rows carry no `feature_*` figures"
        } else {
            "is not a point of this scenario (`vramlab sweep SCENARIO --dry-run` lists them)"
        };
        return Err(bad_file(&a.scenario, format!("point `{}` {why}", a.point)));
    };
    let source = Source::parse(&p.source).map_err(|e| bad_file(&a.scenario, e))?;
    let prep = Prepared {
        config: source.config()?,
        source,
    };
    let quant = quant_weight_bytes(&prep, p)?;
    let mut out = Vec::with_capacity(rows.len());
    for (phase, kv_tokens) in rows {
        let f = point_features(&prep.config, p, phase, kv_tokens, quant, a.lora_targets)?;
        out.push(RowJson {
            phase,
            kv_tokens,
            feature_weight_bytes: f.weight_bytes,
            feature_kv_bytes: f.kv_bytes,
            feature_act_bytes: f.act_bytes,
            feature_logits_bytes: f.logits_bytes,
            feature_optimizer_bytes: f.optimizer_bytes,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "{:<11} {:>10} {:>16} {:>16} {:>16} {:>16} {:>16}",
        "phase", "kv_tokens", "weights (B)", "kv (B)", "act (B)", "logits (B)", "optimizer (B)"
    );
    for r in &out {
        println!(
            "{:<11} {:>10} {:>16} {:>16} {:>16} {:>16} {:>16}",
            r.phase.to_string(),
            r.kv_tokens,
            r.feature_weight_bytes,
            r.feature_kv_bytes,
            r.feature_act_bytes,
            r.feature_logits_bytes,
            r.feature_optimizer_bytes
        );
    }
    Ok(())
}
