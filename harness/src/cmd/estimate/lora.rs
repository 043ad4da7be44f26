//! The LoRA flags of an LLM query (`--lora-targets`, `--lora-dropout`): what the estimate models
//! for them, checked before anything is estimated (one line, exit 2).
use super::Args;
use crate::error::InputError;
use crate::model::Config;
use crate::vocab::Runtime;
use anyhow::Result;

/// Both flags of `a` against model `m`.
pub fn check(a: &Args, m: &Config) -> Result<()> {
    targets(a, m)?;
    dropout(a, m)
}

/// `--lora-targets` other than peft's default: with LoRA training, under torch (peft), on a
/// decoder of the llama family, and matching at least one of the model's modules; else one
/// line.
fn targets(a: &Args, m: &Config) -> Result<()> {
    let t = a.lora_targets;
    if t.is_default() {
        return Ok(());
    }
    let fail = |why: String| -> Result<()> {
        Err(InputError::arg(format!("--lora-targets {t}: {why}")).into())
    };
    if a.trainable.lora_rank().is_none() {
        return fail(format!(
            "adapters need --trainable lora-rN or qlora-rN (got {})",
            a.trainable
        ));
    }
    if a.runtime != Runtime::Torch {
        return fail(
            "vramlab's candle models put LoRA on the architecture's default targets only;              other targets are peft's (--runtime torch)"
                .into(),
        );
    }
    if matches!(m.architecture.name(), "gpt2" | "gpt_bigcode" | "bert") {
        return fail(format!(
            "the targets name the llama family's modules; {} takes peft's default (peft)",
            m.architecture.name()
        ));
    }
    let n = crate::features::counts_in(m, a.trainable, t).map_err(|e| anyhow::anyhow!("{e}"))?;
    if n.adapters == 0 {
        return fail(format!("no module of --model {} is one of them", a.model));
    }
    Ok(())
}

/// `--lora-dropout`: a probability, and above 0 only where the estimate models it: peft's
/// adapters (torch) on the llama family's modules, not on the routed experts; else one line.
fn dropout(a: &Args, m: &Config) -> Result<()> {
    let p = a.lora_dropout;
    let fail = |why: String| -> Result<()> {
        Err(InputError::arg(format!("--lora-dropout {p}: {why}")).into())
    };
    if !(0.0..1.0).contains(&p) {
        return fail("a probability in [0, 1)".into());
    }
    if p == 0.0 {
        return Ok(());
    }
    if a.trainable.lora_rank().is_none() {
        return fail(format!(
            "dropout on adapters needs --trainable lora-rN or qlora-rN (got {})",
            a.trainable
        ));
    }
    if a.runtime != Runtime::Torch {
        return fail("vramlab's candle LoRA has no dropout; peft's is --runtime torch".into());
    }
    if matches!(m.architecture.name(), "gpt2" | "gpt_bigcode" | "bert")
        || a.lora_targets.contains(crate::vocab::LoraTarget::Experts)
    {
        return fail(format!(
            "modelled for peft's adapters on the llama family's linear modules, not on {}",
            if a.lora_targets.contains(crate::vocab::LoraTarget::Experts) {
                "the routed experts (peft's target_parameters)".to_string()
            } else {
                m.architecture.name().to_string()
            }
        ));
    }
    Ok(())
}
