//! The caching allocator's reserve and the three figures of `estimate` on CUDA: allocated,
//! reserved and NVML "used", through the real binary. Expected figures are derived here, from
//! the committed emulated sweeps, their committed fits and the JSON's own rows.
mod common;
use common::{
    estimate_json, estimate_row as row, reserve_coefficients, reserve_of, root, vramlab,
    ReserveKey, RESERVE_CONSTANTS as REFERENCE, RESERVE_CSVS,
};

/// The torch-2.2 stack's sweep and fit (`--stack torch-2.2`).
const TORCH22_CSV: &str = "results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.csv";
const TORCH22: &str = "results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.constants.toml";

fn reserve_tables(text: &str) -> Vec<toml::Value> {
    let v: toml::Value = toml::from_str(text).unwrap();
    v["reserve"].as_array().cloned().unwrap_or_default()
}

/// The reserve classes the rows of `csvs` cover, derived from their columns: `load`, and per
/// whole-run row (`total`, `step_total`) of a point: mode, whether attention materializes the
/// scores, for training checkpointing, LoRA and mixed precision, and for inference the KV
/// cache's kind.
fn classes_in(csvs: &[&str]) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for csv in csvs {
        let mut rdr = csv::Reader::from_path(root().join(csv)).unwrap();
        let h = rdr.headers().unwrap().clone();
        let col = |name: &str| h.iter().position(|c| c == name).unwrap();
        let cols = [
            "mode",
            "phase",
            "attention",
            "checkpointing",
            "trainable",
            "precision",
            "kv_cache",
        ]
        .map(col);
        let st = col("status");
        for rec in rdr.records() {
            let rec = rec.unwrap();
            let [mode, phase, att, ck, tr, prec, kv] = cols.map(|c| rec[c].to_string());
            if &rec[st] != "ok" {
                continue;
            }
            let train = mode == "train";
            if phase == "load" {
                out.insert("load".to_string());
            } else if phase == if train { "step_total" } else { "total" } {
                let att = if att == "eager" { "eager" } else { "sdpa" };
                out.insert(if train {
                    format!(
                        "{mode} {att} {ck} {} {}",
                        tr.starts_with("lora"),
                        prec.starts_with("mixed")
                    )
                } else {
                    format!("{mode} {att} {kv}")
                });
            }
        }
    }
    out
}

/// The reserve fits built into the binary, one per stack, are what `vramlab fit` makes of the
/// committed CSVs today: refitting gives the same classes, coefficients and held-out errors,
/// one class per kind of run the CSVs hold.
#[test]
fn the_built_in_reserve_is_the_fit_of_the_committed_emulated_sweep() {
    for (csvs, constants) in [
        (&RESERVE_CSVS[..], REFERENCE),
        (&[TORCH22_CSV][..], TORCH22),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.toml");
        vramlab()
            .arg("fit")
            .args(csvs)
            .arg("--out")
            .arg(&out)
            .assert()
            .success()
            .stdout(predicates::str::contains("caching-allocator reserve"))
            .stdout(predicates::str::contains("held out by model"));
        let fresh = reserve_tables(&std::fs::read_to_string(&out).unwrap());
        let committed = reserve_tables(&std::fs::read_to_string(root().join(constants)).unwrap());
        assert_eq!(fresh.len(), classes_in(csvs).len(), "{csvs:?}: {fresh:?}");
        assert_eq!(
            fresh,
            committed,
            "{constants} is stale: refit it with `vramlab fit {} --out {constants}`",
            csvs.join(" ")
        );
        for t in &fresh {
            // Every class is judged on models it never saw.
            assert_eq!(t["error_by"].as_str(), Some("held out by model"), "{t}");
            let (lo, hi) = (
                t["error_min"].as_float().unwrap(),
                t["error_max"].as_float().unwrap(),
            );
            assert!(lo <= 0.0 && hi >= 0.0, "{t}");
        }
    }
}

