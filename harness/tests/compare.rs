//! `vramlab compare` on crafted CSV pairs: exit codes, margins,
//! one-sided points, schema checks, the refreshed baseline and the cross-runtime table.
mod common;
use common::vramlab;
use std::path::{Path, PathBuf};
use vramlab::record::{Phase, Record, Status, SCHEMA_VERSION};
use vramlab::vocab::{Backend, MeterKind, Mode, Precision};

const GIB: u64 = 1 << 30;
const MB: u64 = 1_000_000;

/// Three CUDA points of an inference sweep, with prefill, one decode row and total.
fn rows(backend: Backend) -> Vec<Record> {
    let mut out = Vec::new();
    for (i, b) in [1u64, 2, 4].iter().enumerate() {
        for (phase, step) in [
            (Phase::Prefill, None),
            (Phase::Decode, Some(1)),
            (Phase::Total, None),
        ] {
            let peak = 10 * GIB + i as u64 * GIB + step.unwrap_or(0) * 4096;
            out.push(Record {
                schema_version: SCHEMA_VERSION,
                point_id: format!("m/infer/bf16/b{b}/c4096/preallocated/r0"),
                backend,
                device_name: if backend == Backend::Cuda {
                    "NVIDIA H200"
                } else {
                    "cpu"
                }
                .into(),
                vramlab_version: "0.1.0".into(),
                scenario_hash: "abc123".into(),
                mode: Mode::Infer,
                precision: Precision::Bf16,
                batch: *b,
                context: 4096,
                phase: Some(phase),
                step,
                peak_allocated: Some(peak),
                end_allocated: Some(peak - GIB / 2),
                peak_reserved: Some(peak + GIB / 4),
                device_used: Some(peak + GIB),
                status: Some(Status::Ok),
                ..Default::default()
            });
        }
    }
    out
}

fn write(dir: &Path, name: &str, rows: &[Record]) -> PathBuf {
    let p = dir.join(name);
    let mut w = csv::Writer::from_path(&p).unwrap();
    for r in rows {
        w.serialize(r).unwrap();
    }
    w.flush().unwrap();
    p
}

/// Scales one metric of one row (index) by `factor`.
fn bump(rows: &mut [Record], i: usize, factor: f64) {
    let v = rows[i].peak_allocated.unwrap();
    rows[i].peak_allocated = Some((v as f64 * factor).round() as u64);
}

fn run(args: &[&Path], flags: &[&str]) -> (i32, String, String) {
    let out = vramlab().args(args).args(flags).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compare(base: &Path, new: &Path, flags: &[&str]) -> (i32, String, String) {
    run(&[Path::new("compare"), base, new], flags)
}

#[test]
fn equal_files_pass() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    let b = write(d.path(), "b.csv", &rows(Backend::Cuda));
    let (code, out, err) = compare(&a, &b, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("9 joined rows: 0 regression(s)"), "{out}");
}

