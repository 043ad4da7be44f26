//! The architectures qwen3, phi3 and gpt_bigcode and the published parameter
//! counts of every preset architecture, derived by hand from the shapes:
//! - parameter counts of the published configs (harness/presets/), through `Config`, and the
//!   weight bytes `estimate` prints for them;
//! - a tiny real-shaped variant of each new architecture (same structure, small dims) through
//!   the real binary: an inference sweep (both KV kinds; exact load and KV figures) and a
//!   training sweep (full and LoRA; gradients and AdamW state);
//! - in process: every parameter gets a gradient, LoRA adapts the documented targets, and the
//!   logits of one full forward equal those of prefill + decode steps through the KV cache
//!   (which catches KV, RoPE, position and sliding-window mistakes);
//! - against transformers (needs torch, `#[ignore]`d; scripts/test.sh runs it after
//!   scripts/torch-env.sh): HF's own checkpoint of each tiny variant (its names, its
//!   config.json) loads, and the logits equal HF's eager forward to 1e-4
//!   (scripts/arch_reference.py writes them).
//!
//! Sources of the presets (config.json as published on the Hugging Face hub):
//! - qwen3-0.6b: Qwen/Qwen3-0.6B;
//! - phi-3-mini-4k: microsoft/Phi-3-mini-4k-instruct;
//! - starcoderbase-1b: bigcode/starcoderbase-1b; starcoder-15.5b: bigcode/starcoder (the
//!   architecture of bigcode/octocoder, which ../shared/peers/published.json measures).
mod common;
use candle_core::{DType, Device, Tensor};
use common::{root, vramlab};
use std::collections::HashMap;
use std::path::Path;
use vramlab::model::{weights, Config, Decoder, InferenceModel, KvCache, KvKind, Source};
use vramlab::record::{Phase, Record, Status};
use vramlab::scenario::spec::{Checkpointing, KvWindow, Trainable};
use vramlab::workload::training;

#[path = "architectures/tinies.rs"]
mod tinies;
use tinies::*;

fn preset(name: &str) -> Config {
    Config::from_file(&root().join(format!("harness/presets/{name}/config.json"))).unwrap()
}

