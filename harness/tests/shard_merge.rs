//! `sweep --shard K/N` and `merge`: the property "merge of all shards == the unsharded sweep"
//! on a synthetic scenario (the shards run as N concurrent processes), the one-line errors of
//! bad shard specs, and merge's refusals.
mod common;
use common::{root, stable, vramlab};
use std::path::{Path, PathBuf};

/// Two weight groups of inference (f32, bf16) and one of training, on a tiny synthetic llama.
const SCENARIO: &str = "scenarios/shard-synth.toml";

fn scenario(dir: &Path) -> PathBuf {
    let p = dir.join("shard-synth.toml");
    std::fs::copy(root().join(SCENARIO), &p).unwrap();
    p
}

fn sweep_cmd(sc: &Path, out: &Path, shard: Option<&str>) -> std::process::Command {
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("vramlab"));
    c.current_dir(root())
        .env("VRAMLAB_MODELS", common::models())
        .args(["sweep", "--quiet"])
        .arg(sc)
        .arg("--out")
        .arg(out);
    if let Some(s) = shard {
        c.args(["--shard", s]);
    }
    c
}

fn merge(out: &Path, inputs: &[PathBuf]) -> std::process::Output {
    vramlab()
        .arg("merge")
        .arg(out)
        .args(inputs)
        .output()
        .unwrap()
}

fn dry_run(sc: &Path, shard: &str) -> Vec<String> {
    let out = vramlab()
        .args(["sweep", "--dry-run", "--shard", shard])
        .arg(sc)
        .output()
        .unwrap();
    String::from_utf8(common::ok_stdout(out))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn merged_shards_equal_the_unsharded_sweep() {
    let d = tempfile::tempdir().unwrap();
    let sc = scenario(d.path());
    let full = d.path().join("full.csv");
    let n = 3;
    let st = sweep_cmd(&sc, &full, None).output().unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    // The shards run concurrently, as N processes (one per GPU or node on a cluster).
    let mut children: Vec<(std::process::Child, PathBuf)> = (1..=n)
        .map(|k| {
            let out = d.path().join(format!("shard{k}.csv"));
            let child = sweep_cmd(&sc, &out, Some(&format!("{k}/{n}")))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    let mut shard_csvs = Vec::new();
    for (c, out) in children.iter_mut() {
        assert!(c.wait().unwrap().success());
        shard_csvs.push(out.clone());
    }
    // The shards partition the grid, and points sharing weights stay together.
    let all_ids: Vec<String> = {
        let o = vramlab()
            .args(["sweep", "--dry-run"])
            .arg(&sc)
            .output()
            .unwrap();
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let per: Vec<Vec<String>> = (1..=n).map(|k| dry_run(&sc, &format!("{k}/{n}"))).collect();
    let mut union: Vec<String> = per.concat();
    union.sort();
    let mut want = all_ids.clone();
    want.sort();
    assert_eq!(union, want);
    let group = |id: &str| id.split('/').take(3).collect::<Vec<_>>().join("/");
    for (k, ids) in per.iter().enumerate() {
        for (j, other) in per.iter().enumerate().filter(|(j, _)| *j != k) {
            for id in ids {
                assert!(
                    !other.iter().any(|o| group(o) == group(id)),
                    "group of {id} split between shards {k} and {j}"
                );
            }
        }
    }
    // Each shard's manifest says which shard it is.
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("shard2.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["shard"], "2/3");

    // Merge (giving one shard twice: its rows are exact duplicates and are removed).
    let merged = d.path().join("merged.csv");
    let mut inputs = shard_csvs.clone();
    inputs.push(shard_csvs[0].clone());
    let res = merge(&merged, &inputs);
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{err}");
    assert!(err.contains(&format!("{} points", all_ids.len())), "{err}");
    let a: Vec<_> = vramlab::export::csv::read(&full).unwrap();
    let b: Vec<_> = vramlab::export::csv::read(&merged).unwrap();
    // Same rows in the grid's order, with identical point ids and allocated columns.
    assert_eq!(
        a.iter().map(stable).collect::<Vec<_>>(),
        b.iter().map(stable).collect::<Vec<_>>()
    );
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("merged.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["points"], all_ids.len());
    assert_eq!(m["shards"].as_array().unwrap().len(), n + 1);
    assert!(m.get("shard").is_none());
    // And the merged CSV passes the regression gate against the unsharded one.
    vramlab()
        .arg("compare")
        .arg(&full)
        .arg(&merged)
        .assert()
        .success();

    // A conflicting duplicate: one figure changed in a copy of shard 1.
    let bad = d.path().join("bad.csv");
    let text = std::fs::read_to_string(&shard_csvs[0]).unwrap();
    let rows = vramlab::export::csv::read(&shard_csvs[0]).unwrap();
    let peak = rows[1].peak_allocated.unwrap().to_string();
    let line = text.lines().nth(2).unwrap();
    let changed = line.replacen(&format!(",{peak},"), &format!(",{}9,", peak), 1);
    assert_ne!(line, changed);
    std::fs::write(&bad, text.replacen(line, &changed, 1)).unwrap();
    std::fs::copy(
        d.path().join("shard1.manifest.json"),
        d.path().join("bad.manifest.json"),
    )
    .unwrap();
    let res = merge(&d.path().join("m2.csv"), &[shard_csvs[0].clone(), bad]);
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("bad.csv") && err.contains("shard1.csv"),
        "{err}"
    );
    assert!(
        err.contains(&format!("point `{}`", rows[1].point_id)),
        "{err}"
    );

    // Another scenario's output is refused.
    let other = d.path().join("other.csv");
    std::fs::copy(&shard_csvs[1], &other).unwrap();
    let mt = std::fs::read_to_string(d.path().join("shard2.manifest.json")).unwrap();
    let h = m["scenario_hash"].as_str().unwrap();
    std::fs::write(
        d.path().join("other.manifest.json"),
        mt.replace(h, "0000000000000000"),
    )
    .unwrap();
    let res = merge(&d.path().join("m3.csv"), &[shard_csvs[0].clone(), other]);
    assert_eq!(res.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&res.stderr).contains("scenario hash"));
}

#[test]
fn bad_shard_specs_are_one_line_errors() {
    let d = tempfile::tempdir().unwrap();
    let sc = scenario(d.path());
    for (spec, needle) in [
        ("3/2", "--shard 3/2: K must be between 1 and N (2)"),
        ("0/2", "--shard 0/2: K must be between 1 and N (2)"),
        ("two", "expected K/N"),
    ] {
        let out = vramlab()
            .args(["sweep", "--dry-run", "--shard", spec])
            .arg(&sc)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}
