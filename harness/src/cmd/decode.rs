//! `vramlab decode` (formerly `generate`, still accepted as an alias until the next release):
//! greedy decoding from token ids, to check a model implementation against known output
//! (prints ids, and text when the GGUF carries a vocabulary). Renamed because "generate" means
//! a diffusion pipeline everywhere else (`mode = "generate"`).
use super::synth_weights::storage_precision;
use crate::error::InputError;
use crate::model::{gguf, weights, Decoder, InferenceModel, Source};
use crate::vocab::{Compute, Precision, QMatmul};
use anyhow::Result;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the tokens were generated; 1 loading or running the model \
failed; 2 bad input: an unusable model source or weights file, or a precision the source cannot \
take (one line naming it)."
)]
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
    /// Precision: f32, f16 or bf16 (dense); or, for a GGUF, `native` (keep the file's
    /// quantized types) or a re-quantization (q4_0, q4_1, q5_0, q5_1, q8_0, q4k, q5k, q6k, q8k).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: Precision,
    /// Compute dtype of a quantized precision (activations and KV cache).
    #[arg(long, value_enum, default_value = "f32")]
    pub compute: Compute,
    /// How a quantized precision's linear layers multiply (`dequantize`: per product).
    #[arg(long, value_enum, default_value = "auto")]
    pub qmatmul: QMatmul,
}

/// Loads a decoder of any architecture at a precision on the CPU (`compute`: a quantized
/// precision's compute dtype; dense precisions compute in their own).
pub fn load(
    source: &Source,
    p: Precision,
    compute: Compute,
    qmatmul: QMatmul,
) -> Result<Box<dyn Decoder>> {
    let cfg = source.config()?;
    let dev = candle_core::Device::Cpu;
    let (dtype, compute) = p.dtypes(compute);
    let model = match (p.quantized(), source) {
        (Some(q), Source::Gguf(path)) => {
            let (t, qt) = gguf::load_quantized(path, &cfg, q, compute, &dev, |_, _| {})?;
            cfg.architecture
                .inference_quantized(&cfg, t, qt, qmatmul, compute)?
        }
        (Some(_), _) => {
            return Err(InputError::arg(format!(
                "--precision {p}: quantized precisions need a `gguf:` model, got `{}`",
                source.path().display()
            ))
            .into())
        }
        (None, _) => {
            let t = weights::load(source, &cfg, dtype, &dev, |_, _| {})?;
            cfg.architecture.inference(&cfg, t, compute)?
        }
    };
    match model {
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
    if args.precision.is_mixed() {
        storage_precision("--precision", args.precision)?;
    }
    let model = load(&source, args.precision, args.compute, args.qmatmul)?;
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
