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
#define _GNU_SOURCE
#ifdef VRAMLAB_CUDART_10 /* declared by the headers in CUDA 11's layout, defined below in 10's */
#define cudaGetDeviceProperties cudaGetDeviceProperties_cuda11
#define cudaPointerGetAttributes cudaPointerGetAttributes_cuda11
#endif
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef VRAMLAB_CUDART_10
#undef cudaPointerGetAttributes
#endif

#define EXPORT __attribute__((visibility("default")))

/* ---- the device ------------------------------------------------------------------------ */

struct emu_gpu {
  int present;
  char name[256];
  uint64_t total;    /* totalGlobalMem, bytes */
  uint64_t context;  /* held by the CUDA context and loaded modules, bytes */
  int major, minor, sms, l2, threads_per_sm;
  uint64_t smem_optin, smem_per_sm;
};

static struct emu_gpu gpu;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;

static uint64_t env_u64(const char *key, uint64_t dflt) {
  const char *v = getenv(key);
  return (v && *v) ? strtoull(v, NULL, 10) : dflt;
}

static void gpu_init(void) {
  const char *total = getenv("VRAMLAB_EMU_TOTAL");
  if (!total || !*total) return;
  gpu.present = 1;
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
}

static const struct emu_gpu *dev(void) {
  pthread_once(&gpu_once, gpu_init);
  return &gpu;
}

/* ---- device memory: live allocations, their total and its high-water mark ---------------- */

struct block {
  uintptr_t ptr;
  size_t size;
  int host; /* pinned host memory (real, readable) rather than device address space */
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, capblocks;
static uint64_t used, peak_used, failed_mallocs, mallocs;

static void add_block(uintptr_t p, size_t size, int host) {
  if (nblocks == capblocks) {
    capblocks = capblocks ? 2 * capblocks : 256;
    blocks = realloc(blocks, capblocks * sizeof *blocks);
  }
  blocks[nblocks++] = (struct block){p, size, host};
}

/* The block holding address p, or NULL. Called with mem_lock held. */
static struct block *find_block(uintptr_t p) {
  for (size_t i = 0; i < nblocks; i++)
    if (p >= blocks[i].ptr && p < blocks[i].ptr + (blocks[i].size ? blocks[i].size : 1))
      return &blocks[i];
  return NULL;
}

static int is_device(const void *p) {
  pthread_mutex_lock(&mem_lock);
  struct block *b = find_block((uintptr_t)p);
  int d = b && !b->host;
  pthread_mutex_unlock(&mem_lock);
  return d;
}

static cudaError_t device_alloc(void **out, size_t size) {
  if (!dev()->present) return cudaErrorNoDevice;
  if (!out) return cudaErrorInvalidValue;
  size_t mapped = size ? size : 1;
  pthread_mutex_lock(&mem_lock);
  uint64_t capacity = gpu.total > gpu.context ? gpu.total - gpu.context : 0;
  if (used + size > capacity) {
    failed_mallocs++;
    pthread_mutex_unlock(&mem_lock);
    *out = NULL;
    return cudaErrorMemoryAllocation;
  }
  void *p = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    failed_mallocs++;
    pthread_mutex_unlock(&mem_lock);
    *out = NULL;
    return cudaErrorMemoryAllocation;
  }
  add_block((uintptr_t)p, size, 0);
  used += size;
  mallocs++;
  if (used > peak_used) peak_used = used;
  pthread_mutex_unlock(&mem_lock);
  *out = p;
  return cudaSuccess;
}

static cudaError_t block_free(void *p, int host) {
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&mem_lock);
  for (size_t i = 0; i < nblocks; i++) {
    if (blocks[i].ptr == (uintptr_t)p && blocks[i].host == host) {
      struct block b = blocks[i];
      blocks[i] = blocks[--nblocks];
      if (!host) used -= b.size;
      pthread_mutex_unlock(&mem_lock);
      if (host)
        free(p);
      else
        munmap(p, b.size ? b.size : 1);
      return cudaSuccess;
    }
  }
  pthread_mutex_unlock(&mem_lock);
  return cudaErrorInvalidValue;
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

static void *new_handle(void) {
  pthread_mutex_lock(&handle_lock);
  uintptr_t h = next_handle += 0x10;
  pthread_mutex_unlock(&handle_lock);
  return (void *)h;
}

