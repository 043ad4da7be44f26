/*
 * C-level tests of what tensor-parallel ranks use on two emulated devices
 * (scripts/emulator-c-test.sh builds and runs them against libvramlab_emu.so and the emulated
 * NCCL, libnccl.so.2): a pointer reads back the device it was allocated on (device memory, and
 * pinned host memory by the device current at its allocation, as torch reads a UVA view's
 * device); a communicator knows its rank count, rank and device; collectives succeed without
 * moving anything; ncclMemAlloc's bytes count on the rank's device; bad ranks are refused.
 *
 * The prototypes are the ABI's, written with plain C types, so the test needs neither the CUDA
 * nor the NCCL headers.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
/* cudaPointerAttributes (CUDA 11 on): type, device, devicePointer, hostPointer. */
struct pointer_attributes {
  int type;
  int device;
  void *device_pointer;
  void *host_pointer;
};
enum { cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaHostAllocMapped = 2 };
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclSum = 0, ncclFloat32 = 7 };

cudaError_t cudaSetDevice(int d);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaPointerGetAttributes(struct pointer_attributes *a, const void *p);
ncclResult_t ncclGetVersion(int *v);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommCount(ncclComm_t c, int *n);
ncclResult_t ncclCommUserRank(ncclComm_t c, int *r);
ncclResult_t ncclCommCuDevice(ncclComm_t c, int *d);
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, void *config);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c,
                           void *stream);
ncclResult_t ncclMemAlloc(void **p, size_t size);
ncclResult_t ncclMemFree(void *p);
ncclResult_t ncclCommDestroy(ncclComm_t c);

#define MIB ((size_t)1 << 20)
#include "check.h"

static size_t device_free(void) {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return f;
}

static void pointers_know_their_device(void) {
  void *d0 = NULL, *d1 = NULL, *h1 = NULL;
  struct pointer_attributes a;
  CHECK(cudaSetDevice(0) == 0 && cudaMalloc(&d0, MIB) == 0, "allocate on device 0");
  CHECK(cudaSetDevice(1) == 0 && cudaMalloc(&d1, MIB) == 0, "allocate on device 1");
  CHECK(cudaHostAlloc(&h1, MIB, cudaHostAllocMapped) == 0, "pinned host memory");
  CHECK(cudaPointerGetAttributes(&a, d1) == 0 && a.type == cudaMemoryTypeDevice && a.device == 1,
        "device 1's block reads type %d device %d", a.type, a.device);
  CHECK(cudaPointerGetAttributes(&a, d0) == 0 && a.device == 0, "device 0's block reads %d",
        a.device);
  CHECK(cudaPointerGetAttributes(&a, h1) == 0 && a.type == cudaMemoryTypeHost && a.device == 1,
        "pinned memory of device 1 reads type %d device %d", a.type, a.device);
  cudaFree(d1);
  cudaFreeHost(h1);
  cudaSetDevice(0);
  cudaFree(d0);
}

static void a_rank_s_communicator(void) {
  int version = 0, n = 0, rank = -1, dev = -1;
  ncclUniqueId id;
  ncclComm_t c = NULL, split = (ncclComm_t)&id;
  CHECK(ncclGetVersion(&version) == ncclSuccess && version >= 20000, "version %d", version);
  CHECK(ncclGetUniqueId(&id) == ncclSuccess, "a unique id");
  CHECK(cudaSetDevice(1) == 0, "rank 1 on device 1");
  CHECK(ncclCommInitRank(&c, 2, id, 1) == ncclSuccess && c, "rank 1 of 2");
  CHECK(ncclCommCount(c, &n) == ncclSuccess && n == 2, "%d ranks", n);
  CHECK(ncclCommUserRank(c, &rank) == ncclSuccess && rank == 1, "rank %d", rank);
  CHECK(ncclCommCuDevice(c, &dev) == ncclSuccess && dev == 1, "device %d", dev);
  float x[4] = {1, 2, 3, 4};
  CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, NULL) == ncclSuccess && x[3] == 4,
        "an all-reduce succeeds and moves nothing");
  CHECK(ncclCommSplit(c, -1, 0, &split, NULL) == ncclSuccess && split == NULL,
        "a rank outside the split gets no communicator");
  size_t before = device_free();
  void *p = NULL;
  CHECK(ncclMemAlloc(&p, 64 * MIB) == ncclSuccess && p, "NCCL's own allocation");
  CHECK(before - device_free() >= 64 * MIB, "it counts on the device: %zu bytes",
        before - device_free());
  CHECK(ncclMemFree(p) == ncclSuccess && device_free() == before, "and is given back");
  ncclComm_t bad = NULL;
  CHECK(ncclCommInitRank(&bad, 2, id, 2) == ncclInvalidArgument && !bad, "rank 2 of 2 refused");
  CHECK(ncclCommDestroy(c) == ncclSuccess, "destroyed");
  cudaSetDevice(0);
}

int main(void) {
  pointers_know_their_device();
  a_rank_s_communicator();
  if (failures) {
    fprintf(stderr, "ranks_test: %d check(s) failed\n", failures);
    return 1;
  }
  fprintf(stderr, "ranks_test: ok (pointers' devices, a rank's communicator, NCCL's memory)\n");
  return 0;
}
