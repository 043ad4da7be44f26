//! vLLM's own engine startup on the emulated GPU (docs/src/guides/emulator.md, "vLLM's
//! startup"): `LLM(...)` with `load_format="dummy"` from a preset's config.json alone, under
//! the vllm-0.33 stack (`scripts/torch-env.sh --stack vllm-0.33`, `$VRAMLAB_VLLM_PYTHON`).
//! Each startup must end cleanly, and the report must carry vLLM's own lines from its engine
//! core: the KV tokens, and the available KV memory they follow from. The token count is
//! derived here from the config and the exact available bytes, by vLLM's rule
//! (`v1/core/kv_cache_planning.py`: blocks = available // bytes per block over every layer;
//! `kv_cache_utils.get_kv_cache_capacity`: tokens = int(blocks / cdiv(max_model_len, block) *
//! max_model_len)). The analytic `estimate --runtime vllm` answer at `vllm serve`'s defaults
//! for the card must give the same KV tokens within 3%, on one GPU and, with `--tp`, on
//! tensor-parallel ranks. Needs the stack, so `#[ignore]`d; `scripts/test.sh` runs it.
mod common;
use common::{root, vramlab};

const MAX_MODEL_LEN: u64 = 4096;

fn vllm_python() -> String {
    std::env::var("VRAMLAB_VLLM_PYTHON").expect(
        "VRAMLAB_VLLM_PYTHON: the vLLM stack's python (scripts/torch-env.sh --stack vllm-0.33)",
    )
}

/// The KV cache's shape from a config.json: layers, KV heads, head dim and dtype bytes.
fn kv_shape(config: &serde_json::Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| {
        config[k]
            .as_u64()
            .unwrap_or_else(|| panic!("config.json: {k}"))
    };
    let heads = n("num_attention_heads");
    let head_dim = config["head_dim"]
        .as_u64()
        .unwrap_or(n("hidden_size") / heads);
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(heads);
    let dtype_bytes = match config["torch_dtype"].as_str() {
        Some("float32") => 4,
        _ => 2,
    };
    (n("num_hidden_layers"), kv_heads, head_dim, dtype_bytes)
}

/// One emulated startup: the `--json` report. `batched` and `seqs` are vLLM's
/// max_num_batched_tokens and max_num_seqs.
fn startup(preset: &str, gpu: &str, (batched, seqs): (u64, u64)) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        root()
            .join("harness/presets")
            .join(preset)
            .join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let program = format!(
        "from vllm import LLM\n\
         LLM(model={:?}, load_format='dummy', max_model_len={MAX_MODEL_LEN}, \
         gpu_memory_utilization=0.9, enforce_eager=True, skip_tokenizer_init=True, \
         max_num_batched_tokens={batched}, max_num_seqs={seqs})\n",
        dir.path().to_str().unwrap()
    );
    let json_out = dir.path().join("report.json");
    let out = vramlab()
        .args(["emulate", "--gpu", gpu, "--timeout", "8m", "--json-out"])
        .arg(&json_out)
        .arg("--")
        .arg(vllm_python())
        .args(["-c", &program])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(out.status.code(), Some(0), "{preset} on {gpu}: {tail}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_out).unwrap()).unwrap();
    // The table prints vLLM's lines beside the allocator's figures.
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "vLLM's startup, process ",
        "KV cache size ",
        "maximum concurrency ",
    ] {
        assert!(
            table.contains(needle),
            "{preset} on {gpu}: no {needle:?} in {table}"
        );
    }
    assert_eq!(j["status"], "complete", "{preset} on {gpu}: {j}");
    assert_eq!(j["fits"], true, "{preset} on {gpu}");
    j
}

/// The analytic `--runtime vllm` answer at `vllm serve`'s defaults for the card.
fn analytic(preset: &str, gpu: &str) -> serde_json::Value {
    let len = MAX_MODEL_LEN.to_string();
    common::serving_estimate(preset, gpu, &["--max-model-len", &len])["serving"].clone()
}

