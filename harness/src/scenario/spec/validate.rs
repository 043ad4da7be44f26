//! The checks of a parsed scenario: the whole spec, and a language model's `[sweep]` table
//! (its axes, their combinations and their bounds). Each failure names its key so the error
//! carries the key's line.
use super::pipeline::{is_pipeline_source, validate_finetune, validate_generate, NO_LORA_REASON};
use super::{Attention, Mode, Spec, SweepSpec, TrainableKind};

/// A validation failure: where (sweep table index and key), and the message.
pub(super) type Invalid = (Option<(usize, &'static str)>, String);

impl Spec {
    /// On error: the message, and where it is (the index of the sweep table and the key).
    pub(super) fn validate(&self) -> std::result::Result<(), Invalid> {
        if self.sweep.0.is_empty() {
            return Err((None, "no [sweep] table: nothing to run".into()));
        }
        let n = &self.name;
        if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\\', '\0']) {
            return Err((
                None,
                format!(
                    "`name` must be a plain file name (it names results/<name>.csv), got {n:?}"
                ),
            ));
        }
        if self.model.source.to_vec().is_empty() {
            return Err((None, "[model] `source` is an empty list".into()));
        }
        for (i, s) in self.sweep.0.iter().enumerate() {
            let sources = s.source.as_ref().unwrap_or(&self.model.source).to_vec();
            // A diffusion pipeline generates, or (Wan) fine-tunes its denoiser with LoRA; the
            // LLM modes mean nothing to it.
            let is_pipeline = |src: &String| is_pipeline_source(src);
            let pipeline = sources.iter().find(|src| is_pipeline(src));
            if let Some(src) = pipeline {
                let mode = |msg: String| Err((Some((i, "mode")), msg));
                if let Some(m) = s
                    .mode
                    .iter()
                    .find(|m| !matches!(m, Mode::Generate | Mode::Train))
                {
                    return mode(format!(
                        "[sweep] mode `{m}` on the diffusion pipeline `{src}`: a pipeline runs mode = [\"generate\"] or (Wan2.1's and SD's LoRA) [\"train\"]"
                    ));
                }
                if s.mode.contains(&Mode::Train) {
                    if let Some(src) = sources.iter().find(|src| {
                        src.strip_prefix("synthetic:")
                            .and_then(|m| m.parse::<crate::vocab::GenModel>().ok())
                            .is_some_and(|m| !m.trains())
                    }) {
                        return mode(format!(
                            "[sweep] mode `train` on the diffusion pipeline `{src}`: {}",
                            NO_LORA_REASON
                        ));
                    }
                    if let Some(src) = sources.iter().find(|src| !is_pipeline(src)) {
                        return mode(format!(
                            "[sweep] mode `train` on a diffusion pipeline runs alone in its [sweep] table (`{src}` is a language model)"
                        ));
                    }
                    validate_finetune(s).map_err(|(k, e)| (Some((i, k)), e))?;
                    continue;
                }
            }
            validate_sweep(s, &sources, self.runtime).map_err(|(k, e)| (Some((i, k)), e))?;
            if let (Some(p), Some(src)) = (
                s.precision.iter().find(|p| p.is_quantized()),
                sources.iter().find(|s| !s.starts_with("gguf:")),
            ) {
                return Err((
                    Some((i, "precision")),
                    format!(
                        "[sweep] precision `{}` needs a `gguf:` source (quantized weights come from a GGUF file), got `{src}`",
                        p.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// QLoRA (`qlora-rN`) and bitsandbytes' optimizers are estimated, not measured: a scenario
/// naming them is refused with the `vramlab estimate` command that answers for them.
pub(super) fn estimate_only(s: &SweepSpec) -> std::result::Result<(), (&'static str, String)> {
    if let Some(t) = s
        .trainable
        .iter()
        .find(|t| t.kind() == crate::vocab::TrainableKind::Qlora)
    {
        return Err((
            "trainable",
            format!("[sweep] trainable `{t}` (QLoRA on a bitsandbytes NF4 base) is estimate-only for now: `vramlab estimate --mode train --trainable {t}`"),
        ));
    }
    if let Some(o) = s.optimizer.iter().find(|o| o.is_bitsandbytes()) {
        return Err((
            "optimizer",
            format!("[sweep] optimizer `{o}` (bitsandbytes) is estimate-only for now: `vramlab estimate --mode train --optimizer {o}`"),
        ));
    }
    Ok(())
}

pub(super) const MAX_BATCH: i64 = 1 << 20;
pub(super) const MAX_CONTEXT: i64 = 1 << 27;
pub(super) const MAX_REPEATS: i64 = 10_000;
pub(super) const MAX_STEPS: i64 = 1 << 20;

fn validate_sweep(
    s: &SweepSpec,
    sources: &[String],
    runtime: crate::vocab::Runtime,
) -> std::result::Result<(), (&'static str, String)> {
    if runtime == crate::vocab::Runtime::Vllm {
        return Err((
            "runtime",
            "`runtime = \"vllm\"` is not a sweep: `vramlab estimate --runtime vllm` answers in vLLM's terms, and `vramlab emulate -- vllm serve ...` runs vLLM itself".into(),
        ));
    }
    {
        let nonempty = |key: &'static str, n: usize| {
            if n == 0 {
                Err((
                    key,
                    format!("[sweep] `{key}` is an empty list: nothing to run"),
                ))
            } else {
                Ok(())
            }
        };
        nonempty("mode", s.mode.len())?;
        nonempty("precision", s.precision.len())?;
        nonempty("batch", s.batch.len())?;
        if let Some(m) = s.mode.iter().find(|m| **m != Mode::Generate) {
            if s.context.is_empty() {
                return Err((
                    "context",
                    format!("[sweep] missing field `context` (mode `{m}` needs it)"),
                ));
            }
        }
        if s.mode.contains(&Mode::Generate) {
            validate_generate(s, sources)?;
        } else if s.frames.is_some() {
            return Err((
                "frames",
                "[sweep] `frames` is for mode = \"generate\" (video models)".into(),
            ));
        } else if s.attention.contains(&Attention::Sliced) {
            return Err((
                "attention",
                "[sweep] attention `sliced` is for mode = \"generate\" (the UNet's sliced attention)".into(),
            ));
        }
        nonempty("kv_cache", s.kv_cache.len())?;
        nonempty("kv_window", s.kv_window.len())?;
        nonempty("kernels", s.kernels.len())?;
        nonempty("attention", s.attention.len())?;
        if s.attention.contains(&Attention::Sdpa) && runtime != crate::vocab::Runtime::Torch {
            return Err((
                "attention",
                "[sweep] attention `sdpa` is PyTorch's kernel (a `runtime = \"torch\"` scenario runs it); vramlab's models run `eager` or `flash`".into(),
            ));
        }
        nonempty("compute", s.compute.len())?;
        nonempty("qmatmul", s.qmatmul.len())?;
        if let Some(p) = s.precision.iter().find(|p| p.is_quantized()) {
            let lora = s.trainable.iter().find(|t| t.kind() == TrainableKind::Lora);
            if let (true, Some(t)) = (s.mode.contains(&Mode::Train), lora) {
                return Err((
                    "trainable",
                    format!(
                        "[sweep] trainable `{t}` on precision `{}` is QLoRA, which cannot run: candle 0.11.1's QMatMul records no backward (it applies the QTensor with `apply_op1_no_bwd`), so no gradient reaches the adapters below a quantized layer; `vramlab estimate --mode train --trainable {t} --weights {}` estimates it",
                        p.as_str(),
                        p.as_str()
                    ),
                ));
            }
            if let Some(m) = s.mode.iter().find(|m| **m != Mode::Infer) {
                return Err((
                    "precision",
                    format!(
                        "[sweep] precision `{}` keeps GGUF weights quantized, which runs inference only (mode `{}` needs f32, f16, bf16 or mixed-*)",
                        p.as_str(),
                        m.as_str()
                    ),
                ));
            }
        }
        let train = s.mode.contains(&Mode::Train);
        if train {
            estimate_only(s)?;
            nonempty("optimizer", s.optimizer.len())?;
            if let Some(o) = s.optimizer.iter().find(|o| !o.is_scenario_choice()) {
                return Err((
                    "optimizer",
                    format!("[sweep] optimizer `{o}` is not a scenario choice: use `sgd`, `adamw` or `adamw-fused` (torch's implementations are the probe's `--torch-optim`)"),
                ));
            }
            nonempty("checkpointing", s.checkpointing.len())?;
            nonempty("grad_accum", s.grad_accum.len())?;
            nonempty("trainable", s.trainable.len())?;
            if s.train_steps == 0 {
                return Err((
                    "train_steps",
                    "[sweep] `train_steps` must be at least 1".into(),
                ));
            }
            for &n in &s.grad_accum {
                if n <= 0 {
                    return Err((
                        "grad_accum",
                        format!("[sweep] `grad_accum` must be positive, got {n}"),
                    ));
                }
                if let Some(b) = s.batch.iter().find(|&&b| b > 0 && b % n != 0) {
                    return Err((
                        "grad_accum",
                        format!("[sweep] grad_accum {n} does not divide batch {b}"),
                    ));
                }
            }
        }
        if s.mode.contains(&Mode::Infer) {
            if let Some(p) = s.precision.iter().find(|p| p.is_mixed()) {
                return Err((
                    "precision",
                    format!(
                        "[sweep] precision `{}` is a training policy; inference points need f32, f16 or bf16",
                        p.as_str()
                    ),
                ));
            }
        }
        // Upper bounds far beyond any real run: they keep the size arithmetic downstream
        // (bytes = batch · context · ...) from overflowing on a typo.
        for (key, v, max) in [
            (
                "batch",
                s.batch.iter().copied().max().unwrap_or(0),
                MAX_BATCH,
            ),
            (
                "context",
                s.context.iter().copied().max().unwrap_or(0),
                MAX_CONTEXT,
            ),
            ("decode_steps", s.decode_steps as i64, MAX_CONTEXT),
            ("prompt_len", s.prompt_len.unwrap_or(0) as i64, MAX_CONTEXT),
            ("repeats", s.repeats as i64, MAX_REPEATS),
            ("train_steps", s.train_steps as i64, MAX_STEPS),
        ] {
            // (TOML integers are i64, so the usize ones convert back exactly.)
            if v > max {
                return Err((
                    key,
                    format!("[sweep] `{key}` = {v} is too large (at most {max})"),
                ));
            }
        }
        if !(s.lr.is_finite() && s.lr > 0.0) {
            return Err((
                "lr",
                format!("[sweep] `lr` must be a positive number, got {}", s.lr),
            ));
        }
        for &b in &s.batch {
            if b <= 0 {
                return Err((
                    "batch",
                    format!("[sweep] `batch` must be positive, got {b}"),
                ));
            }
        }
        for &c in &s.context {
            if c <= 0 {
                return Err((
                    "context",
                    format!("[sweep] `context` must be positive, got {c}"),
                ));
            }
            let prompt = s
                .prompt_len
                .unwrap_or((c as usize).saturating_sub(s.decode_steps));
            let infer = s.mode.contains(&Mode::Infer);
            if infer && (prompt == 0 || prompt + s.decode_steps > c as usize) {
                let key = if s.prompt_len.is_some() {
                    "prompt_len"
                } else {
                    "context"
                };
                return Err((
                    key,
                    format!(
                        "[sweep] context {c} cannot hold prompt_len {prompt} + decode_steps {}",
                        s.decode_steps
                    ),
                ));
            }
        }
        if s.decode_every == 0 {
            return Err((
                "decode_every",
                "[sweep] `decode_every` must be at least 1".into(),
            ));
        }
        if s.repeats == 0 {
            return Err(("repeats", "[sweep] `repeats` must be at least 1".into()));
        }
        Ok(())
    }
}