#[test]
fn cuda_allocated_margin_is_half_a_percent() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    let mut r = rows(Backend::Cuda);
    bump(&mut r, 4, 1.003);
    let b = write(d.path(), "b.csv", &r);
    let (code, out, err) = compare(&a, &b, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("+0.30%") && out.contains("within margin"),
        "{out}"
    );

    let mut r = rows(Backend::Cuda);
    bump(&mut r, 4, 1.02);
    bump(&mut r, 7, 1.003);
    let c = write(d.path(), "c.csv", &r);
    let (code, out, err) = compare(&a, &c, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("1 regression(s)"), "{err}");
    // Worst first: the +2% row leads, in GB and GiB, with its signed percentage.
    let first = out.lines().nth(3).unwrap();
    assert!(first.contains("b2/") && first.contains("decode"), "{out}");
    assert!(
        first.contains("+2.00%") && first.contains("REGRESSION"),
        "{out}"
    );
    let delta =
        (r[4].peak_allocated.unwrap() - rows(Backend::Cuda)[4].peak_allocated.unwrap()) as f64;
    assert!(first.contains(&format!("{:+.3}", delta / 1e9)), "{first}");
    assert!(
        first.contains(&format!("{:+.3}", delta / GIB as f64)),
        "{first}"
    );

    // A --tolerance override lets it through.
    let (code, _, err) = compare(&a, &c, &["--tolerance", "peak_allocated=3,2MiB"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn cpu_allocated_is_exact() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cpu));
    let mut r = rows(Backend::Cpu);
    r[0].end_allocated = Some(r[0].end_allocated.unwrap() + 1);
    let b = write(d.path(), "b.csv", &r);
    let (code, out, _) = compare(&a, &b, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("end_allocated") && out.contains("REGRESSION"),
        "{out}"
    );
    // RSS moves within its wider margin, device_used (the machine) is not gated.
    let mut r = rows(Backend::Cpu);
    r[0].peak_reserved = Some(r[0].peak_reserved.unwrap() + (1 << 20));
    r[0].device_used = Some(r[0].device_used.unwrap() * 2);
    let c = write(d.path(), "c.csv", &r);
    let (code, out, _) = compare(&a, &c, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("not gated") && out.contains("within margin"),
        "{out}"
    );
}

#[test]
fn improvements_pass_unless_told_to_fail() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    let mut r = rows(Backend::Cuda);
    bump(&mut r, 2, 0.95);
    let b = write(d.path(), "b.csv", &r);
    let (code, out, _) = compare(&a, &b, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("-5.00%") && out.contains("improvement"),
        "{out}"
    );
    let (code, _, err) = compare(&a, &b, &["--fail-on-improvement"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1 improvement(s) (--fail-on-improvement)"),
        "{err}"
    );
}

#[test]
fn one_sided_points_are_listed() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    let mut r = rows(Backend::Cuda);
    r.truncate(6);
    let mut extra = r[0].clone();
    extra.point_id = "m/infer/bf16/b8/c4096/preallocated/r0".into();
    r.push(extra);
    let b = write(d.path(), "b.csv", &r);
    let (code, out, err) = compare(&a, &b, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("only in the baseline: m/infer/bf16/b4/c4096/preallocated/r0 (3 rows)"),
        "{out}"
    );
    assert!(
        out.contains("only in the new: m/infer/bf16/b8/c4096/preallocated/r0 (1 rows)"),
        "{out}"
    );
    assert!(err.contains("1 baseline point(s) missing"), "{err}");
}

fn one_line_code_2(res: (i32, String, String), needle: &str) {
    let (code, out, err) = res;
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

#[test]
fn unusable_inputs_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    // A schema mismatch: a column dropped.
    let text = std::fs::read_to_string(&a).unwrap();
    let col = text
        .lines()
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "non_pool")
        .unwrap();
    let cut: String = text
        .lines()
        .map(|l| {
            let mut f: Vec<&str> = l.split(',').collect();
            f.remove(col);
            f.join(",") + "\n"
        })
        .collect();
    let b = d.path().join("b.csv");
    std::fs::write(&b, cut).unwrap();
    one_line_code_2(compare(&a, &b, &[]), "missing field `non_pool`");
    // A schema mismatch: a column the baseline does not have.
    let extra: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{l},{}\n", if i == 0 { "sequence_parallel" } else { "1" }))
        .collect();
    let x = d.path().join("x.csv");
    std::fs::write(&x, extra).unwrap();
    one_line_code_2(compare(&a, &x, &[]), "schema mismatch");
    // A newer schema version than this build reads.
    let v = d.path().join("v.csv");
    let bumped = text.replacen(&format!("\n{SCHEMA_VERSION},"), "\n99,", 1);
    std::fs::write(&v, bumped).unwrap();
    one_line_code_2(compare(&a, &v, &[]), "schema_version `99`");
    // Another scenario.
    let mut r = rows(Backend::Cuda);
    r.iter_mut().for_each(|r| r.scenario_hash = "def456".into());
    let s = write(d.path(), "s.csv", &r);
    one_line_code_2(compare(&a, &s, &[]), "scenario hash");
    assert_eq!(compare(&a, &s, &["--allow-scenario-change"]).0, 0);
    // Another device.
    let mut r = rows(Backend::Cuda);
    r.iter_mut()
        .for_each(|r| r.device_name = "NVIDIA H100".into());
    let g = write(d.path(), "g.csv", &r);
    one_line_code_2(compare(&a, &g, &[]), "backend/device");
    assert_eq!(compare(&a, &g, &["--allow-device-change"]).0, 0);
    one_line_code_2(
        compare(&a, &g, &["--tolerance", "peak_allocated=x"]),
        "percentage",
    );
    one_line_code_2(
        compare(&a, &d.path().join("missing.csv"), &[]),
        "missing.csv",
    );
}

