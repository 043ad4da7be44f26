/*
 * The emulated GPU's stream-ordered allocator (cuMemAllocAsync, cudaMallocAsync) and the rest
 * of what candle 0.11 and cudarc 0.19 call: the driver's context, stream, event, copy and module
 * entry points, cuRAND, and the cuBLAS calls candle makes (docs/src/guides/emulator.md,
 * "candle on the emulated GPU").
 *
 * The pool. Each device has one memory pool, its default and current pool. What it answers:
 * - USED_MEM_CURRENT/HIGH are the bytes the program asked for and has not freed: exact by rule;
 * - RESERVED_MEM_CURRENT/HIGH are modelled. The pool maps device memory in segments of whole
 *   allocation granules (POOL_GRANULE, 2 MiB: cuMemGetAllocationGranularity's minimum for device
 *   memory on these cards), suballocated best fit with POOL_ALIGN-byte blocks that split and
 *   merge. A free that empties a segment keeps it mapped; at the next synchronization (a stream,
 *   an event, the context or the device) the pool unmaps empty segments for as long as it holds
 *   more than its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0), as the CUDA
 *   programming guide documents; cuMemPoolTrimTo unmaps them down to the bytes it is told to
 *   keep. An allocation the device cannot map first unmaps the pool's empty segments, then
 *   fails with CUDA_ERROR_OUT_OF_MEMORY.
 * The segments are device memory like cudaMalloc's: they count against the device's capacity
 * and in cuMemGetInfo, shared with every process of the run.
 */
#include "emu_cuda.h"

#define POOL_GRANULE ((size_t)2 << 20)
#define POOL_ALIGN ((size_t)512)

struct pblock {
  size_t off, size; /* within the segment; size is a multiple of POOL_ALIGN */
  size_t asked;     /* the bytes asked for; 0 for a free block */
  int busy;
};

struct segment {
  uintptr_t base;
  size_t size; /* whole granules */
  struct pblock *b; /* by offset, covering the segment */
  size_t nb, cap;
};

struct pool {
  uint64_t used, used_high, reserved, reserved_high, threshold;
  struct segment *seg;
  size_t nseg, capseg;
};

static struct pool pools[EMU_MAX_DEVICES];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void insert_block(struct segment *s, size_t at, struct pblock b) {
  if (s->nb == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 8;
    s->b = realloc(s->b, s->cap * sizeof *s->b);
  }
  memmove(&s->b[at + 1], &s->b[at], (s->nb - at) * sizeof *s->b);
  s->b[at] = b;
  s->nb++;
}

static void remove_block(struct segment *s, size_t at) {
  memmove(&s->b[at], &s->b[at + 1], (s->nb - at - 1) * sizeof *s->b);
  s->nb--;
}

static int segment_empty(const struct segment *s) { return s->nb == 1 && !s->b[0].busy; }

/* Unmaps empty segments while the pool holds more than `keep` bytes. Called with pool_lock. */
static void pool_trim(struct pool *p, uint64_t keep) {
  for (size_t i = p->nseg; i-- > 0 && p->reserved > keep;) {
    struct segment *s = &p->seg[i];
    if (!segment_empty(s)) continue;
    block_free((void *)s->base, 0, "the memory pool's release");
    p->reserved -= s->size;
    free(s->b);
    p->seg[i] = p->seg[--p->nseg];
  }
}

static void pool_release_all(void) {
  pthread_mutex_lock(&pool_lock);
  for (int d = 0; d < EMU_MAX_DEVICES; d++) pool_trim(&pools[d], pools[d].threshold);
  pthread_mutex_unlock(&pool_lock);
}

/* Best fit over the free blocks of every segment: (segment, block) or 0. */
static int best_fit(struct pool *p, size_t need, size_t *si, size_t *bi) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < p->nseg; i++)
    for (size_t j = 0; j < p->seg[i].nb; j++) {
      struct pblock *b = &p->seg[i].b[j];
      if (!b->busy && b->size >= need && b->size < best) {
        best = b->size;
        *si = i;
        *bi = j;
      }
    }
  return best != SIZE_MAX;
}

