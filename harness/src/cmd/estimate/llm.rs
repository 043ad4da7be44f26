//! The LLM estimator of `vramlab estimate`: the query of the flags, its exact quantized
//! weights, `--best-format`, the constants, and the [`LlmReport`] of the estimate.
use super::emulated::emulate_query;
use super::overflow::{constants_flag, overflow_error, Size};
use super::report::{BestFormat, EmulatedFit, LlmReport, ModelJson, QuantWeights, Row};
use super::Args;
use crate::checked::Checked;
use crate::error::InputError;
use crate::estimate::{
    self, Compute, Mode, Overflow, Precision, Query, Resolved, Sharding, Trainable,
};
use crate::fit::Constants;
use crate::model::Config;
use crate::vocab::{Checkpointing, Runtime};
use anyhow::Result;

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
        format: None,
        vllm: None,
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
        lora_targets: a.lora_targets,
        peft_f32_adapters: a.stack.unwrap_or_default().peft_f32_adapters(),
        lora_dropout: a.lora_dropout > 0.0,
        sharding: a.sharding,
        gpus: a.gpus,
        offload: a.offload,
        attention: a.attention,
        kv_cache: a.kv_cache,
        // transformers' StaticCache and generate()'s DynamicCache keep a sliding-window
        // model's window, as candle and vLLM do: docs/src/guides/estimate.md, "Sliding windows".
        kv_window: a.kv_window.unwrap_or(crate::vocab::KvWindow::Model),
        runtime: a.runtime,
        backend: a.backend,
        optimizer_impl: a.optimizer_impl,
        stack: a.stack.unwrap_or_default(),
        reserve_stack: None,
        compute_capability: card_capability(a),
        dequant_bytes: 0,
    }
}

/// The compute capability of the card the query is for: `--gpu`'s, else `--emulate`'s.
fn card_capability(a: &Args) -> Option<(u32, u32)> {
    [&a.gpu, &a.emulate]
        .into_iter()
        .flatten()
        .find_map(|n| crate::gpu::compute_capability(n))
}

/// What vLLM holds of an MXFP4 checkpoint of stacked experts on the catalogued `--gpu` (its
/// kernel's padding), with a note saying so; None for another format, model or GPU.
fn vllm_mxfp4(
    a: &Args,
    m: &Config,
    plan: &crate::model::quant::Plan,
    q: &estimate::Query,
    notes: &mut Vec<String>,
) -> Option<super::report::VllmWeights> {
    // vLLM's ROCm kernels (AITER) pad otherwise: NVIDIA GPUs only.
    let g = crate::gpu::by_name(a.gpu.as_deref()?)
        .filter(|g| g.vendor == crate::gpu::Vendor::Nvidia)?;
    let v = estimate::vllm::mxfp4_weights(m, plan, q.state_bytes(), g.compute_capability)?;
    let padding = match v.bytes == plan.bytes() {
        true => "which needs no padding".to_string(),
        false => format!(
            "padded to hidden {} and intermediate {}",
            v.hidden, v.intermediate
        ),
    };
    notes.push(format!(
        "vLLM 0.33 on the {} (sm{}{}) runs these experts through its {} MXFP4 kernel, \
         {padding}: its weights take {} (the checkpoint's {})",
        g.label,
        g.compute_capability.0,
        g.compute_capability.1,
        v.kernel.name(),
        crate::units::gb_gib(v.bytes),
        crate::units::gb_gib(plan.bytes()),
    ));
    Some(super::report::VllmWeights {
        kernel: v.kernel.name(),
        hidden: v.hidden,
        intermediate: v.intermediate,
        bytes: v.bytes,
    })
}

/// `--gpu`'s name and bytes, if given.
fn gpu(a: &Args) -> Result<Option<(String, u64)>> {
    let Some(name) = &a.gpu else {
        return Ok(None);
    };
    let gpu = crate::gpu::name_or_size(name).ok_or_else(|| {
        InputError::arg(format!(
            "unknown --gpu `{name}` (known: {}; `vramlab gpus` lists every name; or a size like \
             48gb)",
            crate::gpu::names().join(", ")
        ))
    })?;
    Ok(Some(gpu))
}

/// `--best-format` on the GPU `(name, bytes)`: every candidate format's fit at the query of
/// `a` (at `precision`, the default one).
fn best_format(
    a: &Args,
    m: &Config,
    gguf: Option<&std::path::Path>,
    precision: Precision,
    (name, bytes): (&str, u64),
) -> Result<BestFormat> {
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
            let w = quantized_weights(a, gguf, m, p)
                .map(|w| w.map(|w| w.bytes))
                .map_err(|e| crate::error::one_line(&e));
            (p, w)
        })
        .collect();
    let base = query(a, precision, None);
    let budget = estimate::budget(bytes, a.headroom);
    let formats = estimate::format_fits(m, &base, None, &candidates, budget);
    let best = formats.iter().find(|f| f.fits).map(|f| f.precision);
    Ok(BestFormat {
        gpu: name.to_string(),
        budget_bytes: budget,
        best,
        formats,
    })
}

