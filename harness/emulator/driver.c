/*
 * Driver (libcuda) entry points beyond torch's: those that vLLM's compiled extensions link
 * (vllm/_C_stable_libtorch, flash attention, the sleep-mode allocator cumem_allocator) and that
 * Triton's launcher calls (triton/backends/nvidia/driver.c, compiled at run time against this
 * library as libcuda.so.1). Kernels never run: modules load as handles, functions answer plain
 * attributes, launches do nothing, tensor-map descriptors are zeros.
 */
#include "emu_cuda.h"

/* What a driver function the emulator does not define answers, when a program resolved it by
 * name (cudaGetDriverEntryPoint, cuGetProcAddress): not supported, in one line. PyTorch resolves
 * a fixed list of names at once (c10/cuda/driver_api.cpp: green contexts, multicast, shareable
 * handles) and asserts that each is there; it calls them only for features the emulator
 * refuses. */
static char undefined_names[512];
static pthread_mutex_t undefined_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult undefined_driver_function(void) {
  return fail(CUDA_ERROR_NOT_SUPPORTED, "a driver function the emulated GPU does not define, "
              "resolved by name (one of: %s)", undefined_names);
}

/* Remembers a name resolved to undefined_driver_function, for its line. */
static void undefined(const char *symbol) {
  pthread_mutex_lock(&undefined_lock);
  if (!strstr(undefined_names, symbol)) {
    size_t n = strlen(undefined_names);
    snprintf(undefined_names + n, sizeof undefined_names - n, "%s%s", n ? ", " : "", symbol);
  }
  pthread_mutex_unlock(&undefined_lock);
}

/* The driver's own name for a symbol at a CUDA version: cuGetProcAddress looks a base name up
 * (cuMemAlloc) and answers its newest versioned definition (cuMemAlloc_v2); a driver name the
 * emulator does not define answers undefined_driver_function. */
void *driver_symbol(const char *symbol) {
  if (!symbol) return NULL;
  char name[256];
  for (int v = 4; v >= 2; v--) {
    snprintf(name, sizeof name, "%s_v%d", symbol, v);
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f) return f;
  }
  void *f = dlsym(RTLD_DEFAULT, symbol);
  if (!f && symbol[0] == 'c' && symbol[1] == 'u' && symbol[2] >= 'A' && symbol[2] <= 'Z') {
    undefined(symbol);
    f = (void *)undefined_driver_function;
  }
  return f;
}

#if CUDA_VERSION >= 12000
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
  (void)version;
  (void)flags;
  void *f = driver_symbol(symbol);
  if (pfn) *pfn = f;
  if (status) *status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
#endif

/* Where a pointer lives: the emulator's device blocks are device memory on the calling
 * thread's device; Triton's launcher asks for the device pointer of every tensor argument. */
EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (!data) return fail(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute(NULL, %d)", (int)attr);
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    *(CUdeviceptr *)data = ptr;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    *(void **)data = is_device((const void *)ptr) ? NULL : (void *)ptr;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    *(unsigned int *)data = is_device((const void *)ptr) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    *(int *)data = current;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_CONTEXT:
    *(CUcontext *)data = (CUcontext)0x100;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED:
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    *(int *)data = 0;
    return CUDA_SUCCESS;
  default:
    return fail(CUDA_ERROR_NOT_SUPPORTED, "cuPointerGetAttribute(attribute %d): not emulated",
                (int)attr);
  }
}
EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                       CUdeviceptr ptr) {
  for (unsigned int i = 0; i < n; i++) {
    CUresult r = cuPointerGetAttribute(data[i], attrs[i], ptr);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

/* The PCI bus id NVML answers for the same device (nvml.c; the runtime's is in runtime.c). */
EXPORT CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice d) {
  return (CUresult)cudaDeviceGetPCIBusId(out, len, (int)d);
}

/* The allocation that holds an address (PyTorch's DriverAPI resolves it at start-up). */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  uintptr_t b;
  size_t n;
  if (!block_range((const void *)ptr, &b, &n))
    return fail(CUDA_ERROR_NOT_FOUND, "cuMemGetAddressRange(%p): not an address the emulated "
                "GPU gave", (void *)ptr);
  if (base) *base = (CUdeviceptr)b;
  if (size) *size = n;
  return CUDA_SUCCESS;
}

