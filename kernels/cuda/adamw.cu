// In-place AdamW passes (kernels/src/adamw.rs), element-wise over contiguous buffers. Entry
// points are named by the destination's type, then the source's (`moment_bf16_f32`: x bf16,
// s f32). Compiled with --fmad=false so the f32 arithmetic is the CPU's, operation for operation.
#include "common.cuh"

// mode 0: x ← x·β + s·(1−β); 1: x ← x·β + s²·(1−β); 2: x ← s (cast into x's type).
template <typename T, typename S>
__device__ void moment(T *x, const S *s, i64 x_off, i64 s_off, i64 n, i64 mode, float beta,
                       float one_minus) {
  GRID_LOOP(i, n) {
    const float sv = ld(s, s_off + i);
    if (mode == 2) {
      st(x, x_off + i, sv);
    } else {
      const float xv = ld(x, x_off + i);
      st(x, x_off + i, xv * beta + (mode == 1 ? sv * sv : sv) * one_minus);
    }
  }
}

// θ ← θ·decay − (m·sm / (√(v·sv) + ε))·lr
template <typename T, typename M>
__device__ void update(T *x, const M *m, const M *v, i64 x_off, i64 m_off, i64 v_off, i64 n,
                       float decay, float scale_m, float scale_v, float eps, float lr) {
  GRID_LOOP(i, n) {
    const float adj = (ld(m, m_off + i) * scale_m) / (sqrtf(ld(v, v_off + i) * scale_v) + eps);
    st(x, x_off + i, ld(x, x_off + i) * decay - adj * lr);
  }
}

#define ADAMW(T, ts, S, ss)                                                                     \
  extern "C" __global__ void moment_##ts##_##ss(T *x, const S *s, i64 x_off, i64 s_off, i64 n,   \
                                                i64 mode, float beta, float one_minus) {        \
    moment(x, s, x_off, s_off, n, mode, beta, one_minus);                                       \
  }                                                                                             \
  extern "C" __global__ void update_##ts##_##ss(T *x, const S *m, const S *v, i64 x_off,         \
                                                i64 m_off, i64 v_off, i64 n, float decay,       \
                                                float scale_m, float scale_v, float eps,        \
                                                float lr) {                                     \
    update(x, m, v, x_off, m_off, v_off, n, decay, scale_m, scale_v, eps, lr);                  \
  }
FOR_TYPE_PAIRS(ADAMW)
