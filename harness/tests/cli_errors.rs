//! CLI surface checks. The bad-input cases that used to live here (unknown key, malformed TOML,
//! wrong type, zero batch, missing model, context beyond max positions) are in the corpus:
//! `bad_inputs.rs` and `bad-inputs/`.
mod common;
use common::vramlab;
use predicates::prelude::*;

#[test]
fn sweep_help_explains_options() {
    vramlab()
        .args(["sweep", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("--out"))
        .stdout(predicate::str::contains("--device"))
        .stdout(predicate::str::contains("--dry-run"));
}

#[test]
fn dry_run_lists_point_ids() {
    vramlab()
        .args(["sweep", "--dry-run", "scenarios/smoke.toml"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "SmolLM2-135M-Instruct.Q4_1/infer/f32/b1/c64/preallocated/r0\n",
        ));
}

#[test]
fn sweep_rejects_a_truncated_weights_file_before_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let src = common::models().join("all-minilm-l6-v2");
    std::fs::copy(src.join("config.json"), m.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(m.join("model.safetensors"), &bytes[..5_000_000]).unwrap();
    let sc = dir.path().join("s.toml");
    std::fs::write(
        &sc,
        format!(
            "name = \"t\"\n[model]\nsource = \"hf:{}\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [16]\n",
            m.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("o.csv");
    let res = common::vramlab()
        .args(["sweep", "--out"])
        .arg(&out)
        .arg(&sc)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "model.safetensors: truncated safetensors file",
        ));
    let err = String::from_utf8_lossy(&res.get_output().stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !out.exists(),
        "nothing is written before the inputs are checked"
    );
}
