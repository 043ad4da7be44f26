//! Generation and fine-tuning sweeps shard, merge and honour `--capacity` as language-model
//! sweeps do, on the tiny SD pipeline (written as a synthetic diffusers directory): `--shard 1/2`
//! and `2/2` list disjoint point sets whose union is the unsharded dry run; both shards merged
//! give the unsharded run's point ids and allocated figures (each run measured here); a capacity
//! between the smallest and the largest point's peak (measured in the unsharded run) records the
//! larger points `oom`, keeps the smaller ones' figures, and the manifest says the capacity.
mod common;
use common::{stable, vramlab};
use std::path::{Path, PathBuf};
use vramlab::record::{Phase, Record, Status};

/// The tiny SD pipeline (f32) as a diffusers directory under `tmp`.
fn tiny_sd_dir(tmp: &Path) -> PathBuf {
    let dir = tmp.join("tiny-sd");
    let p = vramlab::model::diffusion::sd::Sd::new(
        common::tiny_sd(),
        candle_core::DType::F32,
        candle_core::DType::F32,
    );
    vramlab::workload::generate::write_synthetic(&p, &dir).unwrap();
    dir
}

/// A scenario over the tiny SD directory with the `[sweep]` lines `sweep`.
fn scenario(tmp: &Path, name: &str, sweep: &str) -> PathBuf {
    let sc = tmp.join(format!("{name}.toml"));
    std::fs::write(
        &sc,
        format!(
            "name = \"{name}\"\ndevice = \"cpu\"\n[model]\nsource = \"diffusers:{}\"\n[sweep]\n{sweep}",
            tiny_sd_dir(tmp).display()
        ),
    )
    .unwrap();
    sc
}

fn dry_run(sc: &Path, shard: Option<&str>) -> Vec<String> {
    let mut c = vramlab();
    c.args(["sweep", "--dry-run"]).arg(sc);
    if let Some(s) = shard {
        c.args(["--shard", s]);
    }
    String::from_utf8(common::ok_stdout(c.output().unwrap()))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `vramlab sweep` into `out` with `extra` flags; its stderr on failure.
fn sweep(sc: &Path, out: &Path, extra: &[&str]) {
    let o = vramlab()
        // One compute thread: every peak is reproducible.
        .env("RAYON_NUM_THREADS", "1")
        .args(["sweep", "--quiet"])
        .arg(sc)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    common::ok_stdout(o);
}

fn manifest(csv: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(csv.with_extension("manifest.json")).unwrap())
        .unwrap()
}

/// Shards partition the unsharded dry run; the merged shards equal the unsharded run; returns
/// the unsharded run's rows.
fn shards_merge(tmp: &Path, sc: &Path) -> Vec<Record> {
    let all = dry_run(sc, None);
    let (s1, s2) = (dry_run(sc, Some("1/2")), dry_run(sc, Some("2/2")));
    println!("{} points: shard 1 {s1:?}, shard 2 {s2:?}", all.len());
    assert!(all.len() >= 4, "{all:?}");
    assert!(!s1.is_empty() && !s2.is_empty(), "{s1:?} {s2:?}");
    assert!(s1.iter().all(|id| !s2.contains(id)), "{s1:?} {s2:?}");
    let mut union = [s1.clone(), s2.clone()].concat();
    union.sort();
    let mut want = all.clone();
    want.sort();
    assert_eq!(union, want);

    let full = tmp.join("full.csv");
    sweep(sc, &full, &[]);
    let shard_csvs: Vec<PathBuf> = (1..=2)
        .map(|k| {
            let out = tmp.join(format!("shard{k}.csv"));
            sweep(sc, &out, &["--shard", &format!("{k}/2")]);
            assert_eq!(manifest(&out)["shard"], format!("{k}/2"));
            assert_eq!(manifest(&out)["points"], [&s1, &s2][k - 1].len());
            out
        })
        .collect();
    // Each shard measured only its own points.
    let ids = |csv: &Path| {
        let mut v: Vec<String> = vramlab::export::csv::read(csv)
            .unwrap()
            .into_iter()
            .map(|r| r.point_id)
            .collect();
        v.dedup();
        v
    };
    assert_eq!(ids(&shard_csvs[0]), s1);
    assert_eq!(ids(&shard_csvs[1]), s2);
    let merged = tmp.join("merged.csv");
    let res = vramlab()
        .arg("merge")
        .arg(&merged)
        .args(&shard_csvs)
        .output()
        .unwrap();
    common::ok_stdout(res);
    let a = vramlab::export::csv::read(&full).unwrap();
    let b = vramlab::export::csv::read(&merged).unwrap();
    assert!(a.iter().all(|r| r.status == Some(Status::Ok)));
    assert_eq!(ids(&full), all, "the unsharded run in the grid's order");
    // Same rows in the grid's order, with identical point ids and allocated figures.
    assert_eq!(
        a.iter().map(stable).collect::<Vec<_>>(),
        b.iter().map(stable).collect::<Vec<_>>()
    );
    assert_eq!(manifest(&merged)["points"], all.len());
    a
}

