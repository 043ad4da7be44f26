//! Software stacks as an axis: SmolLM2-135M training on an emulated H100 under the default stack
//! and under torch-2.2 (`scripts/torch-env.sh --stack torch-2.2`), committed as
//! `results/emulated/h100-80gb-emu-stack-smollm2{,-torch-2.2}.csv`, and `vramlab compare`
//! between them as the "new runtime version" gate (docs/src/results/emu-stack-smollm2.md).
//! The comparison of the committed CSVs runs everywhere; re-measuring them (`vramlab sweep` of
//! the scenario, `runtime = "torch"`) needs both torch environments and is `#[ignore]`d
//! (`scripts/test.sh` runs it).
mod common;
use common::{root, vramlab};
use std::collections::BTreeSet;
use vramlab::record::Record;

const SCENARIO: &str = "scenarios/emu-stack-smollm2.toml";
const DEFAULT: &str = "results/emulated/h100-80gb-emu-stack-smollm2.csv";
const OLD: &str = "results/emulated/h100-80gb-emu-stack-smollm2-torch-2.2.csv";

fn rows(rel: &str) -> Vec<Record> {
    vramlab::export::csv::read(&root().join(rel)).unwrap()
}

fn runtime(csv_rel: &str) -> String {
    let manifest = root().join(csv_rel.replace(".csv", ".manifest.json"));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    m["runtime"].as_str().unwrap().to_string()
}

#[test]
fn compare_between_stacks_reports_every_phase_and_gates() {
    assert!(
        runtime(DEFAULT).starts_with("torch-2.15"),
        "{}",
        runtime(DEFAULT)
    );
    assert!(
        runtime(OLD).starts_with("torch-2.2.2") && runtime(OLD).ends_with("transformers-4.39.3"),
        "{}",
        runtime(OLD)
    );
    let out = vramlab()
        .args(["compare", DEFAULT, OLD, "--json"])
        .output()
        .unwrap();
    // The same points on the same emulated device: no --allow-* flag is needed, and the stack
    // change is a regression the gate reports (exit 1).
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let points: BTreeSet<_> = rows(DEFAULT).iter().map(|r| r.point_id.clone()).collect();
    let phases = ["load", "forward", "backward", "optimizer", "step_total"];
    let measured = rows(DEFAULT)
        .iter()
        .filter(|r| r.phase.is_some_and(|p| phases.contains(&p.as_str())))
        .count();
    assert_eq!(j["joined_rows"].as_u64().unwrap() as usize, measured);
    assert!(j["only_in_baseline"].as_array().unwrap().is_empty());
    assert!(j["only_in_new"].as_array().unwrap().is_empty());
    let changed: BTreeSet<&str> = j["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["phase"].as_str().unwrap())
        .collect();
    for p in phases {
        assert!(changed.contains(p), "no change reported in phase {p}");
    }
    // Every change is the difference of the two CSVs' figures, to the byte.
    for c in j["changes"].as_array().unwrap() {
        let d = c["new"].as_i64().unwrap() - c["baseline"].as_i64().unwrap();
        assert_eq!(c["delta"].as_i64().unwrap(), d, "{c}");
    }
    assert_eq!(points.len(), 24);
    // --by-phase (JSON: `by_phase`) sums the changes up per (phase, metric): the counts add up
    // to the changes, and each group's largest change is the largest of its members.
    let groups = j["by_phase"].as_array().unwrap();
    let changes = j["changes"].as_array().unwrap();
    let total: u64 = groups.iter().map(|g| g["changed"].as_u64().unwrap()).sum();
    assert_eq!(total as usize, changes.len());
    for g in groups {
        let members: Vec<&serde_json::Value> = changes
            .iter()
            .filter(|c| c["phase"] == g["phase"] && c["metric"] == g["metric"])
            .collect();
        assert_eq!(members.len() as u64, g["changed"].as_u64().unwrap(), "{g}");
        let largest = members
            .iter()
            .map(|c| c["delta"].as_i64().unwrap().unsigned_abs())
            .max()
            .unwrap();
        assert_eq!(
            g["largest"]["delta"].as_i64().unwrap().unsigned_abs(),
            largest,
            "{g}"
        );
    }
}

/// transformers 4.39 gives each decoder layer its own rotary embedding, with cos and sin caches
/// of `max_position_embeddings` rows (`_cos_cached`, `_sin_cached`) in the default dtype, which
/// from_config sets to the model's; 5.x computes them per forward. Derived from the preset's
/// config.json, they account for the load phase's growth, up to the caching allocator's block
/// rounding of the weights (what the default stack's load holds beyond the weight bytes).
#[test]
fn the_old_stacks_per_layer_rotary_caches_show_at_load() {
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("harness/presets/smollm2-135m/config.json")).unwrap(),
    )
    .unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let head_dim = n("hidden_size") / n("num_attention_heads");
    let load = |rel: &str, precision: &str| {
        rows(rel)
            .into_iter()
            .find(|r| {
                r.phase.map(|p| p.as_str()) == Some("load")
                    && r.point_id.contains(&format!("/train/{precision}/"))
            })
            .unwrap()
    };
    for (precision, bytes) in [("f32", 4), ("bf16", 2)] {
        let caches = n("num_hidden_layers") * 2 * n("max_position_embeddings") * head_dim * bytes;
        let (old, new) = (load(OLD, precision), load(DEFAULT, precision));
        let held = |r: &Record| r.end_allocated.unwrap() - r.baseline_allocated.unwrap_or(0);
        let rounding = held(&new) - new.feature_weight_bytes.unwrap();
        let grew = held(&old) - held(&new);
        assert!(
            grew.abs_diff(caches) <= rounding,
            "{precision}: load grew by {grew} B; the rotary caches are {caches} B, the weights' \
             block rounding {rounding} B"
        );
    }
}

