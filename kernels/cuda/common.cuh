// Shared helpers of the vramlab kernels: loads and stores between the three element types and
// f32 (all arithmetic is in f32, as on the CPU), warp and block reductions, and the macro that
// instantiates one extern "C" entry point per element type (suffix f32, bf16, f16).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

typedef long long i64;

__device__ __forceinline__ float ld(const float *p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, i64 i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld(const __half *p, i64 i) { return __half2float(p[i]); }

__device__ __forceinline__ void st(float *p, i64 i, float x) { p[i] = x; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, i64 i, float x) { p[i] = __float2bfloat16(x); }
__device__ __forceinline__ void st(__half *p, i64 i, float x) { p[i] = __float2half(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronises the block.
__device__ __forceinline__ float block_sum(float x, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < nw ? scratch[lane] : -CUDART_INF_F;
  return warp_max(x);
}

// Grid-stride loop over n elements.
#define GRID_LOOP(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// M(T, suffix) for each element type.
#define FOR_TYPES(M) M(float, f32) M(__nv_bfloat16, bf16) M(__half, f16)
// M(T, ts, S, ss) for each pair of element types.
#define FOR_TYPE_PAIRS(M)                                                                      \
  M(float, f32, float, f32) M(float, f32, __nv_bfloat16, bf16) M(float, f32, __half, f16)      \
  M(__nv_bfloat16, bf16, float, f32) M(__nv_bfloat16, bf16, __nv_bfloat16, bf16)               \
  M(__nv_bfloat16, bf16, __half, f16) M(__half, f16, float, f32)                               \
  M(__half, f16, __nv_bfloat16, bf16) M(__half, f16, __half, f16)
