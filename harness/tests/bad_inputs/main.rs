//! The bad-input corpus (`tests/bad-inputs/`, README there): every case runs the real binary
//! and must exit 2 with exactly one line on stderr that names the file and says what is wrong
//! (with the line and key where there is one), and must not panic.
#[path = "../common/mod.rs"]
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

// ---- model configs (through `synthetic:` sources) ----

// ---- safetensors ----

// ---- GGUF ----

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

// ---- CSV ----

fn fit(name: &str, needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let file = format!("{DIR}/{name}");
    let mut args = os(&["fit", &file, "--out"]);
    args.push(tmp.path().join("c.toml").into());
    fails(&args, &file, needle);
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

// ---- command-line values ----

/// A scenario file with `text`, in a temporary folder (kept alive by the first value).
fn inline_scenario(text: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let s = tmp.path().join("s.toml");
    std::fs::write(&s, text).unwrap();
    (tmp, s)
}

mod results;
mod scenario;
mod weights;
