//! `vramlab estimate`: breakdown, smallest GPU of the catalog, largest batch and context for a
//! chosen GPU, and a vLLM-style KV capacity line. `--json` prints the same content.
use crate::checked::Checked;
use crate::error::InputError;
use crate::estimate::{
    self, gpu_by_name, smallest_gpu, Attention, Backend, Breakdown, Compute, GpuFit, KvWindow,
    Mode, Optimizer, OptimizerImpl, Overflow, Precision, Query, Resolved, Runtime, Sharding,
    Trainable, CATALOG,
};
use crate::fit::Constants;
use crate::model::Config;
use crate::units::{gb, gb_gib, gib};
use crate::vocab::{Checkpointing, KvKind};
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_CODES)]
pub struct Args {
    /// What the job runs: `infer` (prefill, then decode with a growing KV cache), `train` (one
    /// training step), `encode` (an encoder's forward, e.g. BERT) or `generate` (a generation
    /// pipeline; `infer` means the same for one).
    #[arg(long, value_enum, default_value = "infer")]
    pub mode: Mode,
    /// Sequences per batch (per GPU when training on --gpus); images or videos per batch for
    /// a generation pipeline.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// Tokens per sequence (prompt + generated for inference; sequence length for training).
    #[arg(long, default_value_t = 4096)]
    pub context: u64,

    /// A built-in preset, an HF directory, a config.json or a GGUF file; or a generation
    /// pipeline (`--help` lists the presets and pipelines).
    #[arg(
        long,
        help_heading = "Model and precision",
        long_help = model_long_help()
    )]
    pub model: String,
    /// f32, f16, bf16, mixed-bf16, mixed-f16; or weights kept quantized (inference): `native`
    /// (a GGUF's own tensor types, read from the file) or q4_0, q4_1, q5_0, q5_1, q8_0, q4k,
    /// q5k, q6k, q8k (every matrix at that format's block bytes, scales included). Default:
    /// `native` for a GGUF file, bf16 otherwise. `--weights` is the same flag.
    #[arg(
        long,
        value_enum,
        visible_alias = "weights",
        help_heading = "Model and precision"
    )]
    pub precision: Option<Precision>,
    /// The compute dtype (activations, KV cache) of a quantized precision.
    #[arg(
        long,
        value_enum,
        default_value = "f32",
        help_heading = "Model and precision"
    )]
    pub compute: Compute,

    /// Training only.
    #[arg(long, value_enum, default_value = "adamw", help_heading = "Training")]
    pub optimizer: Optimizer,
    /// Training with torch: how AdamW's step runs (its transient: foreach ≈ the parameter
    /// bytes, for-loop ≈ the largest tensor, fused ≈ 0).
    #[arg(long, value_enum, default_value = "foreach", help_heading = "Training")]
    pub optimizer_impl: OptimizerImpl,
    /// Training only: activation checkpointing (keep each layer's input, recompute in backward).
    #[arg(long, help_heading = "Training")]
    pub checkpointing: bool,
    /// Training only: what is updated: full, frozen-embeddings, or lora-rN (rank-N LoRA on the
    /// query and value projections; gradients and optimizer state cover the adapters only).
    #[arg(long, default_value = "full", value_parser = parse_trainable, help_heading = "Training")]
    pub trainable: Trainable,
    /// GPUs the training job spans.
    #[arg(long, default_value_t = 1, help_heading = "Training")]
    pub gpus: u64,
    /// How training state is spread over `--gpus` (ZeRO stages; fsdp = zero3).
    #[arg(long, value_enum, default_value = "ddp", help_heading = "Training")]
    pub sharding: Sharding,

    /// The runtime the job will use: torch (PyTorch + transformers, what most users run) or
    /// candle (vramlab's own workloads).
    #[arg(
        long,
        value_enum,
        default_value = "torch",
        help_heading = "Runtime and device"
    )]
    pub runtime: Runtime,
    /// The device kind: cuda (adds the CUDA context, cuBLAS workspace and allocator reserve
    /// rows, and judges the GPU by NVML used) or cpu (to compare with `vramlab sweep` on this
    /// machine).
    #[arg(
        long,
        value_enum,
        default_value = "cuda",
        help_heading = "Runtime and device"
    )]
    pub backend: Backend,
    /// Attention kernel: flash and sdpa never materialize the b·heads·s² scores; eager does.
    #[arg(
        long,
        value_enum,
        default_value = "flash",
        help_heading = "Runtime and device"
    )]
    pub attention: Attention,
    /// Inference KV cache kind (selects the fitted group).
    #[arg(
        long,
        value_enum,
        default_value = "preallocated",
        help_heading = "Runtime and device"
    )]
    pub kv_cache: KvKind,
    /// Inference with a sliding-window model (Mistral): `model` caps the KV cache at the
    /// window (min(context, window) tokens per sequence, what vLLM and HF allocate); `full`
    /// holds every token. Models without a window ignore it.
    #[arg(
        long,
        value_enum,
        default_value = "model",
        help_heading = "Runtime and device"
    )]
    pub kv_window: KvWindow,
    /// Fitted constants from `vramlab fit` (default: built-in analytic constants). They supply
    /// only the uncertain rows (runtime constant, activations, logits); weights, KV cache,
    /// gradients and optimizer state are always exact. Used only when their runtime and
    /// backend match the query's (else exit 2; see --allow-transfer).
    #[arg(long, help_heading = "Runtime and device")]
    pub constants: Option<PathBuf>,
    /// Use constants measured on another runtime or backend anyway (prints a warning line).
    #[arg(long, help_heading = "Runtime and device")]
    pub allow_transfer: bool,

    /// A GPU to fit (h100-80, a100-40, l4, h200, mi300x, … or a size such as 48gb).
    #[arg(long, help_heading = "GPU fit")]
    pub gpu: Option<String>,
    /// Fraction of GPU memory kept free.
    #[arg(long, default_value_t = 0.1, help_heading = "GPU fit")]
    pub headroom: f64,
    /// With --gpu: the format with the most bits per weight that fits the GPU at this batch
    /// and context, among the unquantized one (a GGUF's own types; for a preset the dense
    /// precision of --compute) and q8_0, q6k, q5k, q4k, q4_1, q4_0 (each at its exact block
    /// bytes), all with activations and KV cache in --compute, with a table of every
    /// format's total. The rest of the report is then for that format.
    #[arg(long, requires = "gpu", help_heading = "GPU fit")]
    pub best_format: bool,

    /// Also run this exact query under PyTorch on an emulated GPU (h200, h100-80gb, h100-pcie,
    /// a100-80gb, a100-40gb, l40s, l4, rtx-4090, rtx-3090, v100-16gb, v100-32gb): PyTorch's
    /// own allocator gives max_memory_allocated, max_memory_reserved and the NVML-equivalent
    /// "used", printed beside the analytic total, with "fits on GPU: yes/no" from a run at
    /// that GPU's capacity. Seconds; needs the torch environment (--python).
    #[arg(long, value_name = "GPU", help_heading = "Emulated GPU")]
    pub emulate: Option<String>,
    /// With --emulate: the Python of the torch environment (default: $VRAMLAB_TORCH_PYTHON,
    /// else python3 on PATH).
    #[arg(long, value_name = "PYTHON", help_heading = "Emulated GPU")]
    pub python: Option<PathBuf>,

    /// Generation models (`--model sd15|sd21|sdxl`): the output image, `WxH` pixels.
    #[arg(long, default_value = "512x512", help_heading = "Generation and video")]
    pub resolution: crate::vocab::Resolution,
    /// Generation models: classifier-free guidance (doubles the denoiser's batch).
    #[arg(long, help_heading = "Generation and video")]
    pub cfg: bool,
    /// Video models (`--model wan2.1-t2v-1.3b`): output frames per video, 4k+1 for Wan.
    #[arg(long, default_value_t = 1, help_heading = "Generation and video")]
    pub frames: u64,
    /// Generation models: how the VAE decodes: the whole batch at once, one image at a time,
    /// or overlapping tiles of `--tile` pixels.
    #[arg(
        long,
        value_enum,
        default_value = "full",
        help_heading = "Generation and video"
    )]
    pub vae_decode: crate::vocab::VaeDecode,
    /// Generation models, `--vae-decode tiled`: tile side in output pixels.
    #[arg(long, default_value_t = 256, help_heading = "Generation and video")]
    pub tile: usize,
    /// Generation models, `--vae-decode tiled`: overlap of neighbouring tiles in pixels.
    #[arg(long, default_value_t = 64, help_heading = "Generation and video")]
    pub overlap: usize,
    /// Generation models: the analytic priors instead of the built-in reference constants
    /// (fitted on this repository's CPU measurements of the runtime; see the `constants:` line).
    #[arg(
        long,
        conflicts_with = "constants",
        help_heading = "Generation and video"
    )]
    pub priors: bool,

    /// Print JSON instead of tables.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