/// What the stack results are compared on: each row's point, phase, step and bytes.
type Key = (
    String,
    Option<String>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
);

fn key(r: &Record) -> Key {
    (
        r.point_id.clone(),
        r.phase.map(|p| p.as_str().to_string()),
        r.step,
        r.peak_allocated,
        r.end_allocated,
        r.peak_reserved,
        r.device_used,
    )
}

/// Requires `got`'s rows to be the committed CSV's, figure for figure, in any order (`merge`
/// orders them by point).
fn same_rows(got: &std::path::Path, committed: &str) {
    let mut want: Vec<Key> = rows(committed).iter().map(key).collect();
    let mut got: Vec<Key> = vramlab::export::csv::read(got)
        .unwrap()
        .iter()
        .map(key)
        .collect();
    want.sort();
    got.sort();
    assert_eq!(
        got, want,
        "{committed} is stale: re-run {SCENARIO} (both stacks)"
    );
}

/// Runs the torch probe under `python` on `scenario` with `args`, into `out`: its rows.
fn probe(
    python: &str,
    scenario: &std::path::Path,
    args: &[&str],
    out: &std::path::Path,
) -> Vec<Record> {
    let done = std::process::Command::new(python)
        .arg(root().join("harness/python/vramlab/probe"))
        .arg(scenario)
        .args(args)
        .arg("--out")
        .arg(out)
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    vramlab::export::csv::read(out).unwrap()
}

fn torch_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var}: scripts/torch-env.sh (scripts/test.sh)"))
}

