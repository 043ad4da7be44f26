//! `validate --emulate`: a published row's own program run on the emulated GPU of the row's card,
//! under the installable software stack closest to the row's, beside the analytic estimate.
//! PyTorch's allocator answers with the figure the row measured (NVML used, allocated or
//! reserved). Only rows whose program vramlab carries run: the HF Trainer program of
//! transformers' single-GPU training guide (`vramlab/peers/peer_hf_trainer.py`) and
//! fms-acceleration's fine-tuning benchmark (`vramlab/peers/peer_fms_sft.py`: fms-hf-tuning's
//! SFT on the HF Trainer, FSDP through accelerate on more than one GPU); every other row says why
//! it has no emulated figure.
use super::{precision, Metric, PeerOptimizer, PeerRow, Program as Peer, Setup};
use crate::emulate::query;
use crate::estimate::{Precision, Recompute, Trainable};
use crate::gpu as catalogue;
use crate::model::diffusion::GenSource;
use crate::vocab::{GenModel, Mode, Stack};
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

/// One of vramlab's peer programs (in vramlab's `peers/`) with a row's arguments (after
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
    match r.program {
        Some(Peer::FmsSft) => fms_args(r),
        Some(Peer::SdxlNotebook) => match r.pipeline() {
            Some(m) => sdxl_args(r, m),
            None => Err("the SDXL notebook's program runs a pipeline preset".into()),
        },
        Some(Peer::HfTrainer) => hf_trainer_args(r).map(|args| Program {
            script: "peer_hf_trainer.py",
            args,
            gpus: 1,
            pipeline: None,
        }),
        None => Err(
            "no emulated program: vramlab carries transformers' single-GPU training guide's, \
             fms-acceleration's benchmark's and HF's SDXL notebook's"
                .into(),
        ),
    }
}

