//! `vramlab generate`: greedy decoding from token ids, to check a model implementation
//! against known output (prints ids, and text when the GGUF carries a vocabulary).
use super::synth_weights::storage_precision;
use crate::error::InputError;
use crate::model::{gguf, weights, Decoder, InferenceModel, Source};
use crate::vocab::Precision;
use anyhow::Result;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model source: `gguf:FILE`, `hf:DIR` or `synthetic:CONFIG.json`.
    #[arg(long)]
    pub model: String,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Storage precision: f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: Precision,
}

/// Loads a decoder of any architecture at a precision on the CPU.
pub fn load(source: &Source, p: Precision) -> Result<Box<dyn Decoder>> {
    let cfg = source.config()?;
    let dev = candle_core::Device::Cpu;
    let t = weights::load(source, &cfg, p.dtype(), &dev, |_, _| {})?;
    match cfg.architecture.inference(&cfg, t, p.dtype())? {
        InferenceModel::Decoder(m) => Ok(m),
        InferenceModel::Encoder(_) => Err(InputError::arg(format!(
            "--model {}: a {} model is an encoder; generate needs a decoder",
            source.path().display(),
            cfg.architecture.name()
        ))
        .into()),
    }
}

pub fn run(args: Args) -> Result<()> {
    let source = Source::parse(&args.model)?;
    if !source.path().exists() {
        return Err(InputError::file(source.path(), "does not exist").into());
    }
    let model = load(&source, storage_precision("--precision", args.precision)?)?;
    let out = crate::workload::inference::generate(model.as_ref(), &args.prompt_ids, args.steps)?;
    let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
    println!("ids: {}", ids.join(","));
    if let Source::Gguf(p) = &source {
        let vocab = gguf::vocab(p)?;
        let text: String = out
            .iter()
            .map(|&t| vocab.get(t as usize).map(String::as_str).unwrap_or("?"))
            .collect::<String>()
            .replace('Ġ', " ")
            .replace('Ċ', "\n");
        println!("text: {text}");
    }
    Ok(())
}