#[test]
fn published_parameter_counts_by_hand() {
    // Qwen3-0.6B: V 151,936, d 1,024, f 3,072, 28 layers, 16 heads × head_dim 128 (q is 2,048
    // wide, wider than d), 8 KV heads, per-head q/k norms (2 × 128), tied embeddings.
    // Per layer: 2,097,152 (q) + 2 × 1,048,576 (k, v) + 2,097,152 (o) + 9,437,184 (mlp)
    // + 2,048 (norms) + 256 (q/k norms) = 15,730,944; × 28 = 440,466,432;
    // + 155,582,464 (embedding) + 1,024 (final norm) = 596,049,920.
    // A count of 751,632,384 is 596,049,920 + 151,936 × 1,024 (155,582,464): the checkpoint
    // stores an `lm_head.weight` copy although the config ties it. transformers ties the head
    // to the embedding on load (one tensor; the model card's "0.6B" and "0.44B non-embedding"
    // are this count), vLLM skips the copy, and vramlab's loader reads only the listed
    // tensors: the memory holds the tied count.
    let q3 = llama_layer(1024, 3072, 16, 8, 128) + 2 * 128;
    let qwen3 = 151_936 * 1024 + 28 * q3 + 1024;
    assert_eq!(q3, 15_730_944);
    assert_eq!(qwen3, 596_049_920);
    assert_eq!(qwen3 + 151_936 * 1024, 751_632_384);
    let c = preset("qwen3-0.6b");
    assert_eq!(c.architecture.name(), "qwen3");
    assert!(c.qk_norm && c.tie_word_embeddings && !c.qkv_bias && c.head_dim == 128);
    assert_eq!(c.param_count(), qwen3);

    // Phi-3-mini-4k: V 32,064, d 3,072, f 8,192, 32 layers, 32 heads × 96, no GQA, untied.
    // Fusing q/k/v (9,216 × 3,072) and gate/up (16,384 × 3,072) changes no count:
    // per layer 113,252,352; × 32 = 3,624,075,264; + 2 × 98,500,608 (embedding, head)
    // + 3,072 = 3,821,079,552.
    let phi = 2 * 32_064 * 3072 + 32 * llama_layer(3072, 8192, 32, 32, 96) + 3072;
    assert_eq!(phi, 3_821_079_552);
    let c = preset("phi-3-mini-4k");
    assert!(c.fused_qkv && c.fused_gate_up && !c.tie_word_embeddings);
    assert_eq!(c.sliding_window, Some(2047));
    assert_eq!(c.param_count(), phi);

    // StarCoderBase-1B: V 49,152, 8,192 positions, d 2,048, f 8,192, 24 layers, 16 heads of
    // 128, multi-query (one K/V head: c_attn is 2,048 + 2 × 128 = 2,304 wide), tied head.
    // Per block 42,490,112; × 24 = 1,019,762,688; + 100,663,296 (wte) + 16,777,216 (wpe)
    // + 4,096 (ln_f) = 1,137,207,296.
    let sc1 = 49_152 * 2048 + 8192 * 2048 + 24 * gpt2_block(2048, 8192, 128) + 2 * 2048;
    assert_eq!(sc1, 1_137_207_296);
    assert_eq!(preset("starcoderbase-1b").param_count(), sc1);
    // StarCoder (15.5B): d 6,144, f 24,576, 40 layers, 48 heads of 128.
    // Per block 379,128,064; × 40 = 15,165,122,560; + 301,989,888 (wte) + 50,331,648 (wpe)
    // + 12,288 (ln_f) = 15,517,456,384.
    let sc = 49_152 * 6144 + 8192 * 6144 + 40 * gpt2_block(6144, 24_576, 128) + 2 * 6144;
    assert_eq!(sc, 15_517_456_384);
    let c = preset("starcoder-15.5b");
    assert_eq!((c.num_kv_heads, c.head_dim), (1, 128));
    assert_eq!(c.param_count(), sc);
    // Multi-query KV: 2 · 40 layers · 1 head · 128 · 2 B = 20,480 B per token in bf16 (48×
    // less than multi-head attention's 983,040).
    assert_eq!(c.kv_bytes_per_token(2).get(), Some(20_480));

    // GPT-2 small: V 50,257, 1,024 positions, d 768, 12 layers; (its 12 `attn.bias` mask
    // buffers are not parameters and are not loaded). 124,439,808.
    let g = 50_257 * 768 + 1024 * 768 + 12 * gpt2_block(768, 3072, 768) + 2 * 768;
    assert_eq!(g, 124_439_808);
    assert_eq!(preset("gpt2").param_count(), g);
    // Mistral-7B-v0.1: V 32,000, d 4,096, f 14,336, 32 layers, 32 heads × 128, 8 KV heads,
    // untied. 7,241,732,096.
    let m = 2 * 32_000 * 4096 + 32 * llama_layer(4096, 14_336, 32, 8, 128) + 4096;
    assert_eq!(m, 7_241_732_096);
    assert_eq!(preset("mistral-7b-v0.1").param_count(), m);
    // Qwen2.5-0.5B: V 151,936, d 896, f 4,864, 24 layers, 14 heads × 64, 2 KV heads, q/k/v
    // biases (896 + 2 × 128), tied. 494,032,768.
    let q2 = 151_936 * 896 + 24 * (llama_layer(896, 4864, 14, 2, 64) + 896 + 2 * 128) + 896;
    assert_eq!(q2, 494_032_768);
    assert_eq!(preset("qwen2.5-0.5b").param_count(), q2);

    // `estimate` on the new presets: the weights row is the hand count × 2 B (bf16).
    for (name, params) in [
        ("qwen3-0.6b", qwen3),
        ("phi-3-mini-4k", phi),
        ("starcoderbase-1b", sc1),
        ("starcoder-15.5b", sc),
    ] {
        let out = vramlab()
            .args(["estimate", "--json", "--precision", "bf16", "--model", name])
            .assert()
            .success();
        let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
        let weights = v["breakdown"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "weights")
            .unwrap();
        assert_eq!(weights["bytes"].as_u64(), Some(2 * params), "{name}");
    }
}

