/*
 * The emulated GPU's NCCL (libnccl.so.2): tensor-parallel and distributed programs run their
 * ranks on emulated devices, one process each (`vramlab emulate --devices N`). vLLM's
 * PyNcclCommunicator opens it through VLLM_NCCL_SO_PATH and torch's ProcessGroupNCCL binds it
 * first because `vramlab emulate` preloads it (torch's libtorch_cuda finds the real one through
 * its RPATH, which a preloaded soname overrides).
 *
 * A communicator is a host struct of its rank count, rank and device; collectives and
 * point-to-point calls move nothing and succeed (the emulated GPU computes nothing, so there is
 * nothing to move). Nothing is allocated on the device except through ncclMemAlloc, which
 * allocates through the emulated runtime: real NCCL's own buffers (per channel and peer, NVLink
 * SHARP's on NVSwitch systems) are not held, and a report says so (docs/src/guides/emulator.md,
 * "Tensor parallelism"). ncclGetVersion answers NCCL 2.30.7, the vllm-0.33 stack's.
 *
 * Compiled without the NCCL headers (the wheels carry none): the types below have nccl.h's C
 * ABI for what they carry. VRAMLAB_NCCL_LOG=1 traces the calls on standard error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclInvalidArgument = 4 };
/* NCCL_SPLIT_NOCOLOR: a rank that takes no part in the split communicator. */
enum { NOCOLOR = -1 };
/* ncclNumOps: the first user-defined reduction (ncclRedOpCreatePreMulSum). */
enum { FIRST_USER_OP = 5 };
typedef struct {
  char internal[128];
} ncclUniqueId;
struct ncclComm {
  int nranks, rank, device;
};
typedef struct ncclComm *ncclComm_t;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("VRAMLAB_NCCL_LOG");
    on = e && *e && strcmp(e, "0") != 0;
  }
  if (!on) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "vramlab nccl (pid %d): ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* The emulated runtime's functions, found in the process (libvramlab_emu.so is preloaded first). */
static void *runtime(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static int current_device(void) {
  int (*get)(int *) = (int (*)(int *))runtime("cudaGetDevice");
  int d = 0;
  if (get) get(&d);
  return d;
}

static ncclResult_t new_comm(ncclComm_t *out, int nranks, int rank, int device) {
  if (!out || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclUnhandledCudaError;
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  *out = c;
  trace("communicator (rank %d of %d, device %d)", rank, nranks, device);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetVersion(int *v) {
  if (v) *v = 23007;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  /* Distinct per call and process: the ranks only pass it around. */
  static uint64_t calls;
  uint64_t s = ((uint64_t)getpid() << 32) ^ ++calls;
  for (size_t i = 0; i < sizeof id->internal; i++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    id->internal[i] = (char)(s >> 56);
  }
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  return new_comm(comm, nranks, rank, current_device());
}
EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                           int rank, void *config) {
  (void)config;
  return ncclCommInitRank(comm, nranks, id, rank);
}
EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nids,
                                             ncclUniqueId *ids, void *config) {
  (void)nids, (void)ids, (void)config;
  return new_comm(comm, nranks, rank, current_device());
}
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  for (int i = 0; i < ndev; i++) {
    ncclResult_t r = new_comm(&comms[i], ndev, i, devlist ? devlist[i] : i);
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  void *config) {
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  if (color == NOCOLOR) {
    *newcomm = NULL;
    return ncclSuccess;
  }
  /* The ranks' split is not known here: the new communicator keeps the rank count. */
  return new_comm(newcomm, comm->nranks, key >= 0 && key < comm->nranks ? key : comm->rank,
                  comm->device);
}
EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excluded, int n, ncclComm_t *newcomm,
                                   void *config, int flags) {
  (void)excluded, (void)config, (void)flags;
  if (!comm || n < 0 || n >= comm->nranks) return ncclInvalidArgument;
  int rank = comm->rank < comm->nranks - n ? comm->rank : 0;
  return new_comm(newcomm, comm->nranks - n, rank, comm->device);
}
/* What succeeds without acting, traced: a call of `name` with the parameters that follow. */
#define SUCCEEDS(name, ...)                                                                        \
  EXPORT ncclResult_t name(__VA_ARGS__) {                                                          \
    trace("%s", #name);                                                                            \
    return ncclSuccess;                                                                            \
  }
/* A communicator's few bytes are kept: torch may abort one it has destroyed. */
SUCCEEDS(ncclCommDestroy, ncclComm_t c)
SUCCEEDS(ncclCommAbort, ncclComm_t c)
SUCCEEDS(ncclCommFinalize, ncclComm_t c)
EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
  (void)c;
  if (e) *e = ncclSuccess;
  return ncclSuccess;
}
EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (vramlab's emulated NCCL)";
  case ncclInvalidArgument: return "invalid argument (vramlab's emulated NCCL)";
  default: return "unknown result code (vramlab's emulated NCCL)";
  }
}
EXPORT const char *ncclGetLastError(ncclComm_t c) {
  (void)c;
  return "";
}
EXPORT ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
  if (!c || !n) return ncclInvalidArgument;
  *n = c->nranks;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *d) {
  if (!c || !d) return ncclInvalidArgument;
  *d = c->device;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
  if (!c || !r) return ncclInvalidArgument;
  *r = c->rank;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommMemStats(ncclComm_t c, int stat, uint64_t *v) {
  (void)c, (void)stat;
  if (v) *v = 0;
  return ncclSuccess;
}

/* Collectives and point-to-point: nothing moves. */
SUCCEEDS(ncclAllReduce, const void *s, void *r, size_t n, int dt, int op, ncclComm_t c,
         void *st)
SUCCEEDS(ncclBroadcast, const void *s, void *r, size_t n, int dt, int root, ncclComm_t c,
         void *st)
SUCCEEDS(ncclBcast, void *b, size_t n, int dt, int root, ncclComm_t c, void *st)
SUCCEEDS(ncclReduce, const void *s, void *r, size_t n, int dt, int op, int root,
         ncclComm_t c, void *st)
SUCCEEDS(ncclAllGather, const void *s, void *r, size_t n, int dt, ncclComm_t c, void *st)
SUCCEEDS(ncclReduceScatter, const void *s, void *r, size_t n, int dt, int op, ncclComm_t c,
         void *st)
SUCCEEDS(ncclAlltoAll, const void *s, void *r, size_t n, int dt, ncclComm_t c, void *st)
SUCCEEDS(ncclGather, const void *s, void *r, size_t n, int dt, int root, ncclComm_t c,
         void *st)
SUCCEEDS(ncclScatter, const void *s, void *r, size_t n, int dt, int root, ncclComm_t c,
         void *st)
SUCCEEDS(ncclSend, const void *s, size_t n, int dt, int peer, ncclComm_t c, void *st)
SUCCEEDS(ncclRecv, void *r, size_t n, int dt, int peer, ncclComm_t c, void *st)
SUCCEEDS(ncclGroupStart, void)
SUCCEEDS(ncclGroupEnd, void)
SUCCEEDS(ncclGroupSimulateEnd, void *info)

/* NCCL's own allocator: the emulated runtime's, so the bytes count on the rank's device. */
EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  int (*alloc)(void **, size_t) = (int (*)(void **, size_t))runtime("cudaMalloc");
  int rc = alloc ? alloc(ptr, size) : 1;
  trace("ncclMemAlloc (%zu bytes): %d", size, rc);
  return rc ? ncclUnhandledCudaError : ncclSuccess;
}
EXPORT ncclResult_t ncclMemFree(void *ptr) {
  int (*release)(void *) = (int (*)(void *))runtime("cudaFree");
  return release && release(ptr) ? ncclUnhandledCudaError : ncclSuccess;
}

