/*
 * The emulated GPU's CUDA runtime, part one: devices and their properties, device and host
 * allocation, copies and sets (emu.c has the shared state; launch.c streams, events, modules,
 * launches, the driver and cuBLAS).
 */
#include "emu_cuda.h"
/* ---- the CUDA runtime ---------------------------------------------------------------------- */

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount(NULL): no count to write");
  *count = dev()->present ? dev()->count : 0;
  return dev()->present ? cudaSuccess : cudaErrorNoDevice;
}
EXPORT cudaError_t cudaGetDevice(int *d) {
  if (d) *d = current;
  return dev()->present ? cudaSuccess : cudaErrorNoDevice;
}
/* An ordinal the emulated GPUs do not have, named with how many there are. */
cudaError_t bad_device(const char *call, int d) {
  return fail(cudaErrorInvalidDevice,
              "%s(device %d): the emulator presents %d device(s) (vramlab emulate --devices)", call,
              d, dev()->count);
}
EXPORT cudaError_t cudaSetDevice(int d) {
  if (!dev()->present) return cudaErrorNoDevice;
  if (!valid_device(d)) return bad_device("cudaSetDevice", d);
  current = d;
  return cudaSuccess;
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
#define DEVICE_PROP struct cudaDeviceProp10
#define REPORTED_CUDART_VERSION 10020
#else
#define DEVICE_PROP struct cudaDeviceProp
#define REPORTED_CUDART_VERSION CUDART_VERSION
#endif

#undef cudaGetDeviceProperties
EXPORT cudaError_t cudaGetDeviceProperties(DEVICE_PROP *prop, int d) {
  if (!dev()->present) return cudaErrorNoDevice;
  if (!valid_device(d)) return bad_device("cudaGetDeviceProperties", d);
  if (!prop) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties(NULL, %d)", d);
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
  if (!valid_device(d)) return bad_device("cudaDeviceGetAttribute", d);
  if (!value) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(NULL, %d, %d)", (int)attr, d);
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
  if (!valid_device(d)) return bad_device("cudaDeviceGetPCIBusId", d);
  if (id && len > 0) snprintf(id, (size_t)len, "00000000:%02x:00.0", d + 1);
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
  return fail(cudaErrorNotSupported,
              "cudaDeviceEnablePeerAccess(%d): peer access is not emulated", peer);
}
EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceSynchronize(void) {
  emu_synchronized();
  return cudaSuccess;
}
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
  static __thread char unknown[96];
  if (e != cudaSuccess && (int)e == last_code && last_error[0]) return last_error;
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (vramlab emulator: no GPU configured)";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotSupported: return "operation not supported (vramlab emulator)";
  default:
    snprintf(unknown, sizeof unknown, "vramlab emulator: error %d from a call it did not record",
             (int)e);
    return unknown;
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

EXPORT cudaError_t cudaMalloc(void **p, size_t size) { return device_alloc(p, size, "cudaMalloc"); }
EXPORT cudaError_t cudaFree(void *p) { return block_free(p, 0, "cudaFree"); }
EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
  (void)flags;
  return device_alloc(p, size, "cudaMallocManaged");
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