/// The multimodal presets, by hand: the text decoder, plus the vision tower and projector the
/// checkpoint stores; and their KV cache by layer kind.
#[test]
fn multimodal_presets_by_hand() {
    // Llama-4-Scout: V 202,048, d 5,120, 48 layers of 40 heads × 128 with 8 KV heads, every
    // layer MoE: 16 experts of 8,192 (gate_up 16 × 5,120 × 16,384, down 16 × 8,192 × 5,120),
    // the router 16 × 5,120 and a shared expert of 8,192, untied head.
    let attn = 2 * 5120 * 5120 + 2 * 5120 * 1024;
    let moe = 3 * 16 * 5120 * 8192 + 16 * 5120 + 3 * 5120 * 8192;
    let text = 2 * 202_048 * 5120 + 48 * (attn + moe + 2 * 5120) + 5120;
    assert_eq!(text, 107_769_861_120);
    // Its ViT: d 1,408, f 5,632, 34 layers, 336-pixel images in 14-pixel patches (576 and a
    // class token); per layer 4 biased d × d projections, a biased GELU MLP and two biased
    // LayerNorms; the pixel-shuffle adapter (5,632 → 4,096 → 4,096) and the projector to the
    // text width (4,096 → 5,120).
    let (d, f) = (1408, 5632);
    let layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 4 * d;
    let vit = d + 577 * d + d * 3 * 14 * 14 + 4 * d + 34 * layer + f * 4096 + 4096 * 4096;
    let vision = vit + 4096 * 5120;
    assert_eq!(vision, 871_932_416);
    let c = preset("llama-4-scout");
    assert_eq!(c.param_count(), text + vision);
    // Active: 15 idle experts a layer.
    assert_eq!(
        c.active_params().get(),
        Some(text + vision - 48 * 15 * 3 * 5120 * 8192)
    );
    // KV at 32,768 tokens in bf16: 36 chunked layers hold their chunk of 8,192, the 12 NoPE
    // layers every token; 2 · 8 · 128 · 2 B a layer and token.
    let per = 2 * 8 * 128 * 2;
    assert_eq!(
        c.kv_bytes(32_768, KvWindow::Model, 2, Default::default())
            .get(),
        Some(per * (36 * 8192 + 12 * 32_768))
    );

    // Gemma-3-27B: V 262,208, d 5,376, f 21,504, 62 layers of 32 heads × 128 with 16 KV heads,
    // four norms and q/k norms a layer, tied embedding; SigLIP: d 1,152, f 4,304, 27 layers,
    // 896-pixel images in 14-pixel patches (4,096), a biased convolutional patch embedding,
    // post LayerNorm; the projector 1,152 × 5,376 and its RMSNorm.
    let layer = llama_layer(5376, 21_504, 32, 16, 128) + 2 * 5376 + 2 * 128;
    let text = 262_208 * 5376 + 62 * layer + 5376;
    let (d, f) = (1152, 4304);
    let siglip = d * 3 * 14 * 14
        + d
        + 4096 * d
        + 27 * (4 * (d * d + d) + (d * f + f) + (f * d + d) + 4 * d)
        + 2 * d;
    let c = preset("gemma-3-27b");
    assert_eq!(c.param_count(), text + siglip + d * 5376 + d);
    assert_eq!(c.param_count(), 27_432_406_640);
    // 52 sliding layers (window 1,024) and 10 full ones.
    let per = 2 * 16 * 128 * 2;
    assert_eq!(
        c.kv_bytes(32_768, KvWindow::Model, 2, Default::default())
            .get(),
        Some(per * (52 * 1024 + 10 * 32_768))
    );
}

/// Writes the tiny configs as `<dir>/<name>.json`.
fn write_tinies(dir: &Path) {
    for t in &TINIES {
        std::fs::write(dir.join(format!("{}.json", t.name)), t.json).unwrap();
    }
}

fn tiny(name: &str) -> &'static Tiny {
    TINIES.iter().find(|t| t.name == name).unwrap()
}

/// The tiny variant a row belongs to (model ids are `synthetic-<name>`).
fn tiny_of(r: &Record) -> &'static Tiny {
    tiny(r.model_id.strip_prefix("synthetic-").unwrap())
}

