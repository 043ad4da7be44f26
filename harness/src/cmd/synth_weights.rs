//! `vramlab synth-weights`: real shapes from a config.json, seeded random values, written as
//! an HF directory (config.json + model.safetensors) that the real loader reads, or created in
//! memory on a device (`--in-memory`), as a sweep's `synthetic:` source does, and timed.
//! `--pipeline MODEL` writes a generation preset's diffusers directory instead, the one a
//! sweep's `synthetic:MODEL` source loads; `--configs-only` leaves out its weights, which is all
//! the emulated GPU reads (docs/src/guides/emulator.md).
use crate::error::InputError;
use crate::model::diffusion::{GenSource, Pipeline};
use crate::model::{synth, Config};
use crate::vocab::{Component, GenModel, Precision};
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the weights were written (or created, with --in-memory); \
1 writing or creating them failed; 2 bad input: an unusable config.json, --dtype or --device \
(one line naming it).\n\nA generation preset: `vramlab synth-weights --pipeline wan2.1-t2v-1.3b \
--dtype bf16 --configs-only` writes model_index.json and each component's config.json (no \
weights) into the directory a sweep's `synthetic:wan2.1-t2v-1.3b` source uses, which is what \
the torch probe on `--device emu:GPU` builds the models from. A later sweep writes the \
weights that are missing."
)]
pub struct Args {
    /// HF config.json whose shapes to use.
    #[arg(
        long,
        required_unless_present = "pipeline",
        conflicts_with = "pipeline"
    )]
    pub config: Option<PathBuf>,
    /// A generation preset instead of --config: its diffusers directory (model_index.json, each
    /// component's config.json and weights). Without --out, the directory a sweep's
    /// `synthetic:MODEL` source loads: $VRAMLAB_MODELS/synthetic-gen/MODEL-DTYPE-vae-DTYPE.
    #[arg(long, value_enum)]
    pub pipeline: Option<GenModel>,
    /// With --pipeline: the VAE's storage dtype (default: the pipeline's own choice, f32 for
    /// SDXL's upcast and Wan's VAE, else --dtype).
    #[arg(long, value_enum, requires = "pipeline")]
    pub vae_dtype: Option<Precision>,
    /// With --pipeline: write the configs only (model_index.json and each component's
    /// config.json), no weights.
    #[arg(long, requires = "pipeline")]
    pub configs_only: bool,
    /// Storage dtype of the written tensors.
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: Precision,
    /// Output directory (created).
    #[arg(
        long,
        required_unless_present_any = ["in_memory", "pipeline"],
        conflicts_with = "in_memory"
    )]
    pub out: Option<PathBuf>,
    /// Create the weights in memory on --device, the way a sweep's `synthetic:` source does,
    /// and print how long that took (nothing is written).
    #[arg(long, conflicts_with = "pipeline")]
    pub in_memory: bool,
    /// Device for --in-memory: cpu or cuda:N.
    #[arg(long, default_value = "cpu", requires = "in_memory")]
    pub device: String,
    /// Random seed for the values.
    #[arg(long, default_value_t = synth::SEED)]
    pub seed: u64,
}

/// `precision` as a storage dtype: f32, f16 or bf16 (the mixed policies are training
/// policies, not storage).
pub fn storage_precision(flag: &str, p: Precision) -> Result<Precision> {
    if p.is_mixed() || p.is_quantized() {
        let what = if p.is_mixed() {
            "a mixed policy"
        } else {
            "a quantized precision (it keeps a GGUF's blocks)"
        };
        return Err(InputError::arg(format!(
            "{flag} {p}: {what} is not a dense storage precision (use f32, f16 or bf16)"
        ))
        .into());
    }
    Ok(p)
}

pub fn run(args: Args) -> Result<()> {
    let Some(config) = &args.config else {
        return run_pipeline(&args);
    };
    let cfg = Config::from_file(config)?;
    let dtype = storage_precision("--dtype", args.dtype)?.dtype();
    let bytes = cfg.param_count() * dtype.size_in_bytes() as u64;
    let Some(out) = &args.out else {
        let (device, _) = crate::device::open(&args.device)?;
        let t0 = std::time::Instant::now();
        let tensors = synth::generate(&cfg, dtype, args.seed, &device)?;
        device.synchronize()?;
        let secs = t0.elapsed().as_secs_f64();
        let made: u64 = tensors
            .values()
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum();
        anyhow::ensure!(made == bytes, "created {made} B, the config says {bytes} B");
        println!(
            "created {} tensors, {} parameters, {} of {:?} weights on {} in {secs:.2} s",
            tensors.len(),
            cfg.param_count(),
            crate::units::gb_gib(bytes),
            dtype,
            args.device
        );
        return Ok(());
    };
    synth::write(&cfg, dtype, args.seed, out)?;
    println!(
        "wrote {} tensors, {} parameters, {} of {:?} weights to {}",
        cfg.tensor_count(),
        cfg.param_count(),
        crate::units::gb_gib(bytes),
        dtype,
        out.display()
    );
    Ok(())
}

/// `--pipeline MODEL`: the preset's diffusers directory, with or without its weights.
fn run_pipeline(args: &Args) -> Result<()> {
    let m = args.pipeline.expect("clap: --config or --pipeline");
    let dtype = storage_precision("--dtype", args.dtype)?.dtype();
    let vae = match args.vae_dtype {
        Some(v) => Some(storage_precision("--vae-dtype", v)?.dtype()),
        None => None,
    };
    let src = GenSource::Synthetic(m);
    let p = src.pipeline(dtype, vae)?;
    let dir = match &args.out {
        Some(out) => out.clone(),
        None => src.synthetic_dir(p.as_ref())?,
    };
    if args.configs_only {
        p.write_configs(&dir)?;
        println!(
            "wrote the configs of {m} ({}) to {} (no weights)",
            components(p.as_ref()),
            dir.display()
        );
        return Ok(());
    }
    crate::model::diffusion::write_synthetic(p.as_ref(), &dir)?;
    let bytes: u64 = p
        .components()
        .into_iter()
        .map(|c| p.params_analytic(c) * p.dtype(c).size_in_bytes() as u64)
        .sum();
    println!(
        "wrote {m} ({}), {} of weights, to {}",
        components(p.as_ref()),
        crate::units::gb_gib(bytes),
        dir.display()
    );
    Ok(())
}

/// "text_encoder bf16, transformer bf16, vae f32": each component and its dtype.
fn components(p: &dyn Pipeline) -> String {
    p.components()
        .into_iter()
        .map(|c: Component| format!("{c} {}", p.dtype(c).as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}