/// `estimate`'s exit codes (its `--help`).
const EXIT_CODES: &str = "Exit codes: 0 the estimate was printed (whether or not it fits \
--gpu or the emulated GPU); 1 a failure (with --emulate: the torch probe failed on the emulated \
GPU); 2 bad input: an unusable --model file, constants file or flag value (one line naming it).";

/// `--model`'s long help: the forms it takes, then the built-in presets and the generation
/// pipelines, listed from the tables `--model` is resolved against (the presets are compiled
/// into the binary: no repository path is needed).
pub fn model_long_help() -> String {
    use clap::ValueEnum;
    let presets: Vec<&str> = estimate::model::PRESETS.iter().map(|(n, _)| *n).collect();
    let mut s = String::from(
        "The model: a built-in preset, an HF directory (its config.json), a config.json, a \
         GGUF file (its tensor types give exact quantized weight bytes), or a generation \
         pipeline.\n\n",
    );
    s.push_str("Presets (published config.json files, built in): ");
    s.push_str(&presets.join(", "));
    s.push_str(".\n\nGeneration pipelines:");
    for m in crate::vocab::GenModel::value_variants() {
        let v = m.to_possible_value().expect("no GenModel is skipped");
        let help = v.get_help().map(|h| h.to_string()).unwrap_or_default();
        s.push_str(&format!("\n  {:<16} {help}", v.get_name()));
    }
    s
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    bytes: u64,
}

/// The model in `--json`: its name, architecture, parameter count and the normalized
/// config written back as `config.json`.
#[derive(Serialize)]
struct ModelJson<'a> {
    name: &'a str,
    architecture: &'static str,
    params: u64,
    config: serde_json::Value,
}

