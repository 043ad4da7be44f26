// Flash attention (kernels/src/attention.rs): tiled, online softmax, O(s) memory.
//
// Layouts: q (b, h, sq, d), k and v (b, kvh, sk, d), any strides (each view is an element
// offset and four strides); the incoming gradient and the saved output (b, sq, h, d), any
// strides. Written: out (b, sq, h, d), lse and delta (b, sq, h) f32, dq (b, h, sq, d),
// dk and dv (b, kvh, sk, d), all contiguous.
//
// Every kernel runs one warp per row (a query row in `fwd` and `bwd_dq`, a key row in
// `bwd_dkv`), WARPS rows per block; lane l holds elements l, l+32, ... of the row (d <= 256).
// The block walks the other side in tiles of `ft` rows (<= 32) staged in shared memory as f32.
// The backward recomputes the scores from q, k and the saved log-sum-exp: `bwd_dq` (one pass
// over the keys per query row, which also writes delta = Σ out·dout per row), then `bwd_dkv`
// (one pass over the queries of every head of the group per key row). No atomics.
#include "common.cuh"

#define WARPS 8
#define MAXT 8  // d <= 32 * MAXT

struct View4 {
  i64 off, s0, s1, s2, s3;
  __device__ __forceinline__ i64 at(i64 a, i64 b, i64 c, i64 e) const {
    return off + a * s0 + b * s1 + c * s2 + e * s3;
  }
};

struct Dims {
  i64 b, h, kvh, sq, sk, d, ft, causal, window;  // window < 0: none
};

// The half-open key range [lo, hi) of query row i (AttnMask::keys).
__device__ __forceinline__ void keys(const Dims &m, i64 i, i64 &lo, i64 &hi) {
  const i64 p = i + (m.sk > m.sq ? m.sk - m.sq : 0);
  hi = m.causal ? min(p + 1, m.sk) : m.sk;
  lo = 0;
  if (m.window >= 0) {
    if (!m.causal) hi = min(p + m.window, m.sk);
    lo = p + 1 - m.window;
    if (lo < 0) lo = 0;
  }
}

// Loads rows [r0, r0 + n) of one (a, b) plane of a 4-d view into a (n, d) f32 tile.
template <typename T>
__device__ __forceinline__ void stage(float *tile, const T *x, const View4 &v, i64 a, i64 b, i64 r0,
                                      int n, i64 d) {
  for (i64 idx = threadIdx.x; idx < (i64)n * d; idx += blockDim.x) {
    const i64 r = idx / d, e = idx % d;
    tile[idx] = ld(x, v.at(a, b, r0 + r, e));
  }
}

// Same for a view whose row index is its second axis (out, dout: (b, sq, h, d)).
template <typename T>
__device__ __forceinline__ void stage_bshd(float *tile, const T *x, const View4 &v, i64 a, i64 hh,
                                           i64 r0, int n, i64 d) {
  for (i64 idx = threadIdx.x; idx < (i64)n * d; idx += blockDim.x) {
    const i64 r = idx / d, e = idx % d;
    tile[idx] = ld(x, v.at(a, r0 + r, hh, e));
  }
}

// Σ_e a[e]·tile[e] over the warp (a in registers, lane-strided).
__device__ __forceinline__ float dot_row(const float *a, const float *tile, i64 d) {
  const int lane = threadIdx.x & 31;
  float part = 0.f;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    const i64 e = lane + 32 * t;
    if (e < d) part += a[t] * tile[e];
  }
  return warp_sum(part);
}

template <typename T>
__device__ __forceinline__ void load_row(float *r, const T *x, i64 base, i64 stride, i64 d, bool ok) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    const i64 e = lane + 32 * t;
    r[t] = (ok && e < d) ? ld(x, base + e * stride) : 0.f;
  }
}

