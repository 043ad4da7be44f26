//! The torch probe (scripts/torch_probe) and `vramlab sweep` measure the same grid: for every
//! scenario in scenarios/, `python3 scripts/torch_probe --dry-run` (with `--device cpu` for the
//! CPU scenarios, as scripts/torch-cpu.sh runs it) prints exactly the ids of `vramlab sweep --dry-run`.
//! The dry run imports no torch, so this runs wherever python3 (≥ 3.11, for tomllib) does.
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
    let mut scenarios: Vec<_> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    scenarios.sort();
    assert!(!scenarios.is_empty());
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
            .arg(root().join("scripts/torch_probe"))
            .arg(s)
            .args(if cpu {
                &["--device", "cpu"][..]
            } else {
                &[][..]
            })
            .arg("--dry-run")
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
        .arg(root().join("scripts/torch_probe"))
        .arg(root().join("scenarios/gpu-smoke.toml"))
        .arg("--dry-run")
        .env("PYTHONPATH", dir.path())
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
        .current_dir(root().join("scripts"))
        .args([
            "-c",
            "import torch_probe as t; print(t.SCHEMA_VERSION); print(','.join(t.COLUMNS))",
        ])
        .output()
        .unwrap();
    let lines = ids(&out, "import torch_probe");
    assert_eq!(
        lines[0],
        vramlab::record::SCHEMA_VERSION.to_string(),
        "schema version"
    );
    assert_eq!(lines[1], vramlab::record::columns().join(","));
}
