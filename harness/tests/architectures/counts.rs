//! Parameter counts by hand: published figures, multimodal presets, the tiny configs.
use super::*;

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
