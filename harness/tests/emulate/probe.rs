//! The torch probe and programs' own recorders on the emulated GPU: FSDP ranks, precisions, kernels, OOM rows.
use super::*;

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_programs_own_recorder_writes_rows_vramlab_reads() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("rows.csv");
    let r = emulate(
        &["--gpu", "l4"],
        &data("recorder_csv.py"),
        &[csv.to_str().unwrap()],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let rows = vramlab::export::csv::read(&csv).unwrap();
    // Three phases a step and the step's own `step_total` row (the emulator counts optimizer
    // steps), two steps.
    assert_eq!(rows.len(), 8);
    let row = |phase: &str, step: u64| {
        rows.iter()
            .find(|r| r.phase.map(|p| p.as_str()) == Some(phase) && r.step == Some(step))
            .unwrap_or_else(|| panic!("no {phase} row of step {step}"))
    };
    assert!(rows
        .iter()
        .all(|r| r.meter == vramlab::vocab::MeterKind::TorchEmulated
            && r.device_name == "NVIDIA L4 (emulated)"));
    // The weight (256 × 256 f32) and bias (256 f32), each rounded to 512 B, stay resident.
    let weights = (256 * 256 * 4u64).div_ceil(512) * 512 + (256 * 4u64).div_ceil(512) * 512;
    assert!(row("forward", 1).baseline_allocated.unwrap() >= weights);
    // After the first optimizer step: weights plus AdamW's two moments, the input, and the loss
    // the program still holds (a scalar: one 512 B block).
    let input = (8 * 256 * 4u64).div_ceil(512) * 512;
    assert_eq!(
        row("optimizer", 1).end_allocated,
        Some(3 * weights + input + 512)
    );
    assert_eq!(
        row("step_total", 2).status,
        Some(vramlab::record::Status::Ok)
    );
}

