//! `scripts/gpu/run.sh --rehearse`: the device run's pipeline on the CPU, into the layout the
//! device tool brings back: at most 8 files, each ≤ 16 MiB, at most two folders deep,
//! names of letters, digits, `.`, `_` and `-`; one archive with the candle CSV (ok rows for
//! inference and training) and its manifest; a status.txt saying what ran.
mod common;
use std::path::Path;
use std::process::Command;

fn files(dir: &Path, depth: usize, out: &mut Vec<(String, u64, usize)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = e.metadata().unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if meta.is_dir() {
            files(&e.path(), depth + 1, out);
        } else {
            out.push((name, meta.len(), depth));
        }
    }
}

/// Runs the rehearsal into a temporary $OUT, checks the device tool's limits on what comes
/// back, unpacks the archive; returns status.txt and the unpacked `gpu-run/` folder.
fn rehearse(torch_python: Option<&str>) -> (String, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(common::root().join("scripts/gpu/run.sh"))
        .arg("--rehearse")
        .current_dir(common::root())
        .env("OUT", out.path())
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
        .env("VRAMLAB_MODELS", common::models());
    match torch_python {
        Some(py) => cmd.env("VRAMLAB_TORCH_PYTHON", py),
        // No torch: the probe is skipped and status.txt says so.
        None => cmd.env("VRAMLAB_TORCH_PYTHON", "/nonexistent/python"),
    };
    let status = cmd.status().unwrap();
    let status_txt = std::fs::read_to_string(out.path().join("status.txt")).unwrap();
    assert!(status.success(), "{status_txt}");

    let mut all = Vec::new();
    files(out.path(), 0, &mut all);
    assert!(all.len() <= 8, "{all:?}");
    let total: u64 = all.iter().map(|f| f.1).sum();
    assert!(total <= 64 << 20);
    for (name, size, depth) in &all {
        assert!(*size <= 16 << 20, "{name}: {size} B");
        assert!(*depth <= 2, "{name} is {depth} folders deep");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
            "{name}"
        );
        assert!(!name.ends_with(".lock"), "{name}");
    }
    assert!(status_txt.contains("rehearse on cpu: ok"), "{status_txt}");
    assert!(
        status_txt.contains("sweep rehearse: exit 0"),
        "{status_txt}"
    );

    let unpacked = tempfile::tempdir().unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(out.path().join("gpu-run.tar.gz"))
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(tar.success());
    (status_txt, unpacked)
}

/// Every row ok, with inference (decode, total) and training (backward, step_total) rows.
fn check_rows(csv: &Path) {
    use vramlab::record::{Phase, Status};
    let rows = vramlab::export::csv::read(csv).unwrap();
    let ok = |p: Phase| {
        rows.iter()
            .any(|r| r.phase == Some(p) && r.status == Some(Status::Ok))
    };
    assert!(ok(Phase::Decode) && ok(Phase::Total), "inference rows");
    assert!(ok(Phase::Backward) && ok(Phase::StepTotal), "training rows");
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
}

#[test]
fn rehearsal_brings_back_everything_within_the_device_limits() {
    let (status_txt, unpacked) = rehearse(None);
    assert!(
        status_txt.contains("torch rehearse: skipped"),
        "{status_txt}"
    );
    let run = unpacked.path().join("gpu-run");
    for f in [
        "rehearse-candle.csv",
        "rehearse-candle.manifest.json",
        "status.txt",
        "run.log",
        "ldd.txt",
    ] {
        assert!(run.join(f).exists(), "{f} is not in the archive");
    }
    check_rows(&run.join("rehearse-candle.csv"));
}

/// With torch (scripts/test.sh runs it after scripts/torch-env.sh, with
/// VRAMLAB_TORCH_PYTHON set): the torch probe's CSV is in the archive, every row ok, and
/// `vramlab fit` accepts it.
#[test]
#[ignore = "needs the torch environment: VRAMLAB_TORCH_PYTHON=$(scripts/torch-env.sh)"]
fn rehearsal_with_the_torch_probe() {
    let py = std::env::var("VRAMLAB_TORCH_PYTHON")
        .expect("set VRAMLAB_TORCH_PYTHON=$(scripts/torch-env.sh)");
    let (status_txt, unpacked) = rehearse(Some(&py));
    assert!(
        status_txt.contains("torch rehearse: exit 0"),
        "{status_txt}"
    );
    let run = unpacked.path().join("gpu-run");
    let torch = run.join("rehearse-torch.csv");
    check_rows(&torch);
    common::vramlab()
        .arg("fit")
        .arg(&torch)
        .arg("--out")
        .arg(unpacked.path().join("torch.constants.toml"))
        .assert()
        .success();
}
