//! Calibration bundles: a results folder (CSVs, manifests, constants, plots) packed into one
//! `.tar.gz` with a generated `REPORT.md` and a `SHA256SUMS` (sha256sum's format), and the
//! check that every file in a bundle still has the hash it was published with.
use crate::compare::{check_compatible, compare, index, render, Allow, Margins};
use crate::error::bad_file;
use crate::estimate::{estimate, resolve, Query};
use crate::export::csv::{read_table, Table};
use crate::fit::{fit_all, Constants, ErrStats};
use crate::units::{gb, gib};
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The presets whose estimates a report gives.
pub const PRESETS: [&str; 3] = ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"];

const PACKED: [&str; 6] = ["csv", "json", "toml", "svg", "png", "md"];

pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The files of a results folder a bundle carries (relative paths, sorted): CSVs, manifests,
/// constants, plots and notes, in the folder and its subfolders. Hidden files (locks) and a
/// previous REPORT.md / SHA256SUMS are left out.
pub fn collect(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let rd = std::fs::read_dir(dir).map_err(|e| bad_file(dir, format!("cannot read: {e}")))?;
        for e in rd {
            let p = e?.path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if name.starts_with('.') || name == "REPORT.md" || name == "SHA256SUMS" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out)?;
            } else if p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| PACKED.contains(&e))
            {
                out.push(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    if !out
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "csv"))
    {
        return Err(bad_file(dir, "no calibration CSV to bundle"));
    }
    Ok(out)
}