/// FSDP full shard on N emulated GPUs in one process (torch's fake process group, FSDP2): rank
/// 0's weights, gradients and AdamW state are each the 1/N share the program derives from the
/// parameter shapes, within the caching allocator's 512 B rounding of each tensor; with
/// CPUOffloadPolicy none of them stays on the GPU.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn fsdp_full_shard_holds_a_1_over_n_share_per_rank() {
    let end = |r: &Run, name: &str, step: u64| {
        u(&r.json["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name && p["step"] == step)
            .unwrap_or_else(|| panic!("no {name} phase of step {step}"))["end_allocated"])
    };
    for n in ["2", "8"] {
        let r = emulate(&["--gpu", "a100-80gb"], &data("fsdp_tiny.py"), &[n]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let e = r.expect.as_ref().expect("EXPECT line");
        let shard = u(&e["shard_bytes"]);
        // Every dim 0 of the tiny Llama divides by 2 and 8: the shard is exactly 1/N.
        assert_eq!(shard * n.parse::<u64>().unwrap(), u(&e["full_param_bytes"]));
        assert_eq!(u(&e["local_param_bytes"]), shard);
        let slack = 512 * u(&e["tensors"]);
        let within = |what: &str, got: u64, want: u64| {
            assert!(
                got >= want && got - want <= slack,
                "N={n} {what}: {got} B, the 1/N share is {want} B (+ at most {slack} B rounding)"
            )
        };
        let (load, grads, step) = (
            end(&r, "load", 1),
            end(&r, "backward", 1),
            end(&r, "optimizer", 1),
        );
        within("weights", load, shard);
        within("gradients", grads - load, u(&e["grad_bytes"]));
        assert_eq!(u(&e["grad_bytes"]), shard);
        within("AdamW state", step - grads, 2 * shard);
        assert_eq!(u(&e["state_bytes"]), 2 * shard);
    }
    let off = emulate(
        &["--gpu", "a100-80gb"],
        &data("fsdp_tiny.py"),
        &["2", "offload"],
    );
    assert_eq!(off.code, 0, "{}", off.stderr);
    let e = off.expect.as_ref().expect("EXPECT line");
    let slack = 512 * u(&e["tensors"]);
    for (phase, step) in [("load", 1), ("optimizer", 1), ("optimizer", 2)] {
        assert!(
            end(&off, phase, step) < slack,
            "offload: {phase} {step} left {} B on the GPU",
            end(&off, phase, step)
        );
    }
}

#[test]
fn committed_emulated_generation_rows_hold_the_cpu_rows_weights() {
    // results/emulated/: SD 1.5 and Wan2.1 on the emulated H100, against the same scenarios
    // under the CPU preload meter (from_pretrained reading real files). The weights of every
    // point, per component and in all, are the same bytes: the emulated models are built from
    // the configs alone, with the classes' f32-kept modules, and allocated once each.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let pairs = [
        ("h100-80gb-torch-cpu-sd15.csv", "torch-cpu-sd15.csv"),
        ("h100-80gb-torch-cpu-wan-1.3b.csv", "torch-cpu-wan-1.3b.csv"),
        (
            "h100-80gb-torch-cpu-wan-1.3b-sdpa.csv",
            "torch-cpu-wan-1.3b-sdpa.csv",
        ),
    ];
    for (emu, cpu) in pairs {
        let read = |p: PathBuf| vramlab::export::csv::read(&p).unwrap();
        let emu_rows = read(root.join("results/emulated").join(emu));
        let cpu_rows = read(root.join("results/cpu").join(cpu));
        let key = |r: &vramlab::record::Record| (r.point_id.clone(), r.phase, r.component, r.step);
        let cpu_by: std::collections::BTreeMap<_, _> =
            cpu_rows.iter().map(|r| (key(r), r)).collect();
        assert_eq!(emu_rows.len(), cpu_rows.len(), "{emu} vs {cpu}");
        for r in &emu_rows {
            let c = cpu_by
                .get(&key(r))
                .unwrap_or_else(|| panic!("{emu}: {:?}", key(r)));
            assert_eq!(r.param_count, c.param_count, "{emu}: {:?}", key(r));
            assert!(r.feature_weight_bytes.is_some(), "{emu}: {:?}", key(r));
            assert_eq!(
                r.feature_weight_bytes,
                c.feature_weight_bytes,
                "{emu}: {:?}",
                key(r)
            );
        }
    }
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn estimate_allocated_meets_pytorchs_where_the_loss_dominates() {
    // SmolLM2-135M, bf16, 8 × 2048 tokens, layer checkpointing: its 805 M logits (49,152
    // vocabulary) dominate. Counting the f32 log-softmax beside 16-bit logits (6 B per logit),
    // the analytic allocated figure was 39% under PyTorch's; the loss's backward holds three
    // f32 tensors per logit, and the estimate now comes within 5% of PyTorch's own peak.
    let mut args = SMOLLM2_BF16_TRAIN.to_vec();
    args.extend(["--batch", "8", "--context", "2048", "--checkpointing"]);
    let json = estimate_json(&[args.as_slice(), &["--emulate", "h100-80gb"]].concat());
    let analytic = u(&json["allocated_bytes"]) as f64;
    let torch = u(&json["emulated"]["max_memory_allocated"]) as f64;
    let err = analytic / torch - 1.0;
    assert!(err.abs() < 0.05, "analytic {analytic} B, PyTorch {torch} B");
}

/// The torch probe's `--gpus N` (FSDP full shard, rank 0 in one process through the fake
/// process group), as `estimate --emulate --gpus N --sharding fsdp` runs it, on a tiny Llama
/// in f32 with AdamW: the load holds rank 0's shard of every parameter, ceil(rows / N) rows of
/// each (FSDP pads the last rank), and after each optimizer step the shard thrice (weights and
/// AdamW's two moments; the gradients are freed by zero_grad), each derived from the config's
/// shapes here, within the allocator's 512 B rounding per tensor. Then `--gpus` with a LoRA
/// point is one line and exit 2.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_probes_fsdp_ranks_hold_their_share_of_weights_and_adamw_state() {
    let dir = tempfile::tempdir().unwrap();
    let (v, h, i, layers, heads, kv) = (1024u64, 256u64, 512u64, 2u64, 4u64, 2u64);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v,
        "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "max_position_embeddings": 128,
        "tie_word_embeddings": false, "rms_norm_eps": 1e-5, "hidden_act": "silu"
    });
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, config.to_string()).unwrap();
    let kv_rows = kv * (h / heads);
    // (rows, row length) of every parameter: embedding, per layer q k v o, gate up down and
    // two norms, the final norm, the untied head.
    let mut shapes = vec![(v, h), (h, 1), (v, h)];
    for _ in 0..layers {
        shapes.extend([(h, h), (kv_rows, h), (kv_rows, h), (h, h)]);
        shapes.extend([(i, h), (i, h), (h, i), (h, 1), (h, 1)]);
    }
    let tolerance = 512 * (shapes.len() as u64 + 4);
    let run = |gpus: u64, trainable: &str, extra: &[&str]| {
        let scen = dir.path().join(format!("fsdp-{gpus}-{trainable}.toml"));
        std::fs::write(
            &scen,
            format!(
                "name = \"fsdp\"\n[model]\nsource = \"synthetic:{}\"\n[sweep]\nmode = [\"train\"]\n\
                 precision = [\"f32\"]\nbatch = [2]\ncontext = [64]\noptimizer = [\"adamw\"]\n\
                 trainable = [\"{trainable}\"]\ntrain_steps = 2\n",
                cfg.display()
            ),
        )
        .unwrap();
        let csv = dir.path().join(format!("fsdp-{gpus}.csv"));
        let out = std::process::Command::new(torch_python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/vramlab/probe"))
            .arg(&scen)
            .args([
                "--device",
                "emu:a100-80gb",
                "--gpus",
                &gpus.to_string(),
                "--out",
            ])
            .arg(&csv)
            .args(extra)
            .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
            .output()
            .unwrap();
        (out, csv)
    };
    for n in [2u64, 8] {
        let (out, csv) = run(n, "full", &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let shard: u64 = shapes.iter().map(|&(r, c)| r.div_ceil(n) * c * 4).sum();
        let full: u64 = shapes.iter().map(|&(r, c)| r * c * 4).sum();
        assert!(shard < full / n + full / 100, "N={n}: {shard} vs {full}");
        let rows = vramlab::export::csv::read(&csv).unwrap();
        let held = |r: &vramlab::record::Record| {
            r.end_allocated.unwrap() - r.baseline_allocated.unwrap_or(0)
        };
        let load = rows
            .iter()
            .find(|r| r.phase.map(|p| p.as_str()) == Some("load"))
            .unwrap();
        assert!(
            held(load).abs_diff(shard) <= tolerance,
            "N={n}: the load holds {} B, rank 0's shard is {shard} B",
            held(load)
        );
        for r in rows
            .iter()
            .filter(|r| r.phase.map(|p| p.as_str()) == Some("optimizer"))
        {
            let end = r.end_allocated.unwrap();
            assert!(
                end.abs_diff(3 * shard) <= 3 * tolerance,
                "N={n} step {:?}: {end} B after the step, 3 × the shard is {} B",
                r.step,
                3 * shard
            );
            assert!(
                r.message.contains(&format!("rank 0 of {n}")),
                "{}",
                r.message
            );
        }
    }
    // FSDP's CPU offload: the rank's shards, their gradients and AdamW's state never reach the
    // device; the load and the end of each step hold nothing there.
    let (out, csv) = run(2, "full", &["--offload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in vramlab::export::csv::read(&csv)
        .unwrap()
        .iter()
        .filter(|r| matches!(r.phase.map(|p| p.as_str()), Some("load" | "optimizer")))
    {
        assert!(
            r.end_allocated.unwrap() <= tolerance,
            "{:?}: {r:?}",
            r.phase
        );
        let step = r.phase.map(|p| p.as_str()) == Some("optimizer");
        assert!(
            !step || r.message.contains("offloaded to the CPU"),
            "{}",
            r.message
        );
    }
    let (out, _) = run(2, "lora-r8", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.trim().lines().count() == 1 && err.contains("lora-r8"),
        "{err}"
    );
}

/// Mixed precision with checkpointed layers, as the HF Trainer's `bf16=True` with
/// `gradient_checkpointing=True` runs it (f32 masters, autocast, transformers' non-reentrant
/// checkpointing), in the probe on an emulated GPU beside the same point without
/// checkpointing, each derived from the config's shapes:
/// - the load holds every parameter in f32 (4 B each, the allocator's 512 B rounding apart);
/// - after the first backward the gradients are f32 too: the parameters' bytes again;
/// - the checkpointed forward keeps at least every layer's f32 input (the residual stream
///   under autocast is f32: layers · b · s · h · 4 B) and less than the plain forward keeps,
///   and its backward peaks lower.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn mixed_precision_with_checkpointing_keeps_f32_masters_and_gradients_and_peaks_lower() {
    use vramlab::record::Phase;
    let dir = tempfile::tempdir().unwrap();
    let (v, h, i, layers, heads, kv) = (1024u64, 256u64, 512u64, 4u64, 4u64, 2u64);
    let (b, s) = (4u64, 256u64);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v,
        "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "rms_norm_eps": 1e-5, "hidden_act": "silu"
    });
    let kv_rows = kv * (h / heads);
    // (rows, row length) of every parameter: embedding, final norm, untied head, and per layer
    // q k v o, gate up down and two norms.
    let mut shapes = vec![(v, h), (h, 1), (v, h)];
    for _ in 0..layers {
        shapes.extend([(h, h), (kv_rows, h), (kv_rows, h), (h, h)]);
        shapes.extend([(i, h), (i, h), (h, i), (h, 1), (h, 1)]);
    }
    let f32_bytes: u64 = shapes.iter().map(|&(r, c)| r * c * 4).sum();
    let tolerance = 512 * shapes.len() as u64;
    let rows = probe_emulated(
        dir.path(),
        &config,
        &format!(
            "name = \"mixed-ckpt\"\n[model]\nsource = \"synthetic:{{config}}\"\n[sweep]\n\
             mode = [\"train\"]\nprecision = [\"mixed-bf16\"]\nbatch = [{b}]\ncontext = [{s}]\n\
             optimizer = [\"adamw\"]\ncheckpointing = [\"none\", \"layer\"]\ntrain_steps = 2\n"
        ),
    );
    let row = |ckpt: &str, phase: Phase| {
        rows.iter()
            .find(|r| {
                r.point_id.ends_with(&format!("/adamw/{ckpt}/ga1/full"))
                    && r.phase == Some(phase)
                    && matches!(r.step, None | Some(0) | Some(1))
            })
            .unwrap_or_else(|| panic!("no {phase:?} row for checkpointing {ckpt}: {rows:?}"))
    };
    let held =
        |r: &vramlab::record::Record| r.end_allocated.unwrap() - r.baseline_allocated.unwrap_or(0);
    for ckpt in ["none", "layer"] {
        let load = held(row(ckpt, Phase::Load));
        assert!(
            load.abs_diff(f32_bytes) <= tolerance,
            "{ckpt}: the load holds {load} B, the f32 parameters are {f32_bytes} B"
        );
        let fwd = row(ckpt, Phase::Forward);
        let grads =
            row(ckpt, Phase::Backward).end_allocated.unwrap() - fwd.baseline_allocated.unwrap();
        assert!(
            grads.abs_diff(f32_bytes) <= tolerance,
            "{ckpt}: the gradients hold {grads} B, f32 gradients are {f32_bytes} B"
        );
    }
    let kept = |ckpt: &str| held(row(ckpt, Phase::Forward));
    let inputs = layers * b * s * h * 4;
    assert!(
        kept("layer") >= inputs && kept("layer") < kept("none"),
        "the checkpointed forward keeps {} B (every layer's f32 input is {inputs} B), the \
         plain one {} B",
        kept("layer"),
        kept("none")
    );
    let peak = |ckpt: &str| row(ckpt, Phase::Backward).peak_allocated.unwrap();
    assert!(
        peak("layer") < peak("none"),
        "backward peaks: checkpointed {} B, plain {} B",
        peak("layer"),
        peak("none")
    );
}

