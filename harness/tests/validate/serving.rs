//! vLLM startup rows (`vllm-available-kv`): each estimated row is what `vramlab estimate
//! --runtime vllm` answers at the row's own settings (a second path through the binary), the
//! rows the serving estimate does not model say why, and the published figures are met.
use super::*;

/// The peers file's vLLM startup rows.
fn serving_rows() -> Vec<Value> {
    let rows: Vec<Value> = peers()
        .into_iter()
        .filter(|p| p["metric"] == "vllm-available-kv")
        .collect();
    assert!(!rows.is_empty(), "no vllm-available-kv rows in {PEERS}");
    rows
}

/// `vramlab estimate --runtime vllm --enforce-eager --json` at a row's settings: its
/// `serving` object.
fn estimate_serving(p: &Value) -> Value {
    let s = &p["serving"];
    let arg = |k: &str| s[k].to_string().trim_matches('"').to_string();
    let out = vramlab()
        .args(["estimate", "--runtime", "vllm", "--enforce-eager", "--json"])
        .args(["--model", p["preset"].as_str().unwrap()])
        .args(["--gpu", p["gpu"].as_str().unwrap()])
        .args(["--precision", p["precision"].as_str().unwrap()])
        .args(["--max-model-len", &arg("max_model_len")])
        .args(["--gpu-memory-utilization", &arg("gpu_memory_utilization")])
        .args(["--max-num-batched-tokens", &arg("max_num_batched_tokens")])
        .args(["--max-num-seqs", &arg("max_num_seqs")])
        .args(["--kv-cache-dtype", &arg("kv_cache_dtype")])
        .args([
            "--tp",
            &p["tensor_parallel"].as_u64().unwrap_or(1).to_string(),
        ])
        .output()
        .unwrap();
    let j: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: {e}: {}", p["id"], String::from_utf8_lossy(&out.stderr)));
    j["serving"].clone()
}

#[test]
fn vllm_rows_are_the_serving_estimate_at_their_settings() {
    let r = report(&[]);
    let mut estimated = 0;
    for p in serving_rows() {
        let id = p["id"].as_str().unwrap();
        let x = row(&r, id);
        if x["kind"] == "not_expressible" {
            // Only what the serving estimate refuses for the model itself (gemma-2's windows).
            let why = x["reason"].as_str().unwrap();
            assert!(why.contains("not modelled yet"), "{id}: {why}");
            continue;
        }
        let s = estimate_serving(&p);
        let available = s["available_kv_bytes"].as_i64().unwrap().max(0) as u64;
        assert_eq!(x["estimate_bytes"].as_u64().unwrap(), available, "{id}");
        // The one term is the available KV cache.
        assert_eq!(x["terms"][0]["name"], "available KV cache", "{id}");
        estimated += 1;
    }
    assert!(estimated >= 4, "only {estimated} vLLM rows estimated");
}

#[test]
fn vllm_startups_are_met_within_3_percent_on_one_gpu_and_5_on_ranks() {
    // H100 rows: vLLM 0.19's startup logs; the estimate is vLLM 0.33's eager accounting.
    let r = report(&[]);
    for p in serving_rows() {
        let id = p["id"].as_str().unwrap();
        let x = row(&r, id);
        if x["kind"] != "estimated" || !id.starts_with("vllm-h100-") {
            continue;
        }
        let err = x["error_pct"].as_f64().unwrap();
        if p["tensor_parallel"].as_u64().unwrap_or(1) > 1 {
            // A rank's NCCL buffers are not counted (vLLM's non-torch memory on real GPUs):
            // the estimate leaves the KV cache more than vLLM did, by less than 5%.
            assert!(err > 0.0 && err <= 5.0, "{id}: {err:+.2}% ({x})");
        } else {
            assert!(err.abs() <= 3.0, "{id}: {err:+.2}% ({x})");
        }
    }
}

#[test]
fn a_refused_startup_is_does_not_fit_with_the_largest_length() {
    // The RTX 3090 row at max_model_len 29,000: vLLM refused to start (23,648 KV tokens).
    let p = serving_rows()
        .into_iter()
        .find(|p| p["id"] == "vllm-rtx3090-llama31-8b-29000")
        .expect("the refused RTX 3090 row");
    let s = estimate_serving(&p);
    let len = p["serving"]["max_model_len"].as_u64().unwrap();
    assert_eq!(s["fits"], false, "{s}");
    let fits = s["max_model_len_fits"].as_u64().unwrap();
    assert!(fits < len, "{s}");
    // The largest fitting length is whole 16-token blocks of the available KV memory.
    let per_block = 16 * s["kv_bytes_per_token"].as_u64().unwrap();
    let available = s["available_kv_bytes"].as_i64().unwrap().max(0) as u64;
    assert_eq!(fits, available / per_block * 16, "{s}");
}

#[test]
fn bad_serving_rows_are_one_line_naming_the_row_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let rows = peers();
    let i = rows
        .iter()
        .position(|p| p["metric"] == "vllm-available-kv")
        .unwrap();
    let j = rows
        .iter()
        .position(|p| p["metric"] == "nvml-used")
        .unwrap();
    let settings = rows[i]["serving"].clone();
    let with = |k: &str, v: Value| {
        let mut s = settings.clone();
        s[k] = v;
        Some(s)
    };
    for (name, row, key, value, needle) in [
        (
            "a.json",
            i,
            "serving",
            None,
            "key `serving` missing (a vLLM startup row)",
        ),
        (
            "b.json",
            j,
            "serving",
            Some(settings.clone()),
            "key `serving`: only a `vllm-available-kv` row has one",
        ),
        (
            "c.json",
            i,
            "serving",
            with("vllm", "0.19".into()),
            "vLLM version `0.19` must be MAJOR.MINOR.PATCH",
        ),
        (
            "d.json",
            i,
            "serving",
            with("gpu_memory_utilization", 1.5.into()),
            "gpu_memory_utilization 1.5 is not in (0, 1]",
        ),
        (
            "e.json",
            i,
            "serving",
            with("kv_cache_dtype", "int4".into()),
            "int4",
        ),
    ] {
        let f = edited(dir.path(), name, row, key, value);
        fails_with(&f, &format!("row {} (`", row + 1));
        fails_with(&f, needle);
    }
}
