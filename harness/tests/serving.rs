//! `vramlab estimate --runtime vllm` (docs/src/guides/serving.md): vLLM's startup figures. The
//! exact terms against the published config.json by hand, vLLM's KV token and concurrency
//! rules, the refusal with the largest --max-model-len that fits, and bad input. The agreement
//! with vLLM's own startup on the emulated GPU is `tests/vllm.rs`.
mod common;
use common::{one_line_exit_2, root, serving_estimate as serving, vramlab};

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

fn config(preset: &str) -> serde_json::Value {
    let path = root()
        .join("harness/presets")
        .join(preset)
        .join("config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Llama-3.1-8B on an H100 at vLLM's settings: the weights, the sampler state and a token's K
/// and V by hand from the config, and vLLM's block arithmetic over what is available.
#[test]
fn serving_terms_follow_vllm_s_rules_by_hand() {
    let c = config("llama-3.1-8b");
    let n = |k: &str| u(&c[k]);
    let (h, inter, vocab, layers) = (
        n("hidden_size"),
        n("intermediate_size"),
        n("vocab_size"),
        n("num_hidden_layers"),
    );
    let head_dim = h / n("num_attention_heads");
    let kv_heads = n("num_key_value_heads");
    // Embeddings and an untied head, per layer q/k/v/o, the gated MLP and two norms, a final norm.
    let params = 2 * vocab * h
        + layers * (h * h * 2 + 2 * h * kv_heads * head_dim + 3 * h * inter + 2 * h)
        + h;
    for (gpu, tokens, seqs, kv, len) in [
        ("h100-80gb", "8192", "1024", "auto", "8192"),
        ("a100-40gb", "2048", "256", "fp8", "4096"),
    ] {
        let j = serving(
            "llama-3.1-8b",
            gpu,
            &[
                "--max-num-batched-tokens",
                tokens,
                "--max-num-seqs",
                seqs,
                "--kv-cache-dtype",
                kv,
                "--max-model-len",
                len,
            ],
        );
        let s = &j["serving"];
        let seqs: u64 = seqs.parse().unwrap();
        let len: u64 = len.parse().unwrap();
        assert_eq!(u(&j["model"]["params"]), params);
        assert_eq!(u(&s["weights_bytes"]), 2 * params, "{gpu}");
        assert_eq!(
            u(&s["sampler_state_bytes"]),
            seqs * vocab * 4 + seqs * vocab.div_ceil(32) * 4
        );
        let kv_bytes = if kv == "fp8" { 1 } else { 2 };
        let per_token = layers * 2 * kv_heads * head_dim * kv_bytes;
        assert_eq!(u(&s["kv_bytes_per_token"]), per_token);
        // The rows add up; the request is the card's bytes at 0.9.
        let total = u(&j["gpu"]["total_bytes"]);
        assert_eq!(u(&s["requested_bytes"]), (total as f64 * 0.9).ceil() as u64);
        let non_kv = [
            "weights",
            "sampler_state",
            "other_buffers",
            "activation_peak",
        ]
        .iter()
        .map(|k| u(&s[format!("{k}_bytes")]))
        .sum::<u64>();
        assert_eq!(u(&s["non_kv_bytes"]), non_kv);
        let available = u(&s["requested_bytes"]) - non_kv;
        assert_eq!(u(&s["available_kv_bytes"]), available);
        // vLLM: whole blocks of 16 tokens; tokens = int(blocks / ⌈L/16⌉ × L).
        let blocks = available / (16 * per_token);
        assert_eq!(u(&s["kv_blocks"]), blocks);
        let concurrency = blocks as f64 / len.div_ceil(16) as f64;
        assert_eq!(u(&s["kv_tokens"]), (concurrency * len as f64) as u64);
        assert_eq!(s["fits"], true, "{gpu}: {s}");
    }
}

/// Where one request of --max-model-len does not fit, vLLM refuses to start and names the
/// largest length that does: that length fits, one block more does not.
#[test]
fn a_max_model_len_that_does_not_fit_names_the_largest_that_does() {
    // Llama-3.1-8B's own max_model_len (131,072) on an L4.
    let j = serving("llama-3.1-8b", "l4", &[]);
    let s = &j["serving"];
    assert_eq!(u(&s["max_model_len"]), 131_072);
    assert_eq!(s["fits"], false, "{s}");
    let largest = u(&s["max_model_len_fits"]);
    assert!(largest > 0 && largest < 131_072 && largest.is_multiple_of(16));
    let note = j["notes"][0].as_str().unwrap();
    assert!(
        note.contains(&format!(
            "the largest --max-model-len that fits is {largest}"
        )),
        "{note}"
    );
    let at = |len: u64| serving("llama-3.1-8b", "l4", &["--max-model-len", &len.to_string()]);
    assert_eq!(at(largest)["serving"]["fits"], true);
    assert_eq!(at(largest + 16)["serving"]["fits"], false);
    // The table says so.
    let out = vramlab()
        .args(["estimate", "--model", "llama-3.1-8b", "--runtime", "vllm"])
        .args(["--gpu", "l4", "--enforce-eager"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "fits: no (the largest --max-model-len that fits: {largest})"
        )),
        "{text}"
    );
}

/// What the serving estimate does not answer, in one line each (exit 2).
#[test]
fn serving_refusals_are_one_line() {
    let base = ["--runtime", "vllm", "--gpu", "h100-80gb"];
    for (more, needle) in [
        (&["--model", "llama-3.1-8b"][..], "add --enforce-eager"),
        (
            &[
                "--model",
                "llama-3.1-8b",
                "--enforce-eager",
                "--mode",
                "train",
            ][..],
            "--mode infer only",
        ),
        (
            &["--model", "mixtral-8x7b", "--enforce-eager"][..],
            "fused MoE workspace is not modelled yet",
        ),
        (
            &["--model", "mistral-7b-v0.1", "--enforce-eager"][..],
            "sliding-window or chunked layers",
        ),
        (
            &["--model", "llama-3.1-8b", "--enforce-eager", "--gpus", "2"][..],
            "one GPU only",
        ),
        (
            &["--model", "gpt2", "--enforce-eager"][..],
            "only the llama family's decoders",
        ),
        (
            &[
                "--model",
                "llama-3.1-8b",
                "--enforce-eager",
                "--max-num-batched-tokens",
                "1000000000000",
            ][..],
            "--max-num-batched-tokens 1000000000000 is larger than",
        ),
        (
            &[
                "--model",
                "llama-3.1-8b",
                "--enforce-eager",
                "--emulate",
                "l4",
            ][..],
            "--emulate l4 must name the --gpu card (h100-80gb)",
        ),
        (
            &[
                "--model",
                "llama-3.1-8b",
                "--enforce-eager",
                "--gpu-memory-utilization",
                "1.5",
            ][..],
            "--gpu-memory-utilization must be in (0, 1]",
        ),
        (
            &[
                "--model",
                "llama-3.1-8b",
                "--enforce-eager",
                "--precision",
                "q4k",
            ][..],
            "serves bf16, f16 or f32 weights",
        ),
    ] {
        let out = vramlab()
            .arg("estimate")
            .args(base)
            .args(more)
            .output()
            .unwrap();
        one_line_exit_2(&out, needle);
    }
    let out = vramlab()
        .args(["estimate", "--model", "llama-3.1-8b", "--runtime", "vllm"])
        .arg("--enforce-eager")
        .output()
        .unwrap();
    one_line_exit_2(&out, "--runtime vllm needs --gpu");
}