/// The terms of one committed row, by the constants' term names: its `feature_*` columns, the
/// constant, and attention's b·s·T·bytes (a training row: T = s = its context, bf16).
fn row_terms(csv: &str, point: &str, phase: &str) -> Vec<(&'static str, f64)> {
    let mut rdr = csv::Reader::from_path(root().join(csv)).unwrap();
    let h = rdr.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let rec = rdr
        .records()
        .map(|r| r.unwrap())
        .find(|r| &r[col("point_id")] == point && &r[col("phase")] == phase)
        .unwrap_or_else(|| panic!("{csv}: no {phase} row of {point}"));
    let f = |name: &str| rec[col(name)].parse::<f64>().unwrap();
    let (b, s) = (f("batch"), f("context"));
    vec![
        ("const", 1.0),
        ("weight", f("feature_weight_bytes")),
        ("kv", f("feature_kv_bytes")),
        ("act", f("feature_act_bytes")),
        ("logits", f("feature_logits_bytes")),
        ("attn", b * s * s * 2.0),
    ]
}

/// `--stack torch-2.2` takes that stack's reserve: the reserve row is the class's model in its
/// own fit, evaluated on the terms the probe wrote for the same point (so the estimate's terms
/// are the probe's), and the reserve source names the fit and the class.
#[test]
fn the_stack_chooses_its_own_reserve_model_on_the_probes_terms() {
    let class: ReserveKey = (false, "train", "eager", "layer", false, false, false);
    let point = "synthetic-tinyllama-1.1b/train/bf16/b4/c1024/adamw/layer/ga1/full";
    let args = [
        "--model",
        "tinyllama-1.1b",
        "--mode",
        "train",
        "--batch",
        "4",
        "--context",
        "1024",
        "--checkpointing",
        "--attention",
        "eager",
    ];
    let mut rows = Vec::new();
    for (stack, csv, constants) in [
        ("default", RESERVE_CSVS[1], REFERENCE),
        ("torch-2.2", TORCH22_CSV, TORCH22),
    ] {
        let j = estimate_json(&[&args[..], &["--stack", stack]].concat());
        let want = reserve_of(
            &reserve_coefficients(constants, class),
            &row_terms(csv, point, "step_total"),
        );
        let got = row(&j, "allocator reserve");
        assert!(got.abs_diff(want) <= 1, "{stack}: {got} against {want}");
        let source = j["reserve_source"].as_str().unwrap();
        assert!(source.contains(constants), "{source}");
        assert!(
            source.contains("train eager, checkpointing layer ("),
            "{source}"
        );
        rows.push(got);
    }
    assert_ne!(rows[0], rows[1]);
}

/// Inference with a growing KV cache reserves by its own class, in either stack: each decode
/// step concatenates every layer's K and V into a new block and frees the old, which a
/// preallocated cache never does. The two stacks' fits each hold the class (measured on the
/// same points), the estimate names it, and on the default stack its reserve is not the
/// preallocated cache's.
#[test]
fn a_growing_cache_reserves_by_its_own_class() {
    let args = [
        "--model",
        "tinyllama-1.1b",
        "--batch",
        "8",
        "--context",
        "2048",
        "--attention",
        "eager",
        "--runtime",
        "torch",
    ];
    for (stack, constants) in [("default", REFERENCE), ("torch-2.2", TORCH22)] {
        let table = reserve_tables(&std::fs::read_to_string(root().join(constants)).unwrap())
            .into_iter()
            .find(|t| {
                let c = &t["class"];
                c["mode"].as_str() == Some("infer")
                    && c["attention"].as_str() == Some("eager")
                    && c["growing"].as_bool() == Some(true)
            })
            .unwrap_or_else(|| panic!("{constants}: no growing-cache class"));
        assert!(table["points"].as_integer().unwrap() >= 8, "{table}");
        let reserve = |kv: &str| {
            let j = estimate_json(&[&args[..], &["--stack", stack, "--kv-cache", kv]].concat());
            (
                row(&j, "allocator reserve"),
                j["reserve_source"].to_string(),
            )
        };
        let (growing, source) = reserve("growing");
        let (preallocated, other) = reserve("preallocated");
        assert!(source.contains("infer eager, growing cache ("), "{source}");
        if stack == "default" {
            assert!(other.contains("infer eager ("), "{other}");
            assert_ne!(growing, preallocated, "{stack}");
        } else {
            // transformers 4.39's StaticCache is one layer's, so the stack measured no
            // preallocated inference, and the estimate says it borrows the growing class.
            assert!(other.contains("no infer eager points"), "{other}");
        }
    }
}