/* Functions (modules are in launch.c and pool.c): a function has no spills and the registers of a light
 * kernel (Triton checks both against the device's limits before it launches). */
EXPORT CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  (void)f;
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuFuncGetAttribute(NULL, %d)", (int)a);
  switch (a) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; break;
  case CU_FUNC_ATTRIBUTE_PTX_VERSION:
  case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = dev()->major * 10 + dev()->minor; break;
  default: *v = 0;
  }
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) {
  (void)f; (void)c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetLimit(CUlimit l, size_t v) {
  (void)l; (void)v;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit l) {
  (void)l;
  if (v) *v = 1024;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetApiVersion(CUcontext c, unsigned int *v) {
  (void)c;
  if (v) *v = 3020;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
  (void)c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
  if (c) *c = (CUcontext)0x100;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c) {
  (void)s;
  if (c) *c = (CUcontext)0x100;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *size, CUmodule m, const char *name) {
  (void)m; (void)name;
  if (p) *p = 0;
  if (size) *size = 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                          CUstream s, void **p) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p;
  return CUDA_SUCCESS;
}

#if CUDA_VERSION >= 12000
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  (void)c; (void)f; (void)p; (void)e;
  return CUDA_SUCCESS;
}
/* One cluster of any shape fits. */
EXPORT CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c) {
  (void)f; (void)c;
  if (n) *n = 1;
  return CUDA_SUCCESS;
}
/* TMA descriptors (Hopper kernels, vLLM's and Triton's): opaque 128 bytes, zeros here. */
EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t rank,
                                       void *addr, const cuuint64_t *dims,
                                       const cuuint64_t *strides, const cuuint32_t *box,
                                       const cuuint32_t *estrides, CUtensorMapInterleave il,
                                       CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                       CUtensorMapFloatOOBfill oob) {
  (void)t; (void)rank; (void)addr; (void)dims; (void)strides; (void)box; (void)estrides;
  (void)il; (void)sw; (void)l2; (void)oob;
  if (m) memset(m, 0, sizeof *m);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuTensorMapEncodeIm2col(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t rank,
                                        void *addr, const cuuint64_t *dims,
                                        const cuuint64_t *strides, const int *lower,
                                        const int *upper, cuuint32_t ch, cuuint32_t px,
                                        const cuuint32_t *estrides, CUtensorMapInterleave il,
                                        CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob) {
  (void)t; (void)rank; (void)addr; (void)dims; (void)strides; (void)lower; (void)upper;
  (void)ch; (void)px; (void)estrides; (void)il; (void)sw; (void)l2; (void)oob;
  if (m) memset(m, 0, sizeof *m);
  return CUDA_SUCCESS;
}
#endif

/* The driver's virtual-memory API (vLLM's sleep-mode allocator, PyTorch's expandable segments):
 * not emulated, each refused with one line (cuMemCreate and cuMemGetAllocationGranularity are
 * in launch.c). */
#define VMM_REFUSED(call, ...)                                                                     \
  return fail(CUDA_ERROR_NOT_SUPPORTED, call ": the driver's virtual memory API is not emulated")
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long f) {
  (void)p; (void)size; (void)align; (void)addr; (void)f;
  VMM_REFUSED("cuMemAddressReserve");
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  (void)p; (void)size;
  VMM_REFUSED("cuMemAddressFree");
}
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long f) {
  (void)p; (void)size; (void)off; (void)h; (void)f;
  VMM_REFUSED("cuMemMap");
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  (void)p; (void)size;
  VMM_REFUSED("cuMemUnmap");
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n) {
  (void)p; (void)size; (void)d; (void)n;
  VMM_REFUSED("cuMemSetAccess");
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  (void)h;
  VMM_REFUSED("cuMemRelease");
}
