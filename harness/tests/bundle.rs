//! `vramlab bundle`: pack results/cpu, check REPORT.md and the hashes against an independent
//! sha256, then `--verify` a sound bundle (exit 0) and tampered ones (exit 1, naming the file).
mod common;
use common::{root, vramlab};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

fn entries(p: &Path) -> Vec<(String, Vec<u8>)> {
    let f = std::fs::File::open(p).unwrap();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().to_string();
            let mut b = Vec::new();
            e.read_to_end(&mut b).unwrap();
            (name, b)
        })
        .collect()
}

fn repack(p: &Path, files: &[(String, Vec<u8>)]) {
    let gz = flate2::write::GzEncoder::new(std::fs::File::create(p).unwrap(), Default::default());
    let mut t = tar::Builder::new(gz);
    for (name, b) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(b.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, name, &b[..]).unwrap();
    }
    t.into_inner().unwrap().finish().unwrap();
}

#[test]
fn bundle_report_hashes_and_verify() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("cpu-calibration.tar.gz");
    vramlab()
        .args(["bundle", "results/cpu", "--out"])
        .arg(&out)
        .assert()
        .success();
    let files = entries(&out);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    // Every file of results/cpu (plots/ included), as paths relative to it.
    let mut src: Vec<String> = Vec::new();
    let mut dirs = vec![root().join("results/cpu")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else {
                let rel = p.strip_prefix(root().join("results/cpu")).unwrap();
                src.push(rel.to_string_lossy().to_string());
            }
        }
    }
    for n in &src {
        assert!(
            names.contains(&format!("cpu-calibration/{n}").as_str()),
            "{n} missing: {names:?}"
        );
    }
    let report = String::from_utf8(
        files
            .iter()
            .find(|(n, _)| n == "cpu-calibration/REPORT.md")
            .unwrap()
            .1
            .clone(),
    )
    .unwrap();
    for section in [
        "## Runs",
        "## Fit errors",
        "## Estimates",
        "## Candle vs torch",
        "## Files",
    ] {
        assert!(report.contains(section), "{section}");
    }
    for p in ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"] {
        assert!(report.contains(&format!("| {p} |")), "{p}");
    }
    assert!(report.contains("candle-0.11"), "runtime missing");
    // Every packed file's sha256, computed here, is in the report and in SHA256SUMS.
    let sums = String::from_utf8(
        files
            .iter()
            .find(|(n, _)| n.ends_with("/SHA256SUMS"))
            .unwrap()
            .1
            .clone(),
    )
    .unwrap();
    for n in &src {
        let bytes = std::fs::read(root().join("results/cpu").join(n)).unwrap();
        let h = format!("{:x}", Sha256::digest(&bytes));
        assert!(
            report.contains(&format!("| {h} | {} | {n} |", bytes.len())),
            "{n}"
        );
        assert!(sums.contains(&format!("{h}  {n}\n")), "{n}");
    }

    vramlab()
        .args(["bundle", "--verify"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicates::str::contains(format!(
            "{} files verified",
            src.len() + 1
        )));

    // One byte of a CSV changed.
    let mut tampered = files.clone();
    let i = tampered
        .iter()
        .position(|(n, _)| n.ends_with(".csv"))
        .unwrap();
    let b = &mut tampered[i].1;
    let at = b.len() / 2;
    b[at] = if b[at] == b'1' { b'2' } else { b'1' };
    let bad = d.path().join("bad.tar.gz");
    repack(&bad, &tampered);
    let res = vramlab()
        .args(["bundle", "--verify"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let name = tampered[i].0.split_once('/').unwrap().1;
    assert!(err.contains(&format!("{name}: sha256")), "{err}");

    // A file added after publication.
    let mut added = files.clone();
    added.push(("cpu-calibration/extra.csv".into(), b"x\n".to_vec()));
    repack(&bad, &added);
    let res = vramlab()
        .args(["bundle", "--verify"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(res.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&res.stderr)
        .contains("extra.csv is in the bundle but not in SHA256SUMS"));

    // Not a bundle at all: bad input.
    let junk = d.path().join("junk.tar.gz");
    std::fs::write(&junk, b"not gzip").unwrap();
    let res = vramlab()
        .args(["bundle", "--verify"])
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(res.status.code(), Some(2));
}