/* Buffer registration and windows: a handle that names nothing. */
static char registered;
EXPORT ncclResult_t ncclCommRegister(ncclComm_t c, void *b, size_t n, void **h) {
  (void)c, (void)b, (void)n;
  *h = &registered;
  return ncclSuccess;
}
SUCCEEDS(ncclCommDeregister, ncclComm_t c, void *h)
EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *b, size_t n, void **w, int f) {
  (void)c, (void)b, (void)n, (void)f;
  *w = &registered;
  return ncclSuccess;
}
SUCCEEDS(ncclCommWindowDeregister, ncclComm_t c, void *w)
EXPORT ncclResult_t ncclRedOpCreatePreMulSum(int *op, void *scalar, int dt, int residence,
                                             ncclComm_t c) {
  (void)scalar, (void)dt, (void)residence, (void)c;
  *op = FIRST_USER_OP;
  return ncclSuccess;
}
SUCCEEDS(ncclRedOpDestroy, int op, ncclComm_t c)
SUCCEEDS(ncclCommSuspend, ncclComm_t c, int flags)
SUCCEEDS(ncclCommResume, ncclComm_t c)

/* The rest of what torch's libtorch_cuda imports from NCCL 2.30 (device communicators,
 * symmetric memory, signals): succeed without acting, traced. */
SUCCEEDS(ncclCommGetUniqueId, void)
SUCCEEDS(ncclCommGrow, void)
SUCCEEDS(ncclCommRevoke, void)
SUCCEEDS(ncclDevCommCreate, void)
SUCCEEDS(ncclDevCommDestroy, void)
SUCCEEDS(ncclGetLsaMultimemDevicePointer, void)
SUCCEEDS(ncclGetPeerDevicePointer, void)
SUCCEEDS(ncclGetLsaDevicePointer, void)
SUCCEEDS(ncclGetMultimemDevicePointer, void)
SUCCEEDS(ncclPutSignal, void)
SUCCEEDS(ncclSignal, void)
SUCCEEDS(ncclWaitSignal, void)
SUCCEEDS(ncclWinGetUserPtr, void)
