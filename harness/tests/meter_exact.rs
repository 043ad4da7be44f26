//! Exact tests of the counting allocator and the CPU meter.
//!
//! The counter is process-global, and libtest runs tests on parallel threads whose
//! allocations would land between two readings. This binary has no libtest harness
//! (`harness = false` in Cargo.toml): `main` runs each check in turn on the only thread,
//! so every delta below is exact, to the byte.
use vramlab::meter::{alloc, cpu::CpuMeter, measure};

/// Live bytes above `before`, as a signed delta.
fn delta(before: u64) -> i64 {
    alloc::current() as i64 - before as i64
}

fn counts_alloc_realloc_and_peak() {
    alloc::reset_peak();
    let before = alloc::current();
    let mut v: Vec<u8> = Vec::with_capacity(64 << 20);
    assert_eq!(delta(before), 64 << 20, "alloc of 64 MiB");
    v.push(1);
    assert_eq!(alloc::peak() - before, 64 << 20, "peak after alloc");
    v.shrink_to(16);
    assert_eq!(delta(before), 16, "realloc down to 16 B");
    v.extend_from_slice(&[0u8; 1000]);
    let grown = v.capacity() as i64;
    assert_eq!(delta(before), grown, "realloc up to the new capacity");
    assert_eq!(
        alloc::peak() - before,
        64 << 20,
        "peak keeps its high-water mark"
    );
    drop(v);
    assert_eq!(delta(before), 0, "drop returns every byte");
    alloc::reset_peak();
    assert_eq!(
        alloc::peak(),
        alloc::current(),
        "reset takes the live bytes"
    );
    let z = vec![0u8; 3 << 20]; // alloc_zeroed
    assert_eq!(delta(before), 3 << 20, "alloc_zeroed");
    drop(z);
    assert_eq!(delta(before), 0);
}

fn phase_sees_a_transient() {
    let mut m = CpuMeter::new();
    let mut kept = Vec::new();
    let (sum, mem, _) = measure(&mut m, || {
        let v = vec![7u8; 32 << 20];
        kept = vec![1u8; 1 << 20];
        Ok(v.iter().map(|&x| x as u64).sum::<u64>())
    })
    .unwrap();
    assert_eq!(sum, 7 * (32 << 20));
    assert_eq!(
        mem.peak_allocated - mem.baseline_allocated,
        (32 << 20) + (1 << 20),
        "peak = the 32 MiB transient plus the 1 MiB kept"
    );
    assert_eq!(
        mem.end_allocated - mem.baseline_allocated,
        1 << 20,
        "end = what was kept"
    );
    // The touched 32 MiB show in the resident high-water mark too (pages, not bytes).
    assert!(mem.peak_reserved >= mem.baseline_reserved + (30 << 20));
    drop(kept);
}

fn main() {
    let checks: [(&str, fn()); 2] = [
        (
            "counts_alloc_realloc_and_peak",
            counts_alloc_realloc_and_peak,
        ),
        ("phase_sees_a_transient", phase_sees_a_transient),
    ];
    for (name, check) in checks {
        check();
        println!("test {name} ... ok");
    }
    println!("test result: ok. {} passed", checks.len());
}