#[test]
fn tiny_configs_match_the_hand_counts() {
    for t in &TINIES {
        let c =
            Config::from_json(Path::new(t.name), &serde_json::from_str(t.json).unwrap()).unwrap();
        assert_eq!(c.architecture.name(), t.name);
        assert_eq!(c.param_count(), t.params, "{}", t.name);
        assert_eq!(c.tensor_count() as u64, t.tensors, "{}", t.name);
        assert_eq!(
            c.kv_bytes_per_token(1).get(),
            Some(t.kv_elems),
            "{}",
            t.name
        );
        assert_eq!(
            vramlab::features::adapter_params(&c, Trainable::Lora(1)),
            Ok(t.lora_per_rank),
            "{}",
            t.name
        );
        // The HF json written back (what synth-weights puts beside the weights) reads the same.
        let back = Config::from_json(Path::new(t.name), &c.to_hf_json()).unwrap();
        assert_eq!(back, c, "{}", t.name);
    }
    // transformers ≥ 5 writes RoPE's θ under `rope_parameters` (Qwen3's 1e6, not the 1e4
    // default).
    let mut v: serde_json::Value = serde_json::from_str(QWEN3).unwrap();
    let theta = v.as_object_mut().unwrap().remove("rope_theta").unwrap();
    v["rope_parameters"] = serde_json::json!({"rope_theta": theta, "rope_type": "default"});
    let c = Config::from_json(Path::new("v5.json"), &v).unwrap();
    assert_eq!((c.rope_theta, &c), (1e6, &tiny_config(tiny("qwen3"))));
}

/// Runs `vramlab sweep` over the tiny variants (written in `dir`) with the `[sweep]`
/// table `axes`, and returns its rows (all of them `ok`).
fn sweep(dir: &Path, axes: &str) -> Vec<Record> {
    write_tinies(dir);
    let sources: Vec<String> = TINIES
        .iter()
        .map(|t| format!("\"synthetic:{}/{}.json\"", dir.display(), t.name))
        .collect();
    let sc = dir.join("s.toml");
    std::fs::write(
        &sc,
        format!(
            "name = \"arch\"\n[model]\nsource = [{}]\n[sweep]\n{axes}",
            sources.join(", ")
        ),
    )
    .unwrap();
    let out = dir.join("out.csv");
    vramlab()
        .args(["sweep", "--quiet", "--out"])
        .arg(&out)
        .arg(&sc)
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&out).unwrap();
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
    rows
}

fn bytes_of(precision: &str) -> u64 {
    match precision {
        "f32" => 4,
        "bf16" | "f16" => 2,
        p => panic!("precision {p}"),
    }
}

#[test]
fn inference_sweep_has_exact_weights_and_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    let rows = sweep(
        dir.path(),
        "mode = [\"infer\"]\nprecision = [\"f32\", \"bf16\"]\nbatch = [2]\ncontext = [32]\n\
         kv_cache = [\"preallocated\", \"growing\"]\ndecode_steps = 6\ndecode_every = 1\n",
    );
    let mut points: Vec<&str> = rows.iter().map(|r| r.point_id.as_str()).collect();
    points.dedup();
    assert_eq!(points.len(), TINIES.len() * 2 * 2, "{points:?}");
    let mut growing = 0;
    for id in points {
        let of = |ph: Phase| -> Vec<&Record> {
            rows.iter()
                .filter(|r| r.point_id == id && r.phase == Some(ph))
                .collect()
        };
        let load = of(Phase::Load)[0];
        let t = tiny_of(load);
        assert_eq!(load.architecture, t.name);
        assert_eq!(load.param_count, t.params, "{id}");
        let b = bytes_of(&load.precision.to_string());
        // The weights: the hand count × dtype bytes, live after the load, plus at most 512 B
        // of tensor bookkeeping per tensor.
        let storage = t.params * b;
        assert_eq!(load.feature_weight_bytes, Some(storage), "{id}");
        let live = load.end_allocated.unwrap() - load.baseline_allocated.unwrap();
        assert!(
            live >= storage && live - storage <= 512 * t.tensors,
            "{id}: live {live}, weights {storage}"
        );
        // The KV cache: 2 · L · n_kv · head_dim · bytes per token and sequence (one K/V
        // head for gpt_bigcode).
        let pre = of(Phase::Prefill)[0];
        let decode = of(Phase::Decode);
        assert_eq!(decode.len(), 6, "{id}");
        // A sliding layer holds at most its window (Gemma's layer 0).
        let kv = |tokens: u64| t.kv_elems_at(tokens) * b * 2;
        if id.contains("/preallocated") {
            assert_eq!(pre.feature_kv_bytes, Some(kv(32)), "{id}");
            for d in &decode {
                assert_eq!(d.end_allocated, pre.end_allocated, "{id}: constant cache");
            }
        } else {
            growing += 1;
            let mut prev = pre;
            for d in &decode {
                assert_eq!(d.kv_tokens, Some(prev.kv_tokens.unwrap() + 1), "{id}");
                assert_eq!(d.feature_kv_bytes, Some(kv(d.kv_tokens.unwrap())));
                assert_eq!(
                    d.end_allocated.unwrap() - prev.end_allocated.unwrap(),
                    kv(d.kv_tokens.unwrap()) - kv(prev.kv_tokens.unwrap()),
                    "{id} step {:?}: the cache grows by one token of both sequences",
                    d.step
                );
                prev = d;
            }
        }
    }
    assert_eq!(growing, TINIES.len() * 2);
}