/// A torch scenario's `attention` axis runs per point: one model per attention kernel, the
/// kernel in each row's `attention` column and point id, and eager's prefill holding the
/// materialized scores (at least b · heads · s² 16-bit values for its s-token prompt) beyond
/// what sdpa's does.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_probe_runs_each_points_attention_kernel() {
    use vramlab::record::Phase;
    let dir = tempfile::tempdir().unwrap();
    let (heads, b, s) = (4u64, 2u64, 512u64);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "tie_word_embeddings": false, "rms_norm_eps": 1e-5, "hidden_act": "silu"
    });
    let rows = probe_emulated(
        dir.path(),
        &config,
        &format!(
            "name = \"attention-axis\"\nruntime = \"torch\"\n[model]\n\
             source = \"synthetic:{{config}}\"\n[sweep]\nmode = [\"infer\"]\n\
             precision = [\"bf16\"]\nbatch = [{b}]\ncontext = [{}]\n\
             attention = [\"sdpa\", \"eager\"]\ndecode_steps = 2\n",
            s + 2
        ),
    );
    let prefill = |attention: vramlab::vocab::Attention| {
        rows.iter()
            .find(|r| r.attention == attention && r.phase == Some(Phase::Prefill))
            .unwrap_or_else(|| panic!("no {attention:?} prefill row: {rows:?}"))
    };
    let (sdpa, eager) = (
        prefill(vramlab::vocab::Attention::Sdpa),
        prefill(vramlab::vocab::Attention::Eager),
    );
    assert!(sdpa.point_id.ends_with("/sdpa"), "{}", sdpa.point_id);
    assert!(!eager.point_id.ends_with("/sdpa"), "{}", eager.point_id);
    let scores = b * heads * s * s * 2;
    let (a, e) = (sdpa.peak_allocated.unwrap(), eager.peak_allocated.unwrap());
    assert!(
        e >= a + scores,
        "eager {e} B, sdpa {a} B, the scores {scores} B"
    );
}

