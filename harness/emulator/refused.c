/*
 * CUDA graphs' capture bookkeeping, the calls the emulated GPU refuses (IPC), and those whose
 * prototype differs between CUDA majors. Compiled without the CUDA headers: each has the C ABI
 * of the function it replaces for the arguments it reads, and returns an int error code.
 *
 * Capture: kernels never run, so a graph is only its bookkeeping. A stream captures from
 * cudaStreamBeginCapture to cudaStreamEndCapture under an id of its own, which
 * cudaStreamGetCaptureInfo and cudaStreamIsCapturing answer: PyTorch's caching allocator routes
 * the allocations of a stream whose capture id is a graph's into that graph's private pool (and
 * keeps them there until the graph is released), as on a GPU. Graphs and their executables are
 * handles; launching one does nothing.
 */
#include <pthread.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

void vramlab_emu_refuse(const char *call);
void *new_handle(void);

enum { CUDA_SUCCESS_ = 0, CUDA_ERROR_INVALID_VALUE_ = 1, CUDA_ERROR_NOT_SUPPORTED_ = 801 };
enum { CAPTURE_NONE = 0, CAPTURE_ACTIVE = 1 };

#define MAX_CAPTURES 256
static struct {
  void *stream;
  unsigned long long id;
} captures[MAX_CAPTURES];
static unsigned long long last_id;
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;

/* The capture id of a stream that is capturing, else 0. */
unsigned long long vramlab_emu_capture_id(void *stream) {
  unsigned long long id = 0;
  pthread_mutex_lock(&capture_lock);
  for (int i = 0; i < MAX_CAPTURES && !id; i++)
    if (captures[i].id && captures[i].stream == stream) id = captures[i].id;
  pthread_mutex_unlock(&capture_lock);
  return id;
}

EXPORT int cudaStreamBeginCapture(void *stream, int mode) {
  (void)mode;
  if (!stream || vramlab_emu_capture_id(stream)) return CUDA_ERROR_INVALID_VALUE_;
  int ok = 0;
  pthread_mutex_lock(&capture_lock);
  for (int i = 0; i < MAX_CAPTURES && !ok; i++)
    if (!captures[i].id) {
      captures[i].stream = stream;
      captures[i].id = ++last_id;
      ok = 1;
    }
  pthread_mutex_unlock(&capture_lock);
  if (!ok) vramlab_emu_refuse("cudaStreamBeginCapture (more than 256 captures at once)");
  return ok ? CUDA_SUCCESS_ : CUDA_ERROR_NOT_SUPPORTED_;
}

EXPORT int cudaStreamEndCapture(void *stream, void **graph) {
  int found = 0;
  pthread_mutex_lock(&capture_lock);
  for (int i = 0; i < MAX_CAPTURES && !found; i++)
    if (captures[i].id && captures[i].stream == stream) {
      captures[i].id = 0;
      captures[i].stream = NULL;
      found = 1;
    }
  pthread_mutex_unlock(&capture_lock);
  if (graph) *graph = found ? new_handle() : NULL;
  return found ? CUDA_SUCCESS_ : CUDA_ERROR_INVALID_VALUE_;
}

/* Whether a stream is capturing, and its capture id (CUDA 12 and 13 differ in the trailing
 * out-parameters, which torch passes as NULL or ignores). */
EXPORT int cudaStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id) {
  unsigned long long c = stream ? vramlab_emu_capture_id(stream) : 0;
  if (status) *status = c ? CAPTURE_ACTIVE : CAPTURE_NONE;
  if (id) *id = c;
  return CUDA_SUCCESS_;
}
EXPORT int cudaStreamGetCaptureInfo_v2(void *stream, int *status, unsigned long long *id) {
  return cudaStreamGetCaptureInfo(stream, status, id);
}

/* An executable graph from a captured one (the flags and CUDA 11's error-node arguments are
 * not read). */
EXPORT int cudaGraphInstantiate(void **exec, void *graph) {
  if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE_;
  *exec = new_handle();
  return CUDA_SUCCESS_;
}
EXPORT int cudaGraphInstantiateWithFlags(void **exec, void *graph) {
  return cudaGraphInstantiate(exec, graph);
}
EXPORT int cudaGraphLaunch(void *exec, void *stream) {
  (void)stream;
  return exec ? CUDA_SUCCESS_ : CUDA_ERROR_INVALID_VALUE_;
}
EXPORT int cudaGraphUpload(void *exec, void *stream) { return cudaGraphLaunch(exec, stream); }
/* A captured graph is one node, never run (PyTorch warns that a graph with none was captured on
 * the wrong stream). */
static void *the_node;
EXPORT int cudaGraphGetNodes(void *graph, void **nodes, size_t *count) {
  if (!graph || !count) return CUDA_ERROR_INVALID_VALUE_;
  if (nodes && *count >= 1) {
    if (!the_node) the_node = new_handle();
    nodes[0] = the_node;
  }
  *count = 1;
  return CUDA_SUCCESS_;
}

#define REFUSED(name)                                                                              \
  EXPORT int name(void) {                                                                          \
    vramlab_emu_refuse(#name);                                                                     \
    return CUDA_ERROR_NOT_SUPPORTED_;                                                              \
  }
REFUSED(cudaStreamBeginCaptureToGraph)
REFUSED(cudaIpcGetMemHandle)
REFUSED(cudaIpcOpenMemHandle)
REFUSED(cudaIpcGetEventHandle)
REFUSED(cudaIpcOpenEventHandle)