/* A call the emulator does not model: one line on stderr naming it. */
void vramlab_emu_refuse(const char *call) {
  fprintf(stderr, "vramlab emulator: %s is not emulated (no GPU here); the program cannot run it\n",
          call);
}

/* ---- the CUDA runtime ---------------------------------------------------------------------- */

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return cudaErrorInvalidValue;
  *count = dev()->present ? 1 : 0;
  return dev()->present ? cudaSuccess : cudaErrorNoDevice;
}
EXPORT cudaError_t cudaGetDevice(int *d) {
  if (d) *d = 0;
  return dev()->present ? cudaSuccess : cudaErrorNoDevice;
}
EXPORT cudaError_t cudaSetDevice(int d) {
  if (!dev()->present) return cudaErrorNoDevice;
  return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
EXPORT cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
  if (flags) *flags = 0;
  return cudaSuccess;
}
EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  (void)flags;
  return cudaSuccess;
}

/* The fields every runtime's cudaDeviceProp has, from CUDA 10 on (a macro: the CUDA 10 layout
 * is a struct of its own below). */
#define FILL_COMMON_PROPS(p, g)                                                          \
  do {                                                                                   \
  snprintf(p->name, sizeof p->name, "%s", g->name);                                    \
  p->totalGlobalMem = g->total;                                                        \
  p->sharedMemPerBlock = 49152;                                                        \
  p->regsPerBlock = 65536;                                                             \
  p->warpSize = 32;                                                                    \
  p->memPitch = 2147483647;                                                            \
  p->maxThreadsPerBlock = 1024;                                                        \
  p->maxThreadsDim[0] = 1024;                                                          \
  p->maxThreadsDim[1] = 1024;                                                          \
  p->maxThreadsDim[2] = 64;                                                            \
  p->maxGridSize[0] = 2147483647;                                                      \
  p->maxGridSize[1] = 65535;                                                           \
  p->maxGridSize[2] = 65535;                                                           \
  p->totalConstMem = 65536;                                                            \
  p->major = g->major;                                                                 \
  p->minor = g->minor;                                                                 \
  p->textureAlignment = 512;                                                           \
  p->texturePitchAlignment = 32;                                                       \
  p->multiProcessorCount = g->sms;                                                     \
  p->canMapHostMemory = 1;                                                             \
  p->concurrentKernels = 1;                                                            \
  p->asyncEngineCount = 2;                                                             \
  p->unifiedAddressing = 1;                                                            \
  p->memoryBusWidth = 5120;                                                            \
  p->l2CacheSize = g->l2;                                                              \
  p->maxThreadsPerMultiProcessor = g->threads_per_sm;                                  \
  p->streamPrioritiesSupported = 1;                                                    \
  p->globalL1CacheSupported = 1;                                                       \
  p->localL1CacheSupported = 1;                                                        \
  p->sharedMemPerMultiprocessor = g->smem_per_sm;                                      \
  p->regsPerMultiprocessor = 65536;                                                    \
  p->managedMemory = 1;                                                                \
  p->computePreemptionSupported = 1;                                                   \
  p->cooperativeLaunch = 1;                                                            \
  p->sharedMemPerBlockOptin = g->smem_optin;                                           \
  p->pciBusID = 1;                                                                     \
  } while (0)

static void fill_props(struct cudaDeviceProp *p) {
  const struct emu_gpu *g = dev();
  memset(p, 0, sizeof *p);
  FILL_COMMON_PROPS(p, g);
  p->maxBlocksPerMultiProcessor = 32;
  p->reservedSharedMemPerBlock = 1024;
#if CUDART_VERSION >= 12000
  p->hostRegisterSupported = 1;
  p->memoryPoolsSupported = 1;
#endif
}

#ifdef VRAMLAB_CUDART_10
/* A torch built against CUDA 10 (torch 1.10's PyPI wheels, cu102) passes CUDA 10's
 * cudaDeviceProp, which CUDA 11 changed in the middle (persistingL2CacheMaxSize after
 * l2CacheSize) and at the end. Built with CUDA 11 headers and this macro, the library answers
 * in CUDA 10's layout; every field is declared so that each offset is CUDA 10's. */
