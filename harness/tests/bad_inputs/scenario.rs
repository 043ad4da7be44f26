//! Bad scenarios: one line naming the file and the problem, exit 2.
use super::*;

#[test]
fn unknown_key() {
    scenario("unknown-key.toml", "line 8: unknown field `batchsize`");
}

#[test]
fn wrong_type() {
    scenario(
        "wrong-type.toml",
        "line 7: invalid type: string \"1\", expected a sequence",
    );
}

#[test]
fn empty_grid() {
    scenario(
        "empty-grid.toml",
        "line 7: [sweep] `batch` is an empty list",
    );
}

/// Inverted: a point whose prompt and decode steps do not fit in its context.
#[test]
fn inverted_grid() {
    scenario(
        "inverted-grid.toml",
        "line 9: [sweep] context 64 cannot hold prompt_len 60 + decode_steps 16",
    );
}

#[test]
fn missing_model_path() {
    scenario("missing-model.toml", "NoSuchModel.gguf` does not exist");
}

#[test]
fn context_beyond_max_positions() {
    smollm2_gguf();
    scenario(
        "context-too-long.toml",
        "context 9000 exceeds max_position_embeddings 8192",
    );
}

#[test]
fn negative_batch() {
    scenario(
        "negative-batch.toml",
        "line 7: [sweep] `batch` must be positive, got -1",
    );
}

#[test]
fn zero_batch() {
    scenario(
        "zero-batch.toml",
        "line 7: [sweep] `batch` must be positive, got 0",
    );
}

#[test]
fn huge_batch() {
    scenario(
        "huge-batch.toml",
        "line 7: [sweep] `batch` = 4000000000 is too large",
    );
}

#[test]
fn zero_repeats() {
    scenario(
        "zero-repeats.toml",
        "line 9: [sweep] `repeats` must be at least 1",
    );
}

#[test]
fn unknown_precision() {
    scenario("unknown-precision.toml", "line 6: unknown variant `f8`");
}

#[test]
fn lora_rank_zero() {
    scenario(
        "lora-rank-zero.toml",
        "line 9: LoRA rank in `lora-r0` must be an integer from 1 to 4096",
    );
}

#[test]
fn unknown_trainable_set() {
    scenario(
        "unknown-trainable.toml",
        "line 9: unknown trainable set `lora`, expected `full`, `frozen-embeddings`, `lora-rN` or `qlora-rN`",
    );
}

/// QLoRA and bitsandbytes' optimizers are estimated, not swept.
#[test]
fn estimate_only_training_choices() {
    scenario(
        "qlora-sweep.toml",
        "[sweep] trainable `qlora-r16` (QLoRA on a bitsandbytes NF4 base) is estimate-only for now",
    );
    scenario(
        "optimizer-8bit.toml",
        "[sweep] optimizer `adamw-8bit` (bitsandbytes) is estimate-only for now",
    );
}

/// A `quantization_config` of a method vramlab does not know: one line naming the file and it.
#[test]
fn unknown_quant_method() {
    let file = format!("{DIR}/config-quant-unknown.json");
    fails(
        &os(&["estimate", "--model", &file]),
        &file,
        "quant_method `hqq` is not a format vramlab knows",
    );
}

#[test]
fn duplicate_key() {
    scenario("duplicate-key.toml", "line 8: duplicate key `batch`");
}

#[test]
fn missing_required_key() {
    scenario("missing-context.toml", "missing field `context`");
}

