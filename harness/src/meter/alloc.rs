//! The counting global allocator behind the CPU meter's "allocated" figures.
//!
//! Every heap allocation of the process goes through it: current live bytes (atomic) and a
//! resettable high-water mark (`fetch_max`). `realloc` adjusts by the size difference, so a
//! growing `Vec` is counted once at its final capacity.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Live-byte budget (`--capacity`): an allocation that would pass it fails, which Rust turns
/// into an abort; the sweep's parent process records the point as `oom`.
static CAPACITY: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The harness's own live bytes when it became ready to measure (paths, run ids, buffers):
/// reported figures and the capacity count from here, so that they do not depend on the
/// length of an output path and compare with a GPU pool, which holds only tensors.
static FLOOR: AtomicUsize = AtomicUsize::new(0);

/// Takes the current live bytes as zero for [`current`], [`peak`] and the capacity.
pub fn set_floor() {
    FLOOR.store(CURRENT.load(Relaxed), Relaxed);
}

pub struct CountingAlloc;

/// Sets the live-byte budget of this process.
pub fn set_capacity(bytes: u64) {
    CAPACITY.store(usize::try_from(bytes).unwrap_or(usize::MAX), Relaxed);
}

/// The marker line a refused allocation writes to stderr (parsed by the sweep's parent).
pub const OOM_MARKER: &str = "vramlab-oom";

/// Writes `vramlab-oom requested=N live=M capacity=C` to stderr without allocating.
fn report_refusal(requested: usize, live: usize, capacity: usize) {
    let mut buf = [0u8; 128];
    let mut n = 0;
    let mut put = |bytes: &[u8], n: &mut usize| {
        let end = (*n + bytes.len()).min(buf.len());
        buf[*n..end].copy_from_slice(&bytes[..end - *n]);
        *n = end;
    };
    let num = |v: usize, n: &mut usize, put: &mut dyn FnMut(&[u8], &mut usize)| {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = v;
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        put(&digits[i..], n);
    };
    put(OOM_MARKER.as_bytes(), &mut n);
    put(b" requested=", &mut n);
    num(requested, &mut n, &mut put);
    put(b" live=", &mut n);
    num(live, &mut n, &mut put);
    put(b" capacity=", &mut n);
    num(capacity, &mut n, &mut put);
    put(b"\n", &mut n);
    // SAFETY: writing a stack buffer to fd 2.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
}

/// False (and the refusal reported) when `n` more bytes would pass the capacity.
#[inline]
fn admit(n: usize) -> bool {
    let cap = CAPACITY.load(Relaxed);
    if cap == usize::MAX {
        return true;
    }
    let live = CURRENT.load(Relaxed).saturating_sub(FLOOR.load(Relaxed));
    if live.saturating_add(n) > cap {
        report_refusal(n, live, cap);
        return false;
    }
    true
}

#[inline]
fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

#[inline]
fn shrank(n: usize) {
    CURRENT.fetch_sub(n, Relaxed);
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && !admit(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            let old = layout.size();
            if new_size >= old {
                grew(new_size - old);
            } else {
                shrank(old - new_size);
            }
        }
        p
    }
}

/// Live heap bytes now, above the floor.
pub fn current() -> u64 {
    CURRENT.load(Relaxed).saturating_sub(FLOOR.load(Relaxed)) as u64
}

/// Highest live heap bytes since the last [`reset_peak`], above the floor.
pub fn peak() -> u64 {
    PEAK.load(Relaxed).saturating_sub(FLOOR.load(Relaxed)) as u64
}

/// Sets the high-water mark to the current live bytes.
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Relaxed), Relaxed);
}

// Tests: `harness/tests/meter_exact.rs`, a single-threaded test binary (`harness = false`):
// the counter is process-global, so libtest's parallel threads would make exact deltas racy.