struct cudaDeviceProp10 {
  char name[256];
  cudaUUID_t uuid;
  char luid[8];
  unsigned int luidDeviceNodeMask;
  size_t totalGlobalMem, sharedMemPerBlock;
  int regsPerBlock, warpSize;
  size_t memPitch;
  int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], clockRate;
  size_t totalConstMem;
  int major, minor;
  size_t textureAlignment, texturePitchAlignment;
  int deviceOverlap, multiProcessorCount, kernelExecTimeoutEnabled, integrated, canMapHostMemory,
      computeMode, maxTexture1D, maxTexture1DMipmap, maxTexture1DLinear, maxTexture2D[2],
      maxTexture2DMipmap[2], maxTexture2DLinear[3], maxTexture2DGather[2], maxTexture3D[3],
      maxTexture3DAlt[3], maxTextureCubemap, maxTexture1DLayered[2], maxTexture2DLayered[3],
      maxTextureCubemapLayered[2], maxSurface1D, maxSurface2D[2], maxSurface3D[3],
      maxSurface1DLayered[2], maxSurface2DLayered[3], maxSurfaceCubemap,
      maxSurfaceCubemapLayered[2];
  size_t surfaceAlignment;
  int concurrentKernels, ECCEnabled, pciBusID, pciDeviceID, pciDomainID, tccDriver,
      asyncEngineCount, unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize,
      maxThreadsPerMultiProcessor, streamPrioritiesSupported, globalL1CacheSupported,
      localL1CacheSupported;
  size_t sharedMemPerMultiprocessor;
  int regsPerMultiprocessor, managedMemory, isMultiGpuBoard, multiGpuBoardGroupID,
      hostNativeAtomicSupported, singleToDoublePrecisionPerfRatio, pageableMemoryAccess,
      concurrentManagedAccess, computePreemptionSupported, canUseHostPointerForRegisteredMem,
      cooperativeLaunch, cooperativeMultiDeviceLaunch;
  size_t sharedMemPerBlockOptin;
  int pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost;
};
/* CUDA 10's pointer attributes lead with the deprecated memoryType and end with isManaged. */
struct cudaPointerAttributes10 {
  enum cudaMemoryType memoryType, type;
  int device;
  void *devicePointer, *hostPointer;
  int isManaged;
};
#define DEVICE_PROP struct cudaDeviceProp10
#define REPORTED_CUDART_VERSION 10020
#else
#define DEVICE_PROP struct cudaDeviceProp
#define REPORTED_CUDART_VERSION CUDART_VERSION
#endif

#undef cudaGetDeviceProperties
EXPORT cudaError_t cudaGetDeviceProperties(DEVICE_PROP *prop, int d) {
  if (!dev()->present) return cudaErrorNoDevice;
  if (d != 0) return cudaErrorInvalidDevice;
  if (!prop) return cudaErrorInvalidValue;
#ifdef VRAMLAB_CUDART_10
  memset(prop, 0, sizeof *prop);
  FILL_COMMON_PROPS(prop, dev());
#else
  fill_props(prop);
#endif
  return cudaSuccess;
}
/* CUDA 12 headers call the same function cudaGetDeviceProperties_v2. */
EXPORT cudaError_t cudaGetDeviceProperties_v2(DEVICE_PROP *prop, int d) {
  return cudaGetDeviceProperties(prop, d);
}

EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int d) {
  if (!dev()->present) return cudaErrorNoDevice;
  if (!value || d != 0) return cudaErrorInvalidValue;
  struct cudaDeviceProp p;
  fill_props(&p);
  int v;
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
  case cudaDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
  case cudaDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
  case cudaDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
  case cudaDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
  case cudaDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
  case cudaDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: v = (int)p.sharedMemPerBlock; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = (int)p.sharedMemPerBlockOptin; break;
  case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = (int)p.sharedMemPerMultiprocessor; break;
  case cudaDevAttrTotalConstantMemory: v = (int)p.totalConstMem; break;
  case cudaDevAttrWarpSize: v = 32; break;
  case cudaDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
  case cudaDevAttrMaxRegistersPerMultiprocessor: v = p.regsPerMultiprocessor; break;
  case cudaDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
  case cudaDevAttrComputeCapabilityMajor: v = p.major; break;
  case cudaDevAttrComputeCapabilityMinor: v = p.minor; break;
  case cudaDevAttrL2CacheSize: v = p.l2CacheSize; break;
  case cudaDevAttrMaxThreadsPerMultiProcessor: v = p.maxThreadsPerMultiProcessor; break;
  case cudaDevAttrMaxBlocksPerMultiprocessor: v = p.maxBlocksPerMultiProcessor; break;
  case cudaDevAttrGlobalMemoryBusWidth: v = p.memoryBusWidth; break;
  case cudaDevAttrUnifiedAddressing: v = 1; break;
  case cudaDevAttrConcurrentKernels: v = 1; break;
  case cudaDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
  case cudaDevAttrMemoryPoolsSupported: v = 1; break;
  case cudaDevAttrCooperativeLaunch: v = 1; break;
  case cudaDevAttrTextureAlignment: v = (int)p.textureAlignment; break;
  case cudaDevAttrPciBusId: v = p.pciBusID; break;
  case cudaDevAttrReservedSharedMemoryPerBlock: v = (int)p.reservedSharedMemPerBlock; break;
  case cudaDevAttrMemoryClockRate: v = 2619000; break;
  case cudaDevAttrClockRate: v = 1980000; break;
  default: v = 0; break;
  }
  *value = v;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
  (void)d;
  if (id && len > 0) snprintf(id, (size_t)len, "00000000:01:00.0");
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer) {
  (void)d;
  (void)peer;
  if (can) *can = 0;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)peer;
  (void)flags;
  vramlab_emu_refuse("cudaDeviceEnablePeerAccess");
  return cudaErrorNotSupported;
}
EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
EXPORT cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
EXPORT cudaError_t cudaDriverGetVersion(int *v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}
EXPORT cudaError_t cudaRuntimeGetVersion(int *v) {
  if (v) *v = REPORTED_CUDART_VERSION;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetLastError(void) { return cudaSuccess; }
EXPORT cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

EXPORT const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (vramlab emulator: no GPU configured)";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotSupported: return "operation not supported (vramlab emulator)";
  default: return "vramlab emulator error";
  }
}
EXPORT const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  default: return "cudaErrorUnknown";
  }
}

EXPORT cudaError_t cudaMalloc(void **p, size_t size) { return device_alloc(p, size); }
EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  (void)s;
  return device_alloc(p, size);
}
EXPORT cudaError_t cudaFree(void *p) { return block_free(p, 0); }
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return block_free(p, 0);
}
EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
  (void)flags;
  return device_alloc(p, size);
}

static cudaError_t host_alloc(void **p, size_t size) {
  if (!p) return cudaErrorInvalidValue;
  void *m = NULL;
  if (posix_memalign(&m, 4096, size ? size : 1)) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mem_lock);
  add_block((uintptr_t)m, size, 1);
  pthread_mutex_unlock(&mem_lock);
  *p = m;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMallocHost(void **p, size_t size) { return host_alloc(p, size); }
EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  (void)flags;
  return host_alloc(p, size);
}
EXPORT cudaError_t cudaFreeHost(void *p) { return block_free(p, 1); }
EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  (void)p;
  (void)size;
  (void)flags;
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
#define POINTER_ATTRIBUTES struct cudaPointerAttributes10
#else
#define POINTER_ATTRIBUTES struct cudaPointerAttributes
#endif
EXPORT cudaError_t cudaPointerGetAttributes(POINTER_ATTRIBUTES *a, const void *ptr) {
  if (!a) return cudaErrorInvalidValue;
  memset(a, 0, sizeof *a);
  pthread_mutex_lock(&mem_lock);
  struct block *b = find_block((uintptr_t)ptr);
  if (b && !b->host) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = (void *)ptr;
  } else if (b) {
    a->type = cudaMemoryTypeHost;
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
static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
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
  if (src_dev)
    memset(dst, 0, n);
  else
    memmove(dst, src, n);
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  return copy(dst, src, n, k);
}
EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                   cudaStream_t s) {
  (void)s;
  return copy(dst, src, n, k);
}
EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n,
                                       cudaStream_t s) {
  (void)dst; (void)dd; (void)src; (void)sd; (void)n; (void)s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, enum cudaMemcpyKind k,
                                     cudaStream_t s) {
  (void)s;
  for (size_t r = 0; r < height; r++)
    copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, k);
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemset(void *p, int v, size_t n) {
  if (!is_device(p)) memset(p, v, n);
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMemset(p, v, n);
}