template <typename T>
__device__ void flash_fwd(const T *q, const T *k, const T *v, T *out, float *lse, View4 qv,
                          View4 kv, View4 vv, Dims m, float scale) {
  extern __shared__ float sh[];
  float *ks = sh, *vs = sh + m.ft * m.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 bi = blockIdx.z, hh = blockIdx.y, kh = hh / (m.h / m.kvh), d = m.d;
  const i64 i0 = (i64)blockIdx.x * WARPS, i = i0 + warp;
  const bool row_ok = i < m.sq;
  i64 lo = 0, hi = 0, blo, bhi, tmp;
  if (row_ok) keys(m, i, lo, hi);
  keys(m, i0, blo, tmp);  // lo and hi grow with the row: the block's keys are [blo, bhi)
  keys(m, min(i0 + WARPS, m.sq) - 1, tmp, bhi);

  float qr[MAXT], acc[MAXT];
  load_row(qr, q, qv.at(bi, hh, i, 0), qv.s3, d, row_ok);
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    qr[t] *= scale;
    acc[t] = 0.f;
  }
  float mx = -CUDART_INF_F, sum = 0.f;
  for (i64 t0 = blo; t0 < bhi; t0 += m.ft) {
    const int n = (int)min(m.ft, bhi - t0);
    __syncthreads();
    stage(ks, k, kv, bi, kh, t0, n, d);
    stage(vs, v, vv, bi, kh, t0, n, d);
    __syncthreads();
    float my = -CUDART_INF_F;  // lane jj: the score of key t0 + jj
    for (int jj = 0; jj < n; ++jj) {
      const i64 j = t0 + jj;
      if (j < lo || j >= hi) continue;  // uniform over the warp
      const float s = dot_row(qr, ks + jj * d, d);
      if (lane == jj) my = s;
    }
    const float m_new = fmaxf(mx, warp_max(my));
    if (m_new == -CUDART_INF_F) continue;
    const float alpha = expf(mx - m_new);
    const float p = my == -CUDART_INF_F ? 0.f : expf(my - m_new);
    sum = sum * alpha + warp_sum(p);
#pragma unroll
    for (int t = 0; t < MAXT; ++t) acc[t] *= alpha;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      if (pj == 0.f) continue;
#pragma unroll
      for (int t = 0; t < MAXT; ++t) {
        const i64 e = lane + 32 * t;
        if (e < d) acc[t] += pj * vs[jj * d + e];
      }
    }
    mx = m_new;
  }
  if (!row_ok) return;
  const i64 o = (bi * m.sq + i) * m.h + hh;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    const i64 e = lane + 32 * t;
    if (e < d) st(out, o * d + e, sum > 0.f ? acc[t] / sum : 0.f);
  }
  if (lane == 0) lse[o] = sum > 0.f ? mx + logf(sum) : -CUDART_INF_F;
}

template <typename T>
__device__ void flash_bwd_dq(const T *q, const T *k, const T *v, const T *out, const T *go,
                             const float *lse, T *dq, float *delta, View4 qv, View4 kv, View4 vv,
                             View4 ov, View4 gv, Dims m, float scale) {
  extern __shared__ float sh[];
  float *ks = sh, *vs = sh + m.ft * m.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 bi = blockIdx.z, hh = blockIdx.y, kh = hh / (m.h / m.kvh), d = m.d;
  const i64 i0 = (i64)blockIdx.x * WARPS, i = i0 + warp;
  const bool row_ok = i < m.sq;
  i64 lo = 0, hi = 0, blo, bhi, tmp;
  if (row_ok) keys(m, i, lo, hi);
  keys(m, i0, blo, tmp);
  keys(m, min(i0 + WARPS, m.sq) - 1, tmp, bhi);

  float qr[MAXT], dor[MAXT], orow[MAXT], dqr[MAXT];
  load_row(qr, q, qv.at(bi, hh, i, 0), qv.s3, d, row_ok);
  load_row(dor, go, gv.at(bi, i, hh, 0), gv.s3, d, row_ok);
  load_row(orow, out, ov.at(bi, i, hh, 0), ov.s3, d, row_ok);
  float dl = 0.f;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    dl += orow[t] * dor[t];
    dqr[t] = 0.f;
  }
  dl = warp_sum(dl);
  const i64 o = (bi * m.sq + i) * m.h + hh;
  const float l = row_ok ? lse[o] : -CUDART_INF_F;
  if (row_ok && lane == 0) delta[o] = dl;
  for (i64 t0 = blo; t0 < bhi; t0 += m.ft) {
    const int n = (int)min(m.ft, bhi - t0);
    __syncthreads();
    stage(ks, k, kv, bi, kh, t0, n, d);
    stage(vs, v, vv, bi, kh, t0, n, d);
    __syncthreads();
    if (l == -CUDART_INF_F) continue;
    for (int jj = 0; jj < n; ++jj) {
      const i64 j = t0 + jj;
      if (j < lo || j >= hi) continue;
      const float p = expf(scale * dot_row(qr, ks + jj * d, d) - l);
      const float ds = p * (dot_row(dor, vs + jj * d, d) - dl);
#pragma unroll
      for (int t = 0; t < MAXT; ++t) {
        const i64 e = lane + 32 * t;
        if (e < d) dqr[t] += ds * ks[jj * d + e];
      }
    }
  }
  if (!row_ok) return;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    const i64 e = lane + 32 * t;
    if (e < d) st(dq, ((bi * m.h + hh) * m.sq + i) * d + e, scale * dqr[t]);
  }
}