/// Generation scenarios: resolution, tile, model, attention, cfg, frames.
#[test]
fn generation_scenarios() {
    scenario(
        "gen-resolution-not-8.toml",
        "line 8: [sweep] resolution `512x500` is not a multiple of 8",
    );
    scenario(
        "gen-tile-too-large.toml",
        "line 10: [sweep] tile 512 is larger than the image 256x256",
    );
    scenario("gen-unknown-model.toml", "unknown generation model `sd99`");
    scenario(
        "gen-flash.toml",
        "line 9: [sweep] attention `flash` is not available",
    );
    scenario("gen-cfg-not-bool.toml", "line 9");
    // Fine-tuning (mode = "train") runs Wan2.1's DiT and SD 1.x/2.x's UNet: SDXL's and FLUX's
    // denoisers have no trainable module here.
    for (file, src) in [
        ("gen-train.toml", "synthetic:sdxl"),
        ("gen-train-flux.toml", "synthetic:flux-dev"),
    ] {
        scenario(
            file,
            &format!("line 6: [sweep] mode `train` on the diffusion pipeline `{src}`: its denoiser has no trainable module here"),
        );
    }
    scenario(
        "gen-train-sd-layer.toml",
        "line 11: [sweep] checkpointing `layer` on Stable Diffusion",
    );
    scenario(
        "gen-train-wan-frames.toml",
        "line 9: [sweep] frames 6 is not 4k + 1",
    );
    scenario(
        "gen-train-wan-full.toml",
        "line 11: [sweep] trainable `full`: a denoiser is fine-tuned with LoRA only",
    );
    scenario(
        "gen-wan-frames-not-4k1.toml",
        "line 9: [sweep] frames = 6: wan2.1-t2v-1.3b decodes 4k+1 frames",
    );
    scenario(
        "gen-frames-image.toml",
        "line 9: [sweep] frames = 5: sd15 is an image model",
    );
}

/// `stack` is an axis of PyTorch's stacks: vramlab's candle sweep refuses it, and an unknown
/// stack is a parse error on its line.
#[test]
fn stack_axis() {
    scenario("stack-axis.toml", "set runtime = \"torch\"");
    scenario("stack-unknown.toml", "line 3: unknown variant `torch-1.0`");
}

/// `runtime` against `device`: candle on an emulated GPU needs the CUDA build, torch needs a
/// GPU (emulated or real), and the emulated one must be catalogued.
#[test]
fn runtime_and_device() {
    scenario("runtime-emu-candle.toml", "built without CUDA support");
    scenario("runtime-torch-cpu.toml", "scripts/torch-cpu.sh");
    scenario("runtime-torch-emu-unknown.toml", "no-such-gpu");
}

/// The torch-1.10 stack runs the published programs only: a sweep or an estimate under it is
/// one line, exit 2, before any Python starts.
#[test]
fn stack_without_the_probe() {
    let needle = "stack `torch-1.10` runs the published programs only";
    scenario("runtime-torch-stack-1.10.toml", needle);
    fails(
        &os(&[
            "estimate",
            "--model",
            "smollm2-135m",
            "--stack",
            "torch-1.10",
        ]),
        "--stack",
        needle,
    );
}

/// What the torch probe cannot run is refused by its `--check` before any worker starts. The
/// check imports no torch, so any Python 3.9+ runs it.
#[test]
fn runtime_torch_refuses_what_the_probe_cannot_run() {
    let tmp = tempfile::tempdir().unwrap();
    let file = format!("{DIR}/runtime-torch-fused.toml");
    let out = vramlab()
        .env("VRAMLAB_TORCH_PYTHON", "python3")
        .args(["sweep", "--out"])
        .arg(tmp.path().join("o.csv"))
        .arg(&file)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&file) && err.contains("cannot run `kernels"),
        "{err}"
    );
    assert!(
        !tmp.path().join("o.csv").exists(),
        "nothing written before the check"
    );
}

#[test]
fn no_sweep_table() {
    scenario("no-sweep.toml", "missing field `sweep`");
}

#[test]
fn unknown_source_kind() {
    scenario(
        "unknown-source-kind.toml",
        "unknown model source kind `zip`",
    );
}

#[test]
fn mixed_precision_for_inference() {
    scenario(
        "mixed-precision-inference.toml",
        "line 6: [sweep] precision `mixed-bf16` is a training policy",
    );
}

#[test]
fn scenario_file_missing() {
    sweep(
        &format!("{DIR}/no-such-scenario.toml"),
        "cannot read scenario",
    );
}

#[test]
fn scenario_not_utf8() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("latin1.toml");
    std::fs::write(&p, b"name = \"caf\xe9\"\n").unwrap();
    sweep(&show(&p), "valid UTF-8");
}

#[test]
fn malformed_toml() {
    scenario("malformed.toml", "line 4: invalid table header");
}