/// Torch on CUDA: total = NVML used = reserved + the CUDA context; reserved = allocated + the
/// allocator reserve; every figure is the sum of its rows; the verdicts' range brackets NVML
/// used; and the reserve is its class's model (named in the source).
#[test]
fn torch_on_cuda_reports_allocated_reserved_and_nvml_that_add_up() {
    let cases: [(&[&str], &str); 3] = [
        (&["--batch", "4", "--context", "2048"], "infer sdpa ("),
        (
            &["--mode", "train", "--batch", "2", "--context", "1024"],
            "train sdpa, checkpointing none (",
        ),
        (
            &[
                "--mode",
                "train",
                "--batch",
                "2",
                "--context",
                "1024",
                "--checkpointing",
                "--trainable",
                "lora-r16",
            ],
            "train sdpa, checkpointing layer, LoRA (",
        ),
    ];
    for (args, class) in cases {
        let mut all = vec!["--model", "llama-3.2-1b", "--runtime", "torch"];
        all.extend_from_slice(args);
        let j = estimate_json(&all);
        let sum: u64 = j["breakdown"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap())
            .sum();
        let u = |k: &str| j[k].as_u64().unwrap();
        let (total, alloc, reserved, nvml) = (
            u("total_bytes"),
            u("allocated_bytes"),
            u("reserved_bytes"),
            u("nvml_bytes"),
        );
        assert_eq!(total, sum, "{j}");
        assert_eq!(nvml, total);
        assert_eq!(reserved, nvml - row(&j, "CUDA context"));
        let reserve = row(&j, "allocator reserve");
        assert_eq!(alloc, reserved - reserve);
        assert!(reserve > 0);
        assert!(
            u("nvml_low_bytes") <= nvml && nvml <= u("nvml_high_bytes"),
            "{j}"
        );
        // The range is the class's error on reserved, applied to this run's reserved figure.
        assert!(u("nvml_high_bytes") - nvml < reserved, "{j}");
        assert_eq!(j["verdict_figure"], "nvml_high_bytes");
        let source = j["reserve_source"].as_str().unwrap();
        assert!(
            source.contains(REFERENCE) && source.contains(class),
            "{source}"
        );
    }
}

/// The GPU verdicts judge NVML used at the high end of its range, not allocated: a query whose
/// allocated bytes fit a GPU's budget but whose NVML figure does not is not "fits", and the
/// smallest GPU named is the first catalog class whose budget holds that figure.
#[test]
fn the_verdict_judges_the_high_end_of_nvml_used() {
    let j = estimate_json(&[
        "--model",
        "mistral-7b-v0.1",
        "--mode",
        "train",
        "--precision",
        "f16",
        "--context",
        "4096",
        "--checkpointing",
        "--runtime",
        "torch",
        "--attention",
        "flash",
        "--batch",
        "8",
        "--trainable",
        "lora-r16",
        "--gpu",
        "a100-40",
    ]);
    let (alloc, nvml) = (
        j["allocated_bytes"].as_u64().unwrap(),
        j["nvml_high_bytes"].as_u64().unwrap(),
    );
    let budget = j["gpu"]["budget_bytes"].as_u64().unwrap();
    assert!(alloc <= budget && nvml > budget, "{j}");
    assert_eq!(j["gpu"]["fits"], false);
    let headroom = j["headroom"].as_f64().unwrap();
    let small = j["smallest_gpu_gb"].as_u64().unwrap();
    let budget_of = |gb: u64| (gb as f64 * 1e9 * (1.0 - headroom)) as u64;
    assert!(nvml <= budget_of(small));
    // The classes of the catalog below it (from `--gpu`'s sizes) do not hold it.
    for gb in [24u64, 32, 40, 48, 80, 94, 141, 180, 192] {
        if gb < small {
            assert!(nvml > budget_of(gb), "{gb} GB would hold {nvml} B");
        }
    }
}

/// On the CPU there is no pool reserve and no context: the three figures are one.
#[test]
fn the_cpu_has_no_reserve() {
    let j = estimate_json(&["--model", "smollm2-135m", "--backend", "cpu"]);
    let total = j["total_bytes"].as_u64().unwrap();
    assert_eq!(j["allocated_bytes"].as_u64().unwrap(), total);
    assert_eq!(j["reserved_bytes"].as_u64().unwrap(), total);
    assert_eq!(row(&j, "allocator reserve"), 0);
}