/* Streams and events: handles that are always complete. */
EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s) {
  if (s) *s = new_handle();
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) {
  (void)f;
  return cudaStreamCreate(s);
}
EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int prio) {
  (void)f;
  (void)prio;
  return cudaStreamCreate(s);
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *prio) {
  (void)s;
  if (prio) *prio = 0;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
  (void)s; (void)e; (void)f;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  (void)s;
  if (st) *st = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  (void)mode;
  return cudaSuccess;
}
EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
  (void)s;
  if (fn) fn(data);
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *data,
                                         unsigned int f) {
  (void)f;
  if (cb) cb(s, cudaSuccess, data);
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e) {
  if (e) *e = new_handle();
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) {
  (void)f;
  return cudaEventCreate(e);
}
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)e;
  (void)s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) {
  (void)e; (void)s; (void)f;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventQuery(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  (void)a;
  (void)b;
  if (ms) *ms = 0.0f;
  return cudaSuccess;
}

/* Kernels: registered and launched as no-ops. */
EXPORT void **__cudaRegisterFatBinary(void *fatbin) {
  (void)fatbin;
  return (void **)new_handle();
}
EXPORT void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
EXPORT void __cudaUnregisterFatBinary(void **h) { (void)h; }
EXPORT void __cudaRegisterFunction(void **h, const char *hf, char *df, const char *dn, int tl,
                                   void *tid, void *bid, void *bd, void *gd, int *ws) {
  (void)h; (void)hf; (void)df; (void)dn; (void)tl; (void)tid; (void)bid; (void)bd; (void)gd;
  (void)ws;
}
EXPORT void __cudaRegisterVar(void **h, char *hv, char *dv, const char *dn, int ext, size_t size,
                              int constant, int global) {
  (void)h; (void)hv; (void)dv; (void)dn; (void)ext; (void)size; (void)constant; (void)global;
}
EXPORT unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shmem, void *stream) {
  (void)grid; (void)block; (void)shmem; (void)stream;
  return 0;
}
EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem,
                                              void *stream) {
  if (grid) *grid = (dim3){1, 1, 1};
  if (block) *block = (dim3){1, 1, 1};
  if (shmem) *shmem = 0;
  if (stream) *(void **)stream = NULL;
  return cudaSuccess;
}
#if CUDART_VERSION >= 12000 /* kernel handles and launch configurations: CUDA 12's */
EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fn) {
  (void)fn;
  if (k) *k = new_handle();
  return cudaSuccess;
}
EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t sh,
                                      cudaStream_t s) {
  (void)k; (void)g; (void)b; (void)args; (void)sh; (void)s;
  return cudaSuccess;
}
#endif
EXPORT cudaError_t cudaLaunchKernel(const void *fn, dim3 g, dim3 b, void **args, size_t sh,
                                    cudaStream_t s) {
  (void)fn; (void)g; (void)b; (void)args; (void)sh; (void)s;
  return cudaSuccess;
}
#if CUDART_VERSION >= 12000
EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *fn, void **args) {
  (void)c; (void)fn; (void)args;
  return cudaSuccess;
}
#endif
EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *fn) {
  (void)fn;
  if (!a) return cudaErrorInvalidValue;
  memset(a, 0, sizeof *a);
  a->maxThreadsPerBlock = 1024;
  a->numRegs = 32;
  a->ptxVersion = dev()->major * 10 + dev()->minor;
  a->binaryVersion = a->ptxVersion;
  a->maxDynamicSharedSizeBytes = 49152;
  return cudaSuccess;
}
EXPORT cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int v) {
  (void)fn; (void)attr; (void)v;
  return cudaSuccess;
}
#if CUDART_VERSION >= 12000
EXPORT cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t k, enum cudaFuncAttribute attr,
                                                   int v, int d) {
  (void)k; (void)attr; (void)v; (void)d;
  return cudaSuccess;
}
#endif
/* Occupancy: never zero (kernels' launch math divides by it). */
EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *fn,
                                                                          int block, size_t sh,
                                                                          unsigned int f) {
  (void)fn; (void)sh; (void)f;
  int per = block > 0 ? dev()->threads_per_sm / block : 1;
  if (n) *n = per > 0 ? per : 1;
  return cudaSuccess;
}
EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *fn, int block,
                                                                 size_t sh) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, fn, block, sh, 0);
}
EXPORT cudaError_t cudaGetSymbolAddress(void **p, const void *sym) {
  (void)sym;
  if (p) *p = new_handle();
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemcpyToSymbol(const void *sym, const void *src, size_t n, size_t off,
                                      enum cudaMemcpyKind k) {
  (void)sym; (void)src; (void)n; (void)off; (void)k;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int d) {
  (void)d;
  if (pool) *pool = new_handle();
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  (void)pool;
  (void)a;
  if (v) *(uint64_t *)v = 0;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  (void)pool; (void)a; (void)v;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  (void)pool;
  (void)keep;
  return cudaSuccess;
}
EXPORT cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
EXPORT cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

/* Driver entry points (torch's c10::cuda::DriverAPI): the driver functions of this library. */
#if CUDART_VERSION >= 12000
EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned int ver,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *st) {
  (void)ver;
  (void)flags;
  void *f = sym ? dlsym(RTLD_DEFAULT, sym) : NULL;
  if (fn) *fn = f;
  if (st) *st = f ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *st) {
  return cudaGetDriverEntryPointByVersion(sym, fn, CUDART_VERSION, flags, st);
}
#endif