#[test]
fn training_sweep_has_gradients_and_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let rows = sweep(
        dir.path(),
        "mode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [2]\ncontext = [32]\n\
         optimizer = [\"adamw\"]\ntrainable = [\"full\", \"lora-r4\"]\ntrain_steps = 2\nlr = 1e-3\n",
    );
    let mut points: Vec<&str> = rows
        .iter()
        .filter(|r| r.phase != Some(Phase::Load))
        .map(|r| r.point_id.as_str())
        .collect();
    points.dedup();
    assert_eq!(points.len(), TINIES.len() * 2, "{points:?}");
    let loss = |r: &Record| -> f32 { r.message.strip_prefix("loss=").unwrap().parse().unwrap() };
    for id in points {
        let row = |ph: Phase, step: u64| -> &Record {
            rows.iter()
                .find(|r| r.point_id == id && r.phase == Some(ph) && r.step == Some(step))
                .unwrap_or_else(|| panic!("{id}: no {ph:?} row for step {step}"))
        };
        let (f1, b1, o1) = (
            row(Phase::Forward, 1),
            row(Phase::Backward, 1),
            row(Phase::Optimizer, 1),
        );
        let t = tiny_of(f1);
        assert_eq!(f1.param_count, t.params, "{id}");
        // Trainable parameters: all of them, or the rank-4 adapters only.
        let lora = id.ends_with("/lora-r4");
        let (trained, tensors) = if lora {
            (4 * t.lora_per_rank, 2 * t.lora_modules)
        } else {
            (t.params, t.tensors)
        };
        let adapters = if lora { trained } else { 0 };
        assert_eq!(
            f1.feature_weight_bytes,
            Some((t.params + adapters) * 4),
            "{id}"
        );
        // Gradients live at the end of backward, AdamW's m and v at the end of the optimizer
        // phase: exactly their bytes plus at most 1 KiB of bookkeeping per trainable tensor.
        let before = f1.baseline_allocated.unwrap();
        let grads = b1.end_allocated.unwrap() - before;
        let storage = trained * 4;
        assert!(
            grads >= storage && grads - storage <= 1024 * tensors,
            "{id}: gradients {grads}, expected {storage}"
        );
        assert_eq!(o1.feature_optimizer_bytes, Some(2 * storage), "{id}");
        let state = o1.end_allocated.unwrap() - before;
        assert!(
            state >= 2 * storage && state - 2 * storage <= 1024 * tensors,
            "{id}: optimizer state {state}, expected {}",
            2 * storage
        );
        // AdamW lowers the loss. (Not asserted under LoRA: B starts at zero and the synthetic
        // weights' logits are so flat that one step of the adapters moves the loss by less
        // than its f32 rounding; the in-process test checks that B gets a gradient.)
        if !lora {
            assert!(
                loss(row(Phase::StepTotal, 2)) < loss(row(Phase::StepTotal, 1)),
                "{id}: the loss does not fall"
            );
        }
    }
}

/// Synthetic f32 weights of `cfg` written and loaded by the real loader.
fn load(cfg: &Config) -> HashMap<String, Tensor> {
    let dir = tempfile::tempdir().unwrap();
    vramlab::model::synth::write(cfg, DType::F32, 5, dir.path()).unwrap();
    weights::load(
        &Source::Hf(dir.path().into()),
        cfg,
        DType::F32,
        &Device::Cpu,
        |_, _| {},
    )
    .unwrap()
}

fn tiny_config(t: &Tiny) -> Config {
    Config::from_json(Path::new(t.name), &serde_json::from_str(t.json).unwrap()).unwrap()
}

