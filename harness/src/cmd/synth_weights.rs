//! `vramlab synth-weights`: real shapes from a config.json, seeded random values, written as
//! an HF directory (config.json + model.safetensors) that the real loader reads.
use crate::model::{synth, Config};
use crate::scenario::Precision;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF config.json whose shapes to use.
    #[arg(long)]
    pub config: PathBuf,
    /// Storage dtype of the written tensors.
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: PrecisionArg,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Random seed for the values.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PrecisionArg {
    F32,
    F16,
    Bf16,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::F16 => Precision::F16,
            PrecisionArg::Bf16 => Precision::Bf16,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let cfg = Config::from_file(&args.config)?;
    let dtype = Precision::from(args.dtype).dtype();
    synth::write(&cfg, dtype, args.seed, &args.out)?;
    let bytes = cfg.param_count() * dtype.size_in_bytes() as u64;
    println!(
        "wrote {} tensors, {} parameters, {} of {:?} weights to {}",
        cfg.tensor_count(),
        cfg.param_count(),
        crate::units::gb_gib(bytes),
        dtype,
        args.out.display()
    );
    Ok(())
}
