//! `vramlab validate` through the real binary, on the committed peers file. The analytic
//! rows' expected figures are the papers' formulas, computed here; the structure checks are
//! derived from the peers file itself.
#[path = "../common/mod.rs"]
mod common;
use common::{root, vramlab};
use predicates::str::contains;
use serde_json::Value;
use std::path::Path;

const PEERS: &str = "results/peers/published.json";

fn report(args: &[&str]) -> Value {
    let out = vramlab()
        .args(["validate", PEERS, "--json"])
        .args(args)
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

fn peers() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(PEERS)).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn row<'a>(r: &'a Value, id: &str) -> &'a Value {
    r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == id)
        .unwrap_or_else(|| panic!("no row {id}"))
}

fn estimate(r: &Value, id: &str) -> u64 {
    row(r, id)["estimate_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{id} not estimated"))
}

fn fails_with(file: &Path, needle: &str) {
    let out = vramlab()
        .arg("validate")
        .arg(file)
        .assert()
        .code(2)
        .stderr(contains(file.display().to_string()))
        .stderr(contains(needle));
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The file with row `i`'s key `key` set to `value` (removed where `value` is `None`).
fn edited(dir: &Path, name: &str, i: usize, key: &str, value: Option<Value>) -> std::path::PathBuf {
    let mut rows = peers();
    let row = rows[i].as_object_mut().unwrap();
    match value {
        Some(v) => row.insert(key.into(), v),
        None => row.remove(key),
    };
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string(&rows).unwrap()).unwrap();
    path
}

/// The published counts of stabilityai/stable-diffusion-xl-base-1.0's components (also
/// asserted against the configs by tests/generate.rs `parameter_counts`).
const SDXL_UNET: u64 = 2_567_463_684;
const SDXL_TE: u64 = 123_060_480;
const SDXL_TE2: u64 = 694_659_840;
const SDXL_VAE: u64 = 83_653_863;

fn terms(r: &Value, id: &str) -> Vec<(String, u64)> {
    row(r, id)["terms"]
        .as_array()
        .unwrap_or_else(|| panic!("{id} not estimated"))
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn term(t: &[(String, u64)], name: &str) -> u64 {
    t.iter()
        .find(|x| x.0 == name)
        .unwrap_or_else(|| panic!("no term {name} in {t:?}"))
        .1
}

fn torch22_cache() -> std::path::PathBuf {
    let py = std::env::var("VRAMLAB_TORCH22_PYTHON")
        .expect("VRAMLAB_TORCH22_PYTHON: scripts/torch-env.sh --stack torch-2.2");
    // .../stacks/torch-2.2/venv/bin/python → the torch cache, four levels up.
    Path::new(&py).ancestors().nth(5).unwrap().to_path_buf()
}

mod emulated;
mod generation;
mod rows;
mod serving;