/* Maps a new segment for `need` bytes; CUDA_ERROR_OUT_OF_MEMORY where the device has no room
 * even after the pool's empty segments are unmapped. Called with pool_lock. */
static CUresult grow(struct pool *p, size_t need, const char *call) {
  size_t size = round_up(need, POOL_GRANULE);
  void *base = NULL;
  cudaError_t e = device_alloc(&base, size, call);
  if (e == cudaErrorMemoryAllocation && last_code == 0) {
    pool_trim(p, 0);
    e = device_alloc(&base, size, call);
  }
  if (e != cudaSuccess) return e == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : (CUresult)e;
  if (p->nseg == p->capseg) {
    p->capseg = p->capseg ? 2 * p->capseg : 16;
    p->seg = realloc(p->seg, p->capseg * sizeof *p->seg);
  }
  struct segment *s = &p->seg[p->nseg++];
  *s = (struct segment){(uintptr_t)base, size, NULL, 0, 0};
  insert_block(s, 0, (struct pblock){0, size, 0, 0});
  p->reserved += size;
  if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  return CUDA_SUCCESS;
}

/* An allocation of `size` bytes from device d's pool. */
static CUresult pool_alloc(int d, uintptr_t *out, size_t size, const char *call) {
  if (!dev()->present) return (CUresult)fail(CUDA_ERROR_NO_DEVICE, "%s: no emulated GPU", call);
  if (!out) return (CUresult)fail(CUDA_ERROR_INVALID_VALUE, "%s(NULL, %zu): no pointer to write", call, size);
  if (!valid_device(d)) return (CUresult)fail(CUDA_ERROR_INVALID_DEVICE, "%s: device %d", call, d);
  size_t need = round_up(size ? size : 1, POOL_ALIGN);
  struct pool *p = &pools[d];
  pthread_mutex_lock(&pool_lock);
  size_t si = 0, bi = 0;
  if (!best_fit(p, need, &si, &bi)) {
    CUresult r = grow(p, need, call);
    if (r != CUDA_SUCCESS) {
      uint64_t reserved = p->reserved, used = p->used;
      pthread_mutex_unlock(&pool_lock);
      size_t free_b = 0, total = 0;
      cudaMemGetInfo(&free_b, &total);
      *out = 0;
      /* Not printed and not counted as an error: out of memory is an answer, which
       * cuGetErrorString gives with the figures. */
      snprintf(last_error, sizeof last_error,
               "out of memory: %s(%zu bytes) on device %d, whose pool holds %llu B (%llu B in "
               "use) and which has %zu B free of %zu B",
               call, size, d, (unsigned long long)reserved, (unsigned long long)used, free_b, total);
      last_code = CUDA_ERROR_OUT_OF_MEMORY;
      return r;
    }
    si = p->nseg - 1;
    bi = 0;
  }
  struct segment *s = &p->seg[si];
  struct pblock *b = &s->b[bi];
  if (b->size - need >= POOL_ALIGN) {
    struct pblock rest = {b->off + need, b->size - need, 0, 0};
    b->size = need;
    insert_block(s, bi + 1, rest);
    b = &s->b[bi];
  }
  b->busy = 1;
  b->asked = size;
  p->used += size;
  if (p->used > p->used_high) p->used_high = p->used;
  *out = s->base + b->off;
  pthread_mutex_unlock(&pool_lock);
  return CUDA_SUCCESS;
}

