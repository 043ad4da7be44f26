/*
 * The emulated GPU's NVML (libnvidia-ml.so.1): what a program asks the management library about
 * the card. vLLM detects its platform through NVML (vllm/platforms/__init__.py: nvmlInit, then
 * nvmlDeviceGetCount) and reads the device's name, compute capability and memory there; pynvml
 * (nvidia-ml-py) and torch's NVML-based device count load this library by its soname, which
 * `vramlab emulate` puts on the library path.
 *
 * Compiled without the CUDA or NVML headers (the wheels carry neither): the types below have the
 * C ABI of nvml.h for the fields they carry. The card is the one the VRAMLAB_EMU_* variables
 * describe, as for the CUDA stubs (emu.c); its memory "used" is the device record the CUDA stubs
 * keep in the run folder (emu_record.h): what every process of the run holds there, with one
 * context per process. A call this library does not answer is NVML_ERROR_NOT_SUPPORTED, which
 * pynvml raises as NVMLError_NotSupported and its callers handle as on a card without the
 * feature.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_record.h"

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_UNKNOWN = 999,
};

struct emu_nvml_device {
  unsigned index;
};
typedef struct emu_nvml_device *nvmlDevice_t;

typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;

static struct {
  int present;
  unsigned count;
  char name[96];
  uint64_t total, context;
  int major, minor;
} card;
static struct emu_nvml_device devices[EMU_MAX_DEVICES];
static pthread_once_t card_once = PTHREAD_ONCE_INIT;

static uint64_t env_u64(const char *key, uint64_t dflt) {
  const char *v = getenv(key);
  return (v && *v) ? strtoull(v, NULL, 10) : dflt;
}

static void card_init(void) {
  const char *total = getenv("VRAMLAB_EMU_TOTAL");
  if (!total || !*total) return;
  card.present = 1;
  uint64_t n = env_u64("VRAMLAB_EMU_DEVICES", 1);
  card.count = n < 1 ? 1 : n > EMU_MAX_DEVICES ? EMU_MAX_DEVICES : (unsigned)n;
  snprintf(card.name, sizeof card.name, "%s",
           getenv("VRAMLAB_EMU_NAME") ? getenv("VRAMLAB_EMU_NAME") : "vramlab emulated GPU");
  card.total = strtoull(total, NULL, 10);
  card.context = env_u64("VRAMLAB_EMU_CONTEXT", 0);
  card.major = (int)env_u64("VRAMLAB_EMU_CC_MAJOR", 9);
  card.minor = (int)env_u64("VRAMLAB_EMU_CC_MINOR", 0);
  for (unsigned i = 0; i < EMU_MAX_DEVICES; i++) devices[i].index = i;
}

static int present(void) {
  pthread_once(&card_once, card_init);
  return card.present;
}

/* The device's index, or -1 for a handle that is not one of ours. */
static int index_of(nvmlDevice_t d) {
  if (!present() || d < devices || d >= devices + card.count) return -1;
  return (int)(d - devices);
}

#define DEVICE(d, i)                                                                               \
  int i = index_of(d);                                                                             \
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t copy_text(char *out, unsigned len, const char *text) {
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(text) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(out, text, strlen(text) + 1);
  return NVML_SUCCESS;
}

/* What the run's processes hold on device i now (the CUDA stubs' shared device record), with a
 * context per process there; 0 before any process used it, or without a run folder. */
static uint64_t used_on(int i) {
  const char *dir = getenv("VRAMLAB_EMU_DIR");
  if (!dir || !*dir) return 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/device-%d.bin", dir, i);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct emu_device rec;
  ssize_t n = pread(fd, &rec, sizeof rec, 0);
  close(fd);
  if (n != (ssize_t)sizeof rec || rec.magic != EMU_RECORD_MAGIC) return 0;
  return rec.used + rec.contexts * card.context;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
  return present() ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  return nvmlInit_v2();
}
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case NVML_SUCCESS: return "Success";
  case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
  case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
  case NVML_ERROR_NOT_SUPPORTED: return "Not Supported (vramlab's emulated NVML)";
  case NVML_ERROR_NOT_FOUND: return "Not Found";
  case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
  case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded (no emulated GPU)";
  default: return "Unknown Error";
  }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
  return copy_text(v, len, "emulated");
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
  return copy_text(v, len, "13.0.0");
}
/* The driver's CUDA version: the newest major torch's wheels are built for (13.0). */
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
  if (!v) return NVML_ERROR_INVALID_ARGUMENT;
  *v = (int)env_u64("VRAMLAB_EMU_CUDA_DRIVER", 13000);
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
  return nvmlSystemGetCudaDriverVersion(v);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = present() ? card.count : 0;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  if (!d || !present() || i >= card.count) return NVML_ERROR_INVALID_ARGUMENT;
  *d = &devices[i];
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
  return nvmlDeviceGetHandleByIndex_v2(i, d);
}

