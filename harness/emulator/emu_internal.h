/*
 * What emu.c shares with the emulator's other files (runtime.c, launch.c, pool.c): the emulated
 * devices, the failure line, device memory and handles. Internal to libvramlab_emu.so (built with
 * -fvisibility=hidden): nothing here is exported. Include after the CUDA headers.
 */
#ifndef VRAMLAB_EMU_INTERNAL_H
#define VRAMLAB_EMU_INTERNAL_H
#include <stdint.h>
#include "emu_record.h"

#define EXPORT __attribute__((visibility("default")))

struct emu_gpu {
  int present;
  int count; /* devices presented, all alike (VRAMLAB_EMU_DEVICES, default 1) */
  char name[256];
  uint64_t total;    /* totalGlobalMem, bytes */
  uint64_t context;  /* held by the CUDA context and loaded modules, bytes */
  int major, minor, sms, l2, threads_per_sm;
  uint64_t smem_optin, smem_per_sm;
};

/* The emulated GPU (from the VRAMLAB_EMU_* variables; `present` is 0 without them). */
const struct emu_gpu *dev(void);
int valid_device(int d);
/* The failure for an ordinal the emulated GPUs do not have, naming how many there are. */
cudaError_t bad_device(const char *call, int d);
/* The calling thread's device (cudaSetDevice, cuCtxSetCurrent). */
extern __thread int current;

/* Records and prints one line for a failed call, and returns `code`. */
int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text cudaGetErrorString and cuGetErrorString give for `last_code`. */
extern __thread char last_error[EMU_TEXT];
extern __thread int last_code;
struct emu_proc *record(void);

/* Device address space taken from (given back to) the device's capacity, as cudaMalloc
 * (cudaFree) does; out of capacity is cudaErrorMemoryAllocation with no line printed. */
cudaError_t device_alloc(void **out, size_t size, const char *call);
cudaError_t block_free(void *p, int host, const char *call);
int is_device(const void *p);
/* The allocation holding p (its start and size); 0 for an address the emulator did not give. */
int block_range(const void *p, uintptr_t *base, size_t *size);
/* A driver function by the name cuGetProcAddress is asked for: its newest versioned
 * definition here (cuMemGetAddressRange_v2 for cuMemGetAddressRange), else the name itself. */
void *driver_symbol(const char *name);
/* Only host destinations are written: zeros from the device (counted), bytes from the host. */
cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
/* A synchronization point (stream, event, context, device): the memory pools give back what
 * their release threshold does not keep (pool.c). */
void emu_synchronized(void);
/* A distinct non-null value that is never dereferenced. */
void *new_handle(void);

#endif
