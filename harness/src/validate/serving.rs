//! vLLM startup rows (metric `vllm-available-kv`): the serving estimate (`estimate::serving`,
//! vLLM 0.33's accounting for a dense decoder on one GPU) at the row's engine settings, against
//! the "Available KV cache memory" the source's startup log printed; with `--emulate`, vLLM
//! 0.33 itself at those settings on the emulated card.
use super::emulated::{Column, Options};
use super::row::VllmVersion;
use super::{PeerRow, RowEstimate};
use crate::estimate::serving::{self, ServingQuery};
use crate::estimate::Resolved;
use crate::gpu::Gpu;
use crate::vocab::Precision;

/// The one estimator row a vLLM startup row counts.
pub const AVAILABLE_KV: &str = "available KV cache";

/// From this release vLLM sizes the KV cache after subtracting its estimate of the CUDA
/// graphs' memory (`profile_cudagraph_memory`), which the serving estimate models as vLLM
/// 0.33's; an earlier engine captured the graphs after sizing the cache, so an eager estimate
/// is its figure (the graphs' memory then comes out of the utilization's headroom).
pub const GRAPHS_COUNTED_SINCE: VllmVersion = VllmVersion(0, 21, 0);

/// What a row runs: the model, the card, vLLM's settings and the weights' precision.
struct Startup {
    model: Resolved,
    gpu: Gpu,
    query: ServingQuery,
    precision: Precision,
}

/// The row's startup, or (the model, why the serving estimate cannot express it).
fn startup(r: &PeerRow) -> Result<Startup, (String, String)> {
    let v = r
        .serving
        .as_ref()
        .expect("a vllm-available-kv row's settings, checked when read");
    let preset = r.preset.as_deref().ok_or_else(|| {
        (
            r.model.clone(),
            "a vLLM startup row needs the model's shapes (a preset)".to_string(),
        )
    })?;
    let model = crate::estimate::resolve(preset).map_err(|e| (r.model.clone(), e.to_string()))?;
    let fail = |why: String| (model.name.clone(), why);
    if let Some(why) = serving::unsupported(&model.config) {
        return Err(fail(why));
    }
    let precision = super::precision(r).map_err(fail)?;
    let weight_bytes = serving::weight_bytes(precision)
        .ok_or_else(|| fail(format!("vLLM does not load {precision} weights this way")))?;
    let gpu = r
        .gpu
        .as_deref()
        .and_then(crate::gpu::by_name)
        .expect("a vLLM startup row's card, checked when read");
    let query = ServingQuery::new(
        v.gpu_memory_utilization,
        (v.max_model_len, v.max_num_batched_tokens, v.max_num_seqs),
        weight_bytes,
        serving::kv_bytes(v.kv_cache_dtype, weight_bytes),
    )
    .map(|q| q.eager(!(v.cuda_graphs && v.vllm >= GRAPHS_COUNTED_SINCE)))
    .and_then(|q| q.on_ranks(&model.config, r.tensor_parallel))
    .map_err(fail)?;
    Ok(Startup {
        model,
        gpu,
        query,
        precision,
    })
}

/// The serving estimate of a vLLM startup row, or why it cannot express the row.
pub(crate) fn estimate_row(r: &PeerRow) -> RowEstimate {
    let s = startup(r)?;
    let e = serving::serving(&s.model.config, &s.gpu, &s.query);
    Ok((
        s.model.name,
        vec![(AVAILABLE_KV.to_string(), e.available_kv_bytes.max(0) as u64)],
    ))
}

/// `validate --emulate` for a vLLM startup row: vLLM 0.33's own startup at the row's settings
/// on the emulated card (the `vllm-0.33` stack, or `$VRAMLAB_VLLM_PYTHON`). A row it cannot
/// run, or a startup that fails, is a `NotEmulated` row with the reason.
pub(crate) fn emulated_column(r: &PeerRow, o: &Options) -> Column {
    let not = |reason: String| Column::NotEmulated { reason };
    let s = match startup(r) {
        Ok(s) => s,
        Err((_, why)) => return not(why),
    };
    let run = crate::emulate::serving::python(None).and_then(|python| {
        let config = crate::emulate::serving::config_json(&s.model.name)?;
        crate::emulate::serving::startup(&python, &s.gpu, &config, &s.query, s.precision, o.timeout)
    });
    let e = match run {
        Ok(e) => e,
        Err(e) => return not(crate::error::one_line(&e)),
    };
    let emulated_bytes = e.available_kv_bytes.max(0) as u64;
    let v = r.serving.as_ref().expect("checked when read");
    Column::Ran {
        stack: None,
        torch: e.report["torch"].as_str().map(str::to_string),
        gpu: format!("{} (emulated)", s.gpu.name),
        program: format!(
            "vllm LLM(load_format='dummy', enforce_eager={}, max_model_len={}, \
             gpu_memory_utilization={}, max_num_batched_tokens={}, max_num_seqs={})",
            if s.query.cuda_graphs { "False" } else { "True" },
            s.query.max_model_len,
            s.query.utilization,
            s.query.max_num_batched_tokens,
            s.query.max_num_seqs
        ),
        figure: "vllm_available_kv",
        emulated_bytes,
        error_pct: 100.0 * (emulated_bytes as f64 - r.value_bytes as f64)
            / r.value_bytes.max(1) as f64,
        fits: true,
        note: format!(
            "vLLM 0.33 (the vllm-0.33 stack), {}, {} KV tokens; the row ran vLLM {}",
            if s.query.cuda_graphs {
                "CUDA graphs"
            } else {
                "eager"
            },
            e.kv_tokens,
            v.vllm
        ),
    }
}
