//! Forward and backward: every parameter's gradient, LoRA targets, cached decoding, refusals, transformers' logits and counts.
use super::*;

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
