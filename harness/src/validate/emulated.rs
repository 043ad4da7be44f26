//! `validate --emulate`: a published row's own program run on the emulated GPU of the row's card,
//! under the installable software stack closest to the row's, beside the analytic estimate.
//! PyTorch's allocator answers with the figure the row measured (NVML used, allocated or
//! reserved). Only rows whose program vramlab carries run: the HF Trainer program of
//! transformers' single-GPU training guide (`scripts/torch_probe/peer_hf_trainer.py`) and
//! fms-acceleration's fine-tuning benchmark (`scripts/torch_probe/peer_fms_sft.py`: fms-hf-tuning's
//! SFT on the HF Trainer, FSDP through accelerate on more than one GPU); every other row says why
//! it has no emulated figure.
use super::{number_after, precision, trainable, Metric, PeerRow};
use crate::emulate::query;
use crate::estimate::{Precision, Trainable};
use crate::gpu as catalogue;
use crate::model::diffusion::GenSource;
use crate::vocab::GenModel;
use crate::vocab::Stack;
use anyhow::Result;
use candle_core::DType;
use serde::Serialize;
use std::path::PathBuf;

/// The emulated column of one row.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Column {
    Ran {
        /// The stack the program ran under (none with `--python`), and its torch.
        stack: Option<Stack>,
        torch: Option<String>,
        /// `"<GPU> (emulated)"`.
        gpu: String,
        /// The program and its arguments (after the interpreter).
        program: String,
        /// Which of PyTorch's figures the row's metric is: `nvml_used`,
        /// `max_memory_allocated` or `max_memory_reserved`.
        figure: &'static str,
        emulated_bytes: u64,
        /// (emulated − measured) / measured, in percent.
        error_pct: f64,
        /// The run fitted the card's capacity (PyTorch's own out-of-memory otherwise).
        fits: bool,
        /// The stack used and why it differs from the row's.
        note: String,
    },
    NotEmulated {
        reason: String,
    },
}

/// How to run the emulated column: a fixed stack or Python, else the closest stack per row.
pub struct Options {
    pub stack: Option<Stack>,
    pub python: Option<PathBuf>,
    /// Stop a row's program after this long.
    pub timeout: Option<std::time::Duration>,
    /// The runs so far, by program, input and card: rows that publish two figures of one run
    /// (fms-acceleration's allocated and NVML rows) run it once.
    pub runs: Runs,
}

/// One emulated run's answer, or its failure's one line, by what it ran.
pub type Runs = std::cell::RefCell<std::collections::HashMap<String, Ran>>;
type Ran = std::result::Result<query::Emulated, String>;

/// One of vramlab's peer programs (in `scripts/torch_probe/`) with a row's arguments (after
/// `--config DIR`).
#[derive(Debug, PartialEq)]
pub(crate) struct Program {
    pub script: &'static str,
    pub args: Vec<String>,
    /// Ranks of a multi-GPU run (the program is rank 0 of a fake process group).
    pub gpus: u64,
    /// A diffusion pipeline's program reads the preset's diffusers configs (`--dir DIR`);
    /// the others the model's config.json (`--config DIR`).
    pub pipeline: Option<GenModel>,
}

/// The peer program that reproduces a row, or why none of vramlab's does.
pub(crate) fn program(r: &PeerRow) -> std::result::Result<Program, String> {
    let said = format!("{} {} {}", r.source, r.framework, r.notes).to_ascii_lowercase();
    if said.contains("fms-acceleration") || said.contains("fms-hf-tuning") {
        return fms_args(r);
    }
    if let Some(m) = super::generate::model(&r.model) {
        return sdxl_args(r, m);
    }
    hf_trainer_args(r).map(|args| Program {
        script: "peer_hf_trainer.py",
        args,
        gpus: 1,
        pipeline: None,
    })
}

