/*
 * vramlab's emulated GPU: the CUDA runtime, driver and cuBLAS/cuBLASLt entry points PyTorch
 * calls, answered for one catalogued GPU that does not exist (docs/src/guides/emulator.md).
 *
 * Preloaded (LD_PRELOAD) into a PyTorch process, these definitions come before libcudart's,
 * libcublas's and libcublasLt's in symbol lookup, so every call torch makes lands here.
 * Everything host-side stays PyTorch's own code: dispatch, autocast, the SDPA backend choice,
 * the optimizers' defaults and the CUDACachingAllocator, whose statistics are the figures
 * vramlab reports. Kernels never run, so device data is meaningless.
 *
 * Conventions (each documented in the guide):
 * - device memory is address space only: cudaMalloc reserves inaccessible pages (PROT_NONE,
 *   no backing store) and fails with cudaErrorMemoryAllocation once the live total would pass
 *   the device's capacity less its context and module bytes;
 * - device-to-host copies write zeros, so `.item()`, GradScaler's inf check and data-dependent
 *   shapes read zeros (a mask reads all-false, `nonzero` is empty);
 * - streams and events complete at once; host callbacks run at once;
 * - cuBLAS and cuBLASLt succeed without computing; cuBLASLt's heuristic offers one algorithm
 *   that asks for no workspace beyond what torch itself allocates;
 * - CUDA graphs, IPC and peer access are refused with one line naming the call.
 *
 * The GPU is described by environment variables that `vramlab emulate` sets from its
 * catalogue (VRAMLAB_EMU_*); without them the library reports no device.
 */
#include "emu_cuda.h"


/* ---- the devices ----------------------------------------------------------------------- */


static struct emu_gpu gpu;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
__thread int current; /* the calling thread's device (cudaSetDevice) */

static uint64_t env_u64(const char *key, uint64_t dflt) {
  const char *v = getenv(key);
  return (v && *v) ? strtoull(v, NULL, 10) : dflt;
}

static void at_fork_child(void);
static void lock_mem(void);
static void unlock_mem(void);

static void gpu_init(void) {
  const char *total = getenv("VRAMLAB_EMU_TOTAL");
  if (!total || !*total) return;
  gpu.present = 1;
  gpu.count = (int)env_u64("VRAMLAB_EMU_DEVICES", 1);
  if (gpu.count < 1) gpu.count = 1;
  if (gpu.count > EMU_MAX_DEVICES) gpu.count = EMU_MAX_DEVICES;
  snprintf(gpu.name, sizeof gpu.name, "%s",
           getenv("VRAMLAB_EMU_NAME") ? getenv("VRAMLAB_EMU_NAME") : "vramlab emulated GPU");
  gpu.total = strtoull(total, NULL, 10);
  gpu.context = env_u64("VRAMLAB_EMU_CONTEXT", 0);
  gpu.major = (int)env_u64("VRAMLAB_EMU_CC_MAJOR", 9);
  gpu.minor = (int)env_u64("VRAMLAB_EMU_CC_MINOR", 0);
  gpu.sms = (int)env_u64("VRAMLAB_EMU_SMS", 132);
  gpu.l2 = (int)env_u64("VRAMLAB_EMU_L2", 50u << 20);
  gpu.threads_per_sm = (int)env_u64("VRAMLAB_EMU_THREADS_PER_SM", 2048);
  gpu.smem_optin = env_u64("VRAMLAB_EMU_SMEM_OPTIN", 232448);
  gpu.smem_per_sm = env_u64("VRAMLAB_EMU_SMEM_PER_SM", 233472);
  pthread_atfork(lock_mem, unlock_mem, at_fork_child);
}

const struct emu_gpu *dev(void) {
  pthread_once(&gpu_once, gpu_init);
  return &gpu;
}

int valid_device(int d) { return dev()->present && d >= 0 && d < gpu.count; }

/* ---- failures: every error the stubs return names the call, its arguments and why --------- */

__thread char last_error[EMU_TEXT];
__thread int last_code; /* the code `last_error` was returned with */
struct emu_proc *record(void);

