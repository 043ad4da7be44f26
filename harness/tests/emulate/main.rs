//! `vramlab emulate`: PyTorch programs on an emulated GPU. The torch tests are `#[ignore]`d
//! (they need the torch environment, `VRAMLAB_TORCH_PYTHON`; `scripts/test.sh` runs them); the
//! bad-input tests run everywhere. Every expected figure is derived here or by the program
//! from shapes, never copied from a run.
use assert_cmd::Command;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[path = "../common/mod.rs"]
mod common;
use common::{emulate_data as data, torch_python, vramlab};

struct Run {
    code: i32,
    json: Value,
    expect: Option<Value>,
    stderr: String,
}

/// `vramlab emulate --json <gpu args> -- python SCRIPT ARGS`: the JSON it printed, and the
/// `EXPECT {...}` line the program printed (on stderr: `--json` keeps standard output for
/// vramlab's document alone).
fn emulate(gpu: &[&str], script: &str, args: &[&str]) -> Run {
    emulate_with(&torch_python(), gpu, script, args)
}

/// [`emulate`] under another Python (another software stack).
fn emulate_with(py: &str, gpu: &[&str], script: &str, args: &[&str]) -> Run {
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .arg("emulate")
        .arg("--json")
        .args(gpu)
        .arg("--")
        .arg(py)
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let expect = stderr
        .lines()
        .find_map(|l| l.strip_prefix("EXPECT "))
        .map(|j| serde_json::from_str(j).unwrap());
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON document ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        json,
        expect,
        stderr,
    }
}

/// Runs a command that must succeed; its stdout.
fn ok_stdout(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// The caching allocator's segment for one request, by its documented rules
/// (c10/cuda/CUDACachingAllocator.cpp): ≤ 1 MiB from a 2 MiB small-pool segment; < 10 MiB
/// from a 20 MiB segment; larger, its own segment rounded up to 2 MiB.
fn segment(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let rounded = bytes.div_ceil(512) * 512;
    if rounded <= MIB {
        2 * MIB
    } else if rounded < 10 * MIB {
        20 * MIB
    } else {
        rounded.div_ceil(2 * MIB) * 2 * MIB
    }
}

/// `vramlab emulate --no-weights` loading a 2-layer Llama from a config.json (`tied`: its head
/// tied to the embedding): the load phase's JSON and the derived bytes of its tensors.
fn no_weights_load(tied: bool) -> (Value, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (v, h, ffn, layers, heads, kv) = (1024u64, 64u64, 128u64, 2u64, 4u64, 2u64);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v,
        "hidden_size": h, "intermediate_size": ffn, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16", "max_position_embeddings": 128
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let script = dir.path().join("load.py");
    std::fs::write(
        &script,
        "import sys, torch, vramlab\nfrom transformers import AutoModelForCausalLM\n\
         with vramlab.phase('load'):\n    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], \
         dtype=torch.bfloat16)\n",
    )
    .unwrap();
    let py = torch_python();
    let stdout = ok_stdout(
        Command::cargo_bin("vramlab")
            .unwrap()
            .args(["emulate", "--json", "--no-weights", "--gpu", "h200", "--"])
            .arg(&py)
            .arg(&script)
            .arg(dir.path()),
    );
    let json: Value = serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
    // Each tensor in bf16, rounded to 512 B: the embedding (and an untied head), per layer q,
    // k, v, o, gate, up, down and two norms, and the final norm.
    let t = |n: u64| (n * 2).div_ceil(512) * 512;
    let head_dim = h / heads;
    let per_layer = t(h * h) + 2 * t(kv * head_dim * h) + t(h * h) + 3 * t(h * ffn) + 2 * t(h);
    let embeddings = if tied { 1 } else { 2 };
    // Rotary inverse frequencies are float32 buffers of head_dim / 2: `inv_freq` and
    // `original_inv_freq`.
    let inv_freq = (head_dim / 2 * 4).div_ceil(512) * 512;
    let want = embeddings * t(v * h) + layers * per_layer + t(h) + 2 * inv_freq;
    (json["phases"][0].clone(), want)
}

fn vramlab_emulate(args: &[&str]) -> (i32, String) {
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .arg("emulate")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), err)
}

/// SmolLM2-135M training in bf16, the start of the estimate tests' queries.
const SMOLLM2_BF16_TRAIN: [&str; 6] = [
    "--model",
    "smollm2-135m",
    "--mode",
    "train",
    "--precision",
    "bf16",
];

/// `vramlab estimate --runtime torch --json ... --emulate GPU`: its whole JSON.
fn estimate_json(args: &[&str]) -> Value {
    let stdout = ok_stdout(
        Command::cargo_bin("vramlab")
            .unwrap()
            .args(["estimate", "--runtime", "torch", "--json", "--python"])
            .arg(torch_python())
            .args(args),
    );
    serde_json::from_str(&stdout).unwrap()
}

/// `vramlab estimate ... --emulate GPU --json`: the `emulated` object.
fn estimate_emulated(args: &[&str]) -> Value {
    estimate_json(args)["emulated"].clone()
}

/// `vramlab estimate --runtime torch --json --model smollm2-135m`, before the query's flags.
const ESTIMATE_SMOLLM2: [&str; 6] = [
    "estimate",
    "--runtime",
    "torch",
    "--json",
    "--model",
    "smollm2-135m",
];

/// Runs the torch probe on `scenario_text` (its `{config}` replaced by a config.json of
/// `config`) on an emulated A100-80GB; the rows it wrote.
fn probe_emulated(dir: &Path, config: &Value, scenario_text: &str) -> Vec<vramlab::record::Record> {
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, config.to_string()).unwrap();
    let scen = dir.join("scenario.toml");
    std::fs::write(
        &scen,
        scenario_text.replace("{config}", &cfg.display().to_string()),
    )
    .unwrap();
    let csv = dir.join("rows.csv");
    let out = std::process::Command::new(torch_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/vramlab/probe"))
        .arg(&scen)
        .args(["--device", "emu:a100-80gb", "--out"])
        .arg(&csv)
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    vramlab::export::csv::read(&csv).unwrap()
}

mod estimate;
mod probe;
mod programs;
