// RoPE (rotate-half), SwiGLU and softmax over the last dimension (kernels/src/rowwise.rs).
// Inputs are contiguous (the Rust wrappers call .contiguous()); offsets are in elements.
#include "common.cuh"

// One thread per (x1, x2) pair of a row of d; the tables (s, d) repeat every `plane` elements.
// `back` applies the transpose (the gradient).
template <typename T>
__device__ void rope(const T *x, const T *cs, const T *sn, T *y, i64 x_off, i64 c_off, i64 s_off,
                     i64 pairs, i64 plane, i64 d, i64 back) {
  const i64 half = d / 2;
  GRID_LOOP(idx, pairs) {
    const i64 i = (idx / half) * d + idx % half, t = i % plane;
    const float x1 = ld(x, x_off + i), x2 = ld(x, x_off + i + half);
    const float c1 = ld(cs, c_off + t), c2 = ld(cs, c_off + t + half);
    const float s1 = ld(sn, s_off + t), s2 = ld(sn, s_off + t + half);
    if (back) {
      st(y, i, x1 * c1 + x2 * s2);
      st(y, i + half, x2 * c2 - x1 * s1);
    } else {
      st(y, i, x1 * c1 - x2 * s1);
      st(y, i + half, x2 * c2 + x1 * s2);
    }
  }
}

template <typename T>
__device__ void swiglu_fwd(const T *a, const T *b, T *y, i64 a_off, i64 b_off, i64 n) {
  GRID_LOOP(i, n) {
    const float x = ld(a, a_off + i);
    st(y, i, x / (1.f + expf(-x)) * ld(b, b_off + i));
  }
}

template <typename T>
__device__ void swiglu_bwd(const T *a, const T *b, const T *g, T *da, T *db, i64 a_off, i64 b_off,
                           i64 g_off, i64 n) {
  GRID_LOOP(i, n) {
    const float x = ld(a, a_off + i), y = ld(b, b_off + i), gv = ld(g, g_off + i);
    const float sig = 1.f / (1.f + expf(-x));
    st(da, i, gv * y * sig * (1.f + x * (1.f - sig)));
    st(db, i, gv * x * sig);
  }
}

// One block per row of d.
template <typename T>
__device__ void softmax_fwd(const T *x, T *y, i64 x_off, i64 d) {
  __shared__ float scratch[32];
  const i64 row = blockIdx.x;
  const T *xr = x + x_off + row * d;
  float m = -CUDART_INF_F;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) m = fmaxf(m, ld(xr, e));
  m = block_max(m, scratch);
  float s = 0.f;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) s += expf(ld(xr, e) - m);
  s = block_sum(s, scratch);
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) st(y, row * d + e, expf(ld(xr, e) - m) / s);
}

// dx = y · (g − Σ g·y), one block per row.
template <typename T>
__device__ void softmax_bwd(const T *y, const T *g, T *dx, i64 y_off, i64 g_off, i64 d) {
  __shared__ float scratch[32];
  const i64 row = blockIdx.x;
  const T *yr = y + y_off + row * d, *gr = g + g_off + row * d;
  float dot = 0.f;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) dot += ld(yr, e) * ld(gr, e);
  dot = block_sum(dot, scratch);
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) st(dx, row * d + e, ld(yr, e) * (ld(gr, e) - dot));
}

#define ROWWISE(T, s)                                                                           \
  extern "C" __global__ void rope_##s(const T *x, const T *cs, const T *sn, T *y, i64 x_off,     \
                                      i64 c_off, i64 s_off, i64 pairs, i64 plane, i64 d,         \
                                      i64 back) {                                               \
    rope(x, cs, sn, y, x_off, c_off, s_off, pairs, plane, d, back);                             \
  }                                                                                             \
  extern "C" __global__ void swiglu_fwd_##s(const T *a, const T *b, T *y, i64 a_off, i64 b_off,  \
                                            i64 n) {                                            \
    swiglu_fwd(a, b, y, a_off, b_off, n);                                                       \
  }                                                                                             \
  extern "C" __global__ void swiglu_bwd_##s(const T *a, const T *b, const T *g, T *da, T *db,    \
                                            i64 a_off, i64 b_off, i64 g_off, i64 n) {           \
    swiglu_bwd(a, b, g, da, db, a_off, b_off, g_off, n);                                        \
  }                                                                                             \
  extern "C" __global__ void softmax_fwd_##s(const T *x, T *y, i64 x_off, i64 d) {               \
    softmax_fwd(x, y, x_off, d);                                                                \
  }                                                                                             \
  extern "C" __global__ void softmax_bwd_##s(const T *y, const T *g, T *dx, i64 y_off, i64 g_off, \
                                             i64 d) {                                           \
    softmax_bwd(y, g, dx, y_off, g_off, d);                                                     \
  }
FOR_TYPES(ROWWISE)