/// The report of the LLM query of `a`.
pub fn report(a: &Args) -> Result<LlmReport> {
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(
            InputError::arg(format!("--headroom must be in [0, 1), got {}", a.headroom)).into(),
        );
    }
    if a.batch == 0 || a.context == 0 || a.gpus == 0 {
        return Err(InputError::arg("--batch, --context and --gpus must be at least 1").into());
    }
    if a.offload
        && (a.mode != Mode::Train
            || a.gpus < 2
            || !matches!(a.sharding, Sharding::Fsdp | Sharding::Zero3))
    {
        return Err(InputError::arg(
            "--offload is FSDP's CPU offload: it needs --mode train, --sharding fsdp (or zero3) \
             and --gpus 2 or more",
        )
        .into());
    }
    let Resolved {
        name: model_name,
        config: m,
        gguf,
        stored_bytes,
        quant: checkpoint,
    } = estimate::resolve(&a.model)?;
    super::lora::check(a, &m)?;
    let loaded = super::loaded::loaded(a, checkpoint.as_ref(), gguf.is_some())?;
    super::loaded::not_emulated(a, loaded.as_ref())?;
    let precision = a.precision.unwrap_or(if gguf.is_some() {
        Precision::Native
    } else {
        Precision::Bf16
    });
    let gpu = gpu(a)?;
    let best = match (&gpu, a.best_format) {
        (Some((name, bytes)), true) => Some(best_format(
            a,
            &m,
            gguf.as_deref(),
            precision,
            (name, *bytes),
        )?),
        _ => None,
    };
    let precision = best.as_ref().and_then(|b| b.best).unwrap_or(precision);
    let quant = quantized_weights(a, gguf.as_deref(), &m, precision)?;
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
    let q = query(a, precision, quant.as_ref().map(|w| w.bytes));
    // A quantized checkpoint or QLoRA's base: the format's exact bytes and its
    // dequantization buffer.
    let (q, quant, formatted) = match &loaded {
        None => (q, quant, None),
        Some(l) => {
            let plan = l.plan(a, &m, &q)?;
            let q = q
                .with_checkpoint(&m, &l.checkpoint)
                .map_err(|e| InputError::arg(format!("--model {}: {e}", a.model)))?;
            notes.extend(l.notes(&plan, &q));
            let mut weights = l.weights(&plan, &m, &q);
            weights.vllm = vllm_mxfp4(a, &m, &plan, &q, &mut notes);
            (q, Some(weights), Some((l, plan)))
        }
    };
    notes.extend(super::loaded::optimizer_note(&q));
    notes.extend(super::loaded::dequantized_note(
        checkpoint.as_ref(),
        loaded.as_ref(),
    ));
    // A figure past 2^64 B: bad input, naming the flags that cause it.
    let bad = |o: Overflow| {
        let sizes = [
            Size::of("--batch", a.batch, a.batch > 1),
            Size::of("--context", a.context, a.context > 1),
            Size::of("--constants", constants_flag(a), constants.is_some()),
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
    if let Some(moe) = &m.moe {
        let form = if a.runtime == Runtime::Torch && moe.dense_dispatch() {
            format!(
                "transformers' own for this model, which runs every expert on every token: \
                 tokens × {} rows (vLLM and vramlab's candle model group them: tokens × {})",
                moe.experts, moe.top_k
            )
        } else {
            format!(
                "the grouped form's (transformers' default, vLLM's, vramlab's candle model): \
                 tokens × {} routed rows whatever the routing, which bounds the eager \
                 per-expert loop's worst case (all tokens at one expert; balanced: tokens × k / \
                 {} an expert)",
                moe.top_k, moe.experts
            )
        };
        notes.push(format!(
            "mixture of experts: the weights hold all {} experts a layer ({} parameters); a token \
             runs through {} ({} active). The activations are {form}",
            moe.experts,
            m.param_count(),
            moe.top_k,
            m.active_params().get().unwrap_or(0),
        ));
    }
    if let Some(v) = &m.vision {
        let params: Checked = v
            .shapes(m.hidden_size)
            .iter()
            .map(|(_, s)| Checked::product(s))
            .sum();
        notes.push(format!(
            "the checkpoint stores a {} vision tower and projector, {} parameters, in the \
             weights (transformers and vLLM load it); a text query never runs it",
            v.kind.model_type(),
            params.get().unwrap_or(0)
        ));
    }
    if let Some(c) = m.attention_chunk {
        let chunked = (0..m.num_layers)
            .filter(|&i| m.layer_chunk(i).is_some())
            .count();
        notes.push(format!(
            "chunked attention: {chunked} of {} layers attend within their own chunk of {c} \
             tokens and cache at most {c} tokens a sequence; the other {} attend to every token",
            m.num_layers,
            m.num_layers - chunked
        ));
    }
    if let Some(mla) = &m.mla {
        use crate::model::config::MlaCache;
        let values = |form| m.kv_values_per_layer_token(form).get().unwrap_or(0);
        let (latent, expanded) = (values(MlaCache::Latent), values(MlaCache::Expanded));
        notes.push(match q.mla_cache() {
            MlaCache::Latent => format!(
                "multi-head latent attention: the KV cache holds the compressed latent and the \
                 rotary key, {} + {} = {latent} values a token and layer, as vLLM, SGLang and \
                 transformers ≥ 5 cache it (transformers 4.x expanded K and V to every head: \
                 {expanded} values)",
                mla.kv_lora_rank, mla.qk_rope_head_dim,
            ),
            MlaCache::Expanded => format!(
                "multi-head latent attention: the KV cache holds K and V expanded to every head, \
                 {expanded} values a token and layer, as the {} stack's transformers 4.x caches \
                 it (vLLM, SGLang and transformers ≥ 5 cache the latent: {latent} values)",
                q.stack,
            ),
        });
    }
    if m.mtp_layers > 0 {
        notes.push(format!(
            "the checkpoint also stores {} multi-token-prediction layer(s), {} parameters, that \
             inference does not run (vLLM loads them only for MTP speculative decoding): not in \
             the weights",
            m.mtp_layers,
            m.mtp_params().get().unwrap_or(0)
        ));
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
        Some(g) => {
            let run = emulate_query(a, g, &m, precision, quant.is_some())?;
            let budget = crate::gpu::budget(run.gpu_total_bytes, a.headroom);
            Some(EmulatedFit {
                fits_with_headroom: run.fits && run.nvml_used <= budget,
                budget_bytes: budget,
                run,
            })
        }
    };
    let high = e.total_high().map_err(bad)?;
    let small = crate::gpu::smallest_class(high, a.headroom);
    let fit = gpu
        .map(|(name, bytes)| {
            estimate::gpu_fit(&m, &q, constants.as_ref(), &name, bytes, a.headroom)
        })
        .transpose()
        .map_err(bad)?;
    let train = q.mode == Mode::Train;
    // Under CPU offload the states are on the host (`host_offloaded_bytes`).
    let model_states_bytes = (train && !q.offload)
        .then(|| (Checked::from(e.weights) + e.gradients + e.optimizer).bytes("model states"))
        .transpose()
        .map_err(bad)?;
    let unsharded_bytes = train
        .then(|| (Checked::from(e.activations) + e.logits).bytes("activations"))
        .transpose()
        .map_err(bad)?;
    Ok(LlmReport {
        model: ModelJson {
            name: model_name,
            architecture: m.architecture.name(),
            params: m.param_count(),
            active_params: m.active_params().get().unwrap_or(0),
            config: m.to_hf_json(),
            stored_bytes,
        },
        query: q,
        headroom: a.headroom,
        source: e.source.clone(),
        constants: used,
        breakdown: {
            let mut rows = Row::all(&e.rows());
            if let Some((l, plan)) = &formatted {
                l.rename_weights_row(plan, &q, &mut rows);
            }
            rows
        },
        host_offloaded_bytes: q.offload.then_some(e.host_offloaded),
        total_bytes: total,
        allocated_bytes: e.allocated().map_err(bad)?,
        reserved_bytes: e.reserved().map_err(bad)?,
        nvml_bytes: total,
        nvml_low_bytes: e.total_low().map_err(bad)?,
        nvml_high_bytes: high,
        verdict_figure: "nvml_high_bytes",
        reserve_source: e.reserve_source.clone(),
        smallest_gpu_gb: small.map(|c| c.gb),
        smallest_gpu_examples: small.map(|c| c.examples.as_str()),
        settle_with: fit
            .as_ref()
            .filter(|f| f.verdict == estimate::Verdict::Borderline)
            .zip(a.gpu.as_deref())
            .map(|(_, g)| settle_command(g)),
        gpu: fit,
        weights: quant,
        best_format: best,
        notes,
        emulated,
        max_position_embeddings: m.max_position_embeddings as u64,
        model_states_bytes,
        unsharded_bytes,
        largest_gpu_gb: crate::gpu::classes().last().map(|c| c.gb).unwrap_or(0),
    })
}

/// The command line of this run with `--emulate` on the `--gpu` card: what settles a borderline
/// verdict. A size rather than a catalogued name runs an H100-80GB of that memory.
fn settle_command(gpu: &str) -> String {
    let mut words: Vec<String> = vec!["vramlab".into()];
    let mut args = std::env::args().skip(1);
    while let Some(w) = args.next() {
        if w == "--emulate" || w == "--emulate-memory" {
            args.next();
        } else if !w.starts_with("--emulate=") && !w.starts_with("--emulate-memory=") {
            words.push(w);
        }
    }
    match crate::gpu::by_name(gpu) {
        Some(g) => words.extend(["--emulate".into(), g.key]),
        None => {
            let bytes = crate::gpu::name_or_size(gpu)
                .map(|(_, b)| b)
                .unwrap_or_default();
            words.extend([
                "--emulate".into(),
                "h100-80gb".into(),
                "--emulate-memory".into(),
                bytes.to_string(),
            ]);
        }
    }
    words
        .iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `w` as one shell word: as is when it needs no quoting, else in single quotes.
fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}
