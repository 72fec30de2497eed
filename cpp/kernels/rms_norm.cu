// RMSNorm of contiguous rows: one block per row, the sum of squares reduced across the block in float32, the
// output rounded once. A decode call has one or a few rows of a few thousand elements: the kernel is bound by
// its launch and one pass of loads, not by arithmetic.
#include <cuda_runtime.h>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float x) {
  __shared__ float warps[kThreads / 32];
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += warps[w];
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rms_norm_rows(const T* x, const T* weight, T* y, int64_t width,
                                                          float eps) {
  const T* in = x + blockIdx.x * width;
  T* out = y + blockIdx.x * width;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += kThreads) {
    const float value = load(in + i);
    squares += value * value;
  }
  const float scale = rsqrtf(block_sum(squares) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += kThreads) store(out + i, load(in + i) * scale * load(weight + i));
}

template <typename T>
int launch(const void* x, const void* weight, void* y, int64_t rows, int64_t width, float eps, void* stream) {
  rms_norm_rows<T><<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(y), width, eps);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_rms_norm(const void* x, const void* weight, void* y, int64_t rows, int64_t width, float eps,
                    Dtype dtype, void* stream) {
  if (rows == 0) return 0;
  switch (dtype) {
    case Dtype::float32: return launch<float>(x, weight, y, rows, width, eps, stream);
    case Dtype::bfloat16: return launch<__nv_bfloat16>(x, weight, y, rows, width, eps, stream);
    case Dtype::float16: return launch<__half>(x, weight, y, rows, width, eps, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace speculant::kernels