/// HF's "Exploring simple optimizations for SDXL" notebook: `peer_sdxl.py`'s arguments (one
/// pipeline call: the notebook's three repeat the same allocated peak).
fn sdxl_args(r: &PeerRow, m: GenModel) -> std::result::Result<Program, String> {
    let lower = r.notes.to_ascii_lowercase();
    if m != GenModel::Sdxl {
        return Err(format!(
            "no emulated program for {m}: vramlab carries the SDXL optimizations notebook's"
        ));
    }
    if lower.contains("torch.compile") {
        return Err("torch.compile: its Triton kernels and CUDA graphs are not emulated".into());
    }
    let size = r.resolution.clone().or_else(|| {
        let (w, h) = (r.width?, r.height?);
        Some(format!("{w}x{h}"))
    });
    if size.is_some_and(|s| s != "1024x1024") || r.guidance_scale.is_some_and(|g| g <= 1.0) {
        return Err("the notebook's program runs 1024x1024 with guidance (CFG) only".into());
    }
    let steps = lower
        .find(" steps")
        .and_then(|i| {
            lower[..i]
                .rsplit(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(25u64);
    let mut args = vec![
        "--images".to_string(),
        r.batch.unwrap_or(1).to_string(),
        "--steps".into(),
        steps.to_string(),
        "--calls".into(),
        "1".into(),
    ];
    match precision(&r.precision) {
        Ok(Precision::F32) => args.push("--fp32".into()),
        Ok(Precision::F16) => {}
        _ => {
            return Err(format!(
                "the notebook loads fp32 or fp16, not `{}`",
                r.precision
            ))
        }
    }
    for (words, flag) in [
        ("set_default_attn_processor", "--eager"),
        ("enable_model_cpu_offload", "--model-offload"),
        ("enable_sequential_cpu_offload", "--seq-offload"),
        ("enable_vae_slicing", "--vae-slicing"),
        ("text_encoder=none", "--precomputed-embeds"),
        ("autoencodertiny", "--tiny-vae"),
    ] {
        if lower.contains(words) {
            args.push(flag.into());
        }
    }
    Ok(Program {
        script: "peer_sdxl.py",
        args,
        gpus: 1,
        pipeline: Some(m),
    })
}

/// fms-acceleration's benchmark (full fine-tuning or its standard LoRA, float16 weights),
/// `peer_fms_sft.py`'s arguments.
fn fms_args(r: &PeerRow) -> std::result::Result<Program, String> {
    let lower = r.notes.to_ascii_lowercase();
    if !r.mode.trim().to_ascii_lowercase().starts_with("train") {
        return Err("fms-acceleration's benchmark program trains; the row does not".into());
    }
    if ["bnb", "bitsandbytes", "gptq", "foak", "nf4"]
        .iter()
        .any(|w| lower.contains(w))
    {
        return Err(
            "a quantized base (bitsandbytes, GPTQ) or fused-ops plugin of fms-acceleration: \
             its CUDA kernels are not emulated"
                .into(),
        );
    }
    if precision(&r.precision) != Ok(Precision::F16) {
        return Err(format!(
            "the benchmark's program loads the model in float16 (torch_dtype); the row says `{}`",
            r.precision
        ));
    }
    let lora = match trainable(&lower)? {
        Trainable::Full => false,
        Trainable::Lora(16) => true,
        t => {
            return Err(format!(
                "the benchmark trains all weights or LoRA r=16, not {t}"
            ))
        }
    };
    let gpus = number_after(&lower, "num_gpus=").unwrap_or(1);
    let mut args = vec![
        "--gpus".to_string(),
        gpus.to_string(),
        "--batch".into(),
        r.batch.unwrap_or(1).to_string(),
        "--seq-len".into(),
        r.seq_len.unwrap_or(4096).to_string(),
    ];
    if lora {
        args.push("--lora".into());
    }
    Ok(Program {
        script: "peer_fms_sft.py",
        args,
        gpus,
        pipeline: None,
    })
}

/// transformers' single-GPU training guide: `peer_hf_trainer.py`'s arguments.
fn hf_trainer_args(r: &PeerRow) -> std::result::Result<Vec<String>, String> {
    let notes = r.notes.as_str();
    if !notes.contains("AutoModelForSequenceClassification") {
        return Err(
            "no emulated program: vramlab carries the HF Trainer program of \
                    transformers' single-GPU training guide only"
                .into(),
        );
    }
    if !notes.contains("HF Trainer") {
        return if notes.contains("no forward pass") {
            Ok(vec!["--load-only".into()])
        } else {
            Err("no emulated program for this use of the model".into())
        };
    }
    let optimizer = r.optimizer.to_ascii_lowercase();
    let optim = if optimizer.contains("8bit") || optimizer.contains("bnb") {
        return Err(
            "bitsandbytes' 8-bit Adam: bitsandbytes is in no stack, and its CUDA \
                    kernels are not emulated"
                .into(),
        );
    } else if optimizer.contains("adafactor") {
        "adafactor"
    } else if optimizer.contains("adam") {
        "adamw"
    } else {
        return Err(format!("optimizer `{}` has no Trainer name", r.optimizer));
    };
    let mut a = vec![
        "--batch".to_string(),
        r.batch.unwrap_or(1).to_string(),
        "--grad-accum".into(),
        number_after(notes, "gradient_accumulation_steps=")
            .unwrap_or(1)
            .to_string(),
        "--seq-len".into(),
        r.seq_len.unwrap_or(512).to_string(),
        "--optim".into(),
        optim.into(),
    ];
    if r.gradient_checkpointing == Some(true) {
        a.push("--checkpointing".into());
    }
    if r.precision.to_ascii_lowercase().starts_with("mixed-fp16") {
        a.push("--fp16".into());
    }
    Ok(a)
}

/// What a peer program reads (after `--config` or `--dir`).
#[derive(Clone, Copy, Debug)]
enum Input {
    /// A built-in preset's published `config.json`.
    Config(&'static str),
    /// A diffusion preset's diffusers configs, written for the run.
    Pipeline(GenModel),
}

/// The model's published `config.json` (a built-in preset), by the row's model words.
fn preset_config(model: &str) -> Option<&'static str> {
    let lower = model.trim().to_ascii_lowercase();
    let last = lower.rsplit('/').next().unwrap_or(&lower).to_string();
    crate::estimate::model::PRESETS
        .iter()
        .find(|(name, _)| *name == last)
        .map(|(_, text)| *text)
}

/// Runs the row's program and compares PyTorch's figure with the measurement. Errors are
/// the caller's bad input (a stack that is not installed); a program that fails on the
/// emulated GPU is a `NotEmulated` row naming its last line.
pub fn column(r: &PeerRow, metric: Metric, o: &Options) -> Result<Column> {
    let not = |reason: String| Ok(Column::NotEmulated { reason });
    let figure = match metric {
        Metric::NvmlUsed => "nvml_used",
        Metric::MaxAllocated => "max_memory_allocated",
        Metric::MaxReserved => "max_memory_reserved",
        Metric::ModelStates | Metric::LayerActivations => {
            return not("a formula, not a program".into())
        }
    };
    let program = match program(r) {
        Ok(p) => p,
        Err(why) => return not(why),
    };
    let args = &program.args;
    // What the program reads: the model's config.json, or a pipeline's diffusers configs.
    let input = match (program.pipeline, preset_config(&r.model)) {
        (Some(m), _) => Input::Pipeline(m),
        (None, Some(c)) => Input::Config(c),
        (None, None) => return not(format!("no built-in config for model `{}`", r.model)),
    };
    let Some(gpu) = catalogue::from_words(&r.gpu) else {
        return not(format!("no catalogued GPU for `{}`", r.gpu));
    };
    // `--python` runs that torch, whichever stack it is; otherwise `--stack`, else the
    // stack closest to the row's framework.
    let (stack, python) = match &o.python {
        Some(p) => (None, p.clone()),
        None => {
            let s = o.stack.unwrap_or_else(|| Stack::closest(&r.framework));
            (Some(s), crate::emulate::stack_python(s)?)
        }
    };
    let stubs = crate::emulate::stubs_for(&python)?;
    let dir = std::env::temp_dir().join(format!("vramlab-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let flag = match input {
        Input::Config(c) => {
            std::fs::write(dir.join("config.json"), c)?;
            "--config"
        }
        Input::Pipeline(m) => {
            // The preset's diffusers configs; the program loads them in the row's dtype.
            GenSource::Synthetic(m)
                .pipeline(DType::F16, None)?
                .write_configs(&dir)?;
            "--dir"
        }
    };
    let script = crate::emulate::scripts_dir()
        .join("torch_probe")
        .join(program.script);
    let mut argv = vec![
        python.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
        flag.into(),
        dir.to_string_lossy().into_owned(),
    ];
    argv.extend(args.iter().cloned());
    // The folder is the same for every row, so the key names what it holds.
    let key = format!("{input:?} {} {}", gpu.key, argv.join(" "));
    let cached = o.runs.borrow().get(&key).cloned();
    let run = cached.unwrap_or_else(|| {
        let run = query::run_program(&argv, &gpu, &stubs, o.timeout)
            .map_err(|err| crate::error::one_line(&err));
        o.runs.borrow_mut().insert(key, run.clone());
        run
    });
    let _ = std::fs::remove_dir_all(&dir);
    let e = match run {
        Ok(e) => e,
        Err(why) => return not(why),
    };
    // NVML used counts the CUDA context of the row's own driver and CUDA where its source
    // measured it (a CUDA 11 context without lazy module loading is three times the
    // emulator's CUDA 12+ constant).
    let stated = stated_context(&r.notes);
    let context = stated.unwrap_or(catalogue::CONTEXT_BYTES);
    let emulated_bytes = match metric {
        Metric::NvmlUsed => e.nvml_used - catalogue::CONTEXT_BYTES + context,
        Metric::MaxAllocated => e.max_memory_allocated,
        _ => e.max_memory_reserved,
    };
    let error_pct =
        100.0 * (emulated_bytes as f64 - r.value_bytes as f64) / r.value_bytes.max(1) as f64;
    let torch = e.torch.clone();
    let ran = torch.as_deref().unwrap_or("?");
    let framework = r.framework.split(['(', ';']).next().unwrap_or("").trim();
    let mut note = match stack {
        Some(s) => format!(
            "stack {s} (torch {ran}) for the row's `{framework}`: {}",
            if o.stack.is_some() {
                "the stack --stack named"
            } else {
                "the closest installable stack"
            }
        ),
        None => format!("--python's torch {ran} for the row's `{framework}`"),
    };
    if args.iter().any(|a| a == "adamw") {
        note.push_str(
            "; AdamW is transformers' own (adamw_hf) where the stack has it, else torch's",
        );
    }
    if program.script == "peer_fms_sft.py" {
        note.push_str(
            "; attention is PyTorch's SDPA, not the row's flash-attn 2 (no wheel for the \
             stack's torch, and its kernels are not emulated)",
        );
    }
    if program.pipeline.is_some() {
        note.push_str(
            "; one pipeline call (the notebook's three repeat its allocated peak); convolutions \
             take PyTorch's native CUDA path under emulation (cuDNN off): its im2col column \
             buffers stand in for cuDNN's workspace, which cuDNN sizes from the memory free at \
             the call",
        );
    }
    if metric == Metric::NvmlUsed && program.gpus > 1 {
        note.push_str(&format!(
            "; rank 0 of {} in torch's fake process group: NCCL's communicator buffers and \
             its kernels' memory, which a real rank also holds, are not counted",
            program.gpus
        ));
    }
    if metric == Metric::NvmlUsed {
        note.push_str(&match stated {
            Some(c) => format!(
                "; nvml adds the CUDA context the row's source measured on its driver, {} \
                 (the emulator's own constant, {}, is CUDA 12+ with lazy module loading)",
                crate::units::human(c),
                crate::units::human(catalogue::CONTEXT_BYTES)
            ),
            None => format!(
                "; nvml adds the emulator's {} context constant (CUDA 12+, lazy module \
                 loading): the row's source states no context of its own",
                crate::units::human(catalogue::CONTEXT_BYTES)
            ),
        });
    }
    Ok(Column::Ran {
        stack,
        torch,
        gpu: e.gpu,
        program: format!("{} {}", program.script, args.join(" ")),
        figure,
        emulated_bytes,
        error_pct,
        fits: e.fits,
        note,
    })
}

/// The CUDA context a row's notes say its source measured: the first "N MiB" within a few
/// words of "context" ("includes CUDA context/kernels (1343 MiB measured after ...)").
pub(crate) fn stated_context(notes: &str) -> Option<u64> {
    notes.match_indices(" MiB").find_map(|(i, _)| {
        let digits: String = notes[..i]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let mib: u64 = digits.parse().ok()?;
        let lo = notes.floor_char_boundary(i.saturating_sub(40));
        let hi = notes.ceil_char_boundary((i + 40).min(notes.len()));
        notes[lo..hi].contains("context").then_some(mib << 20)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bert-large training row with `fields` in place of its own.
    fn row_with(fields: serde_json::Value) -> PeerRow {
        let mut v = serde_json::json!({
            "id": "r", "model": "bert-large-uncased", "mode": "training",
            "precision": "fp32", "optimizer": "adamw", "batch": 1, "seq_len": 512,
            "gradient_checkpointing": true, "metric": "nvidia-smi used",
            "value_bytes": 1, "notes": "",
        });
        for (k, x) in fields.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn row(notes: &str, optimizer: &str, precision: &str) -> PeerRow {
        row_with(serde_json::json!({
            "notes": notes, "optimizer": optimizer, "precision": precision,
        }))
    }

    #[test]
    fn rows_map_to_the_guides_trainer_arguments() {
        let notes = "per_device_train_batch_size=1, gradient_accumulation_steps=4. \
                     bert-large-uncased via AutoModelForSequenceClassification, HF Trainer";
        let a = hf_trainer_args(&row(notes, "adafactor", "mixed-fp16 (AMP)")).unwrap();
        assert_eq!(
            a.join(" "),
            "--batch 1 --grad-accum 4 --seq-len 512 --optim adafactor --checkpointing --fp16"
        );
        assert!(hf_trainer_args(&row(notes, "bnb Adam8bit", "fp32")).is_err());
        let load = "from_pretrained(...) AutoModelForSequenceClassification; no forward pass";
        assert_eq!(
            hf_trainer_args(&row(load, "none", "fp32")).unwrap(),
            ["--load-only"]
        );
        assert!(hf_trainer_args(&row("SDXL pipeline", "none", "fp16")).is_err());
    }

    #[test]
    fn fms_rows_map_to_the_benchmarks_program() {
        let fms = |notes: &str, precision: &str| {
            row_with(serde_json::json!({
                "model": "mistralai/Mistral-7B-v0.1", "batch": 2, "seq_len": 4096,
                "source": "https://github.com/foundation-model-stack/fms-acceleration/...",
                "precision": precision, "notes": notes,
            }))
        };
        let p = program(&fms(
            "LoRA r=16 (lora_alpha 16); num_gpus=2: accelerate",
            "fp16",
        ))
        .unwrap();
        assert_eq!(p.script, "peer_fms_sft.py");
        assert_eq!(p.gpus, 2);
        assert_eq!(p.args.join(" "), "--gpus 2 --batch 2 --seq-len 4096 --lora");
        let p = program(&fms("full fine-tuning; num_gpus=1", "fp16")).unwrap();
        assert_eq!(p.args.join(" "), "--gpus 1 --batch 2 --seq-len 4096");
        for (notes, precision, why) in [
            ("LoRA r=8, num_gpus=1", "fp16", "LoRA r=16"),
            ("LoRA without its rank", "fp16", "without a rank"),
            ("full fine-tuning", "bf16", "float16"),
            (
                "LoRA r=16 on a bitsandbytes nf4 base",
                "fp16",
                "not emulated",
            ),
        ] {
            let e = program(&fms(notes, precision)).unwrap_err();
            assert!(e.contains(why), "{notes}: {e}");
        }
    }

    #[test]
    fn sdxl_rows_map_to_the_notebooks_setups() {
        let sdxl = |notes: &str, precision: &str| {
            row_with(serde_json::json!({
                "model": "stabilityai/stable-diffusion-xl-base-1.0", "mode": "inference",
                "batch": 4, "metric": "torch.cuda.max_memory_allocated",
                "precision": precision, "notes": notes,
            }))
        };
        let p = program(&sdxl(
            "fp16 + SDPA + enable_vae_slicing() + enable_sequential_cpu_offload(); 30 steps",
            "fp16",
        ))
        .unwrap();
        assert_eq!(p.script, "peer_sdxl.py");
        assert_eq!(p.pipeline, Some(GenModel::Sdxl));
        assert_eq!(
            p.args.join(" "),
            "--images 4 --steps 30 --calls 1 --seq-offload --vae-slicing"
        );
        let p = program(&sdxl("set_default_attn_processor(); 25 steps", "fp32")).unwrap();
        assert_eq!(
            p.args.join(" "),
            "--images 4 --steps 25 --calls 1 --fp32 --eager"
        );
        let e = program(&sdxl("torch.compile(unet)", "fp16")).unwrap_err();
        assert!(e.contains("torch.compile"), "{e}");
        assert!(program(&sdxl("default", "bf16")).is_err());
    }

    #[test]
    fn the_context_a_row_states() {
        let n = "includes CUDA context/kernels (1343 MiB measured after torch.ones(1,1).cuda())";
        assert_eq!(stated_context(n), Some(1343 << 20));
        let n = "Includes 1343 MiB CUDA context/kernels measured before loading (so weights \
                 ~1288 MiB ~ 335M params x 4 B)";
        assert_eq!(stated_context(n), Some(1343 << 20));
        assert_eq!(stated_context("weights ~1288 MiB, nothing else"), None);
    }

    #[test]
    fn gpus_and_stacks_from_the_rows_words() {
        let key = |t: &str| catalogue::from_words(t).map(|g| g.key);
        assert_eq!(
            key("NVIDIA Tesla V100-SXM2 16GB").as_deref(),
            Some("v100-16gb")
        );
        assert_eq!(key("V100 32GB").as_deref(), Some("v100-32gb"));
        assert_eq!(key("NVIDIA A100-SXM4-40GB").as_deref(), Some("a100-40gb"));
        assert_eq!(key("A100 80GB").as_deref(), Some("a100-80gb"));
        assert_eq!(key("H100 PCIe").as_deref(), Some("h100-pcie"));
        assert_eq!(key("NVIDIA L40S").as_deref(), Some("l40s"));
        assert_eq!(key("NVIDIA L4").as_deref(), Some("l4"));
        assert_eq!(key("GeForce RTX 4090").as_deref(), Some("rtx-4090"));
        assert_eq!(key("TPU v4"), None);
        assert_eq!(
            Stack::closest("PyTorch ~1.10 + transformers ~4.16"),
            Stack::Torch110
        );
        assert_eq!(Stack::closest("PyTorch 2.x + diffusers"), Stack::Torch22);
        assert_eq!(
            Stack::closest("torch 2.3, transformers 4.41"),
            Stack::Torch22
        );
        assert_eq!(Stack::closest("PyTorch 2.12"), Stack::Default);
        assert_eq!(Stack::closest("diffusers"), Stack::Default);
    }
}