/* Frees a pool allocation: 1 when `ptr` was one, 0 when no pool holds it. */
static int pool_free(uintptr_t ptr) {
  pthread_mutex_lock(&pool_lock);
  for (int d = 0; d < EMU_MAX_DEVICES; d++) {
    struct pool *p = &pools[d];
    for (size_t i = 0; i < p->nseg; i++) {
      struct segment *s = &p->seg[i];
      if (ptr < s->base || ptr >= s->base + s->size) continue;
      for (size_t j = 0; j < s->nb; j++) {
        if (s->base + s->b[j].off != ptr || !s->b[j].busy) continue;
        p->used -= s->b[j].asked;
        s->b[j].busy = 0;
        s->b[j].asked = 0;
        if (j + 1 < s->nb && !s->b[j + 1].busy) {
          s->b[j].size += s->b[j + 1].size;
          remove_block(s, j + 1);
        }
        if (j > 0 && !s->b[j - 1].busy) {
          s->b[j - 1].size += s->b[j].size;
          remove_block(s, j);
        }
        pthread_mutex_unlock(&pool_lock);
        return 1;
      }
    }
  }
  pthread_mutex_unlock(&pool_lock);
  return 0;
}

static struct pool *pool_of(const void *handle, const char *call) {
  for (int d = 0; d < EMU_MAX_DEVICES; d++)
    if (handle == (const void *)&pools[d]) return &pools[d];
  fail(CUDA_ERROR_INVALID_VALUE, "%s(%p): not a memory pool of the emulated GPU (only each "
       "device's default pool is emulated)", call, handle);
  return NULL;
}

/* Synchronization points, where the pool gives back what its threshold does not keep. */
void emu_synchronized(void) { pool_release_all(); }

/* ---- the driver's pool API ----------------------------------------------------------------- */

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) {
  if (!valid_device(d)) return (CUresult)fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetMemPool: device %d", d);
  if (pool) *pool = (CUmemoryPool)&pools[d];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
  return cuDeviceGetMemPool(pool, d);
}

static CUresult pool_get(struct pool *p, int attr, void *v, const char *call) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (!v) return (CUresult)fail(CUDA_ERROR_INVALID_VALUE, "%s: no value to write", call);
  pthread_mutex_lock(&pool_lock);
  CUresult r = CUDA_SUCCESS;
  switch (attr) {
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)v = 1; break;
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(uint64_t *)v = p->threshold; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(uint64_t *)v = p->reserved; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(uint64_t *)v = p->reserved_high; break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(uint64_t *)v = p->used; break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(uint64_t *)v = p->used_high; break;
  default: r = CUDA_ERROR_NOT_SUPPORTED;
  }
  pthread_mutex_unlock(&pool_lock);
  if (r != CUDA_SUCCESS)
    return (CUresult)fail(r, "%s: pool attribute %d is not emulated", call, attr);
  return r;
}

static CUresult pool_set(struct pool *p, int attr, void *v, const char *call) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (!v) return (CUresult)fail(CUDA_ERROR_INVALID_VALUE, "%s: no value to read", call);
  uint64_t x = *(uint64_t *)v;
  pthread_mutex_lock(&pool_lock);
  CUresult r = CUDA_SUCCESS;
  switch (attr) {
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: break; /* reuse is immediate here */
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = x; break;
  /* A high-water mark can only be reset (to the current figure), by writing 0. */
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    if (x) r = CUDA_ERROR_INVALID_VALUE; else p->reserved_high = p->reserved;
    break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    if (x) r = CUDA_ERROR_INVALID_VALUE; else p->used_high = p->used;
    break;
  default: r = CUDA_ERROR_NOT_SUPPORTED;
  }
  pthread_mutex_unlock(&pool_lock);
  if (r == CUDA_ERROR_INVALID_VALUE)
    return (CUresult)fail(r, "%s: a high-water mark can only be reset with 0, not %llu", call,
                          (unsigned long long)x);
  if (r != CUDA_SUCCESS)
    return (CUresult)fail(r, "%s: pool attribute %d cannot be set here", call, attr);
  return r;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
  return pool_get(pool_of(pool, "cuMemPoolGetAttribute"), (int)a, v, "cuMemPoolGetAttribute");
}
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
  return pool_set(pool_of(pool, "cuMemPoolSetAttribute"), (int)a, v, "cuMemPoolSetAttribute");
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  struct pool *p = pool_of(pool, "cuMemPoolTrimTo");
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&pool_lock);
  pool_trim(p, keep);
  pthread_mutex_unlock(&pool_lock);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
  (void)s;
  return pool_alloc(current, (uintptr_t *)p, size, "cuMemAllocAsync");
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
  (void)s;
  struct pool *q = pool_of(pool, "cuMemAllocFromPoolAsync");
  return q ? pool_alloc((int)(q - pools), (uintptr_t *)p, size, "cuMemAllocFromPoolAsync")
           : CUDA_ERROR_INVALID_VALUE;
}
/* Frees a pool allocation, or a cuMemAlloc one (which the driver also takes here). */
static CUresult free_async(uintptr_t p, const char *call) {
  if (!p || pool_free(p)) return CUDA_SUCCESS;
  return (CUresult)block_free((void *)p, 0, call);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  (void)s;
  return free_async((uintptr_t)p, "cuMemFreeAsync");
}