/// Re-measures the scenario under both stacks through `vramlab sweep` itself (`runtime =
/// "torch"`, `device = "emu:h100-80gb"`, its `stack` axis: one CSV per stack) in two shards,
/// each one worker process per group, and requires the merged figures to be the committed
/// CSVs' to the byte (the emulated allocator is deterministic), so a stale result set fails
/// here. The manifest names the stack, torch's versions and the emulated device; a second run
/// resumes and measures nothing again.
#[test]
#[ignore = "needs both torch stacks (scripts/torch-env.sh and --stack torch-2.2; scripts/test.sh)"]
fn the_committed_stack_results_are_current_in_shards_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = |shard: &str, out: &str| {
        let run = vramlab()
            .args(["sweep", SCENARIO, "--quiet", "--shard", shard, "--out"])
            .arg(dir.path().join(out))
            .env("VRAMLAB_TORCH_PYTHON", torch_env("VRAMLAB_TORCH_PYTHON"))
            .current_dir(root())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "{err}");
        err
    };
    sweep("1/2", "a.csv");
    sweep("2/2", "b.csv");
    let again = sweep("1/2", "a.csv");
    assert!(again.contains("resum"), "a second run resumes: {again}");
    for (suffix, committed, stack, torch) in [
        ("", DEFAULT, "default", "torch-2.15"),
        ("-torch-2.2", OLD, "torch-2.2", "torch-2.2.2"),
    ] {
        let shard = |n: &str| dir.path().join(format!("{n}{suffix}.csv"));
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(shard("a").with_extension("manifest.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(manifest["stack"], stack, "{manifest}");
        assert!(
            manifest["runtime"].as_str().unwrap().starts_with(torch),
            "{manifest}"
        );
        assert!(
            manifest["device_name"]
                .as_str()
                .unwrap()
                .ends_with("(emulated)"),
            "{manifest}"
        );
        let merged = dir.path().join(format!("m{suffix}.csv"));
        vramlab()
            .arg("merge")
            .arg(&merged)
            .arg(shard("a"))
            .arg(shard("b"))
            .assert()
            .success();
        same_rows(&merged, committed);
    }
}

/// LoRA through peft (the probe's `--lora peft`, as labs run it) against vramlab's definition
/// (forward hooks, `--lora hooks`) on SmolLM2-135M in bf16, r16 on q_proj and v_proj. peft 0.21
/// (the default stack) keeps a 16-bit model's adapters in f32: after each optimizer step the
/// adapters and AdamW's two moments hold 3 × 4 B per adapter parameter over the weights, against
/// 3 × 2 B with the hooks, both derived from the config here. peft 0.11 (torch-2.2) keeps them
/// in bf16: every figure equals the hooks' to the byte.
#[test]
#[ignore = "needs both torch stacks (scripts/torch-env.sh and --stack torch-2.2; scripts/test.sh)"]
fn peft_lora_keeps_f32_adapters_from_0_12_and_matches_the_hooks_before() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("lora.toml");
    std::fs::write(
        &scen,
        "name = \"lora\"\n[model]\nsource = \"synthetic:harness/presets/smollm2-135m/config.json\"\n\
         [sweep]\nmode = [\"train\"]\nprecision = [\"bf16\"]\nbatch = [2]\ncontext = [256]\n\
         optimizer = [\"adamw\"]\ntrainable = [\"lora-r16\"]\ntrain_steps = 2\n",
    )
    .unwrap();
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("harness/presets/smollm2-135m/config.json")).unwrap(),
    )
    .unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (h, r) = (n("hidden_size"), 16);
    let kv_dim = n("num_key_value_heads") * h / n("num_attention_heads");
    let adapters = n("num_hidden_layers") * (r * (h + h) + r * (h + kv_dim));
    let run = |python: &str, lora: &str| {
        let out = dir.path().join(format!("{lora}.csv"));
        probe(
            python,
            &scen,
            &["--device", "emu:a100-80gb", "--lora", lora],
            &out,
        )
    };
    // The bytes each optimizer step leaves over the load's.
    let over_load = |rows: &[Record]| -> Vec<u64> {
        let load = rows
            .iter()
            .find(|r| r.phase.map(|p| p.as_str()) == Some("load"))
            .unwrap();
        rows.iter()
            .filter(|r| r.phase.map(|p| p.as_str()) == Some("optimizer"))
            .map(|r| r.end_allocated.unwrap() - load.end_allocated.unwrap())
            .collect()
    };
    let default = torch_env("VRAMLAB_TORCH_PYTHON");
    assert_eq!(
        over_load(&run(&default, "hooks")),
        vec![3 * 2 * adapters; 2]
    );
    assert_eq!(over_load(&run(&default, "peft")), vec![3 * 4 * adapters; 2]);
    let old = torch_env("VRAMLAB_TORCH22_PYTHON");
    let (hooks, peft) = (run(&old, "hooks"), run(&old, "peft"));
    assert_eq!(
        hooks.iter().map(key).collect::<Vec<_>>(),
        peft.iter().map(key).collect::<Vec<_>>()
    );
}

