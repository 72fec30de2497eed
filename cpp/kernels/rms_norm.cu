// RMSNorm of contiguous rows: one block per row, the sum of squares reduced across the block in float32, the
// output rounded once. A decode call has one or a few rows of a few thousand elements: the kernel is bound by
// its launch and the latency of its loads, not by arithmetic. So where the rows and the weight are 16-byte
// aligned and a row fits in kMaxVectors 16-byte vectors per thread, each thread loads all its elements of x and
// of the weight at once, before the reduction, and keeps them in registers; other rows take a plain loop.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVectors = 8;

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

// The same with each thread's V 16-byte vectors of x and of the weight (vector p at index thread + p * kThreads)
// loaded up front; width is a multiple of a vector's N elements.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rms_norm_vectors(const T* x, const T* weight, T* y, int64_t width,
                                                             float eps) {
  constexpr int N = 16 / sizeof(T);
  const int vectors = static_cast<int>(width / N);
  const uint4* in = reinterpret_cast<const uint4*>(x + blockIdx.x * width);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  uint4* out = reinterpret_cast<uint4*>(y + blockIdx.x * width);
  uint4 xs[V], ws[V];
#pragma unroll
  for (int p = 0; p < V; ++p) {
    const int i = threadIdx.x + p * kThreads;
    if (i < vectors) xs[p] = in[i], ws[p] = __ldg(w + i);
  }
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < V; ++p) {
    if (threadIdx.x + p * kThreads >= vectors) break;
    const T* e = reinterpret_cast<const T*>(&xs[p]);
#pragma unroll
    for (int j = 0; j < N; ++j) squares += load(e + j) * load(e + j);
  }
  const float scale = rsqrtf(block_sum(squares) / static_cast<float>(width) + eps);
#pragma unroll
  for (int p = 0; p < V; ++p) {
    const int i = threadIdx.x + p * kThreads;
    if (i >= vectors) break;
    const T* e = reinterpret_cast<const T*>(&xs[p]);
    const T* g = reinterpret_cast<const T*>(&ws[p]);
    uint4 result;
    T* r = reinterpret_cast<T*>(&result);
#pragma unroll
    for (int j = 0; j < N; ++j) store(r + j, load(e + j) * scale * load(g + j));
    out[i] = result;
  }
}

template <typename T>
int launch(const void* x, const void* weight, void* y, int64_t rows, int64_t width, float eps, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(rows));
  constexpr int64_t N = 16 / sizeof(T);
  const bool aligned = width % N == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(weight) |
                                          reinterpret_cast<uintptr_t>(y)) % 16 == 0;
  const int64_t per_thread = (width / N + kThreads - 1) / kThreads;
  const auto run = [&](auto kernel) {
    launch_kernel(kernel, grid, kThreads, s, static_cast<const T*>(x), static_cast<const T*>(weight),
                  static_cast<T*>(y), width, eps);
  };
  if (!aligned || per_thread > kMaxVectors) run(rms_norm_rows<T>);
  else if (per_thread <= 1) run(rms_norm_vectors<T, 1>);
  else if (per_thread <= 2) run(rms_norm_vectors<T, 2>);
  else if (per_thread <= 4) run(rms_norm_vectors<T, 4>);
  else run(rms_norm_vectors<T, kMaxVectors>);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_rms_norm(const void* x, const void* weight, void* y, int64_t rows, int64_t width, float eps,
                    Dtype dtype, void* stream) {
  if (rows == 0) return 0;
  return by_dtype(dtype, [&](auto element) {
    return launch<decltype(element)>(x, weight, y, rows, width, eps, stream);
  });
}

}  // namespace speculant::kernels
