//! `vramlab plot` renders every kind of figure from fixture CSVs (the committed CPU results, a
//! torch CSV made from them, the committed constants): each SVG is well-formed XML and holds
//! its series names; each PNG is a PNG.
mod common;
use common::{root, vramlab};
use std::path::Path;

/// A torch probe CSV of the same points: the probe's meter and signature, 10% more.
fn torch_csv(dir: &Path) -> std::path::PathBuf {
    let mut rd = csv::Reader::from_path(root().join("results/cpu/cpu-smollm2.csv")).unwrap();
    let headers = rd.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let p = dir.join("torch.csv");
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(&headers).unwrap();
    for row in rd.records() {
        let mut row: Vec<String> = row.unwrap().iter().map(str::to_string).collect();
        row[col("vramlab_version")] = "torch_probe".into();
        row[col("meter")] = "cpu-preload".into();
        let i = col("peak_allocated");
        if let Ok(v) = row[i].parse::<u64>() {
            row[i] = (v + v / 10).to_string();
        }
        w.write_record(&row).unwrap();
    }
    w.flush().unwrap();
    p
}

#[test]
fn every_kind_renders_as_svg_and_png() {
    let d = tempfile::tempdir().unwrap();
    let torch = torch_csv(d.path());
    let out = d.path().join("plots");
    let res = vramlab()
        .args([
            "plot",
            "results/cpu/cpu-smollm2.csv",
            "results/cpu/cpu-train-smollm2.csv",
            "--constants",
            "results/cpu/cpu-smollm2.constants.toml",
            "--out",
        ])
        .arg(&out)
        .arg(&torch)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let smol = "SmolLM2-135M-Instruct.Q4_1";
    let expect: [(&str, &[&str]); 6] = [
        (
            "-candle-cpu-context",
            &["f32 preallocated", "bf16 growing", "context (tokens)"],
        ),
        (
            "-candle-cpu-batch",
            &["f16 preallocated", "batch (sequences)"],
        ),
        (
            "-candle-cpu-kv-curve",
            &[
                "allocated (growing)",
                "reserved (growing)",
                "allocated (preallocated)",
            ],
        ),
        (
            "-candle-cpu-train-phases",
            &["resident at step start", "forward", "backward", "optimizer"],
        ),
        (
            "-candle-cpu-parity",
            &[
                "predicted = measured",
                "+1%",
                "-1%",
                "+5%",
                "-5%",
                "total",
                "decode",
            ],
        ),
        ("-candle-vs-torch", &["candle", "torch", "prefill"]),
    ];
    for (suffix, names) in expect {
        let stem = format!("{smol}{suffix}");
        let svg = std::fs::read_to_string(out.join(format!("{stem}.svg")))
            .unwrap_or_else(|e| panic!("{stem}.svg: {e}"));
        let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{stem}.svg: {e}"));
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        for n in names {
            assert!(
                texts.iter().any(|t| t.trim() == *n),
                "{stem}.svg lacks `{n}`: {texts:?}"
            );
        }
        assert!(texts.iter().any(|t| t.contains("GiB")), "{stem}: axis unit");
        if !suffix.contains("torch") {
            assert!(
                texts
                    .iter()
                    .any(|t| t.contains(&format!("{smol} · candle · cpu · "))),
                "{stem}: title"
            );
        }
        let png = std::fs::read(out.join(format!("{stem}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png");
    }
}

/// The generation figures from the committed SD 1.5 CSV: each point's stack is as high as its
/// largest phase peak (the `total` row's peak), and the decode series hold every decode row's
/// peak over its baseline at the batch's output pixels.
#[test]
fn generation_figures_add_up_to_the_rows() {
    use vramlab::plot::{figures, Chart, Kind};
    use vramlab::record::Phase;
    let path = root().join("results/cpu/cpu-sd15.csv");
    let table = vramlab::export::csv::read_table(&path).unwrap();
    let figs = figures(std::slice::from_ref(&table), None);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let phases = figs.iter().find(|f| f.kind == Kind::GenPhases).unwrap();
    let Chart::Bars { series, .. } = &phases.chart else {
        panic!("bars")
    };
    let totals: Vec<u64> = table
        .records
        .iter()
        .filter(|r| r.phase == Some(Phase::Total))
        .map(|r| r.peak_allocated.unwrap())
        .collect();
    assert_eq!(series[0].1.len(), totals.len());
    for (i, total) in totals.iter().enumerate() {
        let height: f64 = series.iter().map(|s| s.1[i]).sum();
        assert!((height - gib(*total)).abs() < 1e-9, "point {i}");
    }
    let decode = figs.iter().find(|f| f.kind == Kind::DecodePixels).unwrap();
    let Chart::Xy(lines) = &decode.chart else {
        panic!("xy")
    };
    let n: usize = lines.iter().map(|s| s.points.len()).sum();
    let rows: Vec<_> = table
        .records
        .iter()
        .filter(|r| r.phase == Some(Phase::VaeDecode))
        .collect();
    assert_eq!(n, rows.len());
    for r in rows {
        let name = format!("{} {}", r.precision, r.vae_decode.unwrap());
        let x = (r.resolution.unwrap().pixels() as u64 * r.batch) as f64 / 1e6;
        let y = gib(r.peak_allocated.unwrap() - r.baseline_allocated.unwrap());
        let s = lines.iter().find(|s| s.name == name).unwrap();
        assert!(s.points.iter().any(|p| p.0 == x && (p.1 - y).abs() < 1e-12));
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("plots");
    vramlab()
        .args(["plot", "results/cpu/cpu-sd15.csv", "--out"])
        .arg(&out)
        .assert()
        .success();
    for kind in ["gen-phases", "decode-pixels"] {
        let svg = std::fs::read_to_string(out.join(format!("sd15-candle-cpu-{kind}.svg"))).unwrap();
        assert!(
            svg.contains("vae_decode") || svg.contains("f32 full"),
            "{kind}"
        );
        assert!(out.join(format!("sd15-candle-cpu-{kind}.png")).exists());
    }
}
