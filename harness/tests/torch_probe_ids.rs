//! The torch probe (harness/python/vramlab/probe) and `vramlab sweep` measure the same grid, vramlab's: the
//! probe reads its points from `vramlab sweep --dry-run --json` (its grid.py; the pytest
//! test_grid.py checks it takes no point of its own). For every scenario in scenarios/, the
//! probe's command line, `python3 harness/python/vramlab/probe --dry-run` (with `--device cpu` for the
//! CPU scenarios, as scripts/torch-cpu.sh runs it), reads them and prints exactly the ids of
//! `vramlab sweep --dry-run`. The dry run imports no torch and parses no TOML, so this runs
//! wherever python3 (≥ 3.9) does.
mod common;
use common::{root, vramlab};

fn ids(out: &std::process::Output, what: &str) -> Vec<String> {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn torch_probe_dry_run_ids_equal_vramlab_ids() {
    let scenarios = common::scenarios();
    for s in &scenarios {
        let ours = vramlab()
            .args(["sweep", "--dry-run"])
            .arg(s)
            .output()
            .unwrap();
        let ours = ids(&ours, &format!("vramlab sweep --dry-run {}", s.display()));
        // CPU scenarios as scripts/torch-cpu.sh runs them (`--device cpu`).
        let cpu = std::fs::read_to_string(s)
            .unwrap()
            .contains("device = \"cpu\"");
        let theirs = std::process::Command::new("python3")
            .arg(root().join("harness/python/vramlab/probe"))
            .arg(s)
            .args(if cpu {
                &["--device", "cpu"][..]
            } else {
                &[][..]
            })
            .arg("--dry-run")
            .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
            .current_dir(root())
            .output()
            .expect("python3 runs");
        let theirs = ids(&theirs, &format!("torch_probe --dry-run {}", s.display()));
        assert!(!ours.is_empty(), "{}: no points", s.display());
        assert_eq!(theirs, ours, "{}: the point ids differ", s.display());
    }
}

#[test]
fn torch_probe_dry_run_imports_no_torch() {
    // A `torch` that explodes on import: the dry run must not touch it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("torch")).unwrap();
    std::fs::write(
        dir.path().join("torch/__init__.py"),
        "raise ImportError('no torch in a dry run')\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("transformers")).unwrap();
    std::fs::write(
        dir.path().join("transformers/__init__.py"),
        "raise ImportError('no transformers in a dry run')\n",
    )
    .unwrap();
    let out = std::process::Command::new("python3")
        .arg(root().join("harness/python/vramlab/probe"))
        .arg(root().join("scenarios/gpu-smoke.toml"))
        .arg("--dry-run")
        .env("PYTHONPATH", dir.path())
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
        .current_dir(root())
        .output()
        .unwrap();
    let got = ids(&out, "torch_probe --dry-run with a broken torch");
    assert!(
        got.iter().any(|l| l.starts_with("synthetic-llama-3.1-8b/")),
        "{got:?}"
    );
}

/// The probe writes the schema `vramlab` reads: the same version and columns, in order.
#[test]
fn torch_probe_columns_are_the_record_columns() {
    let out = std::process::Command::new("python3")
        .current_dir(root().join("harness/python"))
        .args([
            "-c",
            "import vramlab.probe as t; print(t.SCHEMA_VERSION); print(','.join(t.COLUMNS))",
        ])
        .output()
        .unwrap();
    let lines = ids(&out, "import vramlab.probe");
    assert_eq!(
        lines[0],
        vramlab::record::SCHEMA_VERSION.to_string(),
        "schema version"
    );
    assert_eq!(lines[1], vramlab::record::columns().join(","));
}

/// `sweep --dry-run --json`, what the probe reads: for every scenario, the points of
/// `--dry-run` in the same order, each naming its `[sweep]` table; a shard's are the shard's
/// (on a synthetic scenario: a shard weighs the models' configs); `--json` alone is a usage
/// error (exit 2).
#[test]
fn sweep_dry_run_json_is_the_dry_runs_points() {
    let scenarios = common::scenarios();
    let smoke = root().join("scenarios/gpu-smoke.toml");
    let runs = scenarios
        .iter()
        .map(|s| (s, None))
        .chain([(&smoke, Some("1/2")), (&smoke, Some("2/2"))]);
    for (s, shard) in runs {
        let run = |json: bool| {
            let mut c = vramlab();
            c.args(["sweep", "--dry-run"]).arg(s).current_dir(root());
            if json {
                c.arg("--json");
            }
            if let Some(k) = shard {
                c.args(["--shard", k]);
            }
            c.output().unwrap()
        };
        let what = format!("{} (shard {shard:?})", s.display());
        let lines = ids(&run(false), &what);
        let doc: serde_json::Value =
            serde_json::from_slice(&run(true).stdout).expect("one JSON document");
        let points = doc["points"].as_array().expect("points");
        let json_ids: Vec<_> = points.iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(json_ids, lines, "{what}");
        let tables = toml::from_str::<toml::Value>(&std::fs::read_to_string(s).unwrap()).unwrap()
            ["sweep"]
            .as_array()
            .map_or(1, Vec::len);
        assert!(
            points
                .iter()
                .all(|p| (p["table"].as_u64().unwrap() as usize) < tables),
            "{what}: a point names a table the scenario does not have"
        );
        let plan = doc["plan"].as_str().unwrap();
        assert!(
            ["llm", "generate", "finetune"].contains(&plan),
            "{what}: {plan}"
        );
    }
    let out = vramlab()
        .args(["sweep", "--json"])
        .arg(root().join("scenarios/gpu-smoke.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