fn check(preset: &str, gpu: &str) {
    let est = analytic(preset, gpu);
    let settings = (
        est["max_num_batched_tokens"].as_u64().unwrap(),
        est["max_num_seqs"].as_u64().unwrap(),
    );
    let j = startup(preset, gpu, settings);
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            root()
                .join("harness/presets")
                .join(preset)
                .join("config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (layers, kv_heads, head_dim, dtype_bytes) = kv_shape(&config);
    // One process logged vLLM's startup: the engine core, a child of the program.
    let vllm = j["vllm"].as_array().unwrap();
    assert_eq!(vllm.len(), 1, "{preset} on {gpu}: {j}");
    let v = &vllm[0];
    let pid = v["pid"].as_u64().unwrap();
    let engine = j["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap();
    assert_eq!(engine["status"], "ok", "{engine}");
    assert!(engine["max_memory_reserved"].as_u64().unwrap() > 0);
    let mut own = v.clone();
    own.as_object_mut().unwrap().remove("pid");
    assert_eq!(engine["vllm"], own);

    let tokens = v["kv_tokens"].as_u64().unwrap();
    let available = v["available_kv_bytes"].as_i64().unwrap();
    let block = v["block_size"].as_u64().unwrap();
    assert_eq!(v["available_kv_exact"], true);
    assert_eq!(v["max_model_len"].as_u64(), Some(MAX_MODEL_LEN));
    assert!(available > 0 && tokens > 0, "{preset} on {gpu}: {v}");
    // vLLM's rule: whole blocks of every layer's K and V.
    let bytes_per_block = layers * 2 * block * kv_heads * head_dim * dtype_bytes;
    let blocks = available as u64 / bytes_per_block;
    let per_request = MAX_MODEL_LEN.div_ceil(block);
    let concurrency = blocks as f64 / per_request as f64;
    let derived = (concurrency * MAX_MODEL_LEN as f64) as u64;
    assert_eq!(tokens, derived, "{preset} on {gpu}: {v}");
    // The printed figures are the exact ones, as vLLM rounds them.
    let printed_kv = v["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str()?.strip_prefix("Available KV cache memory: "))
        .next()
        .unwrap_or_else(|| panic!("{preset} on {gpu}: no available-KV line in {v}"));
    let gib = available as f64 / (1u64 << 30) as f64;
    let rounded: f64 = printed_kv.trim_end_matches(" GiB").parse().unwrap();
    assert!(
        (rounded - gib).abs() <= 0.005 + 1e-9,
        "{printed_kv} vs {available} bytes"
    );
    let printed_conc = v["max_concurrency"].as_f64().unwrap();
    assert!((printed_conc - concurrency).abs() <= 0.005 + 1e-9, "{v}");
    // The weights line: what the engine core's allocator held, at least.
    let weights = v["weights_bytes"].as_i64().unwrap();
    assert!(weights > 0 && (weights as u64) < engine["max_memory_reserved"].as_u64().unwrap());
    // The analytic answer in vLLM's terms: its KV tokens within 3% of vLLM's own, and its
    // weights within 1% (or 16 MiB) of vLLM's "Model loading took", which also counts the
    // rotary cache and the allocator's rounding, printed to 0.01 GiB.
    let est_tokens = est["kv_tokens"].as_u64().unwrap();
    let err = est_tokens as f64 / tokens as f64 - 1.0;
    eprintln!(
        "{preset} on {gpu}: weights {weights} B, available KV {available} B, {tokens} KV tokens, \
         {printed_conc}x at {MAX_MODEL_LEN}; analytic {est_tokens} tokens ({:+.3}%)",
        err * 100.0
    );
    assert!(
        err.abs() <= 0.03,
        "{preset} on {gpu}: analytic {est} vs {v}"
    );
    let est_weights = est["weights_bytes"].as_i64().unwrap();
    assert!(
        (est_weights - weights).abs() <= (weights / 100).max(16 << 20),
        "{preset} on {gpu}: weights {est_weights} vs vLLM's {weights}"
    );
}

#[test]
#[ignore = "needs the vLLM stack (scripts/torch-env.sh --stack vllm-0.33)"]
fn startup_kv_tokens_follow_from_the_available_kv_memory() {
    let mut by_card = std::collections::BTreeMap::new();
    for gpu in ["h100-80gb", "a100-40gb"] {
        for preset in ["llama-3.1-8b", "qwen2.5-7b", "qwen2.5-0.5b"] {
            check(preset, gpu);
        }
        by_card.insert(gpu, ());
    }
    assert_eq!(by_card.len(), 2);
}

/// `estimate --runtime vllm --emulate`: the analytic answer and vLLM's own startup on the same
/// emulated card, side by side, within 3% in KV tokens; with CUDA graphs, `vllm serve`'s
/// default (torch.compile, then the graphs' capture), whose memory vLLM subtracts first.
#[test]
#[ignore = "needs the vLLM stack (scripts/torch-env.sh --stack vllm-0.33)"]
fn estimate_emulate_runs_vllm_itself() {
    let python = vllm_python();
    let j = common::estimate_json(&[
        "--model",
        "qwen2.5-0.5b",
        "--runtime",
        "vllm",
        "--gpu",
        "h100-80gb",
        "--max-model-len",
        "4096",
        "--emulate",
        "h100-80gb",
        "--python",
        &python,
    ]);
    let (est, emu) = (&j["serving"], &j["emulated"]);
    assert!(est["cuda_graph_bytes"].as_u64().unwrap() > 0, "{est}");
    let tokens = emu["kv_tokens"].as_u64().unwrap();
    assert!(tokens > 0, "{emu}");
    let err = est["kv_tokens"].as_u64().unwrap() as f64 / tokens as f64 - 1.0;
    assert!(err.abs() <= 0.03, "{est} vs {emu}");
    assert_eq!(emu["report"]["status"], "complete", "{emu}");
    // vLLM captured its graphs: the pool line of the worker.
    assert!(emu["report"]["vllm"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["cuda_graph_bytes"].as_u64().is_some_and(|b| b > 0)));
}

/// Tensor parallelism on emulated ranks, one device and one worker process each (the emulated
/// NCCL between them): at 2 and 4 ranks, each rank's "Model loading took" is its shard of the
/// weights, derived here from the config as vLLM splits it (the query heads, the KV heads, the
/// MLP and the padded vocabulary over the ranks; norms and the rotary cache whole), within 1%
/// (the line's rounding to 0.01 GiB and the buffers made at load); the analytic `--tp` answer's
/// weights are the same shard; its KV tokens (the engine core's line) are within 3% of vLLM's;
/// and every rank put memory on a device of its own.
#[test]
#[ignore = "needs the vLLM stack (scripts/torch-env.sh --stack vllm-0.33)"]
fn tensor_parallel_ranks_hold_their_shards() {
    let python = vllm_python();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("harness/presets/llama-3.1-8b/config.json")).unwrap(),
    )
    .unwrap();
    let n = |k: &str| config[k].as_u64().unwrap();
    let (h, inter, layers, heads) = (
        n("hidden_size"),
        n("intermediate_size"),
        n("num_hidden_layers"),
        n("num_attention_heads"),
    );
    let (_, kv_heads, head_dim, e) = kv_shape(&config);
    let vocab = n("vocab_size").div_ceil(64) * 64;
    for tp in [2u64, 4] {
        let (q, kv) = (heads / tp * head_dim, (kv_heads / tp).max(1) * head_dim);
        let layer = (q + 2 * kv) * h + h * q + 3 * (inter / tp) * h + 2 * h;
        let shard = e * (2 * (vocab / tp) * h + layers * layer + h);
        let rotary = n("max_position_embeddings") * head_dim * e;
        let j = common::serving_estimate(
            "llama-3.1-8b",
            "h100-80gb",
            &[
                "--max-model-len",
                "8192",
                "--tp",
                &tp.to_string(),
                "--emulate",
                "h100-80gb",
                "--python",
                &python,
            ],
        );
        let (est, emu) = (&j["serving"], &j["emulated"]);
        assert_eq!(est["weights_bytes"].as_u64(), Some(shard), "{tp} ranks");
        assert_eq!(est["tensor_parallel"].as_u64(), Some(tp));
        let loaded = emu["weights_bytes"].as_i64().unwrap() as f64;
        let err = (shard + rotary) as f64 / loaded - 1.0;
        assert!(
            err.abs() <= 0.01,
            "{tp} ranks: {shard} + {rotary} vs {loaded}"
        );
        let tokens = emu["kv_tokens"].as_u64().unwrap();
        let err = est["kv_tokens"].as_u64().unwrap() as f64 / tokens as f64 - 1.0;
        assert!(err.abs() <= 0.03, "{tp} ranks: {est} vs {emu}");
        let report = &emu["report"];
        assert_eq!(report["status"], "complete", "{report}");
        let mut devices: Vec<u64> = report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["device"].as_u64())
            .collect();
        devices.sort();
        devices.dedup();
        assert_eq!(devices, (0..tp).collect::<Vec<_>>(), "{tp} ranks: {report}");
    }
}
