#pragma once
// Loads and stores of the kernels' element types, computed in float32, and the launch by dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/launch.h"

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

// kernel<<<grid, block, 0, stream>>>(args...); compiled as C++ for tests/cuda_emulator, the same on CPU threads
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const Args&... args) {
#ifdef SPECULANT_CUDA_EMULATOR
  emulator::run(grid, block, [&] { kernel(args...); });
#else
  kernel<<<grid, block, 0, stream>>>(args...);
#endif
}

// launch(T{}) for the element type T that `dtype` names: each kernel file's launch by dtype
template <typename Launch>
int by_dtype(Dtype dtype, Launch&& launch) {
  switch (dtype) {
    case Dtype::float32: return launch(float{});
    case Dtype::bfloat16: return launch(__nv_bfloat16{});
    case Dtype::float16: return launch(__half{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace speculant::kernels
