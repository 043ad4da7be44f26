//! Bad input: one line naming the file (and line and key), exit code 2, no panic.
mod common;
use common::vramlab;
use predicates::prelude::*;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const GOOD: &str = "name = \"x\"\n[model]\nsource = \"gguf:${VRAMLAB_MODELS}/SmolLM2-135M-Instruct.Q4_1.gguf\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [64]\n";

fn fails_with(text: &str, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "bad.toml", text);
    let out = vramlab()
        .args(["sweep", "--out"])
        .arg(dir.path().join("o.csv"))
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(needle))
        .stderr(predicate::str::contains("bad.toml"))
        .stderr(predicate::str::contains("panicked").not());
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn unknown_key_names_line_and_key() {
    fails_with(
        &GOOD.replace("batch = [1]", "batch = [1]\nbatchsize = 3"),
        "line 8: unknown field `batchsize`",
    );
}

#[test]
fn malformed_toml() {
    fails_with(&GOOD.replace("[sweep]", "[sweep"), "line 4");
}

#[test]
fn wrong_type() {
    fails_with(
        &GOOD.replace("batch = [1]", "batch = \"1\""),
        "line 7: invalid type",
    );
}

#[test]
fn zero_batch() {
    fails_with(
        &GOOD.replace("batch = [1]", "batch = [0]"),
        "`batch` must be positive, got 0",
    );
}

#[test]
fn missing_model_path() {
    fails_with(
        &GOOD.replace("SmolLM2-135M", "NoSuchModel"),
        "does not exist",
    );
}

#[test]
fn context_beyond_max_positions() {
    common::smollm2_gguf();
    fails_with(
        &GOOD.replace("[64]", "[9000]"),
        "context 9000 exceeds max_position_embeddings 8192",
    );
}

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