#[test]
fn every_parameter_gets_a_gradient_and_lora_adapts_its_targets() {
    for t in &TINIES {
        let cfg = tiny_config(t);
        let vars = vramlab::model::trainable::to_vars(load(&cfg)).unwrap();
        let (ids, targets) = training::batch_ids(cfg.vocab_size, 2, 16, 3, &Device::Cpu).unwrap();
        for set in [Trainable::Full, Trainable::Lora(4)] {
            let (model, trainable) = vramlab::model::trainable::trainable_model(
                &cfg,
                &vars,
                set,
                DType::F32,
                Default::default(),
            )
            .unwrap();
            let (l, grads) = training::gradients(
                model.as_ref(),
                &trainable,
                &ids,
                &targets,
                Checkpointing::None,
                1,
            )
            .unwrap();
            assert!(l.is_finite(), "{} {set:?}: loss {l}", t.name);
            let params: usize = trainable.iter().map(|v| v.elem_count()).sum();
            match set {
                Trainable::Full => {
                    assert_eq!(params as u64, t.params, "{}", t.name);
                    for v in &trainable {
                        let g = grads.get(v.as_tensor()).expect("a gradient");
                        assert!(common::max_abs(g) > 0.0, "{}: a zero gradient", t.name);
                    }
                }
                _ => {
                    // A (r, in) and B (out, r) for each target; B starts at zero, so only
                    // B's gradient is non-zero at the first step (A's is Bᵀ·… = 0).
                    assert_eq!(trainable.len() as u64, 2 * t.lora_modules, "{}", t.name);
                    assert_eq!(params as u64, 4 * t.lora_per_rank, "{}", t.name);
                    for v in &trainable {
                        let g = grads.get(v.as_tensor()).expect("a gradient");
                        let (_, cols) = v.dims2().unwrap();
                        if cols == 4 {
                            assert!(common::max_abs(g) > 0.0, "{}: B without gradient", t.name);
                        }
                    }
                }
            }
        }
    }
}

/// Seeded weights of `cfg` uniform in ±0.5, norms included: larger than the synthetic
/// weights' ±0.02 (whose LayerNorm weights, not named `*norm.weight`, would make GPT-2-shaped
/// logits nearly zero and the comparison below weak).
fn random_weights(cfg: &Config, seed: u64) -> HashMap<String, Tensor> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    cfg.tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
            (name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
        })
        .collect()
}

fn decoder(cfg: &Config) -> Box<dyn Decoder> {
    let t = random_weights(cfg, 21);
    match cfg.architecture.inference(cfg, t, DType::F32).unwrap() {
        InferenceModel::Decoder(d) => d,
        InferenceModel::Encoder(_) => panic!("{} is a decoder", cfg.architecture),
    }
}

/// Logits of one forward over the whole sequence (no cache) against a prefill of `prompt`
/// tokens then one decode step per token through the KV cache, for both kinds (and, with a
/// sliding window shorter than the sequence, both window policies): equal to 1e-4.
#[test]
fn cached_decoding_matches_a_full_forward() {
    let (batch, prompt, total) = (2, 9, 24);
    for t in &TINIES {
        let mut cfg = tiny_config(t);
        if ["phi3", "gemma2", "gemma3_text", "gpt_oss"].contains(&t.name) {
            // A window shorter than the sequence: decode steps 12..24 see only the last 12
            // keys, through the capped ring-buffer cache or a full one.
            cfg.sliding_window = Some(12);
        }
        let model = decoder(&cfg);
        let (ids, _) = training::batch_ids(cfg.vocab_size, batch, total, 8, &Device::Cpu).unwrap();
        let full = model.forward(&ids, 0, None, false).unwrap();
        for kind in [KvKind::Preallocated, KvKind::Growing] {
            for window in [KvWindow::Model, KvWindow::Full] {
                let mut cache =
                    KvCache::new(kind, &cfg, batch, total, window, DType::F32, &Device::Cpu)
                        .unwrap();
                let first = model
                    .forward(
                        &ids.narrow(1, 0, prompt).unwrap(),
                        0,
                        Some(&mut cache),
                        false,
                    )
                    .unwrap();
                let mut parts = vec![first];
                for p in prompt..total {
                    let step = ids.narrow(1, p, 1).unwrap();
                    parts.push(model.forward(&step, p, Some(&mut cache), true).unwrap());
                }
                let cached = Tensor::cat(&parts, 1).unwrap();
                let d = common::max_abs_diff(&full, &cached);
                assert!(
                    d <= 1e-4,
                    "{} {kind:?} {window:?}: logits differ by {d}",
                    t.name
                );
                assert!(
                    common::max_abs(&full) > 1e-2,
                    "{}: degenerate logits",
                    t.name
                );
            }
        }
    }
}