/// A group whose largest inference shape is past the card warms up at the next smaller shape:
/// the large point is an `oom` row, the small one is measured, and the probe itself goes on
/// (the warm-up at the largest shape used to kill the worker, leaving `error` rows).
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_point_past_the_card_is_an_oom_row_and_its_group_goes_on() {
    use vramlab::record::Status;
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "tie_word_embeddings": false, "rms_norm_eps": 1e-5, "hidden_act": "silu"
    });
    // Eager scores at batch 16 × 16,384 tokens: 16 · 4 heads · 16,384² · 4 B = 68.7 GB in f32,
    // beside their 16-bit copy: past an A100-80GB.
    let rows = probe_emulated(
        dir.path(),
        &config,
        "name = \"past-the-card\"\n[model]\nsource = \"synthetic:{config}\"\n[sweep]\n\
         mode = [\"infer\"]\nprecision = [\"bf16\"]\nbatch = [1, 16]\ncontext = [256, 16384]\n\
         decode_steps = 2\n",
    );
    let status = |b: u64, c: u64| {
        let id = format!("/b{b}/c{c}/");
        let mine: Vec<_> = rows.iter().filter(|r| r.point_id.contains(&id)).collect();
        assert!(!mine.is_empty(), "no rows for {id}: {rows:?}");
        assert!(
            mine.iter().all(|r| r.status != Some(Status::Error)),
            "{id}: {mine:?}"
        );
        mine.iter().any(|r| r.status == Some(Status::Oom))
    };
    assert!(status(16, 16384), "batch 16 × 16,384 runs out of memory");
    assert!(!status(1, 256), "batch 1 × 256 is measured");
}

