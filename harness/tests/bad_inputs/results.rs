//! Bad CSVs, constants and estimate flags: one line, exit 2.
use super::*;

#[test]
fn csv_wrong_schema_version() {
    fit(
        "csv-wrong-schema-version.csv",
        &format!(
            "row 2: schema_version `9` is not one of the supported 1..={}",
            vramlab::record::SCHEMA_VERSION
        ),
    );
}

#[test]
fn csv_non_numeric_byte_column() {
    fit(
        "csv-non-numeric-bytes.csv",
        "row 2: column `peak_allocated` = `12abc`: invalid digit found in string",
    );
}

#[test]
fn csv_negative_byte_column() {
    fit(
        "csv-negative-bytes.csv",
        "row 2: column `end_allocated` = `-5`: invalid digit",
    );
}

#[test]
fn csv_not_a_vramlab_csv() {
    fit("csv-not-vramlab.csv", "not a vramlab CSV");
}

#[test]
fn constants_for_another_architecture() {
    estimate(
        "constants-gpt2.toml",
        "constants fitted for gpt2 cannot estimate a llama model",
    );
}

#[test]
fn constants_malformed() {
    estimate(
        "constants-malformed.toml",
        "not a vramlab constants file: line 4:",
    );
}

#[test]
fn constants_wrong_type() {
    estimate(
        "constants-wrong-type.toml",
        "not a vramlab constants file: line 18: invalid type: string \"eight\"",
    );
}

#[test]
fn capacity_that_does_not_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = os(&[
        "sweep",
        "scenarios/smoke.toml",
        "--capacity",
        "2XB",
        "--out",
    ]);
    args.push(tmp.path().join("o.csv").into());
    let out = vramlab().args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: --capacity"), "{err}");
    assert!(err.contains("2XB"), "{err}");
}

#[test]
fn out_that_is_not_csv() {
    let _ = root();
    fails(
        &os(&["sweep", "scenarios/smoke.toml", "--out", "results/x.txt"]),
        "results/x.txt",
        "must end in .csv",
    );
}

#[test]
fn name_that_is_a_path() {
    scenario("name-is-a-path.toml", "`name` must be a plain file name");
}

#[test]
fn csv_missing_column() {
    fit("csv-missing-column.csv", "row 2: missing field `message`");
}

#[test]
fn empty_source_list() {
    scenario(
        "empty-source-list.toml",
        "[model] `source` is an empty list",
    );
}

/// A GGUF tensor of a type candle cannot read (IQ4_NL, id 20, patched into a copy of the real
/// file's tensor table): the message names the tensor and the type.
#[test]
fn gguf_unsupported_tensor_type() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("iq.gguf");
    let mut bytes = std::fs::read(smollm2_gguf()).unwrap();
    let name = b"blk.3.ffn_down.weight";
    let mut entry = (name.len() as u64).to_le_bytes().to_vec();
    entry.extend_from_slice(name);
    let at = bytes
        .windows(entry.len())
        .rposition(|w| w == entry.as_slice())
        .expect("the tensor's entry");
    // name, n_dims (u32), 2 dims (u64), then the type id (u32).
    let ty = at + entry.len() + 4 + 16;
    assert_eq!(
        bytes[ty..ty + 4],
        3u32.to_le_bytes(),
        "Q4_1 in the real file"
    );
    bytes[ty..ty + 4].copy_from_slice(&20u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    decode(
        &format!("gguf:{}", show(&p)),
        &show(&p),
        "tensor `blk.3.ffn_down.weight` has GGML type 20 (IQ4_NL), which candle 0.11 cannot load",
    );
}

/// SmolLM2's rows of 576 weights are not whole Q4_K blocks (256): the re-quantization fails
/// on the first such tensor, by name, before anything is measured.
#[test]
fn requantize_to_a_block_that_does_not_divide_the_rows() {
    smollm2_gguf();
    let (_tmp, s) = inline_scenario(
        "name = \"q4k\"\n[model]\nsource = \"gguf:${VRAMLAB_MODELS}/SmolLM2-135M-Instruct.Q4_1.gguf\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"q4k\"]\nbatch = [1]\ncontext = [16]\ndecode_steps = 2\n",
    );
    sweep_names(
        &show(&s),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "cannot re-quantize tensor `token_embd.weight` (shape [49152, 576]) to Q4_K: its rows of 576 weights are not a multiple of the 256-weight block",
    );
}

/// Quantized precisions run inference on GGUF sources only.
#[test]
fn quantized_precision_for_training_or_safetensors() {
    let (_t, s) = inline_scenario(
        "name = \"qt\"\n[model]\nsource = \"gguf:/m/M.gguf\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"native\"]\nbatch = [1]\ncontext = [16]\n",
    );
    sweep(
        &show(&s),
        "precision `native` keeps GGUF weights quantized, which runs inference only",
    );
    let (_t, s) = inline_scenario(
        "name = \"qt\"\n[model]\nsource = \"hf:/m/M\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"q8_0\"]\nbatch = [1]\ncontext = [16]\ndecode_steps = 2\n",
    );
    sweep(&show(&s), "precision `q8_0` needs a `gguf:` source");
    // QLoRA: candle's QMatMul has no backward, so LoRA on a quantized base is refused, saying
    // why and where the estimate is.
    let (_t, s) = inline_scenario(
        "name = \"qt\"\n[model]\nsource = \"gguf:/m/M.gguf\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"q4k\"]\ntrainable = [\"lora-r16\"]\nbatch = [1]\ncontext = [16]\n",
    );
    sweep(
        &show(&s),
        "trainable `lora-r16` on precision `q4k` is QLoRA, which cannot run: candle 0.11.1's QMatMul records no backward",
    );
}

/// `--offload` is FSDP's CPU offload: anything but training sharded over 2 or more GPUs is one
/// line, exit 2.
#[test]
fn offload_without_fsdp_over_several_gpus() {
    let base = ["estimate", "--model", "smollm2-135m", "--offload"];
    for extra in [
        &["--mode", "train", "--gpus", "2"][..],
        &["--mode", "train", "--sharding", "fsdp"][..],
        &["--gpus", "2", "--sharding", "fsdp"][..],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        fails(
            &os(&args),
            "--offload",
            "--sharding fsdp (or zero3) and --gpus 2 or more",
        );
    }
}

/// `vramlab validate --against-emulator FILE`: a queries file is checked whole, before any
/// query runs (so no torch environment is needed to get these).
#[test]
fn queries_files() {
    for (name, needle) in [
        ("queries-no-gpu.toml", "query 1: no --gpu"),
        (
            "queries-bad-arg.toml",
            "query 1: invalid value 'four' for '--batch <BATCH>'",
        ),
        ("queries-unknown-key.toml", "unknown field `models`"),
    ] {
        let file = format!("{DIR}/{name}");
        fails(
            &os(&["validate", "--against-emulator", &file]),
            &file,
            needle,
        );
    }
}