/* ---- the driver (libcuda) ------------------------------------------------------------------ */

EXPORT CUresult cuInit(unsigned int f) {
  (void)f;
  return dev()->present ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
  if (v) *v = CUDART_VERSION;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
  if (n) *n = dev()->present ? 1 : 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (d) *d = ordinal;
  return ordinal == 0 && dev()->present ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  /* The driver's attribute numbers are the runtime's. */
  return cudaDeviceGetAttribute(v, (enum cudaDeviceAttr)a, d) == cudaSuccess
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
  (void)d;
  if (flags) *flags = 0;
  if (active) *active = 1;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  (void)d;
  if (c) *c = (CUcontext)0x100;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
  if (c) *c = (CUcontext)0x100;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  (void)c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
  if (d) *d = 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  if (s) *s = cudaGetErrorString((cudaError_t)e);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  if (s) *s = cudaGetErrorName((cudaError_t)e);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
  (void)s; (void)a; (void)v; (void)f;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream s) {
  (void)p; (void)v; (void)n; (void)s;
  return CUDA_SUCCESS;
}
/* Kernels torch compiles at run time (NVRTC: jiterator, fused kernels): load and launch as
 * no-ops. */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  (void)image;
  if (m) *m = new_handle();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n,
                                   CUjit_option *o, void **v) {
  (void)n; (void)o; (void)v;
  return cuModuleLoadData(m, image);
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  (void)m;
  (void)name;
  if (f) *f = new_handle();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) {
  (void)m;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  (void)f; (void)a; (void)v;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned sh, CUstream s, void **p,
                               void **e) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s;
  (void)p; (void)e;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                            size_t sh) {
  return (CUresult)cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, sh, 0);
}
/* The driver's virtual memory API (expandable segments) is not emulated. */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
                                              CUmemAllocationGranularity_flags o) {
  (void)g; (void)p; (void)o;
  vramlab_emu_refuse("cuMemGetAllocationGranularity (expandable_segments)");
  return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                            const CUmemAllocationProp *p, unsigned long long f) {
  (void)h; (void)n; (void)p; (void)f;
  vramlab_emu_refuse("cuMemCreate (expandable_segments)");
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- cuBLAS and cuBLASLt: handles, settings and products that succeed without computing ---- */

EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  if (h) *h = new_handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *m) {
  (void)h;
  if (m) *m = CUBLAS_DEFAULT_MATH;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t h, cublasPointerMode_t *m) {
  (void)h;
  if (m) *m = CUBLAS_POINTER_MODE_HOST;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
EXPORT size_t cublasGetCudartVersion(void) { return CUDART_VERSION; }
EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t h, int *v) {
  (void)h;
  if (v) *v = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (h) *h = new_handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c,
                                               cudaDataType_t s) {
  (void)c;
  (void)s;
  if (d) *d = new_handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t,
                                                 uint64_t r, uint64_t c, int64_t ld) {
  (void)t; (void)r; (void)c; (void)ld;
  if (l) *l = new_handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  if (p) *p = new_handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t *results,
    int *returned) {
  (void)h; (void)op; (void)a; (void)b; (void)c; (void)d; (void)pref;
  if (requested < 1 || !results) return CUBLAS_STATUS_INVALID_VALUE;
  memset(results, 0, sizeof *results);
  results->state = CUBLAS_STATUS_SUCCESS;
  results->wavesCount = 1.0f;
  if (returned) *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