/* Records and prints one line for a failed call; returns `code` (a cudaError_t, CUresult or
 * cublasStatus_t). cudaGetErrorString then answers with this line, so PyTorch's own error
 * ("CUDA error: ...") quotes it. */
int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  last_code = code;
  fprintf(stderr, "vramlab emulator: %s\n", last_error);
  struct emu_proc *r = record();
  if (r) {
    __atomic_add_fetch(&r->errors, 1, __ATOMIC_RELAXED);
    snprintf(r->last_error, sizeof r->last_error, "%s", last_error);
  }
  return code;
}

/* ---- the run's records (emu_record.h): this process's and each device's ------------------ */

static struct emu_proc *proc_rec;             /* NULL outside a run folder, or before use */
static struct emu_device *dev_rec[EMU_MAX_DEVICES];
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_proc proc_local;            /* where the counts go without a run folder */
static struct emu_device dev_local[EMU_MAX_DEVICES];

/* A file of `size` bytes in the run folder, mapped shared; NULL (and one line) on failure. */
static void *map_file(const char *name, size_t size, int exclusive) {
  const char *dir = getenv("VRAMLAB_EMU_DIR");
  if (!dir || !*dir) return NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : 0), 0600);
  if (fd < 0) {
    if (!(exclusive && errno == EEXIST))
      fprintf(stderr, "vramlab emulator: cannot write the run record %s: %s\n", path,
              strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return NULL;
  }
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? NULL : m;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void at_exit_release(void);

/* This process's record, created at its first use of the device (never NULL once the device
 * is present: without a run folder the counts stay in process memory). */
struct emu_proc *record(void) {
  if (!dev()->present) return NULL;
  struct emu_proc *r = __atomic_load_n(&proc_rec, __ATOMIC_ACQUIRE);
  if (r) return r;
  pthread_mutex_lock(&rec_lock);
  if (!proc_rec) {
    char name[64];
    struct emu_proc *m = NULL;
    for (int n = 0; n < 8 && !m; n++) {
      if (n == 0)
        snprintf(name, sizeof name, "proc-%d.bin", (int)getpid());
      else
        snprintf(name, sizeof name, "proc-%d.%d.bin", (int)getpid(), n);
      m = map_file(name, sizeof *m, 1);
    }
    if (!m) m = &proc_local;
    memset(m, 0, sizeof *m);
    m->pid = (uint64_t)getpid();
    m->ppid = (uint64_t)getppid();
    m->devices = (uint64_t)gpu.count;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t n = read(fd, m->cmdline, sizeof m->cmdline - 1);
      close(fd);
      for (ssize_t i = 0; i < n - 1; i++)
        if (!m->cmdline[i]) m->cmdline[i] = ' ';
    }
    for (int d = 0; d < gpu.count; d++) {
      snprintf(name, sizeof name, "device-%d.bin", d);
      dev_rec[d] = map_file(name, sizeof(struct emu_device), 0);
      if (!dev_rec[d]) dev_rec[d] = &dev_local[d];
      __atomic_store_n(&dev_rec[d]->magic, EMU_RECORD_MAGIC, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&m->magic, EMU_RECORD_MAGIC, __ATOMIC_RELEASE);
    atexit(at_exit_release);
    __atomic_store_n(&proc_rec, m, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&rec_lock);
  return proc_rec;
}

/* The device's peak: the bytes all processes hold, with one context per process there. */
static void device_peak(struct emu_device *d) {
  uint64_t held = __atomic_load_n(&d->used, __ATOMIC_RELAXED) +
                  __atomic_load_n(&d->contexts, __ATOMIC_RELAXED) * gpu.context;
  uint64_t old = __atomic_load_n(&d->peak, __ATOMIC_RELAXED);
  while (held > old &&
         !__atomic_compare_exchange_n(&d->peak, &old, held, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

/* The context on device d: created by this process's first allocation there. */
static void open_context(struct emu_proc *r, int d) {
  uint64_t bit = 1ull << d;
  if (__atomic_fetch_or(&r->contexts, bit, __ATOMIC_RELAXED) & bit) return;
  __atomic_add_fetch(&dev_rec[d]->contexts, 1, __ATOMIC_RELAXED);
  device_peak(dev_rec[d]);
}

/* At exit, the process's bytes and contexts leave the devices (as the driver frees them when a
 * process ends), so a later process of the run has them. A killed process keeps them. */
static void at_exit_release(void) {
  struct emu_proc *r = proc_rec;
  if (!r) return;
  for (int d = 0; d < gpu.count; d++) {
    if (!(r->contexts & (1ull << d))) continue;
    __atomic_sub_fetch(&dev_rec[d]->used, r->dev[d].used, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&dev_rec[d]->contexts, 1, __ATOMIC_RELAXED);
  }
  r->exited = 1;
}

/* ---- device memory: live allocations, their total and its high-water mark ---------------- */

struct block {
  uintptr_t ptr;
  size_t size;
  int host;   /* pinned host memory (real, readable) rather than device address space */
  int device; /* the device it is on */
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, capblocks;
/* This process's bytes on all devices: now, at most since the last reset (vramlab.phase's
 * boundaries), allocations and refusals. */
static uint64_t used, peak_used, failed_mallocs, mallocs;

static void lock_mem(void) { pthread_mutex_lock(&mem_lock); }
static void unlock_mem(void) { pthread_mutex_unlock(&mem_lock); }

/* A forked child owns none of its parent's device memory (on a GPU it cannot use the parent's
 * context at all): it starts with no allocations and a record of its own. */
static void at_fork_child(void) {
  nblocks = 0;
  used = peak_used = failed_mallocs = mallocs = 0;
  pthread_mutex_unlock(&mem_lock);
  if (proc_rec && proc_rec != &proc_local) munmap(proc_rec, sizeof *proc_rec);
  proc_rec = NULL;
  pthread_mutex_init(&rec_lock, NULL);
}

static void add_block(uintptr_t p, size_t size, int host, int device) {
  if (nblocks == capblocks) {
    capblocks = capblocks ? 2 * capblocks : 256;
    blocks = realloc(blocks, capblocks * sizeof *blocks);
  }
  blocks[nblocks++] = (struct block){p, size, host, device};
}

/* The block holding address p, or NULL. Called with mem_lock held. */
static struct block *find_block(uintptr_t p) {
  for (size_t i = 0; i < nblocks; i++)
    if (p >= blocks[i].ptr && p < blocks[i].ptr + (blocks[i].size ? blocks[i].size : 1))
      return &blocks[i];
  return NULL;
}

int block_range(const void *p, uintptr_t *base, size_t *size) {
  pthread_mutex_lock(&mem_lock);
  struct block *b = find_block((uintptr_t)p);
  if (b) {
    if (base) *base = b->ptr;
    if (size) *size = b->size;
  }
  pthread_mutex_unlock(&mem_lock);
  return b != NULL;
}

int is_device(const void *p) {
  pthread_mutex_lock(&mem_lock);
  struct block *b = find_block((uintptr_t)p);
  int d = b && !b->host;
  pthread_mutex_unlock(&mem_lock);
  return d;
}

/* Takes `size` bytes of device d's capacity (shared by the run's processes), or fails. */
static int take(int d, size_t size) {
  struct emu_device *dr = dev_rec[d];
  uint64_t old = __atomic_load_n(&dr->used, __ATOMIC_RELAXED);
  for (;;) {
    uint64_t ctx = __atomic_load_n(&dr->contexts, __ATOMIC_RELAXED) * gpu.context;
    if (old + size + ctx > gpu.total) return 0;
    if (__atomic_compare_exchange_n(&dr->used, &old, old + size, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED))
      break;
  }
  device_peak(dr);
  return 1;
}

cudaError_t device_alloc(void **out, size_t size, const char *call) {
  if (!dev()->present) return fail(cudaErrorNoDevice, "%s: no emulated GPU (VRAMLAB_EMU_TOTAL unset)", call);
  if (!out) return fail(cudaErrorInvalidValue, "%s(NULL, %zu): no pointer to write", call, size);
  int d = current;
  struct emu_proc *r = record();
  size_t mapped = size ? size : 1;
  pthread_mutex_lock(&mem_lock);
  open_context(r, d);
  if (!take(d, size)) {
    failed_mallocs++;
    r->dev[d].failed++;
    last_code = 0; /* PyTorch's own out-of-memory message says the rest */
    pthread_mutex_unlock(&mem_lock);
    *out = NULL;
    return cudaErrorMemoryAllocation; /* PyTorch frees its cache and retries: not an error yet */
  }
  void *p = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    __atomic_sub_fetch(&dev_rec[d]->used, size, __ATOMIC_RELAXED);
    failed_mallocs++;
    pthread_mutex_unlock(&mem_lock);
    *out = NULL;
    return fail(cudaErrorMemoryAllocation,
                "%s(%zu bytes) on device %d: the host refused %zu bytes of address space (%s)",
                call, size, d, mapped, strerror(errno));
  }
  add_block((uintptr_t)p, size, 0, d);
  used += size;
  mallocs++;
  if (used > peak_used) peak_used = used;
  struct emu_proc_device *pd = &r->dev[d];
  pd->used += size;
  pd->mallocs++;
  if (pd->used > pd->peak) pd->peak = pd->used;
  pthread_mutex_unlock(&mem_lock);
  *out = p;
  return cudaSuccess;
}

cudaError_t block_free(void *p, int host, const char *call) {
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&mem_lock);
  for (size_t i = 0; i < nblocks; i++) {
    if (blocks[i].ptr == (uintptr_t)p && blocks[i].host == host) {
      struct block b = blocks[i];
      blocks[i] = blocks[--nblocks];
      if (!host) {
        used -= b.size;
        proc_rec->dev[b.device].used -= b.size;
        __atomic_sub_fetch(&dev_rec[b.device]->used, b.size, __ATOMIC_RELAXED);
      }
      pthread_mutex_unlock(&mem_lock);
      if (host)
        free(p);
      else
        munmap(p, b.size ? b.size : 1);
      return cudaSuccess;
    }
  }
  struct block *inside = find_block((uintptr_t)p);
  const char *why = !inside          ? "not an allocation of this process"
                    : inside->host != host ? (host ? "a device allocation, not pinned host memory"
                                                   : "pinned host memory, not a device allocation")
                                     : "inside an allocation, not its start";
  pthread_mutex_unlock(&mem_lock);
  return fail(cudaErrorInvalidValue, "%s(%p): %s", call, p, why);
}

/* Read by vramlab's Python side (ctypes): bytes cudaMalloc holds now and at most, the bytes
 * it may hold, and how many cudaMalloc calls failed (torch retries after freeing its cache). */
EXPORT void vramlab_emu_stats(uint64_t *out_used, uint64_t *out_peak, uint64_t *out_capacity,
                              uint64_t *out_failed, uint64_t *out_mallocs) {
  const struct emu_gpu *g = dev();
  pthread_mutex_lock(&mem_lock);
  if (out_used) *out_used = used;
  if (out_peak) *out_peak = peak_used;
  if (out_capacity) *out_capacity = g->total > g->context ? g->total - g->context : 0;
  if (out_failed) *out_failed = failed_mallocs;
  if (out_mallocs) *out_mallocs = mallocs;
  pthread_mutex_unlock(&mem_lock);
}

EXPORT void vramlab_emu_reset_peak(void) {
  pthread_mutex_lock(&mem_lock);
  peak_used = used;
  pthread_mutex_unlock(&mem_lock);
}

/* ---- handles: distinct non-null values that are never dereferenced ----------------------- */

static uintptr_t next_handle = 0x1000;
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

void *new_handle(void) {
  pthread_mutex_lock(&handle_lock);
  uintptr_t h = next_handle += 0x10;
  pthread_mutex_unlock(&handle_lock);
  return (void *)h;
}

/* A call the emulator does not model: one line on stderr naming it (refused.c's calls). */
void vramlab_emu_refuse(const char *call) {
  fail(cudaErrorNotSupported, "%s is not emulated (no GPU here); the program cannot run it", call);
}

static cudaError_t host_alloc(void **p, size_t size) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaMallocHost(NULL, %zu)", size);
  void *m = NULL;
  if (posix_memalign(&m, 4096, size ? size : 1))
    return fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu bytes): the host has no memory", size);
  pthread_mutex_lock(&mem_lock);
  add_block((uintptr_t)m, size, 1, current);
  pthread_mutex_unlock(&mem_lock);
  *p = m;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMallocHost(void **p, size_t size) { return host_alloc(p, size); }
EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  (void)flags;
  return host_alloc(p, size);
}
EXPORT cudaError_t cudaFreeHost(void *p) { return block_free(p, 1, "cudaFreeHost"); }
EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  (void)p;
  (void)size;
  (void)flags;
  return cudaSuccess;
}
/* Mapped host memory (vLLM's UVA views of pinned buffers): with unified addressing the device
 * pointer is the host pointer. */
EXPORT cudaError_t cudaHostGetDevicePointer(void **dev_ptr, void *host, unsigned int flags) {
  (void)flags;
  if (!dev_ptr) return fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer(NULL, %p)", host);
  *dev_ptr = host;
  return cudaSuccess;
}
EXPORT cudaError_t cudaHostUnregister(void *p) {
  (void)p;
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  const struct emu_gpu *g = dev();
  if (!g->present) return cudaErrorNoDevice;
  pthread_mutex_lock(&mem_lock);
  uint64_t held = used + g->context;
  pthread_mutex_unlock(&mem_lock);
  if (free_bytes) *free_bytes = held < g->total ? g->total - held : 0;
  if (total) *total = g->total;
  return cudaSuccess;
}

#ifdef VRAMLAB_CUDART_10
/* CUDA 10's pointer attributes lead with the deprecated memoryType and end with isManaged. */
struct cudaPointerAttributes10 {
  enum cudaMemoryType memoryType, type;
  int device;
  void *devicePointer, *hostPointer;
  int isManaged;
};
#define POINTER_ATTRIBUTES struct cudaPointerAttributes10
#else
#define POINTER_ATTRIBUTES struct cudaPointerAttributes
#endif
EXPORT cudaError_t cudaPointerGetAttributes(POINTER_ATTRIBUTES *a, const void *ptr) {
  if (!a) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(NULL, %p)", ptr);
  memset(a, 0, sizeof *a);
  pthread_mutex_lock(&mem_lock);
  struct block *b = find_block((uintptr_t)ptr);
  if (b && !b->host) {
    a->type = cudaMemoryTypeDevice;
    a->device = b->device;
    a->devicePointer = (void *)ptr;
  } else if (b) {
    /* Mapped pinned memory reads as the device current at its allocation: torch takes the device
     * of a view of it (vLLM's UVA-backed buffers, one per tensor-parallel rank) from here. */
    a->type = cudaMemoryTypeHost;
    a->device = b->device;
    a->hostPointer = (void *)ptr;
    a->devicePointer = (void *)ptr;
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
  }
#ifdef VRAMLAB_CUDART_10
  a->memoryType = a->type;
#endif
  pthread_mutex_unlock(&mem_lock);
  return cudaSuccess;
}

/* A copy: only host destinations are written (zeros from the device, bytes from the host). */
cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  if (!n) return cudaSuccess;
  int dst_dev, src_dev;
  switch (kind) {
  case cudaMemcpyHostToHost: dst_dev = 0; src_dev = 0; break;
  case cudaMemcpyHostToDevice: dst_dev = 1; src_dev = 0; break;
  case cudaMemcpyDeviceToHost: dst_dev = 0; src_dev = 1; break;
  case cudaMemcpyDeviceToDevice: dst_dev = 1; src_dev = 1; break;
  default: dst_dev = is_device(dst); src_dev = is_device(src); break;
  }
  if (dst_dev) return cudaSuccess;
  if (src_dev) {
    memset(dst, 0, n);
    /* Counted with its time, so that a program looping on a device value (which reads zeros
     * for ever here) can be told from a slow one when vramlab stops it. */
    struct emu_proc *r = record();
    if (r) {
      __atomic_add_fetch(&r->d2h_reads, 1, __ATOMIC_RELAXED);
      __atomic_store_n(&r->last_d2h_ns, now_ns(), __ATOMIC_RELAXED);
    }
  } else
    memmove(dst, src, n);
  return cudaSuccess;
}