static void uuid_of(int i, char *out, size_t len) {
  snprintf(out, len, "GPU-00000000-0000-0000-0000-vramlab%05d", i);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
  if (!uuid || !d || !present()) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < card.count; i++) {
    char u[96];
    uuid_of((int)i, u, sizeof u);
    if (!strcmp(u, uuid)) {
      *d = &devices[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *out) {
  DEVICE(d, i);
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  *out = (unsigned)i;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *out) {
  return nvmlDeviceGetIndex(d, out);
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
  DEVICE(d, i);
  (void)i;
  return copy_text(name, len, card.name);
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
  DEVICE(d, i);
  char u[96];
  uuid_of(i, u, sizeof u);
  return copy_text(uuid, len, u);
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
  DEVICE(d, i);
  (void)i;
  if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
  *major = card.major;
  *minor = card.minor;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  DEVICE(d, i);
  if (!m) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t used = used_on(i);
  if (used > card.total) used = card.total;
  m->total = card.total;
  m->used = used;
  m->free = card.total - used;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
  nvmlMemory_t v1;
  nvmlReturn_t r = nvmlDeviceGetMemoryInfo(d, &v1);
  if (r != NVML_SUCCESS) return r;
  if (!m) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = v1.total;
  m->reserved = 0;
  m->used = v1.used;
  m->free = v1.free;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
  DEVICE(d, i);
  if (!p) return NVML_ERROR_INVALID_ARGUMENT;
  memset(p, 0, sizeof *p);
  p->bus = (unsigned)i + 1;
  snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", (i + 1) & 0xff);
  snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", (i + 1) & 0xff);
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) {
  return nvmlDeviceGetPciInfo_v3(d, p);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) {
  return nvmlDeviceGetPciInfo_v3(d, p);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
  if (!bus || !d || !present()) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < card.count; i++) {
    nvmlPciInfo_t p;
    nvmlDeviceGetPciInfo_v3(&devices[i], &p);
    if (!strcasecmp(bus, p.busId) || !strcasecmp(bus, p.busIdLegacy)) {
      *d = &devices[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus, d);
}
/* Not a MIG instance, and MIG off. */
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
  DEVICE(d, i);
  (void)i;
  if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
  *is_mig = 0;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
  DEVICE(d, i);
  (void)i;
  if (cur) *cur = 0;
  if (pend) *pend = 0;
  return NVML_SUCCESS;
}
/* No processes are listed (the run's records say who held what). */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n,
                                                            void *infos) {
  DEVICE(d, i);
  (void)i;
  (void)infos;
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = 0;
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n,
                                                            void *infos) {
  return nvmlDeviceGetComputeRunningProcesses_v3(d, n, infos);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n,
                                                         void *infos) {
  return nvmlDeviceGetComputeRunningProcesses_v3(d, n, infos);
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  DEVICE(d, i);
  (void)i;
  if (!u) return NVML_ERROR_INVALID_ARGUMENT;
  u->gpu = u->memory = 0;
  return NVML_SUCCESS;
}
/* Peer-to-peer status (vLLM's custom all-reduce check): not supported between emulated
 * devices, so vLLM takes its NCCL path, as on PCIe cards without P2P. */
EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
  DEVICE(a, i);
  DEVICE(b, j);
  (void)i; (void)j; (void)index;
  if (!status) return NVML_ERROR_INVALID_ARGUMENT;
  *status = 4; /* NVML_P2P_STATUS_NOT_SUPPORTED */
  return NVML_SUCCESS;
}

#define NOT_SUPPORTED(name)                                                                        \
  EXPORT nvmlReturn_t name(void) { return NVML_ERROR_NOT_SUPPORTED; }
NOT_SUPPORTED(nvmlDeviceGetNvLinkState)
NOT_SUPPORTED(nvmlDeviceGetNvLinkRemotePciInfo_v2)
NOT_SUPPORTED(nvmlDeviceGetNvLinkRemoteDeviceType)
NOT_SUPPORTED(nvmlDeviceGetTopologyCommonAncestor)
NOT_SUPPORTED(nvmlDeviceGetCpuAffinity)
NOT_SUPPORTED(nvmlDeviceGetCpuAffinityWithinScope)
NOT_SUPPORTED(nvmlDeviceGetMemoryAffinity)
NOT_SUPPORTED(nvmlDeviceGetPowerUsage)
NOT_SUPPORTED(nvmlDeviceGetPowerManagementLimit)
NOT_SUPPORTED(nvmlDeviceGetEnforcedPowerLimit)
NOT_SUPPORTED(nvmlDeviceGetTemperature)
NOT_SUPPORTED(nvmlDeviceGetClockInfo)
NOT_SUPPORTED(nvmlDeviceGetMaxClockInfo)
NOT_SUPPORTED(nvmlDeviceGetFanSpeed)
NOT_SUPPORTED(nvmlDeviceGetBrand)
NOT_SUPPORTED(nvmlDeviceGetArchitecture)
NOT_SUPPORTED(nvmlDeviceGetSerial)
NOT_SUPPORTED(nvmlDeviceGetBoardPartNumber)
NOT_SUPPORTED(nvmlDeviceGetGpuFabricInfo)
NOT_SUPPORTED(nvmlDeviceGetGpuFabricInfoV)
NOT_SUPPORTED(nvmlDeviceGetCurrPcieLinkGeneration)
NOT_SUPPORTED(nvmlDeviceGetCurrPcieLinkWidth)
NOT_SUPPORTED(nvmlDeviceGetPersistenceMode)
NOT_SUPPORTED(nvmlDeviceGetComputeMode)
NOT_SUPPORTED(nvmlDeviceGetEccMode)
NOT_SUPPORTED(nvmlDeviceGetPerformanceState)
NOT_SUPPORTED(nvmlDeviceGetBAR1MemoryInfo)
NOT_SUPPORTED(nvmlDeviceGetVbiosVersion)
NOT_SUPPORTED(nvmlDeviceGetDisplayMode)
NOT_SUPPORTED(nvmlDeviceGetDisplayActive)
NOT_SUPPORTED(nvmlDeviceGetMaxMigDeviceCount)
NOT_SUPPORTED(nvmlDeviceGetMigDeviceHandleByIndex)
NOT_SUPPORTED(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)
