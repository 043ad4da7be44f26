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