/// FSDP full shard on the torch-2.2 stack (FSDP1, which torch 2.2 has instead of FSDP2's
/// fully_shard): the probe's `--gpus N` wraps each decoder layer and the root as accelerate
/// does, one flat parameter per unit padded to a multiple of N. On a tiny Llama in f32 the
/// load holds rank 0's flat shards, ceil(unit / N) elements of each of the three units, plus
/// transformers 4.39's per-layer rotary caches (2 × max_position_embeddings × head_dim f32 per
/// layer), derived from the config here, within the allocator's 512 B rounding per tensor.
#[test]
#[ignore = "needs the torch-2.2 stack (scripts/torch-env.sh --stack torch-2.2; scripts/test.sh)"]
fn fsdp1_on_torch_2_2_loads_rank_0s_flat_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (v, h, i, layers, heads, kv, positions) =
        (1024u64, 256u64, 512u64, 2u64, 4u64, 2u64, 128u64);
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v,
            "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv,
            "max_position_embeddings": positions, "tie_word_embeddings": false,
            "rms_norm_eps": 1e-5, "hidden_act": "silu"
        })
        .to_string(),
    )
    .unwrap();
    let scen = dir.path().join("fsdp.toml");
    std::fs::write(
        &scen,
        format!(
            "name = \"fsdp\"\n[model]\nsource = \"synthetic:{}\"\n[sweep]\nmode = [\"train\"]\n\
             precision = [\"f32\"]\nbatch = [2]\ncontext = [64]\noptimizer = [\"adamw\"]\n\
             train_steps = 2\n",
            cfg.display()
        ),
    )
    .unwrap();
    let head_dim = h / heads;
    let layer = 2 * h * h + 2 * (kv * head_dim) * h + 3 * i * h + 2 * h;
    let root_unit = 2 * v * h + h;
    let caches = layers * 2 * positions * head_dim * 4;
    for n in [2u64, 8] {
        let rows = probe(
            &torch_env("VRAMLAB_TORCH22_PYTHON"),
            &scen,
            &["--device", "emu:a100-80gb", "--gpus", &n.to_string()],
            &dir.path().join(format!("fsdp-{n}.csv")),
        );
        let shards = (root_unit.div_ceil(n) + layers * layer.div_ceil(n)) * 4;
        let load = rows
            .iter()
            .find(|r| r.phase.map(|p| p.as_str()) == Some("load"))
            .unwrap();
        let held = load.end_allocated.unwrap() - load.baseline_allocated.unwrap_or(0);
        assert!(
            held.abs_diff(shards + caches) <= 512 * (1 + layers + 2 * layers),
            "N={n}: the load holds {held} B; rank 0's flat shards are {shards} B, the rotary \
             caches {caches} B"
        );
        assert!(rows
            .iter()
            .all(|r| r.status == Some(vramlab::record::Status::Ok)));
    }
}

/// The probe parses no TOML of its own (vramlab reads the scenario and expands its points), so
/// the oldest interpreter a stack has, the torch-1.10 stack's CPython 3.9 (the wheel's floor),
/// lists the same points as vramlab: every committed scenario's dry run, without torch.
#[test]
#[ignore = "needs the torch-1.10 stack's CPython 3.9 (scripts/torch-env.sh --stack torch-1.10; scripts/test.sh)"]
fn the_probe_reads_vramlabs_points_on_python_3_9() {
    let python = torch_env("VRAMLAB_TORCH110_PYTHON");
    let version = std::process::Command::new(&python)
        .args(["-c", "import sys; print(sys.version_info[:2])"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), "(3, 9)");
    for s in &common::scenarios() {
        let run = |cmd: &mut std::process::Command| {
            let out = cmd.current_dir(root()).output().unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                s.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let ours = run(
            std::process::Command::new(assert_cmd::cargo::cargo_bin("vramlab"))
                .args(["sweep", "--dry-run"])
                .arg(s),
        );
        let theirs = run(std::process::Command::new(&python)
            .arg(root().join("harness/python/vramlab/probe"))
            .arg(s)
            .args(["--dry-run", "--device", "cpu"])
            .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab")));
        assert_eq!(theirs, ours, "{}", s.display());
    }
}
