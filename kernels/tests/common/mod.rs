//! A counting global allocator for the exact-memory tests (each in a binary of its own,
//! `harness = false`, so no other test shares the process-global counters).
#![allow(dead_code)]
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

pub struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grow(n: usize) {
    let now = CURRENT.fetch_add(n, SeqCst) + n;
    PEAK.fetch_max(now, SeqCst);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grow(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grow(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        CURRENT.fetch_sub(l.size(), SeqCst);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                grow(new - l.size());
            } else {
                CURRENT.fetch_sub(l.size() - new, SeqCst);
            }
        }
        q
    }
}

/// Live bytes now; resets the high-water mark to it.
pub fn reset() -> usize {
    let now = CURRENT.load(SeqCst);
    PEAK.store(now, SeqCst);
    now
}

/// Highest live bytes since the last `reset`.
pub fn peak() -> usize {
    PEAK.load(SeqCst)
}

pub fn current() -> usize {
    CURRENT.load(SeqCst)
}

/// Runs `f`, returning its result and its peak live bytes above the bytes live before it.
pub fn transient<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = reset();
    let r = f();
    (r, peak() - base)
}

/// For the mixed AdamW: a 16-bit working copy of each f32 master variable, and zeroed f32
/// m and v beside each master.
pub fn mixed_setup(
    master: &[candle_core::Var],
    work_dtype: candle_core::DType,
) -> (
    Vec<candle_core::Var>,
    Vec<(candle_core::Tensor, candle_core::Tensor)>,
) {
    let work = master
        .iter()
        .map(|m| {
            candle_core::Var::from_tensor(&m.as_tensor().to_dtype(work_dtype).unwrap()).unwrap()
        })
        .collect();
    let state = master
        .iter()
        .map(|m| (m.zeros_like().unwrap(), m.zeros_like().unwrap()))
        .collect();
    (work, state)
}