/// An encoder's inference (`mode = "encode"`, what `estimate --mode encode --emulate` asks)
/// runs in the probe: a forward row and its total envelope, the same figures, with the f32
/// weights (torch's parameter count) held before and after and more at the peak.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_probe_encodes_with_a_bert() {
    use vramlab::record::Phase;
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 1024,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 512, "type_vocab_size": 2
    });
    let rows = probe_emulated(
        dir.path(),
        &config,
        "name = \"encode\"\n[model]\nsource = \"synthetic:{config}\"\n[sweep]\n\
         mode = [\"encode\"]\nprecision = [\"f32\"]\nbatch = [4]\ncontext = [128]\n",
    );
    let phase = |p: Phase| rows.iter().find(|r| r.phase == Some(p)).unwrap();
    let (fwd, total, load) = (
        phase(Phase::Forward),
        phase(Phase::Total),
        phase(Phase::Load),
    );
    assert_eq!(
        fwd.point_id,
        "config/encode/f32/b4/c128".replace("config", &fwd.model_id)
    );
    assert_eq!(fwd.peak_allocated, total.peak_allocated);
    assert_eq!(fwd.end_allocated, fwd.baseline_allocated);
    assert!(fwd.peak_allocated.unwrap() > fwd.baseline_allocated.unwrap());
    // Every parameter torch built (param_count), in f32, is held from the load on.
    let weights = load.param_count * 4;
    assert!(
        load.end_allocated.unwrap() >= weights && fwd.baseline_allocated.unwrap() >= weights,
        "{load:?}: {weights} B of f32 parameters"
    );
}

/// `estimate --emulate --gpus N` runs FSDP full shard only: another sharding, or a LoRA or
/// inference query, is one line and exit 2 before any Python starts.
#[test]
fn estimate_emulate_gpus_refuses_what_it_cannot_shard() {
    for (extra, needle) in [
        (&["--sharding", "ddp"][..], "not --sharding ddp"),
        (
            &["--sharding", "fsdp", "--trainable", "lora-r8"][..],
            "full and frozen-embeddings",
        ),
    ] {
        let out = Command::cargo_bin("vramlab")
            .unwrap()
            .args([
                "estimate",
                "--model",
                "smollm2-135m",
                "--mode",
                "train",
                "--batch",
                "1",
            ])
            .args(["--context", "256", "--precision", "bf16", "--gpus", "2"])
            .args(extra)
            .args(["--emulate", "a100-80gb", "--python", "/no/such/python"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}
