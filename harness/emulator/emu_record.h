/*
 * The records an emulated run leaves in its run folder ($VRAMLAB_EMU_DIR), the ABI between the
 * stubs (emu.c) and vramlab (harness/src/emulate/records.rs reads them at these offsets).
 *
 * Both are files mapped MAP_SHARED and updated in place at every allocation and free, so what
 * they say survives the process: a program killed by SIGKILL, a forked worker that leaves by
 * os._exit, a program that is not Python at all.
 *
 * - proc-<pid>[.<n>].bin: one per process that used the emulated device (`struct emu_proc`).
 *   <n> numbers a second copy of the stubs in one process (libcuda.so.1 loaded by dlopen).
 * - device-<d>.bin: one per emulated device, shared by every process of the run
 *   (`struct emu_device`): the bytes all of them hold there, so that two processes on one
 *   device share its capacity, as they do on a GPU.
 *
 * Every field is a little-endian uint64_t unless said otherwise; strings are NUL-terminated.
 *
 * The rest of the stubs' interface with vramlab:
 * - exported beside the CUDA names, read through ctypes by vramlab.phase (harness/python) and
 *   looked up by the CUDA build (meter::emulated): vramlab_emu_stats(used, peak, capacity, ...)
 *   and vramlab_emu_reset_peak() (emu.c);
 * - the environment `vramlab emulate` sets (harness/src/emulate/mod.rs, gpu.rs):
 *   VRAMLAB_EMU_NAME       the device name CUDA reports;
 *   VRAMLAB_EMU_TOTAL      totalGlobalMem, bytes (without it the stubs present no device);
 *   VRAMLAB_EMU_CONTEXT    bytes the context and modules hold outside any allocator;
 *   VRAMLAB_EMU_DEVICES    devices presented, all alike (default 1);
 *   VRAMLAB_EMU_CC_MAJOR, VRAMLAB_EMU_CC_MINOR   compute capability;
 *   VRAMLAB_EMU_SMS, VRAMLAB_EMU_L2, VRAMLAB_EMU_THREADS_PER_SM,
 *   VRAMLAB_EMU_SMEM_OPTIN, VRAMLAB_EMU_SMEM_PER_SM   the properties of that name;
 *   VRAMLAB_EMU_DIR        the run folder of these records (none: counted in the process only);
 *   VRAMLAB_EMU_NO_WEIGHTS `--no-weights`, read by the Python boot;
 *   VRAMLAB_EMU_ARCHS      torch's compiled architectures, set by the boot (launch.c);
 *   VRAMLAB_EMU_STUBS      (read by vramlab, not the stubs) a stub folder to use instead of
 *                          building one.
 */
#ifndef VRAMLAB_EMU_RECORD_H
#define VRAMLAB_EMU_RECORD_H
#include <stdint.h>

#define EMU_RECORD_MAGIC 0x31434552454d5256ULL /* "VRMEREC1" */
#define EMU_MAX_DEVICES 16
#define EMU_TEXT 512

/* One process's use of one device. */
struct emu_proc_device {
  uint64_t used;    /* bytes this process holds through cudaMalloc now */
  uint64_t peak;    /* at most, over the whole process (never reset) */
  uint64_t mallocs; /* successful device allocations */
  uint64_t failed;  /* allocations refused for capacity (PyTorch frees its cache and retries) */
};

struct emu_proc {                       /* offset */
  uint64_t magic;                       /* 0 */
  uint64_t pid;                         /* 8 */
  uint64_t ppid;                        /* 16 */
  uint64_t devices;                     /* 24: devices presented */
  uint64_t contexts;                    /* 32: bit d set: a context on device d */
  uint64_t d2h_reads;                   /* 40: device-to-host copies, answered with zeros */
  uint64_t last_d2h_ns;                 /* 48: CLOCK_REALTIME of the last one */
  uint64_t errors;                      /* 56: calls the stubs failed, out of memory aside */
  uint64_t exited;                      /* 64: 1 once the process ran its exit handlers */
  uint64_t reserved[7];                 /* 72 */
  struct emu_proc_device dev[EMU_MAX_DEVICES]; /* 128: 32 bytes each */
  char last_error[EMU_TEXT];            /* 640: the last failed call, its arguments and why */
  char cmdline[EMU_TEXT];               /* 1152: argv, spaces between */
};                                      /* 1664 */

struct emu_device {
  uint64_t magic;
  uint64_t used;     /* bytes all processes hold through cudaMalloc now */
  uint64_t contexts; /* processes with a context here now */
  uint64_t peak;     /* at most: used plus contexts times the context's bytes */
};

#endif
