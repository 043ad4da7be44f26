//! `--device cuda:0` or `emu:GPU` on a build without the `cuda` feature: one line, exit code 2,
//! no panic.
//! (The CUDA build's "no CUDA device" line is checked by scripts/cuda-build-check.sh, which
//! runs that build on the link stubs.)
#![cfg(not(feature = "cuda"))]
mod common;
use common::{root, vramlab};
use predicates::prelude::*;

fn assert_one_line_without_cuda(args: &[&str], scenario: &std::path::Path) {
    assert_one_line_naming(args, scenario, "cuda:0");
}

fn assert_one_line_naming(args: &[&str], scenario: &std::path::Path, device: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = vramlab()
        .arg("sweep")
        .arg(scenario)
        .args(args)
        .arg("--out")
        .arg(dir.path().join("o.csv"))
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("built without CUDA support"))
        .stderr(predicate::str::contains(device))
        .stderr(predicate::str::contains("panicked").not());
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !dir.path().join("o.csv").exists(),
        "no CSV for a device that cannot open"
    );
}

/// A scenario on synthetic shapes: needs no downloaded weights.
fn synthetic_scenario(dir: &std::path::Path, device: &str) -> std::path::PathBuf {
    let cfg = root().join("harness/presets/smollm2-135m/config.json");
    let p = dir.join("cuda.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"cuda\"\ndevice = \"{device}\"\n[model]\nsource = \"synthetic:{}\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"bf16\"]\nbatch = [1]\ncontext = [64]\n",
            cfg.display()
        ),
    )
    .unwrap();
    p
}

#[test]
fn device_flag_cuda_without_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic_scenario(dir.path(), "cpu");
    assert_one_line_without_cuda(&["--device", "cuda:0"], &s);
}

#[test]
fn scenario_device_cuda_without_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic_scenario(dir.path(), "cuda:0");
    assert_one_line_without_cuda(&[], &s);
}

/// The emulated GPU runs vramlab's CUDA build: a CPU build says so before anything runs.
#[test]
fn emulated_device_without_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic_scenario(dir.path(), "emu:h100-80gb");
    assert_one_line_naming(&[], &s, "emu:h100-80gb");
    let s = synthetic_scenario(dir.path(), "cpu");
    assert_one_line_naming(&["--device", "emu:rtx-4090"], &s, "emu:rtx-4090");
}