fn manifest_of(dir: &Path, csv: &Path) -> serde_json::Value {
    std::fs::read_to_string(dir.join(csv.with_extension("manifest.json")))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The generated REPORT.md: runs (device, runtime, versions), fit errors, preset estimates,
/// the candle-vs-torch table when both runtimes are present, and the sha256 of every file.
pub fn report(dir: &Path, name: &str, files: &[PathBuf]) -> Result<String> {
    let mut s = format!(
        "# vramlab calibration bundle `{name}`\n\nBuilt by vramlab {} (git {}) from `{}`. \
         Bytes: GB = 1e9, GiB = 2^30. Check the files with `vramlab bundle --verify {name}.tar.gz` \
         or, unpacked, `sha256sum -c SHA256SUMS`.\n\n",
        env!("CARGO_PKG_VERSION"),
        env!("VRAMLAB_GIT_REV"),
        dir.display()
    );
    let csvs: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    let mut tables: Vec<(&PathBuf, Table)> = Vec::new();
    for c in &csvs {
        tables.push((c, read_table(&dir.join(c))?));
    }

    s += "## Runs\n\nA run's source is `measured` (a device or the CPU) or `emulated` (the emulated GPU: \
          never a device's figures; fitted and compared apart).\n\n\
          | CSV | scenario hash | points | status | backend | device | source | runtime | vramlab (git) | rustc | candle | cudarc | CUDA driver / runtime | host |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (c, (_, t)) in csvs.iter().zip(&tables) {
        let source = if t.records.iter().any(|r| r.meter.is_emulated()) {
            "emulated"
        } else {
            "measured"
        };
        let m = manifest_of(dir, c);
        let v = &m["versions"];
        let st = |k: &str| m[k].as_str().unwrap_or("?").to_string();
        let vs = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let counts: Vec<String> = m["status_counts"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {source} | {} | {} ({}) | {} | {} | {} | {} / {} | {} ({} CPUs) |\n",
            c.display(),
            st("scenario_hash"),
            m["points"],
            counts.join(", "),
            st("backend"),
            st("device_name"),
            st("runtime"),
            vs("vramlab"),
            vs("git_rev"),
            vs("rustc"),
            vs("candle"),
            vs("cudarc"),
            vs("cuda_driver"),
            vs("cuda_runtime"),
            m["host"]["cpu"].as_str().unwrap_or("?"),
            m["host"]["cpus"],
        );
    }

    s += "\n## Fit errors\n\nHeld-out relative error of `vramlab fit` on each CSV (median, p95, worst row), \
          k-fold by point (5 folds) and leave-one-context-out.\n\n\
          | CSV | target | groups | k-fold by point | leave-one-context-out |\n|---|---|---|---|---|\n";
    for (c, t) in &tables {
        let rep = fit_all(&t.records, vec![c.display().to_string()], false, 5);
        for (target, (k, l)) in &rep.heldout {
            let line = |h: &[crate::fit::Heldout]| {
                ErrStats::of(h)
                    .map(|e| e.line())
                    .unwrap_or_else(|| "n/a (too few points)".into())
            };
            let groups = rep
                .constants
                .group
                .iter()
                .filter(|g| g.target.as_str() == *target)
                .count();
            s += &format!(
                "| {} | {target} | {groups} | {} | {} |\n",
                c.display(),
                line(k),
                line(l)
            );
        }
    }

    let constants: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".constants.toml"))
        .collect();
    s += "\n## Estimates\n\nInference, bf16, batch 1, context 4096, preallocated KV cache.\n\n\
          | preset | constants | total GB | total GiB | weights GiB | KV GiB | where the figures come from |\n|---|---|---|---|---|---|---|\n";
    let q = Query::default();
    let mut sets: Vec<(String, Option<Constants>)> = vec![("built-in analytic".into(), None)];
    for c in &constants {
        sets.push((
            c.display().to_string(),
            Some(Constants::load(&dir.join(c))?),
        ));
    }
    for preset in PRESETS {
        let m = resolve(preset)?.config;
        for (label, c) in &sets {
            let e = estimate(&m, &q, c.as_ref())?;
            let total = e.total()?;
            s += &format!(
                "| {preset} | {label} | {} | {} | {} | {} | {} |\n",
                gb(total),
                gib(total),
                gib(e.weights),
                gib(e.kv),
                e.source
            );
        }
    }

    s += "\n## Candle vs torch\n\n";
    let mut any = false;
    for (a, ta) in &tables {
        for (b, tb) in &tables {
            let runtime = |t: &Table| t.records.first().map(|r| r.meter.runtime());
            let (ra, rb) = (runtime(ta), runtime(tb));
            if (ra, rb)
                != (
                    Some(crate::vocab::Runtime::Candle),
                    Some(crate::vocab::Runtime::Torch),
                )
            {
                continue;
            }
            let allow = Allow {
                cross_runtime: true,
                ..Allow::default()
            };
            if check_compatible((a, ta), (b, tb), allow).is_err() {
                continue;
            }
            let ix = index(a, ta)?;
            let rep = compare(&ix, &tb.records, &Margins::default(), false);
            s += &render(
                &rep,
                &format!("{} (candle) vs {} (torch)", a.display(), b.display()),
                40,
                true,
                true,
            );
            any = true;
        }
    }
    if !any {
        s += "No torch CSV of the same scenario in this bundle.\n";
    }

    s += "\n## Files\n\n| sha256 | bytes | file |\n|---|---|---|\n";
    for f in files {
        let bytes = std::fs::read(dir.join(f)).map_err(|e| bad_file(dir.join(f), e))?;
        s += &format!(
            "| {} | {} | {} |\n",
            sha256_hex(&bytes),
            bytes.len(),
            f.display()
        );
    }
    Ok(s)
}

fn append(tar: &mut tar::Builder<impl std::io::Write>, path: &str, bytes: &[u8]) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0); // reproducible: the same inputs give the same archive
    h.set_cksum();
    tar.append_data(&mut h, path, bytes)
        .with_context(|| format!("adding {path}"))?;
    Ok(())
}

