//! `vramlab estimate --runtime vllm` (docs/src/guides/serving.md): vLLM's startup figures. The
//! exact terms against the published config.json by hand, vLLM's KV token and concurrency
//! rules, the refusal with the largest --max-model-len that fits, bad input, and the fitted
//! terms as `vramlab fit --vllm` gives them on the committed corpus of emulated startups. The
//! agreement with vLLM's own startup on the emulated GPU is `tests/vllm.rs`.
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
        // One cos/sin cache of every position, in the weights' dtype.
        let rotary = n("max_position_embeddings") * head_dim * 2;
        assert_eq!(u(&s["rotary_cache_bytes"]), rotary);
        let non_kv = [
            "weights",
            "weights_rounding",
            "rotary_cache",
            "sampler_state",
            "other_buffers",
            "activation_peak",
            "cuda_graph",
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
            "give the ranks with --tensor-parallel-size",
        ),
        (
            &["--model", "llama-3.1-8b", "--enforce-eager", "--tp", "3"][..],
            "--tensor-parallel-size 3 does not divide its 32 attention heads",
        ),
        (
            &["--model", "qwen2.5-0.5b", "--enforce-eager", "--tp", "7"][..],
            "does not divide its 2 KV heads",
        ),
        (
            &["--model", "llama-3.1-8b", "--enforce-eager", "--tp", "0"][..],
            "--tensor-parallel-size must be in 1..=",
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
    let out = vramlab()
        .args(["estimate", "--model", "llama-3.1-8b", "--tp", "2"])
        .output()
        .unwrap();
    one_line_exit_2(
        &out,
        "--tensor-parallel-size is vLLM's (add --runtime vllm)",
    );
}

/// `--tp N`: one rank's figures by hand from the config, as vLLM splits a dense decoder (the
/// query heads, the MLP's intermediate width and the vocabulary padded to 64 rows over the
/// ranks; the KV heads too, or one a rank where the ranks outnumber them; norms and the rotary
/// cache whole on every rank), and the KV tokens of the engine over a rank's heads.
#[test]
fn tensor_parallel_figures_are_one_rank_s_by_hand() {
    let c = config("llama-3.1-8b");
    let n = |k: &str| u(&c[k]);
    let (h, inter, layers, heads, kv_heads) = (
        n("hidden_size"),
        n("intermediate_size"),
        n("num_hidden_layers"),
        n("num_attention_heads"),
        n("num_key_value_heads"),
    );
    let head_dim = h / heads;
    let vocab = n("vocab_size").div_ceil(64) * 64;
    let one = serving("llama-3.1-8b", "h100-80gb", &["--max-model-len", "8192"]);
    // 16 ranks outnumber the 8 KV heads: each rank holds one, twice over the engine.
    for (tp, kv_rank) in [(2u64, kv_heads / 2), (4, kv_heads / 4), (16, 1)] {
        let j = serving(
            "llama-3.1-8b",
            "h100-80gb",
            &["--max-model-len", "8192", "--tp", &tp.to_string()],
        );
        let s = &j["serving"];
        let (q, kv) = (heads / tp * head_dim, kv_rank * head_dim);
        let layer = (q + 2 * kv) * h + h * q + 3 * (inter / tp) * h + 2 * h;
        assert_eq!(
            u(&s["weights_bytes"]),
            2 * (2 * (vocab / tp) * h + layers * layer + h),
            "{tp} ranks"
        );
        assert_eq!(u(&s["tensor_parallel"]), tp);
        let per_token = layers * 2 * kv_rank * head_dim * 2;
        assert_eq!(u(&s["kv_bytes_per_token"]), per_token, "{tp} ranks");
        // What is whole on every rank is the one GPU's.
        for k in [
            "rotary_cache_bytes",
            "sampler_state_bytes",
            "other_buffers_bytes",
        ] {
            assert_eq!(s[k], one["serving"][k], "{tp} ranks: {k}");
        }
        // The rank's forward holds its shard of the MLP beside the whole hidden state; the
        // sampler's gathered logits are the whole vocabulary's.
        let batched = u(&s["max_num_batched_tokens"]);
        let seqs = u(&s["max_num_seqs"]);
        let forward = batched * 2 * (2 * h + 3 * (inter / tp));
        let sampler = batched * h * 2 + seqs * n("vocab_size") * (2 + 4);
        assert_eq!(u(&s["activation_peak_bytes"]), forward.max(sampler));
        let blocks = u(&s["available_kv_bytes"]) / (16 * per_token);
        assert_eq!(u(&s["kv_blocks"]), blocks);
        assert_eq!(u(&s["kv_tokens"]), (blocks as f64 / 512.0 * 8192.0) as u64);
        let note = j["notes"][0].as_str().unwrap();
        assert!(note.contains("NCCL's own buffers"), "{note}");
    }
}