/// HF's "Exploring simple optimizations for SDXL" notebook: `peer_sdxl.py`'s arguments (one
/// pipeline call: the notebook's three repeat the same allocated peak).
fn sdxl_args(r: &PeerRow, m: GenModel) -> std::result::Result<Program, String> {
    if m != GenModel::Sdxl {
        return Err(format!(
            "no emulated program for {m}: vramlab carries the SDXL optimizations notebook's"
        ));
    }
    if r.setup.contains(&Setup::TorchCompile) {
        return Err("torch.compile: its Triton kernels and CUDA graphs are not emulated".into());
    }
    let square = r
        .resolution
        .is_none_or(|s| s.width == 1024 && s.height == 1024);
    if !square || r.guidance_scale.is_some_and(|g| g <= 1.0) {
        return Err("the notebook's program runs 1024x1024 with guidance (CFG) only".into());
    }
    let mut args = vec![
        "--images".to_string(),
        r.batch.unwrap_or(1).to_string(),
        "--steps".into(),
        r.steps.unwrap_or(25).to_string(),
        "--calls".into(),
        "1".into(),
    ];
    match precision(r) {
        Ok(Precision::F32) => args.push("--fp32".into()),
        Ok(Precision::F16) => {}
        _ => return Err("the notebook loads fp32 or fp16 only".into()),
    }
    if r.attention == crate::vocab::Attention::Eager {
        args.push("--eager".into());
    }
    for (setup, flag) in [
        (Setup::ModelCpuOffload, "--model-offload"),
        (Setup::SequentialCpuOffload, "--seq-offload"),
        (Setup::VaeSlicing, "--vae-slicing"),
        (Setup::PrecomputedEmbeddings, "--precomputed-embeds"),
        (Setup::TinyAutoencoder, "--tiny-vae"),
    ] {
        if r.setup.contains(&setup) {
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
    if r.mode != Mode::Train {
        return Err("fms-acceleration's benchmark program trains; the row does not".into());
    }
    if r.bnb_weights.is_some() {
        return Err(
            "a quantized base (bitsandbytes) of fms-acceleration: its CUDA kernels are not \
             emulated"
                .into(),
        );
    }
    if precision(r) != Ok(Precision::F16) {
        return Err(
            "the benchmark's program loads the model in float16 (torch_dtype); the row does not"
                .into(),
        );
    }
    let lora = match r.trainable {
        Some(Trainable::Full) => false,
        Some(Trainable::Lora(16)) => true,
        t => {
            let t = t.map_or("none".to_string(), |t| t.to_string());
            return Err(format!(
                "the benchmark trains all weights or LoRA r=16, not {t}"
            ));
        }
    };
    let gpus = r.gpus;
    let mut args = vec![
        "--gpus".to_string(),
        gpus.to_string(),
        "--batch".into(),
        r.batch.unwrap_or(1).to_string(),
        "--seq-len".into(),
        r.context.unwrap_or(4096).to_string(),
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

/// transformers' single-GPU training guide: `peer_hf_trainer.py`'s arguments (an inference
/// row loads the model only).
fn hf_trainer_args(r: &PeerRow) -> std::result::Result<Vec<String>, String> {
    match r.mode {
        Mode::Train => {}
        Mode::Infer if r.batch.is_none() => return Ok(vec!["--load-only".into()]),
        _ => return Err("no emulated program for this use of the model".into()),
    }
    let optim = match r.optimizer {
        PeerOptimizer::Adam8bit => {
            return Err(
                "bitsandbytes' 8-bit Adam: bitsandbytes is in no stack, and its CUDA \
                 kernels are not emulated"
                    .into(),
            )
        }
        PeerOptimizer::Adafactor => "adafactor",
        PeerOptimizer::Known(o) if o.is_adamw() && !o.is_bitsandbytes() => "adamw",
        PeerOptimizer::Known(o) => return Err(format!("optimizer `{o}` has no Trainer name")),
    };
    let mut a = vec![
        "--batch".to_string(),
        r.batch.unwrap_or(1).to_string(),
        "--grad-accum".into(),
        r.grad_accum.unwrap_or(1).to_string(),
        "--seq-len".into(),
        r.context.unwrap_or(512).to_string(),
        "--optim".into(),
        optim.into(),
    ];
    if r.recompute.is_some_and(|c| c != Recompute::None) {
        a.push("--checkpointing".into());
    }
    if r.precision == Some(Precision::MixedF16) {
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

/// The row's preset's published `config.json` (a built-in preset).
fn preset_config(r: &PeerRow) -> Option<&'static str> {
    let preset = r.preset.as_deref()?;
    crate::estimate::model::PRESETS
        .iter()
        .find(|(name, _)| *name == preset)
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
        Metric::VllmAvailableKv => return Ok(super::serving::emulated_column(r, o)),
    };
    let program = match program(r) {
        Ok(p) => p,
        Err(why) => return not(why),
    };
    let args = &program.args;
    // What the program reads: the model's config.json, or a pipeline's diffusers configs.
    let input = match (program.pipeline, preset_config(r)) {
        (Some(m), _) => Input::Pipeline(m),
        (None, Some(c)) => Input::Config(c),
        (None, None) => return not(format!("no built-in config for model `{}`", r.model)),
    };
    let Some(gpu) = r.gpu.as_deref().and_then(catalogue::by_name) else {
        return not("the row's card is not in the GPU catalogue".into());
    };
    // `--python` runs that torch, whichever stack it is; otherwise `--stack`, else the row's
    // `stack` (the installable one closest to its software).
    let (stack, python) = match &o.python {
        Some(p) => (None, p.clone()),
        None => {
            let s = o.stack.or(r.stack).unwrap_or_default();
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
    let script = crate::emulate::peers_dir()?.join(program.script);
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
    let stated = r.context_mib.map(|mib| mib << 20);
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
        program: format!("{} {}", script.display(), args.join(" ")),
        figure,
        emulated_bytes,
        error_pct,
        fits: e.fits,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bert-large training row of the guide with `fields` in place of its own.
    fn row_with(fields: serde_json::Value) -> PeerRow {
        let mut v = serde_json::json!({
            "id": "r", "source": "", "quote": "", "framework": "", "notes": "",
            "model": "bert-large-uncased", "preset": "bert-large-uncased", "gpu": "v100-16gb",
            "stack": "torch-1.10", "cuda": "11.2", "mode": "train", "precision": "f32",
            "optimizer": "adamw-for-loop", "trainable": "full", "batch": 1, "context": 512,
            "recompute": "full", "sharding": "ddp", "attention": "eager",
            "metric": "nvml-used", "value_bytes": 1, "program": "hf-trainer", "grad_accum": 4,
        });
        for (k, x) in fields.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rows_map_to_the_guides_trainer_arguments() {
        let a = hf_trainer_args(&row_with(serde_json::json!({
            "optimizer": "adafactor", "precision": "mixed-f16",
        })))
        .unwrap();
        assert_eq!(
            a.join(" "),
            "--batch 1 --grad-accum 4 --seq-len 512 --optim adafactor --checkpointing --fp16"
        );
        let bnb = row_with(serde_json::json!({"optimizer": "adam-8bit"}));
        assert!(hf_trainer_args(&bnb).is_err());
        let load = row_with(serde_json::json!({"mode": "infer", "batch": null, "context": null}));
        assert_eq!(hf_trainer_args(&load).unwrap(), ["--load-only"]);
        let none = row_with(serde_json::json!({"program": null}));
        assert!(program(&none).is_err());
    }

    #[test]
    fn fms_rows_map_to_the_benchmarks_program() {
        let fms = |fields: serde_json::Value| {
            let mut base = serde_json::json!({
                "preset": "mistral-7b-v0.1", "batch": 2, "context": 4096, "precision": "f16",
                "optimizer": "adamw-foreach", "program": "fms-sft", "gpu": "a100-80gb",
            });
            for (k, x) in fields.as_object().unwrap() {
                base[k] = x.clone();
            }
            row_with(base)
        };
        let p = program(&fms(serde_json::json!({
            "trainable": "lora-r16", "gpus": 2, "sharding": "fsdp",
        })))
        .unwrap();
        assert_eq!(p.script, "peer_fms_sft.py");
        assert_eq!(p.gpus, 2);
        assert_eq!(p.args.join(" "), "--gpus 2 --batch 2 --seq-len 4096 --lora");
        let p = program(&fms(serde_json::json!({}))).unwrap();
        assert_eq!(p.args.join(" "), "--gpus 1 --batch 2 --seq-len 4096");
        for (fields, why) in [
            (serde_json::json!({"trainable": "lora-r8"}), "LoRA r=16"),
            (serde_json::json!({"precision": "bf16"}), "float16"),
            (
                serde_json::json!({"precision": null, "bnb_weights": "fp4"}),
                "not emulated",
            ),
        ] {
            let e = program(&fms(fields.clone())).unwrap_err();
            assert!(e.contains(why), "{fields}: {e}");
        }
    }

    #[test]
    fn sdxl_rows_map_to_the_notebooks_setups() {
        let sdxl = |fields: serde_json::Value| {
            let mut base = serde_json::json!({
                "preset": "sdxl", "mode": "generate", "batch": 4, "context": null,
                "metric": "max-allocated", "precision": "f16", "optimizer": "none",
                "program": "sdxl-notebook", "attention": "sdpa", "gpu": "a100-40gb",
            });
            for (k, x) in fields.as_object().unwrap() {
                base[k] = x.clone();
            }
            row_with(base)
        };
        let p = program(&sdxl(serde_json::json!({
            "setup": ["vae-slicing", "sequential-cpu-offload"], "steps": 30,
        })))
        .unwrap();
        assert_eq!(p.script, "peer_sdxl.py");
        assert_eq!(p.pipeline, Some(GenModel::Sdxl));
        assert_eq!(
            p.args.join(" "),
            "--images 4 --steps 30 --calls 1 --seq-offload --vae-slicing"
        );
        let p = program(&sdxl(
            serde_json::json!({"precision": "f32", "attention": "eager"}),
        ))
        .unwrap();
        assert_eq!(
            p.args.join(" "),
            "--images 4 --steps 25 --calls 1 --fp32 --eager"
        );
        let e = program(&sdxl(serde_json::json!({"setup": ["torch-compile"]}))).unwrap_err();
        assert!(e.contains("torch.compile"), "{e}");
        assert!(program(&sdxl(serde_json::json!({"precision": "bf16"}))).is_err());
    }
}
