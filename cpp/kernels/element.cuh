#pragma once
// Loads and stores of the kernels' element types, computed in float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace speculant::kernels {

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load(const __half* p) { return __half2float(*p); }
__device__ inline void store(float* p, float x) { *p = x; }
__device__ inline void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ inline void store(__half* p, float x) { *p = __float2half(x); }

__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace speculant::kernels
