// RMSNorm and LayerNorm over the last dimension (kernels/src/norm.rs): one block per row.
// Forward keeps (mean, rstd) per row in an f32 (rows, 2) buffer; the backward computes dx per
// row (one block per row) and dw, db per column (one thread per column, over all rows).
#include "common.cuh"

template <typename T>
__device__ void norm_fwd(const T *x, const T *w, const T *b, T *y, float *stats, i64 x_off,
                         i64 w_off, i64 b_off, i64 d, i64 has_bias, i64 center, float eps) {
  __shared__ float scratch[32];
  const i64 row = blockIdx.x;
  const T *xr = x + x_off + row * d;
  T *yr = y + row * d;
  float mean = 0.f;
  if (center) {
    float s = 0.f;
    for (i64 e = threadIdx.x; e < d; e += blockDim.x) s += ld(xr, e);
    mean = block_sum(s, scratch) / (float)d;
  }
  float s2 = 0.f;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) {
    const float c = ld(xr, e) - mean;
    s2 += c * c;
  }
  const float var = block_sum(s2, scratch) / (float)d;
  const float r = 1.f / sqrtf(var + eps);
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) {
    const float bias = has_bias ? ld(b, b_off + e) : 0.f;
    st(yr, e, (ld(xr, e) - mean) * r * ld(w, w_off + e) + bias);
  }
  if (threadIdx.x == 0) {
    stats[row * 2] = mean;
    stats[row * 2 + 1] = r;
  }
}

template <typename T>
__device__ void norm_bwd_dx(const T *x, const T *w, const T *g, const float *stats, T *dx,
                            i64 x_off, i64 w_off, i64 g_off, i64 d, i64 center) {
  __shared__ float scratch[32];
  const i64 row = blockIdx.x;
  const T *xr = x + x_off + row * d, *gr = g + g_off + row * d;
  const float mean = stats[row * 2], r = stats[row * 2 + 1];
  float sg = 0.f, sgx = 0.f;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) {
    const float xh = (ld(xr, e) - mean) * r, gw = ld(gr, e) * ld(w, w_off + e);
    sg += gw;
    sgx += gw * xh;
  }
  sg = block_sum(sg, scratch);
  sgx = block_sum(sgx, scratch);
  const float cg = center ? sg / (float)d : 0.f, cgx = sgx / (float)d;
  for (i64 e = threadIdx.x; e < d; e += blockDim.x) {
    const float xh = (ld(xr, e) - mean) * r, gw = ld(gr, e) * ld(w, w_off + e);
    st(dx, row * d + e, r * (gw - cg - xh * cgx));
  }
}

template <typename T>
__device__ void norm_bwd_dw(const T *x, const T *g, const float *stats, T *dw, T *db, i64 x_off,
                            i64 g_off, i64 rows, i64 d) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= d) return;
  float aw = 0.f, ab = 0.f;
  for (i64 row = 0; row < rows; ++row) {
    const float gv = ld(g, g_off + row * d + e);
    aw += gv * ((ld(x, x_off + row * d + e) - stats[row * 2]) * stats[row * 2 + 1]);
    ab += gv;
  }
  st(dw, e, aw);
  st(db, e, ab);
}

#define NORM(T, s)                                                                              \
  extern "C" __global__ void norm_fwd_##s(const T *x, const T *w, const T *b, T *y, float *stats, \
                                          i64 x_off, i64 w_off, i64 b_off, i64 d, i64 has_bias, \
                                          i64 center, float eps) {                              \
    norm_fwd(x, w, b, y, stats, x_off, w_off, b_off, d, has_bias, center, eps);                 \
  }                                                                                             \
  extern "C" __global__ void norm_bwd_dx_##s(const T *x, const T *w, const T *g,                \
                                             const float *stats, T *dx, i64 x_off, i64 w_off,   \
                                             i64 g_off, i64 d, i64 center) {                    \
    norm_bwd_dx(x, w, g, stats, dx, x_off, w_off, g_off, d, center);                            \
  }                                                                                             \
  extern "C" __global__ void norm_bwd_dw_##s(const T *x, const T *g, const float *stats, T *dw, \
                                             T *db, i64 x_off, i64 g_off, i64 rows, i64 d) {    \
    norm_bwd_dw(x, g, stats, dw, db, x_off, g_off, rows, d);                                    \
  }
FOR_TYPES(NORM)
