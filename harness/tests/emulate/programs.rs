//! `vramlab emulate`: PyTorch programs on the emulated GPU, their peaks and their failures.
use super::*;

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn allocator_segment_rules() {
    let sizes: [u64; 3] = [1000, 5 << 20, 30 << 20];
    let args: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = emulate(&["--gpu", "h100-80gb"], &data("segments.py"), &args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let load = &r.json["phases"][0];
    assert_eq!(load["name"], "load");
    let allocated: u64 = sizes.iter().map(|s| s.div_ceil(512) * 512).sum();
    let reserved: u64 = sizes.iter().map(|&s| segment(s)).sum();
    assert_eq!(u(&load["end_allocated"]), allocated);
    assert_eq!(u(&load["max_memory_reserved"]), reserved);
    // Nothing but the caching allocator called cudaMalloc: NVML's "used" is reserved plus
    // the context.
    assert_eq!(
        u(&load["nvml_used"]),
        reserved + u(&r.json["gpu"]["context_bytes"])
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn fits_exit_0_and_out_of_memory_exit_1_with_pytorchs_message_and_an_oom_row() {
    let gib: u64 = 1 << 30;
    let fits = emulate(
        &["--gpu", "l4", "--gpu-memory", "4GiB"],
        &data("alloc.py"),
        &[&gib.to_string()],
    );
    assert_eq!(fits.code, 0, "{}", fits.stderr);
    assert_eq!(fits.json["fits"], true);
    assert_eq!(u(&fits.json["gpu"]["total_bytes"]), 4 * gib);
    assert_eq!(u(&fits.json["run"]["max_memory_allocated"]), gib);

    // 5 GiB on a 4 GiB device: PyTorch frees its cache, retries, then raises its own error.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("oom.csv");
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .args(["emulate", "--gpu", "l4", "--gpu-memory", "4GiB", "--out"])
        .arg(&csv)
        .args(["--model-id", "alloc", "--precision", "f32", "--"])
        .arg(torch_python())
        .arg(data("alloc.py"))
        .arg((5 * gib).to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CUDA out of memory. Tried to allocate 5.00 GiB"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("fits on NVIDIA L4 (emulated): no"),
        "{stdout}"
    );
    let rows = vramlab::export::csv::read(&csv).unwrap();
    let last = rows.last().unwrap();
    assert_eq!(last.status, Some(vramlab::record::Status::Oom));
    assert!(last.message.contains("out of memory"), "{}", last.message);
    assert!(rows.iter().all(|r| r.device_name == "NVIDIA L4 (emulated)"));
    assert!(rows
        .iter()
        .all(|r| r.meter == vramlab::vocab::MeterKind::TorchEmulated));
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn bert_step_exact_terms_weights_gradients_adamw_state() {
    let r = emulate(&["--gpu", "a100-40gb"], &data("bert_step.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let e = r.expect.expect("EXPECT line");
    let (state, params, inputs) = (u(&e["state"]), u(&e["params"]), u(&e["inputs"]));
    let phases = r.json["phases"].as_array().unwrap();
    let get = |name: &str, step: u64| {
        phases
            .iter()
            .find(|p| p["name"] == name && p["step"] == step)
            .unwrap_or_else(|| panic!("no {name} of step {step}"))
    };
    // Weights and buffers, to the byte.
    assert_eq!(u(&get("load", 1)["end_allocated"]), state);
    // After the first backward: the gradients (one per parameter) and the input ids.
    assert_eq!(
        u(&get("backward", 1)["end_allocated"]),
        state + params + inputs
    );
    // The first AdamW step creates exp_avg and exp_avg_sq (foreach keeps `step` on the host).
    assert_eq!(
        u(&get("optimizer", 1)["end_allocated"]) - u(&get("backward", 1)["end_allocated"]),
        2 * params
    );
    // Steps 2 and 3 hold what step 1 did.
    for s in [2, 3] {
        assert_eq!(
            get("optimizer", s)["end_allocated"],
            get("optimizer", 1)["end_allocated"]
        );
    }
    assert_eq!(r.json["steps"].as_array().unwrap().len(), 3);
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn mistral_shaped_full_finetune_runs_three_steps() {
    let r = emulate(&["--gpu", "h100-80gb"], &data("mistral_full.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let steps = r.json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    // Full fine-tune with AdamW: after step 1, at least weights + gradients + m + v stay.
    assert!(u(&steps[1]["max_memory_allocated"]) >= u(&steps[0]["end_allocated"]));
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn lora_with_checkpointing_under_fp16_autocast() {
    let r = emulate(&["--gpu", "rtx-4090"], &data("lora_ckpt_fp16.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["steps"].as_array().unwrap().len(), 3);
    // r = 8 on q_proj (128 → 128) and v_proj (128 → 2 kv heads × 32 = 64), two layers:
    // A is r × in, B is out × r.
    let (r_, h, kv) = (8u64, 128u64, 64u64);
    let per_layer = (r_ * h + h * r_) + (r_ * h + kv * r_);
    assert_eq!(u(&r.expect.unwrap()["trainable"]), 2 * per_layer);
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn sd_shaped_unet_step_with_convolutions() {
    let r = emulate(&["--gpu", "l40s"], &data("unet_step.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["steps"].as_array().unwrap().len(), 3);
    let notes = r.json["notes"].to_string();
    assert!(notes.contains("cuDNN is off"), "{notes}");
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn no_weights_builds_from_config_json() {
    let (load, want) = no_weights_load(false);
    assert_eq!(u(&load["end_allocated"]), want, "{load}");
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn no_weights_allocates_a_tied_embedding_once() {
    // As from_pretrained on a GPU: the tied head is never a second tensor, not even for a
    // moment, so the load's peak is its end and the cache holds no freed copy.
    let (load, want) = no_weights_load(true);
    assert_eq!(u(&load["end_allocated"]), want, "{load}");
    assert_eq!(u(&load["max_memory_allocated"]), want, "{load}");
}

#[test]
fn bad_inputs_are_one_line_and_exit_2() {
    let one_line = |(code, err): (i32, String), want: &str| {
        assert_eq!(code, 2, "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "want `{want}` in {err}");
    };
    one_line(
        vramlab_emulate(&["--gpu", "tpu-v5", "--", "python3", "x.py"]),
        "unknown GPU `tpu-v5`",
    );
    one_line(
        vramlab_emulate(&["--gpu", "l4", "--", "no-such-program-vramlab"]),
        "no-such-program-vramlab: no such program",
    );
    one_line(
        vramlab_emulate(&["--gpu", "l4", "--", "python3", "/nonexistent/train.py"]),
        "/nonexistent/train.py: no such script",
    );
    // A Python without torch: the stubs cannot be built for it.
    let bare: PathBuf = std::env::temp_dir().join("vramlab-emulate-no-torch.py");
    std::fs::write(&bare, "print('hi')\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    let py = venv.join("bin/python");
    one_line(
        vramlab_emulate(&[
            "--gpu",
            "l4",
            "--",
            py.to_str().unwrap(),
            bare.to_str().unwrap(),
        ]),
        "no module named 'torch'",
    );
    // `estimate --emulate --stack NAME` with the stack not installed names the installer.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .args(["estimate", "--model", "smollm2-135m", "--runtime", "torch"])
        .args(["--emulate", "a100-40gb", "--stack", "torch-2.2"])
        .env("VRAMLAB_TORCH_CACHE", empty.path())
        .output()
        .unwrap();
    one_line(
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        "`scripts/torch-env.sh --stack torch-2.2` installs it",
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_readmes_emulate_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("vramlab emulate "))
        .expect("an emulate example in README.md");
    let words: Vec<&str> = line.split_whitespace().collect();
    let sep = words.iter().position(|w| *w == "--").unwrap();
    assert_eq!(words[sep + 1], "python", "{line}");
    let stdout = ok_stdout(
        Command::cargo_bin("vramlab")
            .unwrap()
            .current_dir(&root)
            .args(&words[1..=sep])
            .arg(torch_python())
            .args(&words[sep + 2..]),
    );
    // What the README says it prints.
    assert!(
        stdout.contains("fits on NVIDIA GeForce RTX 4090 (emulated): yes"),
        "{stdout}"
    );
    for phase in ["load", "forward", "backward", "optimizer", "total"] {
        assert!(stdout.lines().any(|l| l.starts_with(phase)), "{stdout}");
    }
}

#[test]
fn fit_refuses_emulated_rows_beside_measured_ones_and_labels_emulated_constants() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let emu = root.join("results/emulated/h100-80gb-cpu-train-smollm2.csv");
    let cpu = root.join("results/cpu-torch/cpu-train-smollm2-foreach.csv");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.toml");
    let mixed = Command::cargo_bin("vramlab")
        .unwrap()
        .arg("fit")
        .arg("--out")
        .arg(&out)
        .arg(&cpu)
        .arg(&emu)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&mixed.stderr);
    assert_eq!(mixed.status.code(), Some(2), "{err}");
    assert!(err.contains("mix emulated rows"), "{err}");
    assert!(!out.exists());
    Command::cargo_bin("vramlab")
        .unwrap()
        .arg("fit")
        .arg("--out")
        .arg(&out)
        .arg(&emu)
        .assert()
        .success();
    let constants = std::fs::read_to_string(&out).unwrap();
    assert!(
        constants.contains("device = \"NVIDIA H100 80GB HBM3 (emulated)\""),
        "{constants}"
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_programs_own_peaks_survive_vramlabs_step_boundaries() {
    let r = emulate(&["--gpu", "h100-80gb"], &data("program_peaks.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let e = r.expect.expect("EXPECT line");
    // torch's foreach AdamW: exp_avg_sq's square root, one tensor per parameter.
    assert_eq!(u(&e["transient"]), u(&e["param_bytes"]));
    // vramlab's own step rows see it too.
    let steps = r.json["steps"].as_array().unwrap();
    assert_eq!(
        u(&steps[1]["max_memory_allocated"]) - u(&steps[1]["end_allocated"]),
        u(&e["param_bytes"])
    );
}
