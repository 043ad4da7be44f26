//! `estimate` speed: one query from a config.json on disk (< 1 ms), and a 100,000-point
//! (batch × context) grid of estimates from a resolved model (< 1 s).
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use vramlab::estimate::{estimate, gpu_fit, resolve, Mode, Precision, Query};

fn from_config(c: &mut Criterion) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/presets/llama-3.1-8b/config.json"
    );
    let q = Query {
        mode: Mode::Train,
        precision: Precision::MixedBf16,
        ..Query::default()
    };
    c.bench_function("estimate from config.json (+ h100-80 fit search)", |b| {
        b.iter(|| {
            let m = resolve(black_box(path)).unwrap().config;
            let e = estimate(&m, &q, None).unwrap();
            let g = gpu_fit(&m, &q, None, "h100-80", 80_000_000_000, 0.1).unwrap();
            black_box((e.total(), g.largest_batch))
        })
    });
}

fn grid(c: &mut Criterion) {
    let m = resolve("llama-3.1-8b").unwrap().config;
    c.bench_function("estimate 100,000-point grid", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for batch in 1..=100u64 {
                for k in 1..=1000u64 {
                    let q = Query {
                        batch,
                        context: 128 * k,
                        ..Query::default()
                    };
                    let total = estimate(&m, black_box(&q), None).and_then(|e| e.total());
                    sum = sum.wrapping_add(total.unwrap());
                }
            }
            black_box(sum)
        })
    });
}

criterion_group!(benches, from_config, grid);
criterion_main!(benches);