/// Packs `dir` into `out` (`NAME.tar.gz`, entries under `NAME/`). Returns the file count.
pub fn pack(dir: &Path, out: &Path) -> Result<usize> {
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tar.gz"))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad_file(out, "the bundle's name must end in .tar.gz"))?
        .to_string();
    let files = collect(dir)?;
    let report = report(dir, &name, &files)?;
    let mut sums = String::new();
    let f = std::fs::File::create(out).map_err(|e| bad_file(out, format!("cannot create: {e}")))?;
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::best());
    let mut tar = tar::Builder::new(gz);
    for p in &files {
        let bytes = std::fs::read(dir.join(p))?;
        let rel = p.to_string_lossy().replace('\\', "/");
        sums += &format!("{}  {rel}\n", sha256_hex(&bytes));
        append(&mut tar, &format!("{name}/{rel}"), &bytes)?;
    }
    sums += &format!("{}  REPORT.md\n", sha256_hex(report.as_bytes()));
    append(&mut tar, &format!("{name}/REPORT.md"), report.as_bytes())?;
    append(&mut tar, &format!("{name}/SHA256SUMS"), sums.as_bytes())?;
    tar.into_inner()?.finish()?.sync_all()?;
    Ok(files.len() + 2)
}

/// What `--verify` found on a sound bundle.
#[derive(Debug)]
pub struct Verified {
    pub files: usize,
    pub archive_sha256: String,
}

/// Checks every file of a bundle against `SHA256SUMS` and the table of `REPORT.md`. A file
/// missing, unlisted or with another hash is an error naming it.
pub fn verify(path: &Path) -> Result<Verified> {
    let raw = std::fs::read(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&raw[..]));
    let not_bundle =
        |e: std::io::Error| bad_file(path, format!("not a vramlab bundle (.tar.gz): {e}"));
    for e in ar.entries().map_err(not_bundle)? {
        let mut e = e.map_err(not_bundle)?;
        let name = e.path().map_err(not_bundle)?.to_string_lossy().to_string();
        let rel = name
            .split_once('/')
            .map(|(_, r)| r.to_string())
            .unwrap_or(name);
        let mut b = Vec::new();
        e.read_to_end(&mut b).map_err(not_bundle)?;
        entries.insert(rel, b);
    }
    let sums = entries
        .get("SHA256SUMS")
        .ok_or_else(|| bad_file(path, "not a vramlab bundle: no SHA256SUMS"))?;
    let sums = String::from_utf8_lossy(sums).to_string();
    let mut listed: BTreeMap<String, String> = BTreeMap::new();
    for l in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (h, f) = l
            .split_once("  ")
            .ok_or_else(|| bad_file(path, format!("SHA256SUMS: malformed line `{l}`")))?;
        listed.insert(f.to_string(), h.to_string());
    }
    // REPORT.md's table must agree with SHA256SUMS.
    let report = String::from_utf8_lossy(
        entries
            .get("REPORT.md")
            .map(Vec::as_slice)
            .unwrap_or_default(),
    )
    .to_string();
    for l in report
        .lines()
        .filter(|l| l.starts_with("| ") && l.len() > 70)
    {
        let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
        if let [h, _, f] = cells[..] {
            if h.len() == 64 && listed.get(f).is_some_and(|x| x != h) {
                anyhow::bail!(
                    "{}: {f}: REPORT.md and SHA256SUMS give different hashes",
                    path.display()
                );
            }
        }
    }
    for (f, h) in &listed {
        let b = entries.get(f).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: {f} is listed in SHA256SUMS but missing",
                path.display()
            )
        })?;
        let got = sha256_hex(b);
        if &got != h {
            anyhow::bail!(
                "{}: {f}: sha256 {got} does not match the published {h} (the file was modified)",
                path.display()
            );
        }
    }
    if let Some(f) = entries
        .keys()
        .find(|f| *f != "SHA256SUMS" && !listed.contains_key(*f))
    {
        anyhow::bail!(
            "{}: {f} is in the bundle but not in SHA256SUMS",
            path.display()
        );
    }
    Ok(Verified {
        files: listed.len(),
        archive_sha256: sha256_hex(&raw),
    })
}