/// What the new architectures do not implement is refused with a message naming the file and
/// the key, never run with the wrong function.
#[test]
fn unsupported_variants_are_clear_errors() {
    for (json, key, value) in [
        (BIGCODE, "multi_query", serde_json::json!(false)),
        (BIGCODE, "activation_function", serde_json::json!("gelu")),
        (BIGCODE, "tie_word_embeddings", serde_json::json!(false)),
        (PHI3, "partial_rotary_factor", serde_json::json!(0.75)),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
        v[key] = value;
        let e = Config::from_json(Path::new("m/config.json"), &v).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("m/config.json: ") && msg.contains(key) && !msg.contains('\n'),
            "{msg}"
        );
    }
}

/// HF's checkpoints of the tiny variants (written by scripts/arch_reference.py with
/// transformers, random weights) load through the real loader, hold the hand-counted
/// parameters, and give HF's logits to 1e-4: the architectures compute what transformers
/// computes, not just something self-consistent.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn logits_match_transformers() {
    let python = std::env::var("VRAMLAB_TORCH_PYTHON").expect(
        "VRAMLAB_TORCH_PYTHON is not set: this test runs from scripts/test.sh, after scripts/torch-env.sh",
    );
    let dir = tempfile::tempdir().unwrap();
    write_tinies(dir.path());
    let st = std::process::Command::new(python)
        .arg(root().join("scripts/arch_reference.py"))
        .args(
            TINIES
                .iter()
                .map(|t| dir.path().join(format!("{}.json", t.name))),
        )
        .status()
        .unwrap();
    assert!(st.success(), "arch_reference.py failed");
    for t in &TINIES {
        let hf = dir.path().join(t.name);
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(hf.join("reference.json")).unwrap())
                .unwrap();
        assert_eq!(
            r["params"].as_u64(),
            Some(t.params),
            "{}: transformers' count",
            t.name
        );
        // The config.json transformers writes (v5: `rope_parameters`, `layer_types`, ...).
        let cfg = Config::from_file(&hf.join("config.json")).unwrap();
        assert_eq!(
            cfg,
            tiny_config(t),
            "{}: config.json as transformers writes it",
            t.name
        );
        let w = weights::load(&Source::Hf(hf), &cfg, DType::F32, &Device::Cpu, |_, _| {}).unwrap();
        let InferenceModel::Decoder(model) =
            cfg.architecture.inference(&cfg, w, DType::F32).unwrap()
        else {
            panic!("{} is a decoder", t.name)
        };
        let ids: Vec<u32> = serde_json::from_value(r["ids"].clone()).unwrap();
        let rows: Vec<Vec<f32>> = serde_json::from_value(r["logits"].clone()).unwrap();
        let n = ids.len();
        let ids = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
        let want = Tensor::new(rows, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let got = model.forward(&ids, 0, None, false).unwrap();
        let d = common::max_abs_diff(&got, &want);
        assert!(
            d <= 1e-4,
            "{}: logits differ from transformers' by {d}",
            t.name
        );
        assert!(
            common::max_abs(&want) > 0.5,
            "{}: degenerate logits",
            t.name
        );
    }
}

/// Every preset's parameter count equals the one transformers builds from the same config.json
/// (on the meta device, scripts/preset_params.py): the mixture-of-experts presets (Mixtral,
/// Qwen-MoE) and the 70B class included.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn preset_counts_equal_transformers() {
    let python = std::env::var("VRAMLAB_TORCH_PYTHON").expect("VRAMLAB_TORCH_PYTHON is not set");
    let names: Vec<&str> = vramlab::estimate::model::PRESETS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !n.starts_with("bert"))
        .collect();
    let paths: Vec<String> = names
        .iter()
        .map(|n| {
            root()
                .join(format!("harness/presets/{n}/config.json"))
                .display()
                .to_string()
        })
        .collect();
    let out = std::process::Command::new(python)
        .arg(root().join("scripts/preset_params.py"))
        .args(&paths)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: HashMap<String, u64> = serde_json::from_slice(&out.stdout).unwrap();
    for (n, p) in names.iter().zip(&paths) {
        assert_eq!(Some(&preset(n).param_count()), counts.get(p), "{n}");
    }
}
