//! How `estimate` loads the weights when they are not dense: a checkpoint's
//! `quantization_config` (`model::quant`), QLoRA's NF4 base (`--trainable qlora-rN`), and
//! bitsandbytes' optimizers: the flags each admits (one line, exit 2, otherwise), the query
//! with the format's exact bytes, and the report's weights row, types and notes.
use super::report::{QuantWeights, Row};
use super::Args;
use crate::error::InputError;
use crate::estimate::{Mode, Precision, Query, Runtime, Trainable};
use crate::model::quant::{Checkpoint, Format, Plan};
use crate::model::Config;
use anyhow::Result;

/// The format the weights are loaded in, where it is not the precision's dense dtype or a GGUF
/// block format: a checkpoint's `quantization_config`, or QLoRA's NF4 base.
pub struct Loaded {
    pub checkpoint: Checkpoint,
    /// `--trainable qlora-rN` (the base is quantized at load), not a quantized checkpoint.
    pub qlora: bool,
}

/// The loaded format of the query of `a` on `m` (`quant`: the checkpoint's
/// `quantization_config`), after checking the flags it goes with; None for dense weights.
pub fn loaded(a: &Args, quant: Option<&Checkpoint>, gguf: bool) -> Result<Option<Loaded>> {
    let arg = |msg: String| -> anyhow::Error { InputError::arg(msg).into() };
    if a.optimizer.is_bitsandbytes() && a.runtime != Runtime::Torch {
        return Err(arg(format!(
            "--optimizer {}: bitsandbytes' optimizers run under PyTorch (--runtime torch)",
            a.optimizer
        )));
    }
    let qlora = matches!(a.trainable, Trainable::Qlora(_));
    let what = match (quant, qlora) {
        (None, false) => None,
        (Some(k), true) => {
            return Err(arg(format!(
                "--trainable {}: QLoRA quantizes a dense checkpoint to NF4 at load; --model {} is \
                 already {} (train adapters on it with --trainable lora-rN)",
                a.trainable, a.model, k.format
            )))
        }
        (Some(k), false) => Some(format!("--model {} ({})", a.model, k.format)),
        (None, true) => Some(format!("--trainable {}", a.trainable)),
    };
    let Some(what) = what else {
        return Ok(None);
    };
    if gguf {
        return Err(arg(format!(
            "{what}: bitsandbytes quantizes a safetensors checkpoint, not a GGUF file"
        )));
    }
    if qlora && a.mode != Mode::Train {
        return Err(arg(format!(
            "{what} trains adapters: it needs --mode train"
        )));
    }
    if !qlora && a.mode == Mode::Train && !matches!(a.trainable, Trainable::Lora(_)) {
        // Full training of gpt-oss dequantizes its MXFP4 experts at load
        // (`Mxfp4Config(dequantize=True)`): dense weights (`dequantized_note`).
        if quant.is_some_and(|k| k.format == Format::Mxfp4) {
            return Ok(None);
        }
        return Err(arg(format!(
            "{what}: a quantized checkpoint's weights do not train; train LoRA adapters on it \
             (--trainable lora-rN)"
        )));
    }
    if let Some(p) = a
        .precision
        .filter(|p| p.is_quantized() || (qlora && p.is_mixed()))
    {
        return Err(arg(format!(
            "{what} loads its own format; --precision {p} is not for it (the dense tensors and \
             the compute take f32, f16 or bf16)"
        )));
    }
    if a.runtime != Runtime::Torch {
        return Err(arg(format!(
            "{what} is loaded by transformers: --runtime torch"
        )));
    }
    if a.best_format {
        return Err(arg(format!(
            "{what}: --best-format weighs GGUF formats of a dense model"
        )));
    }
    Ok(Some(Loaded {
        checkpoint: quant.cloned().unwrap_or_else(Checkpoint::qlora),
        qlora,
    }))
}