/// The committed corpus of emulated vLLM startups
/// (`results/emulated/vllm-0.33-startups.tsv`).
fn startups() -> std::path::PathBuf {
    root().join("results/emulated/vllm-0.33-startups.tsv")
}

/// `vramlab fit --vllm` on the committed corpus gives the estimate's own fitted terms: the other
/// buffers of an eager query, and with CUDA graphs (vLLM's default) the pool's coefficients for
/// a Hopper card over the features by hand (1, a hidden row summed over the PIECEWISE capture
/// sizes and over the FULL ones) plus vLLM's 1 MiB floor for each FULL graph beyond the first.
/// The capture sizes by hand: 1, 2, 4, 8 to 248 by 8, 256 to 512 by 16 (51 sizes), all FULL at
/// 1,024 sequences, those up to 256 at 256.
#[test]
fn the_fitted_terms_are_fit_s_answer_on_the_committed_startups() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("serving.toml");
    let o = vramlab()
        .args(["fit", "--vllm"])
        .arg(startups())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("held-out leave-one-model-out, KV tokens:"),
        "{stdout}"
    );
    let t: toml::Value = toml::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let f = &t["serving"];
    let int = |k: &str| f[k].as_integer().unwrap() as u64;
    let pool: Vec<f64> = f["graph_pool"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_float().unwrap())
        .collect();
    let row = (u(&config("llama-3.1-8b")["hidden_size"]) * 2) as f64;
    let mut sizes: Vec<u64> = vec![1, 2, 4];
    sizes.extend((1..=31).map(|k| 8 * k));
    sizes.extend((0..=16).map(|j| 256 + 16 * j));
    assert_eq!(sizes.len(), 51);
    for (tokens, seqs) in [("8192", 1024), ("2048", 256)] {
        let full: Vec<u64> = sizes.iter().copied().filter(|&t| t <= seqs).collect();
        let more = [
            "--max-num-batched-tokens",
            tokens,
            "--max-num-seqs",
            &seqs.to_string(),
        ];
        let eager = serving("llama-3.1-8b", "h100-80gb", &more);
        assert_eq!(
            u(&eager["serving"]["other_buffers_bytes"]),
            int("other_fixed") + int("other_per_seq") * seqs
        );
        assert_eq!(u(&eager["serving"]["cuda_graph_bytes"]), 0);
        let args = [
            &[
                "--model",
                "llama-3.1-8b",
                "--runtime",
                "vllm",
                "--gpu",
                "h100-80gb",
            ][..],
            &more,
        ]
        .concat();
        let graphs = common::estimate_json(&args);
        let g = &graphs["serving"];
        assert_eq!(u(&g["cuda_graphs"]["full_graphs"]), full.len() as u64);
        assert_eq!(g["cuda_graphs"]["sizes"].as_array().unwrap().len(), 51);
        let sum = |v: &[u64]| v.iter().sum::<u64>() as f64;
        let fitted = pool[0] * 1.0 + pool[1] * (row * sum(&sizes)) + pool[2] * (row * sum(&full));
        let expected = fitted.round() as u64 + (full.len() as u64 - 1) * (1 << 20);
        assert_eq!(u(&g["cuda_graph_bytes"]), expected, "{tokens}/{seqs}");
        // The graphs come out of what the KV cache gets, and nothing else moves.
        assert_eq!(
            u(&g["non_kv_bytes"]),
            u(&eager["serving"]["non_kv_bytes"]) + expected
        );
    }
}

/// Every startup of the committed corpus: its estimate columns are the estimate's answer today
/// (recomputed when a term changes), within 3% of vLLM's KV tokens.
#[test]
fn the_committed_startups_are_the_estimate_s_answer_within_3_percent() {
    let text = std::fs::read_to_string(startups()).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let mut graphs = 0;
    for line in lines {
        let v: Vec<&str> = line.split('\t').collect();
        let col = |k: &str| v[header.iter().position(|h| *h == k).unwrap()];
        let mut args = vec![
            "--model",
            col("preset"),
            "--runtime",
            "vllm",
            "--gpu",
            col("gpu"),
            "--max-model-len",
            col("max_model_len"),
            "--max-num-batched-tokens",
            col("max_num_batched_tokens"),
            "--max-num-seqs",
            col("max_num_seqs"),
        ];
        if col("cuda_graphs") == "false" {
            args.push("--enforce-eager");
        } else {
            graphs += 1;
        }
        let j = common::estimate_json(&args);
        let tokens = u(&j["serving"]["kv_tokens"]);
        assert_eq!(tokens.to_string(), col("estimate_kv_tokens"), "{line}");
        let vllm: f64 = col("vllm_kv_tokens").parse().unwrap();
        assert!((tokens as f64 / vllm - 1.0).abs() <= 0.03, "{line}");
    }
    assert!(graphs >= 10, "{graphs} startups with CUDA graphs");
}