template <typename T>
__device__ void flash_bwd_dkv(const T *q, const T *k, const T *v, const T *go, const float *lse,
                              const float *delta, T *dk, T *dv, View4 qv, View4 kv, View4 vv,
                              View4 gv, Dims m, float scale) {
  extern __shared__ float sh[];
  float *qs = sh, *gs = sh + m.ft * m.d, *ls = gs + m.ft * m.d, *dls = ls + m.ft;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 bi = blockIdx.z, kh = blockIdx.y, d = m.d, g = m.h / m.kvh;
  const i64 j0 = (i64)blockIdx.x * WARPS, j = j0 + warp, jl = min(j0 + WARPS, m.sk) - 1;
  const bool key_ok = j < m.sk;

  float kr[MAXT], vr[MAXT], dkr[MAXT], dvr[MAXT];
  load_row(kr, k, kv.at(bi, kh, j, 0), kv.s3, d, key_ok);
  load_row(vr, v, vv.at(bi, kh, j, 0), vv.s3, d, key_ok);
#pragma unroll
  for (int t = 0; t < MAXT; ++t) dkr[t] = dvr[t] = 0.f;
  for (i64 hh = kh * g; hh < (kh + 1) * g; ++hh) {
    for (i64 i0 = 0; i0 < m.sq; i0 += m.ft) {
      const int n = (int)min(m.ft, m.sq - i0);
      i64 lo_first, hi_last, tmp;
      keys(m, i0, lo_first, tmp);
      keys(m, i0 + n - 1, tmp, hi_last);
      if (hi_last <= j0 || lo_first > jl) continue;  // no row of the tile sees a key of the block
      __syncthreads();
      stage(qs, q, qv, bi, hh, i0, n, d);
      stage_bshd(gs, go, gv, bi, hh, i0, n, d);
      for (int r = threadIdx.x; r < n; r += blockDim.x) {
        const i64 o = (bi * m.sq + i0 + r) * m.h + hh;
        ls[r] = lse[o];
        dls[r] = delta[o];
      }
      __syncthreads();
      if (!key_ok) continue;
      for (int ii = 0; ii < n; ++ii) {
        i64 lo, hi;
        keys(m, i0 + ii, lo, hi);
        if (j < lo || j >= hi || ls[ii] == -CUDART_INF_F) continue;
        const float *qi = qs + ii * d, *gi = gs + ii * d;
        const float p = expf(scale * dot_row(kr, qi, d) - ls[ii]);
        const float ds = p * (dot_row(vr, gi, d) - dls[ii]);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
          const i64 e = lane + 32 * t;
          if (e < d) {
            dvr[t] += p * gi[e];
            dkr[t] += ds * qi[e];
          }
        }
      }
    }
  }
  if (!key_ok) return;
  const i64 base = ((bi * m.kvh + kh) * m.sk + j) * d;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    const i64 e = lane + 32 * t;
    if (e < d) {
      st(dk, base + e, scale * dkr[t]);
      st(dv, base + e, dvr[t]);
    }
  }
}

#define V4(n) i64 n##_off, i64 n##0, i64 n##1, i64 n##2, i64 n##3
#define MK(n) View4{n##_off, n##0, n##1, n##2, n##3}
#define DIMS i64 b, i64 h, i64 kvh, i64 sq, i64 sk, i64 d, i64 ft, i64 causal, i64 window
#define MKDIMS Dims{b, h, kvh, sq, sk, d, ft, causal, window}

#define ATTN(T, s)                                                                              \
  extern "C" __global__ void flash_fwd_##s(const T *q, const T *k, const T *v, T *out,           \
                                           float *lse, V4(q), V4(k), V4(v), DIMS, float scale) { \
    flash_fwd(q, k, v, out, lse, MK(q), MK(k), MK(v), MKDIMS, scale);                           \
  }                                                                                             \
  extern "C" __global__ void flash_bwd_dq_##s(const T *q, const T *k, const T *v, const T *out,  \
                                              const T *go, const float *lse, T *dq,             \
                                              float *delta, V4(q), V4(k), V4(v), V4(o), V4(g),  \
                                              DIMS, float scale) {                              \
    flash_bwd_dq(q, k, v, out, go, lse, dq, delta, MK(q), MK(k), MK(v), MK(o), MK(g), MKDIMS,   \
                 scale);                                                                        \
  }                                                                                             \
  extern "C" __global__ void flash_bwd_dkv_##s(const T *q, const T *k, const T *v, const T *go,  \
                                               const float *lse, const float *delta, T *dk,     \
                                               T *dv, V4(q), V4(k), V4(v), V4(g), DIMS,         \
                                               float scale) {                                   \
    flash_bwd_dkv(q, k, v, go, lse, delta, dk, dv, MK(q), MK(k), MK(v), MK(g), MKDIMS, scale);  \
  }
FOR_TYPES(ATTN)
