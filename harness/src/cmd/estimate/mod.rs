//! `vramlab estimate`: breakdown, smallest GPU of the catalog, largest batch and context for a
//! chosen GPU, and a vLLM-style KV capacity line. `--json` prints the same content. This file
//! holds the flags and the dispatch: `llm.rs` or `generation.rs` builds a [`Report`], which
//! `text.rs` or `json.rs` renders.
pub mod agreement;
mod emulated;
mod generation;
mod json;
mod llm;
mod loaded;
mod lora;
mod overflow;
mod report;
mod serving;
mod text;

use crate::estimate::{
    self, Attention, Backend, Compute, KvWindow, Mode, Optimizer, OptimizerImpl, Precision,
    Runtime, Sharding, Trainable,
};
use crate::vocab::KvKind;
use anyhow::Result;
pub use json::render_json;
pub use report::Report;
use std::path::PathBuf;
pub use text::render_text;

#[derive(Clone, Debug, clap::Args)]
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

    /// A built-in preset, an HF directory, a config.json, a GGUF file or a Hugging Face Hub id
    /// (ORG/NAME or ORG/NAME@REVISION); or a generation pipeline (`--help` lists the presets and
    /// pipelines).
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

    /// Training only: the optimizer. torch's (adamw and sgd take --optimizer-impl), or
    /// bitsandbytes' (--runtime torch, estimate only): adamw-8bit keeps both moments in uint8
    /// with an f32 absmax per 256 elements (tensors under 4,096 elements keep f32 moments);
    /// paged-adamw keeps f32 moments in CUDA unified memory, counted on the GPU, which the
    /// driver can evict to the host under memory pressure; paged-adamw-8bit pages the 8-bit
    /// state.
    #[arg(long, value_enum, default_value = "adamw", help_heading = "Training")]
    pub optimizer: Optimizer,
    /// Training with torch: how AdamW's step runs (its transient: foreach ≈ the parameter
    /// bytes, for-loop ≈ the largest tensor, fused ≈ 0).
    #[arg(long, value_enum, default_value = "foreach", help_heading = "Training")]
    pub optimizer_impl: OptimizerImpl,
    /// Training only: activation checkpointing (keep each layer's input, recompute in backward).
    #[arg(long, help_heading = "Training")]
    pub checkpointing: bool,
    /// Training only: what is updated: full, frozen-embeddings, lora-rN (rank-N LoRA on the
    /// query and value projections; gradients and optimizer state cover the adapters only), or
    /// qlora-rN (the same adapters on a base that bitsandbytes loads in NF4 with double
    /// quantization, computing in --precision bf16, f16 or f32: the base at its exact NF4
    /// bytes, plus a dequantization buffer; estimate only).
    #[arg(long, default_value = "full", value_parser = parse_trainable, help_heading = "Training")]
    pub trainable: Trainable,
    /// Training with lora-rN or qlora-rN: the modules the adapters go on. `peft` (the
    /// default): peft's own for the architecture (the query and value projections of the
    /// llama family); or a comma list of q, k, v, o (attention), gate, up, down (dense MLPs and
    /// shared experts) and experts (every routed expert, as peft's `target_parameters` adapts
    /// transformers' stacked expert tensors); `attention` is q,k,v,o, `all-linear`
    /// q,k,v,o,gate,up,down. LoRA on the experts also holds each layer's merged expert
    /// weights (W + BA, which peft builds in the forward) for the backward.
    #[arg(long, default_value = "peft", value_parser = parse_lora_targets, help_heading = "Training")]
    pub lora_targets: crate::vocab::LoraTargets,
    /// Training with lora-rN or qlora-rN under torch: peft's `lora_dropout`, the probability
    /// each adapter's input is dropped (0, peft's default: none). Above 0, each adapter keeps
    /// its dropout's 1-byte mask for the backward, and 16-bit adapters (peft before 0.12:
    /// --stack torch-2.2) their dropout's output too.
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "P",
        help_heading = "Training"
    )]
    pub lora_dropout: f64,
    /// GPUs the training job spans.
    #[arg(long, default_value_t = 1, help_heading = "Training")]
    pub gpus: u64,
    /// How training state is spread over `--gpus` (ZeRO stages; fsdp = zero3).
    #[arg(long, value_enum, default_value = "ddp", help_heading = "Training")]
    pub sharding: Sharding,
    /// FSDP's CPU offload (with --sharding fsdp or zero3 over 2 or more --gpus): each rank's
    /// shards of weights, gradients and optimizer state live in host memory and the optimizer
    /// steps on the CPU; the GPU holds the units it all-gathers, the activations and the
    /// logits. The host bytes per rank are reported beside the GPU figures.
    #[arg(long, help_heading = "Training")]
    pub offload: bool,

    /// The runtime the job will use: torch (PyTorch + transformers, what most users run),
    /// candle (vramlab's own workloads) or vllm (vLLM 0.33's serving engine on one GPU: its
    /// startup figures, weights, activation peak, available KV memory, KV tokens and maximum
    /// concurrency, for a dense decoder; needs --gpu).
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
    /// Inference with a sliding-window model (Mistral, Phi-3): `model` caps the KV cache at
    /// the window (min(context, window) tokens per sequence, what vLLM allocates); `full` holds
    /// every token. Default: `model`, what transformers' StaticCache and generate()'s
    /// DynamicCache hold (the emulated GPU measures it), and candle's cache. Models without a
    /// window ignore it.
    #[arg(long, value_enum, help_heading = "Runtime and device")]
    pub kv_window: Option<KvWindow>,
    /// Fitted constants from `vramlab fit` (default: built-in analytic constants). They supply
    /// only the uncertain rows (runtime constant, activations, logits); weights, KV cache,
    /// gradients and optimizer state are always exact. Used only when their runtime and
    /// backend match the query's (else exit 2; see --allow-transfer).
    #[arg(long, help_heading = "Runtime and device")]
    pub constants: Option<PathBuf>,
    /// Use constants measured on another runtime or backend anyway (prints a warning line).
    #[arg(long, help_heading = "Runtime and device")]
    pub allow_transfer: bool,

    /// A GPU to fit: any name `vramlab gpus` lists (h100-80gb or h100-80, a100-40gb, l4,
    /// rtx-4090 or rtx4090, h200, b200, mi300x, …), judged at its exact `totalGlobalMem`; or a
    /// size such as 48gb. Where the figure is within the allocator reserve's fitted range of
    /// the budget, the verdict is "borderline", with the `--emulate` command that settles it.
    /// A named card's compute capability also sizes torch's cuBLAS workspace (32 MiB from
    /// Hopper, 8.125 MiB before; without a card, 32 MiB).
    #[arg(long, help_heading = "GPU fit")]
    pub gpu: Option<String>,
    /// Fraction of GPU memory kept free: both the analytic and the `--emulate` verdicts judge
    /// NVML used against the card's bytes less this.
    #[arg(long, default_value_t = 0.1, help_heading = "GPU fit")]
    pub headroom: f64,
    /// With --gpu: the format with the most bits per weight that fits the GPU at this batch
    /// and context, among the unquantized one (a GGUF's own types; for a preset the dense
    /// precision of --compute) and q8_0, q6k, q5k, q4k, q4_1, q4_0 (each at its exact block
    /// bytes), all with activations and KV cache in --compute, with a table of every
    /// format's total. The rest of the report is then for that format.
    #[arg(long, requires = "gpu", help_heading = "GPU fit")]
    pub best_format: bool,

    /// Also run this exact query under PyTorch on an emulated GPU (any NVIDIA GPU `vramlab
    /// gpus` lists, by any of its names): PyTorch's own allocator gives max_memory_allocated,
    /// max_memory_reserved and the NVML-equivalent "used", printed beside the analytic total,
    /// with "fits on GPU": the run at that GPU's full capacity must not run out, and its NVML
    /// used must be within --headroom of the card's bytes, as the analytic verdict. Seconds; needs the torch environment (--python). With --gpus N
    /// (--sharding fsdp or zero3, full or frozen-embeddings training): rank 0 of FSDP full
    /// shard, in one process through torch's fake process group. A LoRA query's adapters go
    /// through peft (get_peft_model with its defaults, as labs run it). With --runtime vllm
    /// (the --gpu card): vLLM's own startup, LLM(...) at the query's settings from the model's
    /// config.json with dummy weights, under the vLLM stack's Python (--python, else
    /// $VRAMLAB_VLLM_PYTHON, else what `scripts/torch-env.sh --stack vllm-0.33` installed).
    #[arg(long, value_name = "GPU", help_heading = "Emulated GPU")]
    pub emulate: Option<String>,
    /// With --emulate: the Python of the torch environment (default: --stack's, else
    /// $VRAMLAB_TORCH_PYTHON, else the Python beside vramlab (a pip-installed wheel's), else the
    /// default stack that scripts/torch-env.sh installed, else python3 on PATH).
    #[arg(
        long,
        value_name = "PYTHON",
        help_heading = "Emulated GPU",
        conflicts_with = "stack"
    )]
    pub python: Option<PathBuf>,
    /// The pinned software stack (torch on CUDA): the allocator reserve fitted on that stack's
    /// emulated runs (default: the default stack's); with --emulate, the query also runs under
    /// it, installed by `scripts/torch-env.sh --stack NAME` (default: the torch environment of
    /// --python)
    #[arg(long, value_enum, value_name = "NAME", help_heading = "Emulated GPU")]
    pub stack: Option<crate::vocab::Stack>,
    /// With --emulate: the emulated device's total memory instead of the GPU's (e.g. 36GB,
    /// 33.5GiB, bytes), with the rest of that GPU's properties: where the verdict flips.
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = crate::units::parse_size,
        help_heading = "Emulated GPU",
        requires = "emulate"
    )]
    pub emulate_memory: Option<u64>,
    /// With --emulate: stop the torch probe after this long (e.g. 90s, 10m; 0 for never) and
    /// fail naming where it was.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = crate::emulate::query::DEFAULT_TIMEOUT,
        value_parser = crate::emulate::supervise::parse_timeout,
        help_heading = "Emulated GPU"
    )]
    pub emulate_timeout: crate::emulate::supervise::Timeout,

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

    /// With --runtime vllm: vLLM's `--max-model-len`, the longest request (tokens; default:
    /// the model's max_position_embeddings, as vLLM's).
    #[arg(long, value_name = "TOKENS", help_heading = "Serving (--runtime vllm)")]
    pub max_model_len: Option<u64>,
    /// With --runtime vllm: the fraction of the GPU's total memory vLLM may take.
    #[arg(
        long,
        default_value_t = 0.9,
        value_name = "FRACTION",
        help_heading = "Serving (--runtime vllm)"
    )]
    pub gpu_memory_utilization: f64,
    /// With --runtime vllm: the KV cache's dtype: auto (the model's) or fp8 (one byte a value).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        help_heading = "Serving (--runtime vllm)"
    )]
    pub kv_cache_dtype: crate::vocab::KvCacheDtype,
    /// With --runtime vllm: the tokens of one scheduler step, which the profile run's forward
    /// takes at once (default: `vllm serve`'s for the GPU: 16,384 from 160 GiB, 8,192 from
    /// 70 GiB but not on an A100, else 2,048).
    #[arg(long, value_name = "TOKENS", help_heading = "Serving (--runtime vllm)")]
    pub max_num_batched_tokens: Option<u64>,
    /// With --runtime vllm: the most sequences of one step, the rows of the sampler's state and
    /// of its profile pass (default: `vllm serve`'s: 1,024 from 70 GiB but not on an A100, else
    /// 256).
    #[arg(long, value_name = "SEQS", help_heading = "Serving (--runtime vllm)")]
    pub max_num_seqs: Option<u64>,
    /// With --runtime vllm: an eager engine (`vllm serve --enforce-eager`). Without it the
    /// engine captures CUDA graphs, vLLM's default, and the estimate subtracts what vLLM's
    /// startup sets aside for them.
    #[arg(long, help_heading = "Serving (--runtime vllm)")]
    pub enforce_eager: bool,
    /// With --runtime vllm: tensor-parallel ranks, one GPU of --gpu each (`vllm serve
    /// --tensor-parallel-size`). The figures are one rank's: its shard of the weights, its KV
    /// heads (replicated where the ranks outnumber them) and the engine's KV tokens. NCCL's own
    /// buffers are not counted.
    #[arg(
        long,
        visible_alias = "tp",
        default_value_t = 1,
        value_name = "RANKS",
        help_heading = "Serving (--runtime vllm)"
    )]
    pub tensor_parallel_size: u64,

    /// Print JSON instead of tables.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

