//! The bad-input corpus (`tests/bad-inputs/`, README there): every case runs the real binary
//! and must exit 2 with exactly one line on stderr that names the file and says what is wrong
//! (with the line and key where there is one), and must not panic.
mod common;
use common::{models, root, smollm2_gguf, vramlab};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

const DIR: &str = "harness/tests/bad-inputs";

/// Runs `vramlab args...` and checks the one-line error: exit 2, names `names`, says `needle`.
fn fails(args: &[OsString], names: &str, needle: &str) {
    let out = vramlab().args(args).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "args {args:?}\nstderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got:\n{err}");
    let line = lines[0];
    assert!(line.starts_with("error: "), "{line}");
    assert!(line.contains(names), "does not name `{names}`: {line}");
    assert!(line.contains(needle), "expected `{needle}` in: {line}");
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `vramlab sweep --out TMP/o.csv FILE`, FILE relative to the repo root (as the message shows it).
fn sweep(file: &str, needle: &str) {
    sweep_names(file, file, needle);
}

/// As [`sweep`], where the message names `names` (a file the scenario points at).
fn sweep_names(file: &str, names: &str, needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = os(&["sweep", "--out"]);
    args.push(tmp.path().join("o.csv").into());
    args.push(file.into());
    fails(&args, names, needle);
}

fn scenario(name: &str, needle: &str) {
    sweep(&format!("{DIR}/{name}"), needle);
}

/// `vramlab decode --model SOURCE`: loads the weights (the weight checks run before any row).
fn decode(source: &str, names: &str, needle: &str) {
    fails(
        &os(&[
            "decode",
            "--model",
            source,
            "--prompt-ids",
            "1",
            "--steps",
            "1",
        ]),
        names,
        needle,
    );
}

fn minilm() -> PathBuf {
    let d = models().join("all-minilm-l6-v2");
    assert!(
        d.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-test-models.sh first",
        d.display()
    );
    d
}

/// An HF directory in a temp dir: MiniLM's config.json (edited by `config`) and `weights`.
fn hf_dir(config: impl Fn(String) -> String, weights: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("m");
    std::fs::create_dir(&d).unwrap();
    let cfg = std::fs::read_to_string(minilm().join("config.json")).unwrap();
    std::fs::write(d.join("config.json"), config(cfg)).unwrap();
    std::fs::write(d.join("model.safetensors"), weights).unwrap();
    (tmp, d)
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

// ---- scenarios ----

#[test]
fn malformed_toml() {
    scenario("malformed.toml", "line 4: invalid table header");
}

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
/// check imports no torch, so any Python 3.11+ runs it.
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

// ---- model configs (through `synthetic:` sources) ----

#[test]
fn config_missing_num_hidden_layers() {
    sweep_names(
        &format!("{DIR}/config-missing-layers.toml"),
        &format!("{DIR}/config-missing-layers.json"),
        "missing config key `num_hidden_layers`",
    );
}

#[test]
fn config_unknown_architecture() {
    sweep_names(
        &format!("{DIR}/config-unknown-arch.toml"),
        &format!("{DIR}/config-unknown-arch.json"),
        "unknown architecture `model_type = \"mamba\"`",
    );
}

#[test]
fn config_not_json() {
    sweep_names(
        &format!("{DIR}/config-not-json.toml"),
        &format!("{DIR}/config-not-json.json"),
        "not valid JSON: trailing comma at line 5",
    );
}

#[test]
fn config_implausible_size() {
    sweep_names(
        &format!("{DIR}/config-huge-layers.toml"),
        &format!("{DIR}/config-huge-layers.json"),
        "num_hidden_layers = 1000000000000 is implausibly large",
    );
}

#[test]
fn config_heads_not_a_multiple_of_kv_heads() {
    sweep_names(
        &format!("{DIR}/config-heads-not-multiple.toml"),
        &format!("{DIR}/config-heads-not-multiple.json"),
        "num_attention_heads (4) is not a multiple of num_key_value_heads (3)",
    );
}

// ---- safetensors ----

#[test]
fn truncated_safetensors() {
    let bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    let (_tmp, d) = hf_dir(|c| c, &bytes[..bytes.len() / 3]);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "truncated safetensors file: its tensors need",
    );
}

#[test]
fn safetensors_shorter_than_its_header_length() {
    let (_tmp, d) = hf_dir(|c| c, &[1, 2, 3]);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "shorter than its 8-byte header length",
    );
}