#[derive(Serialize)]
struct Report<'a> {
    model: ModelJson<'a>,
    query: &'a Query,
    headroom: f64,
    source: &'a str,
    constants: &'a str,
    breakdown: Vec<Row>,
    /// NVML's "used": every row (the CUDA context included); the figure the GPU verdicts use.
    total_bytes: u64,
    /// The tensors at the peak (PyTorch's `max_memory_allocated`).
    allocated_bytes: u64,
    /// The allocator's pool at the peak (PyTorch's `max_memory_reserved`).
    reserved_bytes: u64,
    /// NVML's "used" (= `total_bytes`).
    nvml_bytes: u64,
    /// Which figure `smallest_gpu_gb` and `gpu` judge by: always `nvml_bytes`.
    verdict_figure: &'static str,
    /// Where the allocator reserve comes from (empty on the CPU).
    reserve_source: &'a str,
    smallest_gpu_gb: Option<u64>,
    smallest_gpu_examples: Option<&'static str>,
    gpu: Option<GpuFit>,
    /// A quantized precision's weights: bytes, bits per weight, and the kept types.
    weights: Option<&'a QuantWeights>,
    /// `--best-format`: every format's fit, most bits first, and the one chosen.
    best_format: Option<&'a BestFormat>,
    notes: &'a [String],
    /// `--emulate GPU`: PyTorch's figures on the emulated GPU, integer bytes.
    emulated: Option<&'a crate::emulate::query::Emulated>,
}

/// `--best-format`'s answer.
#[derive(Serialize)]
struct BestFormat {
    gpu: String,
    budget_bytes: u64,
    /// The format with the most bits per weight that fits; None if none does.
    best: Option<Precision>,
    formats: Vec<estimate::FormatFit>,
}

