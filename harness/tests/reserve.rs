//! The caching allocator's reserve and the three figures of `estimate` on CUDA: allocated,
//! reserved and NVML "used", through the real binary. Expected figures are derived here, from
//! the committed emulated sweep and the JSON's own rows.
mod common;
use common::{
    estimate_json, estimate_row as row, reserve_ratio, reserve_ratio_in, root, vramlab, ReserveKey,
    RESERVE_CSV as REFERENCE_CSV,
};

const REFERENCE: &str = "results/emulated/a100-80gb-emu-reserve-llm.constants.toml";
/// The torch-2.2 stack's sweep and fit (`--stack torch-2.2`).
const TORCH22_CSV: &str = "results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.csv";
const TORCH22: &str = "results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.constants.toml";

fn reserve_tables(text: &str) -> Vec<toml::Value> {
    let v: toml::Value = toml::from_str(text).unwrap();
    v["reserve"].as_array().cloned().unwrap_or_default()
}

/// The reserve fits built into the binary, one per stack, are what `vramlab fit` makes of the
/// committed CSVs today: refitting gives the same classes, ratios and held-out errors.
#[test]
fn the_built_in_reserve_is_the_fit_of_the_committed_emulated_sweep() {
    for (csv, constants) in [(REFERENCE_CSV, REFERENCE), (TORCH22_CSV, TORCH22)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.toml");
        vramlab()
            .args(["fit", csv, "--out"])
            .arg(&out)
            .assert()
            .success()
            .stdout(predicates::str::contains("caching-allocator reserve"));
        let fresh = reserve_tables(&std::fs::read_to_string(&out).unwrap());
        let committed = reserve_tables(&std::fs::read_to_string(root().join(constants)).unwrap());
        assert_eq!(fresh.len(), 6, "{csv}: every class: {fresh:?}");
        assert_eq!(
            fresh, committed,
            "{constants} is stale: refit it with `vramlab fit {csv} --out {constants}`"
        );
    }
}

/// `--stack torch-2.2` takes that stack's reserve: the class's largest ratio in its own sweep,
/// and the reserve source names its fit.
#[test]
fn the_stack_chooses_its_own_reserve() {
    let class: ReserveKey = ("train", "layer", false);
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
    ];
    for (stack, csv, constants) in [
        ("default", REFERENCE_CSV, REFERENCE),
        ("torch-2.2", TORCH22_CSV, TORCH22),
    ] {
        let j = estimate_json(&[&args[..], &["--stack", stack]].concat());
        let alloc = j["allocated_bytes"].as_u64().unwrap();
        let rho = reserve_ratio_in(csv, Some(class));
        assert_eq!(
            row(&j, "allocator reserve"),
            (alloc as f64 * rho).ceil() as u64,
            "{stack}"
        );
        assert!(j["reserve_source"].as_str().unwrap().contains(constants));
    }
    assert_ne!(
        reserve_ratio_in(REFERENCE_CSV, Some(class)),
        reserve_ratio_in(TORCH22_CSV, Some(class))
    );
}

/// Torch on CUDA: total = NVML used = reserved + the CUDA context; reserved = allocated + the
/// allocator reserve; the reserve is ⌈allocated × the class's largest measured ratio⌉; and
/// every figure is the sum of its rows.
#[test]
fn torch_on_cuda_reports_allocated_reserved_and_nvml_that_add_up() {
    let cases: [(&[&str], ReserveKey); 3] = [
        (
            &["--batch", "4", "--context", "2048"],
            ("infer", "none", false),
        ),
        (
            &["--mode", "train", "--batch", "2", "--context", "1024"],
            ("train", "none", false),
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
            ("train", "layer", true),
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
        let (total, alloc, reserved, nvml) = (
            j["total_bytes"].as_u64().unwrap(),
            j["allocated_bytes"].as_u64().unwrap(),
            j["reserved_bytes"].as_u64().unwrap(),
            j["nvml_bytes"].as_u64().unwrap(),
        );
        assert_eq!(total, sum, "{j}");
        assert_eq!(nvml, total);
        assert_eq!(reserved, nvml - row(&j, "CUDA context"));
        let reserve = row(&j, "allocator reserve");
        assert_eq!(alloc, reserved - reserve);
        let rho = reserve_ratio(Some(class));
        assert_eq!(
            reserve,
            (alloc as f64 * rho).ceil() as u64,
            "{class:?}: {j}"
        );
        assert!(reserve > 0);
        assert_eq!(j["verdict_figure"], "nvml_bytes");
        assert!(j["reserve_source"].as_str().unwrap().contains(REFERENCE));
    }
}

/// The GPU verdicts judge NVML used, not allocated: a query whose allocated bytes fit a GPU's
/// budget but whose NVML figure does not is "does not fit", and the smallest GPU named is the
/// first catalog class whose budget holds NVML used.
#[test]
fn the_verdict_judges_nvml_used() {
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
        j["nvml_bytes"].as_u64().unwrap(),
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
