//! A counting allocator for `LD_PRELOAD` (docs/src/guides/torch-probe.md, meter `cpu-preload`).
//!
//! `LD_PRELOAD=libvramlab_preload.so python ...` routes every libc allocation of the process
//! through these functions. They keep the live bytes and a high-water mark, and export
//! `vramlab_live()`, `vramlab_peak()` and `vramlab_reset_peak()` for ctypes, so that a Python
//! process (torch) is measured the way harness/src/meter/cpu.rs measures candle with its
//! `#[global_allocator]`: requested bytes, not what glibc rounds them up to.
//!
//! # Design
//! - **The real allocator is glibc's `__libc_malloc` family**, called directly, not found with
//!   `dlsym(RTLD_NEXT, "malloc")`. `dlsym` itself calls `calloc` on first use (for its error
//!   state), which would re-enter the interposer before the real pointer is known and needs a
//!   bootstrap arena. The `__libc_*` entry points are public glibc ABI (`GLIBC_2.2.5`) and need no
//!   look-up. The price: this works on glibc only (not musl), which is what the probe runs on.
//! - **Sizes come from a 16-byte header**, not from `malloc_usable_size`. glibc rounds every
//!   request up (to 16 B for small chunks, to whole pages minus 16 B for mmapped ones), so usable
//!   sizes would not give byte-exact deltas: a 1 MiB numpy array would count 1 MiB + 4080 B. The
//!   header `[base pointer, requested size]` sits just below the returned pointer; 16 bytes keep
//!   malloc's 16-byte alignment. Over-aligned requests (`posix_memalign`, `aligned_alloc`,
//!   `memalign`, `valloc`, `pvalloc`) get `align` bytes in front, so the header still fits
//!   below the aligned pointer, and `free` finds the base through it. Because a pointer from the
//!   real allocator would have no header, *every* glibc entry point that hands out heap memory
//!   is replaced, including `valloc`, `pvalloc` and `malloc_usable_size` (glibc's manual,
//!   "Replacing malloc").
//! - **Counters are two atomics** (live, peak via `fetch_max`): thread-safe, no lock, nothing
//!   allocated on these paths, and nothing to repair in a `fork` child, which inherits the
//!   parent's counts at the moment of the fork.
use core::ffi::c_void;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __errno_location() -> *mut i32;
}

const HEADER: usize = 16;
const ENOMEM: i32 = 12;
const EINVAL: i32 = 22;
const PAGE: usize = 4096;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

fn grow(n: usize) {
    let now = LIVE.fetch_add(n as u64, Relaxed) + n as u64;
    PEAK.fetch_max(now, Relaxed);
}

fn shrink(n: usize) {
    LIVE.fetch_sub(n as u64, Relaxed);
}

/// Live heap bytes of this process (requested sizes, headers excluded).
#[no_mangle]
pub extern "C" fn vramlab_live() -> u64 {
    LIVE.load(Relaxed)
}

/// High-water mark of [`vramlab_live`] since the last [`vramlab_reset_peak`].
#[no_mangle]
pub extern "C" fn vramlab_peak() -> u64 {
    PEAK.load(Relaxed)
}

/// Sets the high-water mark to the live bytes now.
#[no_mangle]
pub extern "C" fn vramlab_reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
}

unsafe fn set_errno(e: i32) {
    *__errno_location() = e;
}

/// `size + extra`, or `None` with errno ENOMEM on overflow.
unsafe fn padded(size: usize, extra: usize) -> Option<usize> {
    let total = size.checked_add(extra);
    if total.is_none() {
        set_errno(ENOMEM);
    }
    total
}

/// Writes the header below `user` and counts `size`.
unsafe fn finish(base: *mut c_void, user: *mut u8, size: usize) -> *mut c_void {
    let h = user.sub(HEADER) as *mut usize;
    h.write(base as usize);
    h.add(1).write(size);
    grow(size);
    user as *mut c_void
}

/// (base, size) of a block this allocator handed out.
unsafe fn header(user: *mut c_void) -> (*mut c_void, usize) {
    let h = (user as *mut u8).sub(HEADER) as *const usize;
    (h.read() as *mut c_void, h.add(1).read())
}

unsafe fn alloc(size: usize) -> *mut c_void {
    let Some(total) = padded(size, HEADER) else {
        return null_mut();
    };
    let base = __libc_malloc(total);
    if base.is_null() {
        return base;
    }
    finish(base, (base as *mut u8).add(HEADER), size)
}

unsafe fn alloc_aligned(align: usize, size: usize) -> *mut c_void {
    if align <= HEADER {
        return alloc(size);
    }
    let Some(total) = padded(size, align) else {
        return null_mut();
    };
    let base = __libc_memalign(align, total);
    if base.is_null() {
        return base;
    }
    finish(base, (base as *mut u8).add(align), size)
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    alloc(size)
}

/// # Safety
/// The C `free` contract: `ptr` is null or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let (base, size) = header(ptr);
    shrink(size);
    __libc_free(base);
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(bytes) = n.checked_mul(size) else {
        set_errno(ENOMEM);
        return null_mut();
    };
    let p = alloc(bytes);
    if !p.is_null() {
        core::ptr::write_bytes(p as *mut u8, 0, bytes);
    }
    p
}

/// # Safety
/// The C `realloc` contract. Blocks with the plain header grow in place through glibc's
/// realloc; over-aligned ones move (a new block, a copy, a free), as glibc's own realloc may.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        return alloc(size);
    }
    if size == 0 {
        free(ptr);
        return null_mut();
    }
    let (base, old) = header(ptr);
    if base as usize + HEADER == ptr as usize {
        let Some(total) = padded(size, HEADER) else {
            return null_mut();
        };
        let nb = __libc_realloc(base, total);
        if nb.is_null() {
            return nb;
        }
        shrink(old);
        return finish(nb, (nb as *mut u8).add(HEADER), size);
    }
    let p = alloc(size);
    if !p.is_null() {
        core::ptr::copy_nonoverlapping(ptr as *const u8, p as *mut u8, old.min(size));
        free(ptr);
    }
    p
}

/// # Safety
/// The C `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || align % core::mem::size_of::<usize>() != 0 {
        return EINVAL;
    }
    let p = alloc_aligned(align, size);
    if p.is_null() {
        return ENOMEM;
    }
    out.write(p);
    0
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(EINVAL);
        return null_mut();
    }
    alloc_aligned(align, size)
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned_alloc(align.max(1).next_power_of_two(), size)
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    alloc_aligned(PAGE, size)
}

/// # Safety
/// The C `pvalloc` contract: the size rounded up to whole pages.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match padded(size, PAGE - 1) {
        Some(s) => alloc_aligned(PAGE, s & !(PAGE - 1)),
        None => null_mut(),
    }
}

/// # Safety
/// `ptr` is null or came from this allocator. The requested size: callers may use exactly that.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        0
    } else {
        header(ptr).1
    }
}