/// What `--emulate` cannot run: bitsandbytes (it needs CUDA) and quantized checkpoints.
pub fn not_emulated(a: &Args, l: Option<&Loaded>) -> Result<()> {
    let what = match (l, a.optimizer.is_bitsandbytes()) {
        (Some(l), _) => l.checkpoint.format.to_string(),
        (None, true) => a.optimizer.to_string(),
        (None, false) => return Ok(()),
    };
    match a.emulate {
        Some(_) => Err(InputError::arg(format!(
            "--emulate runs dense weights and torch.optim under the emulated GPU; {what} needs \
             its CUDA kernels (estimate it without --emulate)"
        ))
        .into()),
        None => Ok(()),
    }
}

impl Loaded {
    /// The weights of `m` at the query `q`'s dense dtype: an input error naming the model and
    /// the tensor the format cannot store.
    pub fn plan(&self, a: &Args, m: &Config, q: &Query) -> Result<Plan> {
        self.checkpoint
            .plan(m, q.state_bytes())
            .map_err(|e| InputError::arg(format!("--model {}: {e}", a.model)).into())
    }

    /// The weights' report: bytes, bits per weight, the quantized and dense tensors, the format.
    pub fn weights(&self, plan: &Plan, m: &Config, q: &Query) -> QuantWeights {
        QuantWeights {
            bytes: plan.bytes(),
            bits_per_weight: plan.bytes() as f64 * 8.0 / m.param_count().max(1) as f64,
            types: vec![
                (plan.format.name(), plan.quantized, plan.quantized_bytes),
                (self.dense(q), plan.dense, plan.dense_bytes),
            ],
            format: Some(plan.format),
            vllm: None,
        }
    }

    /// The dense tensors' dtype (`bf16`, ...).
    fn dense(&self, q: &Query) -> &'static str {
        Precision::of_dense(q.precision.dtypes(q.compute).0).as_str()
    }

    /// The weights row's name: "weights (mxfp4 experts, bf16 rest)".
    pub fn rename_weights_row(&self, plan: &Plan, q: &Query, rows: &mut [Row]) {
        let adapters = if self.qlora { " and adapters" } else { "" };
        if let Some(r) = rows.iter_mut().find(|r| r.name == "weights") {
            r.name = format!(
                "weights ({} {}, {} rest{adapters})",
                plan.format.name(),
                plan.what(),
                self.dense(q)
            );
        }
    }

    /// The notes: the format, and where the dequantization buffer comes from.
    pub fn notes(&self, plan: &Plan, q: &Query) -> Vec<String> {
        let mut notes = vec![format!(
            "weights loaded as {}{}: {} quantized tensors (scales, zeros and tables included), \
             the rest in {}",
            plan.format,
            if self.qlora {
                " (QLoRA: transformers' BitsAndBytesConfig(load_in_4bit=True, \
                 bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True))"
            } else {
                ""
            },
            plan.quantized,
            self.dense(q)
        )];
        if q.dequant_bytes > 0 {
            notes.push(format!(
                "dequantization buffer: without a fused kernel transformers multiplies by a \
                 dequantized copy of each {} weight in the compute dtype (bitsandbytes' \
                 MatMul4Bit, AWQ's and GPTQ's torch paths), one at a time: the largest, {} \
                 elements",
                plan.format.name(),
                plan.largest_matrix
            ));
        }
        notes
    }
}

/// The note of a quantized checkpoint estimated dense (`loaded` None): MXFP4 dequantized for
/// full training.
pub fn dequantized_note(quant: Option<&Checkpoint>, l: Option<&Loaded>) -> Option<String> {
    match (quant, l) {
        (Some(k), None) => Some(format!(
            "the {} weights are dequantized for full training (transformers' \
             Mxfp4Config(dequantize=True)): every weight in --precision",
            k.format
        )),
        _ => None,
    }
}

/// The note of a paged optimizer's state.
pub fn optimizer_note(q: &Query) -> Option<String> {
    q.optimizer.is_paged().then(|| {
        format!(
            "optimizer state is paged ({}): bitsandbytes allocates it in CUDA unified memory, \
             counted on the GPU here; under memory pressure the driver can evict its pages to the \
             host (and fetch them back at each step)",
            q.optimizer
        )
    })
}
