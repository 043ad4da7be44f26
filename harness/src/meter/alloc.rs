//! The counting global allocator behind the CPU meter's "allocated" figures.
//!
//! Every heap allocation of the process goes through it: current live bytes (atomic) and a
//! resettable high-water mark (`fetch_max`). `realloc` adjusts by the size difference, so a
//! growing `Vec` is counted once at its final capacity.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

pub struct CountingAlloc;

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
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
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

/// Live heap bytes now.
pub fn current() -> u64 {
    CURRENT.load(Relaxed) as u64
}

/// Highest live heap bytes since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Relaxed) as u64
}

/// Sets the high-water mark to the current live bytes.
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Relaxed), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The counter is process-global and tests run on threads of one process, so these
    // assertions use lower bounds that other tests' allocations cannot break.
    #[test]
    fn counts_alloc_realloc_and_peak() {
        reset_peak();
        let before = current();
        let mut v: Vec<u8> = Vec::with_capacity(64 << 20);
        v.push(1);
        assert!(peak() >= before + (64 << 20));
        v.shrink_to(16);
        drop(v);
        // After the drop the 64 MiB are gone from the live count (others' noise is far smaller).
        assert!(current() < before + (32 << 20));
    }
}