#[test]
fn corrupt_safetensors_header_length() {
    let mut bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    bytes.truncate(1 << 16);
    bytes[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let (_tmp, d) = hf_dir(|c| c, &bytes);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "corrupt safetensors header length 4611686018427387904 for a file of 65536 bytes",
    );
}

#[test]
fn corrupt_safetensors_header_json() {
    let mut bytes = 16u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"a\": not json }");
    let (_tmp, d) = hf_dir(|c| c, &bytes);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "safetensors header is not valid JSON",
    );
}

#[test]
fn tensor_shapes_do_not_match_the_config() {
    let bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    let (_tmp, d) = hf_dir(
        |c| c.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1000"),
        &bytes,
    );
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "tensor `encoder.layer.0.intermediate.dense.weight` has shape [1536, 384], config.json expects [1000, 384]",
    );
}

#[test]
fn sharded_index_names_a_missing_shard() {
    let d = format!("{DIR}/sharded-missing-shard");
    decode(
        &format!("hf:{d}"),
        &format!("{d}/model.safetensors.index.json"),
        "shard `model-00001-of-00002.safetensors` named by weight_map does not exist",
    );
}

// ---- GGUF ----

#[test]
fn truncated_gguf_header() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t.gguf");
    let bytes = std::fs::read(smollm2_gguf()).unwrap();
    std::fs::write(&p, &bytes[..300_000]).unwrap();
    fails(
        &os(&["estimate", "--model", &show(&p)]),
        &show(&p),
        "not a valid GGUF file: gguf: array of 49152 elements needs",
    );
}

#[test]
fn truncated_gguf_data() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t.gguf");
    let bytes = std::fs::read(smollm2_gguf()).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    decode(
        &format!("gguf:{}", show(&p)),
        &show(&p),
        "truncated GGUF file: tensor `",
    );
}

#[test]
fn not_a_gguf_file() {
    sweep_names(
        &format!("{DIR}/not-gguf.toml"),
        &format!("{DIR}/not-gguf.gguf"),
        "not a valid GGUF file",
    );
}

/// A minimal GGUF v3 header with no tensors and these metadata entries.
fn gguf_bytes(kvs: &[(&str, GgufValue)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    for (k, v) in kvs {
        string(&mut b, k);
        match v {
            GgufValue::U32(x) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            GgufValue::Str(s) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                string(&mut b, s);
            }
        }
    }
    b
}

enum GgufValue {
    U32(u32),
    Str(&'static str),
}

fn gguf_case(kvs: &[(&str, GgufValue)], needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("h.gguf");
    std::fs::write(&p, gguf_bytes(kvs)).unwrap();
    fails(&os(&["estimate", "--model", &show(&p)]), &show(&p), needle);
}

/// candle 0.11.1 divides by `general.alignment`: 0 used to panic.
#[test]
fn gguf_alignment_zero() {
    gguf_case(
        &[("general.alignment", GgufValue::U32(0))],
        "metadata `general.alignment` is 0",
    );
}

/// A head count of 0 used to panic (hidden / heads).
#[test]
fn gguf_zero_heads() {
    use GgufValue::*;
    gguf_case(
        &[
            ("general.architecture", Str("llama")),
            ("llama.embedding_length", U32(64)),
            ("llama.attention.head_count", U32(0)),
            ("llama.vocab_size", U32(100)),
            ("llama.feed_forward_length", U32(128)),
            ("llama.block_count", U32(2)),
            ("llama.context_length", U32(256)),
        ],
        "GGUF metadata key `llama.attention.head_count` must be a positive integer, got 0",
    );
}

#[test]
fn gguf_unknown_architecture() {
    gguf_case(
        &[("general.architecture", GgufValue::Str("mamba"))],
        "unknown architecture `mamba`",
    );
}

// ---- CSV ----

fn fit(name: &str, needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let file = format!("{DIR}/{name}");
    let mut args = os(&["fit", &file, "--out"]);
    args.push(tmp.path().join("c.toml").into());
    fails(&args, &file, needle);
}

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

// ---- constants ----

fn estimate(name: &str, needle: &str) {
    let file = format!("{DIR}/{name}");
    fails(
        &os(&["estimate", "--model", "smollm2-135m", "--constants", &file]),
        &file,
        needle,
    );
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

// ---- command-line values ----

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

/// A scenario file with `text`, in a temporary folder (kept alive by the first value).
fn inline_scenario(text: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let s = tmp.path().join("s.toml");
    std::fs::write(&s, text).unwrap();
    (tmp, s)
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