#[test]
fn write_baseline_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let base = rows(Backend::Cuda);
    let a = write(d.path(), "a.csv", &base);
    let mut r = rows(Backend::Cuda);
    bump(&mut r, 1, 1.001); // under a third of 0.5%: the baseline keeps its row
    bump(&mut r, 4, 1.003); // beyond a third: refreshed
    bump(&mut r, 7, 1.02); // a regression: refreshed
    let b = write(d.path(), "b.csv", &r);
    let next = d.path().join("next.csv");
    let (code, _, err) = compare(&a, &b, &["--write-baseline", next.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    let written = vramlab::export::csv::read(&next).unwrap();
    assert_eq!(written.len(), r.len());
    for (i, w) in written.iter().enumerate() {
        let want = if [4, 7].contains(&i) { &r[i] } else { &base[i] };
        assert_eq!(w, want, "row {i}");
    }
    // The new run passes against the refreshed baseline, and the refreshed baseline is stable.
    assert_eq!(compare(&next, &b, &[]).0, 0);
    let again = d.path().join("again.csv");
    let (code, _, _) = compare(&next, &b, &["--write-baseline", again.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(
        std::fs::read_to_string(&next).unwrap(),
        std::fs::read_to_string(&again).unwrap()
    );
}

#[test]
fn markdown_and_json_reports() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.csv", &rows(Backend::Cuda));
    let mut r = rows(Backend::Cuda);
    bump(&mut r, 4, 1.02);
    r[8].status = Some(Status::Oom);
    let b = write(d.path(), "b.csv", &r);
    let (code, out, _) = compare(&a, &b, &["--markdown"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("| point | phase |") && out.contains("|---|"),
        "{out}"
    );
    assert!(out.contains("- status m/infer/bf16/b4"), "{out}");
    let (code, out, _) = compare(&a, &b, &["--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["regressions"], 2);
    assert_eq!(v["changes"][0]["verdict"], "regression");
    assert_eq!(v["changes"][0]["metric"], "peak_allocated");
    let delta = r[4].peak_allocated.unwrap() - rows(Backend::Cuda)[4].peak_allocated.unwrap();
    assert_eq!(v["changes"][0]["delta"], delta);
    assert_eq!(v["status_changes"][0]["new"], "oom");
}

#[test]
fn cross_runtime_reads_a_torch_csv_with_extra_columns() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "candle.csv", &rows(Backend::Cuda));
    let mut r = rows(Backend::Cuda);
    // The torch probe's rows on a GPU: its own meter.
    r.iter_mut().for_each(|r| {
        r.vramlab_version = "torch_probe".into();
        r.meter = MeterKind::TorchCuda;
    });
    bump(&mut r, 0, 1.10);
    let t = write(d.path(), "torch.csv", &r);
    // A torch CSV of a newer layout: an extra column at the end.
    let text = std::fs::read_to_string(&t).unwrap();
    let with_runtime: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{l},{}\n", if i == 0 { "runtime" } else { "torch-2.11" }))
        .collect();
    std::fs::write(&t, with_runtime).unwrap();
    one_line_code_2(compare(&a, &t, &[]), "--cross-runtime");
    let (code, out, err) = compare(&a, &t, &["--cross-runtime"]);
    assert_eq!(code, 0, "{out}{err}");
    let first = out.lines().nth(3).unwrap();
    assert!(first.contains("b1/") && first.contains("+10.00%"), "{out}");
    one_line_code_2(
        compare(&a, &a, &["--cross-runtime"]),
        "both files are candle",
    );
}

/// Generation rows: a `load` row per component joins on its component, and the
/// cross-runtime table keeps NEW's row order, with each phase's own peak (`phase_peak`).
#[test]
fn generation_rows_join_per_component_and_phase() {
    use vramlab::vocab::Component;
    let d = tempfile::tempdir().unwrap();
    let point = "sd15/generate/f32/256x256/b1/cfg/full";
    let mut base = Vec::new();
    let mut at = 0u64;
    for (phase, component, step, add) in [
        (Phase::Load, Some(Component::TextEncoder), None, 492 * MB),
        (Phase::Load, Some(Component::Unet), None, 3_438 * MB),
        (Phase::Load, Some(Component::Vae), None, 335 * MB),
        (Phase::Denoise, None, Some(1), 176 * MB),
        (Phase::VaeDecode, None, None, 369 * MB),
    ] {
        base.push(Record {
            schema_version: SCHEMA_VERSION,
            point_id: point.into(),
            backend: Backend::Cpu,
            device_name: "cpu".into(),
            scenario_hash: "abc123".into(),
            mode: Mode::Generate,
            phase: Some(phase),
            component,
            step,
            baseline_allocated: Some(at),
            peak_allocated: Some(at + add),
            end_allocated: Some(if phase == Phase::Load { at + add } else { at }),
            status: Some(Status::Ok),
            ..Default::default()
        });
        if phase == Phase::Load {
            at += add;
        }
    }
    let a = write(d.path(), "candle.csv", &base);
    // The same file gates cleanly: three load rows are three keys.
    let (code, out, err) = compare(&a, &a, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let mut torch = base.clone();
    for r in &mut torch {
        r.vramlab_version = "torch_probe".into();
        r.meter = MeterKind::CpuPreload;
        // torch's process starts 149 MB higher; its decode adds 254 MB instead of 369 MB.
        let shift = 149 * MB;
        let add = r.peak_allocated.unwrap() - r.baseline_allocated.unwrap();
        let add = if r.phase == Some(Phase::VaeDecode) {
            254 * MB
        } else {
            add
        };
        r.baseline_allocated = Some(r.baseline_allocated.unwrap() + shift);
        r.peak_allocated = Some(r.baseline_allocated.unwrap() + add);
        r.end_allocated = Some(r.end_allocated.unwrap() + shift);
    }
    let t = write(d.path(), "torch.csv", &torch);
    let (code, out, err) = compare(
        &a,
        &t,
        &["--cross-runtime", "--metric", "phase_peak", "--top", "100"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(point)).collect();
    // Only the decode's own peak differs; the table shows it by phase.
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].contains("vae_decode") && lines[0].contains("-31.17%"),
        "{out}"
    );
    let (code, out, _) = compare(&a, &t, &["--cross-runtime", "--metric", "peak_allocated"]);
    assert_eq!(code, 0);
    let phases: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with(point))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        phases,
        ["load", "load", "load", "denoise", "vae_decode"],
        "{out}"
    );
    assert!(out.contains("load unet"), "{out}");
    one_line_code_2(
        compare(&a, &t, &["--cross-runtime", "--metric", "bogus"]),
        "--metric `bogus`",
    );
    one_line_code_2(
        compare(&a, &a, &["--metric", "phase_peak"]),
        "--metric `phase_peak`",
    );
}
