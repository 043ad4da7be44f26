//! What candle's quantized matmul allocates on CPU (candle 0.11.1), exactly: the weight is
//! never dequantized; the activations are quantized into a per-thread scratch buffer
//! (`k_quants::matmul`'s `LHS_SCRATCH`, Q8_1 blocks of 36 B per 32 inputs for a Q4_1 weight)
//! that only grows and is kept; bf16 activations are widened to f32 and the product is made
//! in f32, then narrowed. No libtest harness (`harness = false`): one thread, so every
//! figure is exact.
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use vramlab::meter::{cpu::CpuMeter, measure, PhaseMemory};

const N: usize = 1536;
const K: usize = 576;
/// size_of Q8_1 block (f16 d, f16 s, 32 i8): the vec-dot type of Q4_1.
const Q8_1: usize = 36;

fn matmul(w: &QMatMul, m: usize, dtype: DType) -> PhaseMemory {
    let x = Tensor::ones((m, K), dtype, &Device::Cpu).unwrap();
    let mut meter = CpuMeter::new();
    let (y, mem, _) = measure(&mut meter, || Ok(w.forward(&x)?)).unwrap();
    assert_eq!(y.dims(), [m, N]);
    drop(y);
    mem
}

fn main() {
    let dev = Device::Cpu;
    let dense = Tensor::randn(0f32, 1.0, (N, K), &dev).unwrap();
    let q = QTensor::quantize(&dense, GgmlDType::Q4_1).unwrap();
    assert_eq!(q.storage_size_in_bytes(), N * K / 32 * 20);
    let w = QMatMul::from_qtensor(q).unwrap();
    // Warm up: the worker pool, and the scratch at 16 rows.
    matmul(&w, 16, DType::F32);

    // f32, warmed: the output is the only allocation (its f32 bytes and a tensor's
    // metadata); nothing of the weight's size, no transient.
    let m = 16;
    let mem = matmul(&w, m, DType::F32);
    let out = (m * N * 4) as u64;
    let end = mem.end_allocated - mem.baseline_allocated;
    println!(
        "f32 m={m}: peak-baseline {} end-baseline {end}",
        mem.peak_allocated - mem.baseline_allocated
    );
    assert_eq!(
        mem.peak_allocated, mem.end_allocated,
        "no transient beyond the output"
    );
    assert!(
        end >= out && end - out <= 512,
        "output {out} + metadata, got {end}"
    );

    // More rows: the scratch grows to m × (K/32) Q8_1 blocks and stays.
    let m2 = 64;
    let mem = matmul(&w, m2, DType::F32);
    let grown = (mem.end_allocated - mem.baseline_allocated) as i64
        - end as i64
        - ((m2 - m) * N * 4) as i64;
    println!(
        "f32 m={m2}: peak-baseline {} end-baseline {}",
        mem.peak_allocated - mem.baseline_allocated,
        mem.end_allocated - mem.baseline_allocated
    );
    println!("scratch growth {grown}");
    assert_eq!(
        grown,
        ((m2 - m) * (K / 32) * Q8_1) as i64,
        "Q8_1 scratch of m x K/32 blocks"
    );

    // bf16 activations: widened to f32 (m × K × 4) and multiplied into an f32 buffer
    // (m × N × 4), narrowed into the bf16 output (m × N × 2).
    let mem = matmul(&w, m2, DType::BF16);
    let peak = mem.peak_allocated - mem.baseline_allocated;
    println!(
        "bf16 m={m2}: peak-baseline {peak} end-baseline {}",
        mem.end_allocated - mem.baseline_allocated
    );
    let f32s = (m2 * K * 4 + m2 * N * 4 + m2 * N * 2) as u64;
    assert!(
        peak >= f32s && peak - f32s <= 512,
        "bf16 transient {peak}, expected {f32s} + metadata"
    );
    println!("ok");
}
