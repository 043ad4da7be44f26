/*
 * C-level tests of the emulated GPU's stubs (scripts/emulator-c-test.sh builds and runs them
 * against libvramlab_emu.so; a step of scripts/test.sh): the device's properties read back,
 * cudaMalloc against the capacity, and the stream-ordered pool's rules (pool.c): used bytes
 * exact, reserved in 2 MiB granules, released at a synchronization above the release
 * threshold, trimmed by cuMemPoolTrimTo, out of memory only after the empty segments are given
 * back. The GPU is described by the VRAMLAB_EMU_* variables the script sets.
 *
 * The prototypes are the ABI's, written here with plain C types (CUDA's enum values are fixed
 * by its binary interface), so the test needs no CUDA headers.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int cudaError_t;
typedef void *CUmemoryPool;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_OUT_OF_MEMORY = 2, cudaErrorMemoryAllocation = 2 };
enum { cudaDevAttrMultiProcessorCount = 16 };
enum {
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
  CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
  CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetName(char *name, int len, int dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
cudaError_t cudaDeviceGetAttribute(int *v, int attr, int dev);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, int dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, int dev);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s);
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *v);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *v);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
CUresult cuStreamSynchronize(CUstream s);

#define MIB ((uint64_t)1 << 20)
#include "check.h"

static uint64_t env(const char *k) {
  const char *v = getenv(k);
  if (!v) {
    fprintf(stderr, "emu_test: %s is not set (scripts/emulator-c-test.sh sets it)\n", k);
    exit(2);
  }
  return strtoull(v, NULL, 10);
}

static uint64_t attr(CUmemoryPool pool, int a) {
  uint64_t v = 0;
  CHECK(cuMemPoolGetAttribute(pool, a, &v) == CUDA_SUCCESS, "attribute %d", a);
  return v;
}

static void set_attr(CUmemoryPool pool, int a, uint64_t v) {
  CHECK(cuMemPoolSetAttribute(pool, a, &v) == CUDA_SUCCESS, "attribute %d = %llu", a,
        (unsigned long long)v);
}

static uint64_t device_free(void) {
  size_t f = 0, t = 0;
  CHECK(cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS, "cuMemGetInfo");
  return f;
}

static void properties(uint64_t total, uint64_t context) {
  int n = 0, sms = 0;
  char name[256] = {0};
  size_t bytes = 0;
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 1, "%d devices", n);
  CHECK(cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS, "cuDeviceGetName");
  CHECK(strcmp(name, getenv("VRAMLAB_EMU_NAME")) == 0, "name %s", name);
  CHECK(cuDeviceTotalMem_v2(&bytes, 0) == CUDA_SUCCESS && bytes == total, "total %zu", bytes);
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == 0 &&
            (uint64_t)sms == env("VRAMLAB_EMU_SMS"),
        "%d SMs", sms);
  CHECK(device_free() == total - context, "free %llu, want total - context",
        (unsigned long long)device_free());
}

static void plain_malloc(uint64_t total, uint64_t context) {
  void *p = NULL;
  uint64_t before = device_free();
  CHECK(cudaMalloc(&p, 64 * MIB) == 0 && p, "cudaMalloc 64 MiB");
  CHECK(device_free() == before - 64 * MIB, "free after cudaMalloc %llu",
        (unsigned long long)device_free());
  CHECK(cudaFree(p) == 0 && device_free() == before, "cudaFree gives it back");
  void *q = NULL;
  CHECK(cudaMalloc(&q, total - context + 1) == cudaErrorMemoryAllocation,
        "one byte past the capacity fails");
}

static void pool_rules(uint64_t total, uint64_t context) {
  CUmemoryPool pool = NULL, current = NULL;
  CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS && pool, "default pool");
  CHECK(cuDeviceGetMemPool(&current, 0) == CUDA_SUCCESS && current == pool,
        "the current pool is the default one");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0, "CUDA's default threshold is 0");
  uint64_t free0 = device_free();

  /* Used is the bytes asked for; reserved is whole 2 MiB granules. */
  CUdeviceptr a = 0, b = 0;
  CHECK(cuMemAllocAsync(&a, 1000, NULL) == CUDA_SUCCESS && a, "1000 B");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1000, "used %llu",
        (unsigned long long)attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MIB, "one granule");
  /* 3 MiB does not fit the first segment's rest: a new one of two granules. */
  CHECK(cuMemAllocAsync(&b, 3 * MIB, NULL) == CUDA_SUCCESS && b, "3 MiB");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1000 + 3 * MIB, "used");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 6 * MIB, "reserved %llu",
        (unsigned long long)attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  CHECK(device_free() == free0 - 6 * MIB, "the segments are device memory");

  /* A free keeps the segment until a synchronization, which releases it (threshold 0). */
  CHECK(cuMemFreeAsync(b, NULL) == CUDA_SUCCESS, "free 3 MiB");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1000, "used after free");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 6 * MIB, "kept until a sync");
  CHECK(cuStreamSynchronize(NULL) == CUDA_SUCCESS, "sync");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MIB, "released at the sync");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 6 * MIB, "high-water mark");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1000 + 3 * MIB, "used high-water mark");
  set_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
  set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 2 * MIB, "reset to the current");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1000, "reset to the current");

  /* A threshold above the pool keeps freed segments through syncs; TrimTo releases them. */
  set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  CHECK(cuMemAllocAsync(&b, 3 * MIB, NULL) == CUDA_SUCCESS, "3 MiB again");
  CHECK(cuMemFreeAsync(b, NULL) == CUDA_SUCCESS && cuStreamSynchronize(NULL) == CUDA_SUCCESS,
        "free and sync");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 6 * MIB, "kept under the threshold");
  CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS, "trim");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MIB, "trimmed to the live one");

  /* Out of memory: an allocation that fits only once the empty segments are given back
   * succeeds; one past the device fails with the driver's code and changes nothing. */
  CHECK(cuMemAllocAsync(&b, 64 * MIB, NULL) == CUDA_SUCCESS, "64 MiB");
  CHECK(cuMemFreeAsync(b, NULL) == CUDA_SUCCESS, "free 64 MiB (kept)");
  uint64_t room = total - context - 2 * MIB; /* all but the live segment */
  CUdeviceptr big = 0;
  CHECK(cuMemAllocAsync(&big, room, NULL) == CUDA_SUCCESS, "the whole rest, after a trim");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MIB + room, "reserved %llu",
        (unsigned long long)attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  CUdeviceptr more = 0;
  CHECK(cuMemAllocAsync(&more, 4 * MIB, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "past the device");
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1000 + room, "the failure took nothing");
  CHECK(cuMemFreeAsync(big, NULL) == CUDA_SUCCESS && cuMemFreeAsync(a, NULL) == CUDA_SUCCESS,
        "free the rest");
  CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS &&
            attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0,
        "an empty pool holds nothing");
  CHECK(device_free() == free0, "the device has everything back");
}

int main(void) {
  uint64_t total = env("VRAMLAB_EMU_TOTAL"), context = env("VRAMLAB_EMU_CONTEXT");
  properties(total, context);
  plain_malloc(total, context);
  pool_rules(total, context);
  if (failures) {
    fprintf(stderr, "emu_test: %d check(s) failed\n", failures);
    return 1;
  }
  fprintf(stderr, "emu_test: ok (properties, cudaMalloc, the pool's granules, release, trim, OOM)\n");
  return 0;
}
