//! `vramlab synth-weights`: real shapes from a config.json, seeded random values, written as
//! an HF directory (config.json + model.safetensors) that the real loader reads, or created in
//! memory on a device (`--in-memory`), as a sweep's `synthetic:` source does, and timed.
use crate::error::InputError;
use crate::model::{synth, Config};
use crate::vocab::Precision;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the weights were written (or created, with --in-memory); \
1 writing or creating them failed; 2 bad input: an unusable config.json, --dtype or --device \
(one line naming it)."
)]
pub struct Args {
    /// HF config.json whose shapes to use.
    #[arg(long)]
    pub config: PathBuf,
    /// Storage dtype of the written tensors.
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: Precision,
    /// Output directory (created).
    #[arg(
        long,
        required_unless_present = "in_memory",
        conflicts_with = "in_memory"
    )]
    pub out: Option<PathBuf>,
    /// Create the weights in memory on --device, the way a sweep's `synthetic:` source does,
    /// and print how long that took (nothing is written).
    #[arg(long)]
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
    let cfg = Config::from_file(&args.config)?;
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