/// The weights of a quantized precision, from the GGUF's tensor types or the block formula.
#[derive(Serialize)]
struct QuantWeights {
    bytes: u64,
    /// bytes × 8 / parameters, scales and the dense norms included.
    bits_per_weight: f64,
    /// (type, tensors, bytes) per kept type.
    types: Vec<(&'static str, usize, u64)>,
}

/// The exact weights of a quantized `precision` (None for a dense one).
fn quantized_weights(
    a: &Args,
    gguf: Option<&std::path::Path>,
    m: &Config,
    precision: Precision,
) -> Result<Option<QuantWeights>> {
    use crate::vocab::Quantized;
    let Some(q) = precision.quantized() else {
        return Ok(None);
    };
    match (a.mode, a.trainable) {
        (Mode::Infer, _) | (Mode::Train, Trainable::Lora(_)) => {}
        _ => {
            return Err(InputError::arg(format!(
                "--precision {precision}: quantized weights are estimated for inference, or for training LoRA adapters on the frozen quantized base (QLoRA: --mode train --trainable lora-rN)"
            ))
            .into())
        }
    }
    let compute = precision.dtypes(a.compute).1;
    let plan = match (gguf, q) {
        (Some(file), _) => crate::model::gguf::plan(file, m, q)?,
        (None, Quantized::To(t)) => crate::model::gguf::plan_config(m, t)
            .map_err(|e| InputError::arg(format!("--model {}: {e}", a.model)))?,
        (None, Quantized::Native) => {
            return Err(InputError::arg(format!(
                "--precision native reads the tensor types of a GGUF file; --model {} is not one (use a format such as q4k or q8_0)",
                a.model
            ))
            .into())
        }
    };
    let bytes = crate::model::gguf::plan_bytes(&plan, compute);
    Ok(Some(QuantWeights {
        bytes,
        bits_per_weight: bytes as f64 * 8.0 / m.param_count() as f64,
        types: crate::model::gguf::plan_types(&plan, compute),
    }))
}

/// The query of `a` at `precision` (with its exact weight bytes, for a quantized one).
fn query(a: &Args, precision: Precision, weight_bytes: Option<u64>) -> Query {
    Query {
        mode: a.mode,
        precision,
        compute: a.compute,
        weight_bytes,
        batch: a.batch,
        context: a.context,
        optimizer: a.optimizer,
        checkpointing: if a.checkpointing {
            Checkpointing::Layer
        } else {
            Checkpointing::None
        },
        trainable: a.trainable,
        sharding: a.sharding,
        gpus: a.gpus,
        attention: a.attention,
        kv_cache: a.kv_cache,
        kv_window: a.kv_window,
        runtime: a.runtime,
        backend: a.backend,
        optimizer_impl: a.optimizer_impl,
    }
}

fn parse_trainable(s: &str) -> Result<Trainable, String> {
    Trainable::try_from(s.to_string())
}

pub fn run(a: Args) -> Result<()> {
    if let Ok(m) = a.model.parse::<crate::vocab::GenModel>() {
        return generation(&a, m);
    }
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(
            InputError::arg(format!("--headroom must be in [0, 1), got {}", a.headroom)).into(),
        );
    }
    if a.batch == 0 || a.context == 0 || a.gpus == 0 {
        return Err(InputError::arg("--batch, --context and --gpus must be at least 1").into());
    }
    let Resolved {
        name: model_name,
        config: m,
        gguf,
    } = estimate::resolve(&a.model)?;
    let precision = a.precision.unwrap_or(if gguf.is_some() {
        Precision::Native
    } else {
        Precision::Bf16
    });
    let gpu = match &a.gpu {
        None => None,
        Some(name) => Some(gpu_by_name(name).ok_or_else(|| {
            let names: Vec<&str> = CATALOG
                .iter()
                .flat_map(|c| c.names.iter().copied())
                .collect();
            InputError::arg(format!(
                "unknown --gpu `{name}` (known: {}, or a size like 48gb)",
                names.join(", ")
            ))
        })?),
    };
    let best = match (&gpu, a.best_format) {
        (Some((name, bytes)), true) => {
            if a.precision.is_some() {
                return Err(InputError::arg(
                    "--best-format chooses the precision; drop --precision/--weights",
                )
                .into());
            }
            // Every format is compared at one compute dtype (`--compute`): the unquantized
            // candidate of a preset is the dense precision of that dtype, so a format's KV
            // cache and activations are the same bytes and fewer bits never cost more.
            let top = match (gguf.is_some(), a.compute) {
                (true, _) => Precision::Native,
                (false, Compute::F32) => Precision::F32,
                (false, Compute::F16) => Precision::F16,
                (false, Compute::Bf16) => Precision::Bf16,
            };
            let candidates: Vec<(Precision, Result<Option<u64>, String>)> = std::iter::once(top)
                .chain(estimate::BEST_FORMATS)
                .map(|p| {
                    let w = quantized_weights(&a, gguf.as_deref(), &m, p)
                        .map(|w| w.map(|w| w.bytes))
                        .map_err(|e| crate::error::one_line(&e));
                    (p, w)
                })
                .collect();
            let base = query(&a, precision, None);
            let budget = estimate::budget(*bytes, a.headroom);
            let formats = estimate::format_fits(&m, &base, None, &candidates, budget);
            let best = formats.iter().find(|f| f.fits).map(|f| f.precision);
            Some(BestFormat {
                gpu: name.clone(),
                budget_bytes: budget,
                best,
                formats,
            })
        }
        _ => None,
    };
    let precision = best.as_ref().and_then(|b| b.best).unwrap_or(precision);
    let quant = quantized_weights(&a, gguf.as_deref(), &m, precision)?;
    let mut notes = Vec::new();
    let constants: Option<Constants> = match &a.constants {
        None => None,
        Some(p) => {
            let c = Constants::load(p)?;
            c.check_architecture(p, m.architecture.name())?;
            if let Some(w) = c.check_query(p, a.runtime, a.backend, a.allow_transfer)? {
                eprintln!("warning: {w}");
                notes.push(format!("warning: {w}"));
            }
            Some(c)
        }
    };
    let q = query(&a, precision, quant.as_ref().map(|w| w.bytes));
    // A figure past 2^64 B: bad input, naming the flags that cause it.
    let bad = |o: Overflow| {
        let sizes = [
            Size::of("--batch", a.batch, a.batch > 1),
            Size::of("--context", a.context, a.context > 1),
            Size::of("--constants", constants_flag(&a), constants.is_some()),
        ];
        overflow_error(o, &a.model, &sizes, |reset| {
            let q = Query {
                batch: if reset[0] { 1 } else { q.batch },
                context: if reset[1] { 1 } else { q.context },
                ..q
            };
            let c = constants.as_ref().filter(|_| !reset[2]);
            estimate::estimate(&m, &q, c).is_ok()
        })
    };
    let e = estimate::estimate(&m, &q, constants.as_ref()).map_err(bad)?;
    let used = match (&a.constants, &constants) {
        (Some(p), Some(c)) => format!(
            "{} ({} on {}, {}; models {}); {}",
            p.display(),
            c.runtime.as_str(),
            c.backend,
            c.device,
            c.models.join(", "),
            e.source
        ),
        _ => format!(
            "analytic (no --constants); device terms: sourced {} defaults",
            a.backend.as_str()
        ),
    };
    if let Some(k) = constants.as_ref().filter(|_| e.source == "analytic") {
        notes.push(match estimate::group_key(&m, &q, k.backend) {
            Some(k) => format!(
                "no fitted `{}` group in the constants file; analytic constants used",
                k.label()
            ),
            None => {
                "no fitted group applies (a sharded job, or no optimizer); analytic formulas used"
                    .into()
            }
        });
    }
    let fitted = match &constants {
        Some(c) => estimate::fitted_group(c, &m, &q).map_err(bad)?,
        None => None,
    };
    if let Some((g, _)) = fitted {
        for (t, why) in &g.model.held {
            notes.push(format!("{}: term {t} {why}", g.key.label()));
        }
    }
    if a.context > m.max_position_embeddings as u64 {
        notes.push(format!(
            "context {} exceeds the model's max_position_embeddings {}",
            a.context, m.max_position_embeddings
        ));
    }
    let total = e.total().map_err(bad)?;
    let emulated = match &a.emulate {
        None => None,
        Some(g) => Some(emulate_query(&a, g, &m, precision, quant.is_some())?),
    };
    let small = smallest_gpu(total, a.headroom);
    let fit = gpu
        .map(|(name, bytes)| {
            estimate::gpu_fit(&m, &q, constants.as_ref(), &name, bytes, a.headroom)
        })
        .transpose()
        .map_err(bad)?;
    if a.json {
        let report = Report {
            model: ModelJson {
                name: &model_name,
                architecture: m.architecture.name(),
                params: m.param_count(),
                config: m.to_hf_json(),
            },
            query: &q,
            headroom: a.headroom,
            source: &e.source,
            constants: &used,
            breakdown: e
                .rows()
                .into_iter()
                .map(|(name, bytes)| Row { name, bytes })
                .collect(),
            total_bytes: total,
            allocated_bytes: e.allocated().map_err(bad)?,
            reserved_bytes: e.reserved().map_err(bad)?,
            nvml_bytes: total,
            verdict_figure: "nvml_bytes",
            reserve_source: &e.reserve_source,
            smallest_gpu_gb: small.map(|c| c.gb),
            smallest_gpu_examples: small.map(|c| c.examples),
            gpu: fit,
            weights: quant.as_ref(),
            best_format: best.as_ref(),
            notes: &notes,
            emulated: emulated.as_ref(),
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if let Some(w) = &quant {
        let types: Vec<String> = w
            .types
            .iter()
            .map(|(t, n, b)| format!("{n} {t} = {b} B"))
            .collect();
        notes.insert(
            0,
            format!(
                "weights: {:.3} bits per weight (scales and dense norms included): {}",
                w.bits_per_weight,
                types.join(", ")
            ),
        );
    }
    if let Some(b) = &best {
        print_best(b);
    }
    print_text(
        &model_name,
        &m,
        &q,
        &e,
        &a,
        &used,
        small,
        fit.as_ref(),
        &notes,
    )
    .map_err(bad)?;
    if let Some(em) = &emulated {
        print_emulated(em, &e).map_err(bad)?;
    }
    Ok(())
}

/// `--emulate GPU`: the query under PyTorch on that emulated GPU.
fn emulate_query(
    a: &Args,
    gpu: &str,
    m: &crate::model::config::Config,
    precision: Precision,
    quantized: bool,
) -> Result<crate::emulate::query::Emulated> {
    use crate::emulate::{catalogue, query};
    let g = catalogue::resolve(Some(gpu), None).map_err(InputError::arg)?;
    if quantized {
        return Err(InputError::arg(
            "--emulate runs dense precisions (PyTorch keeps no GGUF blocks): pass --precision",
        )
        .into());
    }
    if a.runtime != Runtime::Torch || a.gpus != 1 {
        return Err(InputError::arg(
            "--emulate runs one GPU under torch (--runtime torch, --gpus 1)",
        )
        .into());
    }
    let explicit = a
        .python
        .clone()
        .or_else(|| std::env::var_os("VRAMLAB_TORCH_PYTHON").map(PathBuf::from));
    let python = crate::emulate::python_for(&[], explicit.as_deref())?;
    let stubs = crate::emulate::stubs_for(&python)?;
    let config = m.to_hf_json();
    let q = query::Query {
        config: &config,
        mode: a.mode,
        precision,
        batch: a.batch,
        context: a.context,
        optimizer: a.optimizer,
        optimizer_impl: a.optimizer_impl,
        checkpointing: a.checkpointing,
        trainable: a.trainable,
        attention: a.attention,
        kv_cache: a.kv_cache,
    };
    query::run(&q, &g, &python, &stubs)
}

fn print_emulated(
    em: &crate::emulate::query::Emulated,
    e: &Breakdown,
) -> Result<(), crate::checked::Overflow> {
    println!();
    println!(
        "emulated on {} (PyTorch {}'s allocator over a stub CUDA runtime; not a GPU measurement):",
        em.gpu,
        em.torch.as_deref().unwrap_or("?")
    );
    for (name, b, analytic) in [
        (
            "max_memory_allocated",
            em.max_memory_allocated,
            e.allocated()?,
        ),
        ("max_memory_reserved", em.max_memory_reserved, e.reserved()?),
        ("nvml_used", em.nvml_used, e.total()?),
    ] {
        let pct = (b as f64 / analytic.max(1) as f64 - 1.0) * 100.0;
        println!(
            "  {name:<21} {:>24}  ({} vs the estimate's {})",
            crate::units::gb_gib(b),
            crate::units::signed_pct(pct),
            crate::units::gb_gib(analytic)
        );
    }
    let verdict = if em.fits {
        "yes".to_string()
    } else {
        format!("no ({}: {})", em.status, em.message)
    };
    println!("fits on {}: {verdict}", em.gpu);
    Ok(())
}

/// `--best-format`'s table: every format's weights and total, and whether it fits.
fn print_best(b: &BestFormat) {
    match b.best {
        Some(p) => println!(
            "best format for {} ({} usable): {p}",
            b.gpu,
            gb_gib(b.budget_bytes)
        ),
        None => println!(
            "best format for {} ({} usable): none of these fits",
            b.gpu,
            gb_gib(b.budget_bytes)
        ),
    }
    println!(
        "{:<8} {:>12} {:>12} {:>12}  fits",
        "format", "bits/weight", "weights GB", "total GB"
    );
    for f in &b.formats {
        match (f.bits_per_weight, f.weight_bytes, f.total_bytes) {
            (Some(bits), Some(w), Some(t)) => println!(
                "{:<8} {:>12.3} {:>12} {:>12}  {}",
                f.precision.as_str(),
                bits,
                gb(w),
                gb(t),
                if f.fits { "yes" } else { "no" }
            ),
            _ => println!(
                "{:<8} {:>12} {:>12} {:>12}  impossible: {}",
                f.precision.as_str(),
                "-",
                "-",
                "-",
                f.impossible.as_deref().unwrap_or_default()
            ),
        }
    }
}

#[allow(clippy::too_many_arguments)] // one call site; the report's parts, borrowed
fn print_text(
    model_name: &str,
    m: &Config,
    q: &Query,
    e: &Breakdown,
    a: &Args,
    used: &str,
    small: Option<&estimate::GpuClass>,
    fit: Option<&GpuFit>,
    notes: &[String],
) -> Result<(), Overflow> {
    let total = e.total()?;
    let params = m.param_count();
    println!(
        "{} ({}, {} params): {} {}, batch {}, context {}{}",
        model_name,
        m.architecture.name(),
        params,
        if q.mode == Mode::Train {
            "train"
        } else {
            "infer"
        },
        q.precision.as_str(),
        q.batch,
        q.context,
        if q.mode == Mode::Train {
            format!(
                ", optimizer {}, checkpointing {}, trainable {}, {:?} over {} GPU(s)",
                q.runtime_optimizer(),
                q.checkpointing,
                q.trainable.label(),
                q.sharding,
                q.gpus
            )
            .to_lowercase()
        } else {
            String::new()
        }
    );
    println!("constants: {used}");
    println!(
        "{:<24} {:>12} {:>12} {:>10}",
        "per GPU", "GB", "GiB", "B/param"
    );
    for (name, bytes) in e.rows() {
        if bytes == 0 && !matches!(name, "weights" | "KV cache" | "activations") {
            continue;
        }
        println!(
            "{:<24} {:>12} {:>12} {:>10.2}",
            name,
            gb(bytes),
            gib(bytes),
            bytes as f64 / params as f64
        );
    }
    println!(
        "{:<24} {:>12} {:>12} {:>10.2}",
        "total",
        gb(total),
        gib(total),
        total as f64 / params as f64
    );
    println!("total: {}", gb_gib(total));
    if q.backend == Backend::Cuda {
        println!(
            "allocated {}; reserved {}; NVML used {} (reserved + CUDA context): the GPU verdicts below use NVML used",
            gb_gib(e.allocated()?),
            gb_gib(e.reserved()?),
            gb_gib(total)
        );
        println!("allocator reserve: {}", e.reserve_source);
    }
    if q.mode == Mode::Train {
        let states =
            (Checked::from(e.weights) + e.gradients + e.optimizer).bytes("model states")?;
        println!(
            "model states (weights + gradients + optimizer): {} = {:.2} B/param per GPU",
            gb_gib(states),
            states as f64 / params as f64
        );
    }
    match small {
        Some(c) => println!(
            "smallest GPU with {:.0}% headroom: {} GB ({})",
            100.0 * a.headroom,
            c.gb,
            c.examples
        ),
        None => println!(
            "smallest GPU with {:.0}% headroom: none of the catalog (largest is {} GB)",
            100.0 * a.headroom,
            CATALOG.last().map(|c| c.gb).unwrap_or(0)
        ),
    }
    if let Some(f) = fit {
        println!(
            "{}: {} usable of {}: {}",
            f.gpu,
            gb_gib(f.budget_bytes),
            gb_gib(f.gpu_bytes),
            if f.fits { "fits" } else { "does NOT fit" }
        );
        if q.mode == Mode::Train && !f.fits {
            match f.min_fsdp_gpus {
                Some(n) => println!("smallest FSDP (ZeRO-3) degree that fits {}: {n} GPUs", f.gpu),
                None => println!(
                    "no FSDP degree up to {} fits {}: activations and logits alone need {}; try --checkpointing or a smaller batch/context",
                    estimate::MAX_GPUS,
                    f.gpu,
                    gb_gib((Checked::from(e.activations) + e.logits).bytes("activations")?)
                ),
            }
        }
        println!(
            "largest batch at context {}: {}",
            q.context, f.largest_batch
        );
        let beyond = if f.largest_context > m.max_position_embeddings as u64 {
            format!(
                " (beyond the model's max_position_embeddings, {})",
                m.max_position_embeddings
            )
        } else {
            String::new()
        };
        println!(
            "largest context at batch {}: {}{beyond}",
            q.batch, f.largest_context
        );
        if let (Some(t), Some(c)) = (f.kv_capacity_tokens, f.max_concurrency) {
            println!(
                "KV cache capacity: {t} tokens; maximum concurrency at {} tokens: {c:.2}x",
                q.context
            );
        }
    }
    for n in notes {
        println!("note: {n}");
    }
    Ok(())
}

/// A flag of the query that can make its figures exceed 64 bits, as the user gave it.
struct Size {
    flag: &'static str,
    value: String,
    /// Whether the flag is above its smallest value (or given at all).
    set: bool,
}

impl Size {
    fn of(flag: &'static str, value: impl std::fmt::Display, set: bool) -> Size {
        Size {
            flag,
            value: value.to_string(),
            set,
        }
    }
}

/// `--constants`' value, as given.
fn constants_flag(a: &Args) -> String {
    a.constants
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// An estimate whose figures exceed 2^64 B, as bad input (exit 2) on one line naming its
/// cause: the set `sizes` each of which, alone brought back to its smallest value (`fits` gets
/// which ones are), makes the estimate representable; else all the set ones, if together
/// they do; else the model.
fn overflow_error(
    o: Overflow,
    model: &str,
    sizes: &[Size],
    fits: impl Fn(&[bool]) -> bool,
) -> anyhow::Error {
    let only = |i: usize| -> Vec<bool> { (0..sizes.len()).map(|j| j == i).collect() };
    let set: Vec<bool> = sizes.iter().map(|s| s.set).collect();
    let mut named: Vec<&Size> = (0..sizes.len())
        .filter(|&i| sizes[i].set && fits(&only(i)))
        .map(|i| &sizes[i])
        .collect();
    if named.is_empty() && set.contains(&true) && fits(&set) {
        named = sizes.iter().filter(|s| s.set).collect();
    }
    let flags: Vec<String> = named
        .iter()
        .map(|s| format!("{} {}", s.flag, s.value))
        .collect();
    let flags = if flags.is_empty() {
        format!("--model {model}")
    } else {
        flags.join(" ")
    };
    InputError::arg(format!("{flags}: {o}")).into()
}

/// A generation model's estimate (docs/src/guides/generation.md): the exact weights per component
/// and tensors, each phase's peak from fitted (or analytic) activation terms, the peak phase, and
/// the largest batch and square resolution each GPU class holds.
fn generation(a: &Args, m: crate::vocab::GenModel) -> Result<()> {
    use crate::estimate::generate::{self as gen, GenArch, GenQuery};
    let arch = GenArch::preset(m);
    if matches!(a.mode, Mode::Train | Mode::Encode) {
        return Err(InputError::arg(format!(
            "--mode {}: {} is estimated as a generation pipeline (--mode generate); its LoRA \
             fine-tuning is measured, not estimated: `vramlab sweep` with mode = [\"train\"] \
             (SD 1.5/2.1 and Wan2.1)",
            a.mode.as_str(),
            m.as_str()
        ))
        .into());
    }
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(
            InputError::arg(format!("--headroom must be in [0, 1), got {}", a.headroom)).into(),
        );
    }
    let precision = a.precision.unwrap_or(Precision::F16);
    if precision.is_mixed() || precision.is_quantized() {
        return Err(InputError::arg(format!(
            "--precision {precision}: generation models take f32, f16 or bf16"
        ))
        .into());
    }
    let dtype = precision.dtype();
    let q = GenQuery {
        batch: a.batch,
        resolution: a.resolution,
        frames: a.frames,
        cfg: a.cfg,
        vae_decode: a.vae_decode,
        tile: a.tile,
        overlap: a.overlap,
        dtype,
        // Both runtimes decode where the real pipeline does (f32 under SDXL's force_upcast,
        // and Wan's VAE, which the real pipeline loads in f32).
        vae_dtype: arch.default_vae_dtype(dtype),
        runtime: a.runtime,
        backend: a.backend,
        attention: a.attention,
    };
    gen::check(&arch, &q)?;
    let mut notes = Vec::new();
    if a.runtime == Runtime::Torch && a.backend == Backend::Cuda {
        // PyTorch's cuDNN v8 path tries the heuristics' engines in order, each allocating its
        // own workspace (counted by max_memory_allocated), and moves on at an out-of-memory
        // error: a workspace that grows into free memory, which no CPU measurement shows.
        notes.push(
            "torch on CUDA: cuDNN may allocate a convolution workspace on a shape's first call, \
             as large as free memory allows, and it is not in this estimate (HF's SDXL \
             VAE-slicing row on an A100 40GB measured above it: docs/src/guides/validate.md)"
                .to_string(),
        );
    }
    let constants = match &a.constants {
        None => None,
        Some(p) => {
            let c = Constants::load(p)?;
            if c.generation.is_empty() {
                notes.push(format!(
                    "{} has no generation groups; analytic priors used",
                    p.display()
                ));
            } else if !c
                .generation
                .iter()
                .any(|g| g.key.architecture == arch.architecture)
            {
                return Err(crate::error::bad_file(
                    p,
                    format!(
                        "constants fitted for other generation architectures cannot estimate {} (refit on its CSVs, or drop --constants)",
                        arch.architecture
                    ),
                ));
            }
            if let Some(w) = c.check_query(p, a.runtime, a.backend, a.allow_transfer)? {
                eprintln!("warning: {w}");
                notes.push(format!("warning: {w}"));
            }
            Some((p, c))
        }
    };
    // Without --constants (or --priors): the runtime's built-in reference constants, where they
    // cover the architecture; used across backends and precisions without --allow-transfer,
    // and said so.
    let reference = (a.constants.is_none() && !a.priors)
        .then(|| gen::reference(a.runtime))
        .filter(|(_, c)| {
            c.generation
                .iter()
                .any(|g| g.key.architecture == arch.architecture)
        });
    let constants = match (constants, &reference) {
        (None, Some((path, c))) => {
            if c.backend != a.backend {
                notes.push(format!(
                    "built-in reference constants measured on {} ({}), used for {}",
                    c.backend, c.device, a.backend
                ));
            }
            Some((std::path::Path::new(*path), c.clone()))
        }
        (c, _) => c.map(|(p, c)| (p.as_path(), c)),
    };
    let groups = constants.as_ref().map(|(_, c)| c.generation.as_slice());
    // A figure past 2^64 B: bad input, naming the flags that cause it.
    let bad = |o: Overflow| {
        let f = arch.factor;
        let sizes = [
            Size::of("--batch", q.batch, q.batch > 1),
            Size::of(
                "--resolution",
                q.resolution,
                q.resolution.width.max(q.resolution.height) > f,
            ),
            Size::of("--frames", q.frames, q.frames > 1),
            Size::of("--constants", constants_flag(a), a.constants.is_some()),
        ];
        overflow_error(o, &a.model, &sizes, |reset| {
            let smallest = crate::vocab::Resolution {
                width: f,
                height: f,
            };
            let q = GenQuery {
                batch: if reset[0] { 1 } else { q.batch },
                resolution: if reset[1] { smallest } else { q.resolution },
                frames: if reset[2] { 1 } else { q.frames },
                ..q
            };
            gen::estimate(&arch, &q, groups.filter(|_| !reset[3])).is_ok()
        })
    };
    let e = gen::estimate(&arch, &q, groups).map_err(bad)?;
    let denoiser_batch = arch.pass_batch(&q).bytes("denoiser batch").map_err(bad)?;
    let used = match &constants {
        Some((p, c)) if !c.generation.is_empty() => {
            let sha: Vec<String> = c
                .generation
                .iter()
                .flat_map(|g| g.origin.csv_sha256.iter())
                .map(|(f, h)| format!("{f} sha256 {}", &h[..12.min(h.len())]))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            format!(
                "{}{} ({} on {}, {}; fitted on {})",
                if reference.is_some() {
                    "built-in reference "
                } else {
                    ""
                },
                p.display(),
                c.runtime.as_str(),
                c.backend,
                c.device,
                sha.join(", ")
            )
        }
        _ => format!(
            "analytic priors (no fitted generation constants): {} profile{}",
            a.runtime.as_str(),
            match (a.runtime, a.attention) {
                (Runtime::Candle, Attention::Flash) if arch.denoise_flash => {
                    ", flash attention in the transformer (no materialized scores), VAE scores in f32"
                }
                (Runtime::Candle, _) if arch.denoise_scores_f32 => {
                    ", attention scores materialized in f32 (UNet and VAE)"
                }
                (Runtime::Candle, _) => {
                    ", attention scores materialized (transformer: in the pipeline's dtype; VAE: f32)"
                }
                (Runtime::Torch, Attention::Eager) =>
                    ", eager denoiser attention (scores and softmax in the pipeline's dtype), SDPA in the VAE",
                (Runtime::Torch, _) => ", SDPA attention (no materialized scores)",
            }
        ),
    };
    for p in &e.phases {
        if p.source == "analytic" && groups.is_some_and(|g| !g.is_empty()) {
            notes.push(format!("{}: no fitted group; analytic priors used", p.name));
        }
        if let Some(g) = groups.and_then(|g| {
            crate::fit::generate::find(
                g,
                &crate::fit::generate::GenGroupKey::of_query(&arch, &q, p.name),
            )
        }) {
            for (t, why) in &g.held {
                notes.push(format!("{}: term {t} {why}", g.key.label()));
            }
        }
    }
    let gpus = gen::gpu_fits(&arch, &q, groups, a.headroom);
    if a.json {
        let rows = |v: &[(String, u64)]| {
            v.iter()
                .map(|(n, b)| serde_json::json!({"name": n, "bytes": b}))
                .collect::<Vec<_>>()
        };
        let v = serde_json::json!({
            "model": {"name": m.as_str(), "architecture": arch.architecture, "params": arch.params()},
            "query": q,
            "denoiser_batch": denoiser_batch,
            "headroom": a.headroom,
            "constants": used,
            "exact": rows(&e.exact),
            "breakdown": rows(&e.breakdown),
            "phases": e.phases,
            "peak_phase": e.peak_phase,
            "total_bytes": e.total_bytes,
            "gpus": gpus,
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let r = q.resolution;
    println!(
        "{} ({}, {} params) {r}{}, batch {}{} (denoiser batch {}), {precision}, VAE {}, decode {}{}; {} on {}",
        m.as_str(),
        arch.architecture,
        arch.params(),
        if q.frames > 1 {
            format!(", {} frames", q.frames)
        } else {
            String::new()
        },
        q.batch,
        if q.cfg { ", cfg" } else { "" },
        denoiser_batch,
        Precision::of_dense(q.vae_dtype),
        q.vae_decode,
        if q.vae_decode == crate::vocab::VaeDecode::Tiled {
            format!(" (tile {}, overlap {})", q.tile, q.overlap)
        } else {
            String::new()
        },
        a.runtime.as_str(),
        a.backend
    );
    println!("constants: {used}");
    println!("{:<26} {:>16} {:>10}", "exact tensor", "bytes", "GiB");
    for (n, b) in e.exact.iter().chain(&e.device) {
        println!("{n:<26} {b:>16} {:>10}", gib(*b));
    }
    println!(
        "{:<12} {:>16} {:>10} {:>16}  coefficients from",
        "phase", "peak bytes", "GiB", "activations"
    );
    for p in &e.phases {
        println!(
            "{:<12} {:>16} {:>10} {:>16}  {}",
            p.name.to_string(),
            p.peak_bytes,
            gib(p.peak_bytes),
            p.activation_bytes,
            p.source
        );
    }
    println!(
        "peak phase: {}; total {}",
        e.peak_phase,
        gb_gib(e.total_bytes)
    );
    let video = arch.temporal_factor > 1;
    let frames_head = if video {
        format!("  {:>20}", format!("max frames@{r} b{}", q.batch))
    } else {
        String::new()
    };
    println!(
        "{:>5}  {:<30} {:>5} {:>14} {:>22}{frames_head}",
        "GB",
        "GPUs",
        "fits",
        format!("max batch@{r}"),
        format!("max square@b{}", q.batch)
    );
    for g in &gpus {
        let frames = if video {
            format!(
                "  {:>20}",
                g.largest_frames
                    .map(|f| f.to_string())
                    .unwrap_or_else(|| "none".into())
            )
        } else {
            String::new()
        };
        println!(
            "{:>5}  {:<30} {:>5} {:>14} {:>22}{frames}",
            g.gb,
            g.examples,
            if g.fits { "yes" } else { "no" },
            g.largest_batch,
            g.largest_square
                .map(|s| s.to_string())
                .unwrap_or_else(|| "none".into())
        );
    }
    println!("(with {:.0}% of each GPU kept free)", 100.0 * a.headroom);
    for n in &notes {
        println!("note: {n}");
    }
    Ok(())
}