/// Each point's peak (the highest `peak_allocated` of its rows), in run order.
fn peaks(rows: &[Record]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    for r in rows {
        let p = r.peak_allocated.unwrap_or(0);
        match v.last_mut() {
            Some((id, peak)) if *id == r.point_id => *peak = (*peak).max(p),
            _ => v.push((r.point_id.clone(), p)),
        }
    }
    v
}

/// A capacity halfway between the smallest and the largest point's peak: the points above it
/// are one `oom` row each (phase named, the sweep goes on, exit 0), the others keep every
/// figure of the run without a capacity; the manifest records the capacity.
fn capacity(tmp: &Path, sc: &Path, full: &[Record]) {
    let peaks = peaks(full);
    let lo = peaks.iter().map(|p| p.1).min().unwrap();
    let hi = peaks.iter().map(|p| p.1).max().unwrap();
    assert!(hi > 2 * lo, "{peaks:?}");
    let cap = lo + (hi - lo) / 2;
    println!("peaks {peaks:?}: capacity {cap} B");
    let out = tmp.join("cap.csv");
    sweep(sc, &out, &["--capacity", &cap.to_string()]);
    let rows = vramlab::export::csv::read(&out).unwrap();
    let m = manifest(&out);
    assert_eq!(m["capacity_bytes"], cap);
    let (mut oom, mut ok) = (0, 0);
    for (id, peak) in &peaks {
        let mine: Vec<&Record> = rows.iter().filter(|r| &r.point_id == id).collect();
        if *peak > cap {
            assert_eq!(mine.len(), 1, "{id}: {mine:?}");
            let r = mine[0];
            assert_eq!(r.status, Some(Status::Oom), "{id}: {}", r.message);
            assert!(r.phase.is_some() && r.phase != Some(Phase::Total), "{id}");
            assert!(
                r.message.contains(&format!("capacity {cap} B")),
                "{id}: {}",
                r.message
            );
            oom += 1;
        } else {
            let want: Vec<&Record> = full.iter().filter(|r| &r.point_id == id).collect();
            assert_eq!(
                mine.iter().map(|r| stable(r)).collect::<Vec<_>>(),
                want.iter().map(|r| stable(r)).collect::<Vec<_>>(),
                "{id}"
            );
            ok += 1;
        }
    }
    println!("capacity {cap} B: {ok} ok, {oom} oom");
    assert!(oom > 0 && ok > 0);
    assert_eq!(m["status_counts"]["oom"], oom);
    assert_eq!(m["status_counts"]["ok"], ok);
}

#[test]
fn generation_sweep_shards_merges_and_honours_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "gen",
        "mode = [\"generate\"]\nprecision = [\"f32\"]\nresolution = [\"64x64\", \"128x128\"]\nbatch = [1, 2]\ndenoise_steps = 2\n",
    );
    let full = shards_merge(tmp.path(), &sc);
    capacity(tmp.path(), &sc, &full);
}

#[test]
fn fine_tuning_sweep_shards_merges_and_honours_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "ft",
        "mode = [\"train\"]\nprecision = [\"f32\"]\nresolution = [\"32x32\", \"64x64\"]\nbatch = [1, 2]\ntrainable = [\"lora-r4\"]\noptimizer = [\"adamw\"]\ntrain_steps = 2\n",
    );
    let full = shards_merge(tmp.path(), &sc);
    capacity(tmp.path(), &sc, &full);
}