/// `estimate`'s exit codes (its `--help`).
const EXIT_CODES: &str = "Exit codes: 0 the estimate was printed (whether or not it fits \
--gpu or the emulated GPU); 1 a failure (with --emulate: the torch probe failed on the emulated \
GPU); 2 bad input: an unusable --model file or Hub id, constants file or flag value (one line \
naming it).";

/// `--model`'s long help: the forms it takes, then the built-in presets and the generation
/// pipelines, listed from the tables `--model` is resolved against (the presets are compiled
/// into the binary: no repository path is needed).
pub fn model_long_help() -> String {
    use clap::ValueEnum;
    let presets: Vec<&str> = estimate::model::PRESETS.iter().map(|(n, _)| *n).collect();
    let mut s = String::from(
        "The model: a built-in preset, an HF directory (its config.json), a config.json, a \
         GGUF file (its tensor types give exact quantized weight bytes), a Hugging Face Hub id \
         ORG/NAME or ORG/NAME@REVISION, or a generation pipeline. A Hub id's config.json and \
         safetensors index are fetched from $HF_ENDPOINT (default https://huggingface.co) \
         with $HF_TOKEN into $VRAMLAB_HUB_CACHE (default ~/.cache/vramlab/hub); \
         HF_HUB_OFFLINE=1 reads that cache only. A path that exists, or a preset name, wins \
         over a Hub id. A config.json with a quantization_config (quant_method mxfp4, fp8, \
         awq, gptq or bitsandbytes) gives the weights as transformers loads them: each \
         quantized tensor's exact bytes (scales, zeros and tables included), the rest in \
         --precision, and for awq, gptq and bitsandbytes 4-bit a dequantization buffer (the \
         largest weight, dequantized in the compute dtype).\n\n",
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

fn parse_trainable(s: &str) -> Result<Trainable, String> {
    Trainable::try_from(s.to_string())
}

fn parse_lora_targets(s: &str) -> Result<crate::vocab::LoraTargets, String> {
    s.parse()
}

/// The report of the query of `a`: of a generation pipeline, or of an LLM.
pub fn report(a: &Args) -> Result<Report> {
    if let Some(why) = a.stack.and_then(|s| s.without_probe()) {
        return Err(crate::error::InputError::arg(format!("--stack: {why}")).into());
    }
    if a.runtime == Runtime::Vllm {
        return Ok(Report::Serving(Box::new(serving::report(a)?)));
    }
    if a.tensor_parallel_size != 1 {
        return Err(crate::error::InputError::arg(
            "--tensor-parallel-size is vLLM's (add --runtime vllm); training across GPUs is \
             --gpus with --sharding",
        )
        .into());
    }
    Ok(match a.model.parse::<crate::vocab::GenModel>() {
        Ok(m) => Report::Generation(Box::new(generation::report(a, m)?)),
        Err(_) => Report::Llm(Box::new(llm::report(a)?)),
    })
}

pub fn run(a: Args) -> Result<()> {
    let r = report(&a)?;
    if a.json {
        println!("{}", render_json(&r)?);
    } else {
        print!("{}", render_text(&r));
    }
    Ok(())
}
