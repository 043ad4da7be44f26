/*
 * The calls the emulated GPU refuses (CUDA graphs, IPC), and those whose prototype differs
 * between CUDA majors. Compiled without the CUDA headers: each has the C ABI of the function
 * it replaces for the arguments it reads, and returns an int error code.
 */
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

void vramlab_emu_refuse(const char *call);

enum { CUDA_SUCCESS_ = 0, CUDA_ERROR_NOT_SUPPORTED_ = 801 };

/* Whether a stream is capturing (CUDA 12 and 13 differ in the trailing out-parameters, which
 * torch passes as NULL or ignores): never. */
EXPORT int cudaStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id) {
  (void)stream;
  if (status) *status = 0; /* cudaStreamCaptureStatusNone */
  if (id) *id = 0;
  return CUDA_SUCCESS_;
}

#define REFUSED(name)                                                                              \
  EXPORT int name(void) {                                                                          \
    vramlab_emu_refuse(#name);                                                                     \
    return CUDA_ERROR_NOT_SUPPORTED_;                                                              \
  }
REFUSED(cudaStreamBeginCapture)
REFUSED(cudaStreamBeginCaptureToGraph)
REFUSED(cudaStreamEndCapture)
REFUSED(cudaGraphInstantiate)
REFUSED(cudaGraphInstantiateWithFlags)
REFUSED(cudaGraphLaunch)
REFUSED(cudaIpcGetMemHandle)
REFUSED(cudaIpcOpenMemHandle)
REFUSED(cudaIpcGetEventHandle)
REFUSED(cudaIpcOpenEventHandle)