/* The runtime's names for the same pool (vramlab-kernels' .cu code, PyTorch's
 * backend:cudaMallocAsync), with their per-thread-default-stream (_ptsz) variants. */
EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  (void)s;
  return (cudaError_t)pool_alloc(current, (uintptr_t *)p, size, "cudaMallocAsync");
}
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s) {
  return cudaMallocAsync(p, size, s);
}
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return (cudaError_t)free_async((uintptr_t)p, "cudaFreeAsync");
}
EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return cudaFreeAsync(p, s); }
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int d) {
  return (cudaError_t)cuDeviceGetMemPool((CUmemoryPool *)pool, d);
}
EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int d) {
  return (cudaError_t)cuDeviceGetMemPool((CUmemoryPool *)pool, d);
}
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  /* The runtime's attribute numbers are the driver's. */
  return (cudaError_t)pool_get(pool_of(pool, "cudaMemPoolGetAttribute"), (int)a, v,
                               "cudaMemPoolGetAttribute");
}
EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  return (cudaError_t)pool_set(pool_of(pool, "cudaMemPoolSetAttribute"), (int)a, v,
                               "cudaMemPoolSetAttribute");
}
EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  return (cudaError_t)cuMemPoolTrimTo((CUmemoryPool)pool, keep);
}

/* ---- the driver: plain allocations, information, copies ------------------------------------ */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
  void *q = NULL;
  cudaError_t e = device_alloc(&q, size, "cuMemAlloc");
  if (p) *p = (CUdeviceptr)(uintptr_t)q;
  return e == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : (CUresult)e;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  return (CUresult)block_free((void *)(uintptr_t)p, 0, "cuMemFree");
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  return cudaMemGetInfo(free_bytes, total) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
  if (!valid_device(d)) return (CUresult)fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceTotalMem: device %d", d);
  if (bytes) *bytes = dev()->total;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (!valid_device(d)) return (CUresult)fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetName: device %d", d);
  if (name && len > 0) snprintf(name, (size_t)len, "%s", dev()->name);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  (void)s;
  return (CUresult)copy((void *)(uintptr_t)dst, src, n, cudaMemcpyHostToDevice);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return (CUresult)copy(dst, (const void *)(uintptr_t)src, n, cudaMemcpyDeviceToHost);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)dst; (void)src; (void)n; (void)s;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
                                  size_t n, CUstream s) {
  (void)dst; (void)dc; (void)src; (void)sc; (void)n; (void)s;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
  (void)p; (void)v; (void)n; (void)s;
  return CUDA_SUCCESS;
}
EXPORT cudaError_t cudaMemsetAsync_ptsz(void *p, int v, size_t n, cudaStream_t s) {
  return cudaMemsetAsync(p, v, n, s);
}

/* ---- the driver: contexts, streams, events, modules ---------------------------------------- */

/* The driver's context, stream and event calls answer as the runtime's (emu.c); the two share
 * their handles and their success code, 0. */
EXPORT CUresult cuCtxSynchronize(void) { return (CUresult)cudaDeviceSynchronize(); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
  (void)c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  (void)d;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return (CUresult)cudaStreamSynchronize((cudaStream_t)s); }
EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) { return cudaStreamSynchronize(s); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return (CUresult)cudaStreamDestroy((cudaStream_t)s); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
  enum cudaStreamCaptureStatus rt;
  cudaError_t r = cudaStreamIsCapturing((cudaStream_t)s, &rt);
  if (st) *st = rt == cudaStreamCaptureStatusNone ? CU_STREAM_CAPTURE_STATUS_NONE : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return (CUresult)r;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) {
  return (CUresult)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, f);
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int f) {
  return (CUresult)cudaEventCreateWithFlags((cudaEvent_t *)e, f);
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { return (CUresult)cudaEventDestroy((cudaEvent_t)e); }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  return (CUresult)cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s);
}
EXPORT CUresult cuEventSynchronize(CUevent e) { return (CUresult)cudaEventSynchronize((cudaEvent_t)e); }
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *path) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return (CUresult)fail(CUDA_ERROR_FILE_NOT_FOUND, "cuModuleLoad(%s): no such file", path ? path : "NULL");
  fclose(f);
  if (m) *m = new_handle();
  return CUDA_SUCCESS;
}
/* nvcc's launch stub for code built with --default-stream per-thread. */
EXPORT cudaError_t __cudaLaunchKernel_ptsz(const void *k, dim3 g, dim3 b, void **args, size_t sh,
                                           cudaStream_t s) {
  (void)k; (void)g; (void)b; (void)args; (void)sh; (void)s;
  return cudaSuccess;
}

/* ---- cuRAND: generators that produce nothing (device data is meaningless here) ------------- */

typedef int curand_status;
EXPORT curand_status curandCreateGenerator(void **gen, int type) {
  (void)type;
  if (gen) *gen = new_handle();
  return 0;
}
EXPORT curand_status curandDestroyGenerator(void *gen) { (void)gen; return 0; }
EXPORT curand_status curandSetStream(void *gen, cudaStream_t s) { (void)gen; (void)s; return 0; }
EXPORT curand_status curandSetPseudoRandomGeneratorSeed(void *gen, unsigned long long seed) {
  (void)gen; (void)seed;
  return 0;
}
EXPORT curand_status curandGenerate(void *gen, unsigned int *out, size_t n) {
  (void)gen; (void)out; (void)n;
  return 0;
}
EXPORT curand_status curandGenerateUniform(void *gen, float *out, size_t n) {
  (void)gen; (void)out; (void)n;
  return 0;
}
EXPORT curand_status curandGenerateUniformDouble(void *gen, double *out, size_t n) {
  (void)gen; (void)out; (void)n;
  return 0;
}
EXPORT curand_status curandGenerateNormal(void *gen, float *out, size_t n, float mean, float sd) {
  (void)gen; (void)out; (void)n; (void)mean; (void)sd;
  return 0;
}
EXPORT curand_status curandGenerateNormalDouble(void *gen, double *out, size_t n, double mean,
                                                double sd) {
  (void)gen; (void)out; (void)n; (void)mean; (void)sd;
  return 0;
}

/* ---- cuBLAS: the calls candle makes (handles and batched products that compute nothing) ---- */

EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }
EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  (void)h; (void)s;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)A; (void)at;
  (void)lda; (void)sa; (void)B; (void)bt; (void)ldb; (void)sb; (void)beta; (void)C; (void)ct;
  (void)ldc; (void)sc; (void)batch; (void)compute; (void)algo;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                                cublasOperation_t tb, int m, int n, int k,
                                                const double *alpha, const double *A, int lda,
                                                long long sa, const double *B, int ldb,
                                                long long sb, const double *beta, double *C,
                                                int ldc, long long sc, int batch) {
  (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)A; (void)lda;
  (void)sa; (void)B; (void)ldb; (void)sb; (void)beta; (void)C; (void)ldc; (void)sc; (void)batch;
  return CUBLAS_STATUS_SUCCESS;
}
