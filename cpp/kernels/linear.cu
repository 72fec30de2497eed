// Linear layers of a few input rows (decoding and verification calls) with what comes before and after the
// matrix product fused in: out[m, n] = sum_k u[m, k] W[n, k] (+ bias[n]) (+ out[m, n], accumulating into a
// residual stream), where u is x, its RMSNorm or LayerNorm, an activation of it, or a gated activation of its
// halves ([gate | up]). Such a call reads each weight once, so it is bound by reading W: each warp streams
// kCols weight rows with 16-byte loads, the next kUnroll vectors per lane loaded while the current ones are
// computed on, and reads the input's few rows (a few KB, from L1 and L2) as it goes, transforming them in float32
// and rounding to T as the ATen composite rounds the transformed input. A norm's statistics come first, while
// the first weights load, each block computing them for all rows (a LayerNorm's variance in a second pass over
// the row, about its mean). Every dot product is reduced in float32 across its warp and rounded once.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 2;    // output columns (weight rows) per warp
constexpr int kUnroll = 4;  // 16-byte weight vectors per column a lane loads before computing on them

template <typename T>
__device__ inline float rounded(float x) {
  T value;
  store(&value, x);
  return load(&value);
}

__device__ inline float activate(float x, Activation kind) {
  switch (kind) {
    case Activation::silu: return x / (1.0f + expf(-x));
    case Activation::gelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::gelu_tanh:
      return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Activation::relu: return fmaxf(x, 0.0f);
    case Activation::identity: break;
  }
  return x;
}

// Each of the block's threads' M partial sums, summed over the block (every thread gets the totals).
template <int M>
__device__ void block_sums(float (&sums)[M]) {
  __shared__ float warps[kWarps][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float total = warp_sum(sums[m]);
    if (lane == 0) warps[warp][m] = total;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sums[m] = 0.0f;
    for (int w = 0; w < kWarps; ++w) sums[m] += warps[w][m];
  }
  __syncthreads();  // warps[] is read before any later call writes it
}

// sum over each row's k elements of (x - shift[m])^2, or of x when `squares` is false; k is whole vectors
template <typename T, int M>
__device__ void row_sums(const LinearArgs& a, const float (&shift)[M], bool squares, float (&sums)[M]) {
  constexpr int N = 16 / sizeof(T);
  const int vectors = a.k / N;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sums[m] = 0.0f;
    if (m >= a.rows) continue;
    const uint4* row = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + m * a.x_stride);
#pragma unroll 4
    for (int i = threadIdx.x; i < vectors; i += kThreads) {
      const uint4 v = __ldg(row + i);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float value = load(e + j) - shift[m];
        sums[m] += squares ? value * value : value;
      }
    }
  }
  block_sums(sums);
}

// The norm's mean (0 for RMSNorm) and reciprocal standard deviation of each row.
template <typename T, int M>
__device__ void norm_statistics(const LinearArgs& a, float (&mean)[M], float (&scale)[M]) {
  float sums[M];
  if (a.input == LinearInput::layer_norm) {
    row_sums<T, M>(a, mean, false, sums);  // mean is 0 here
#pragma unroll
    for (int m = 0; m < M; ++m) mean[m] = sums[m] / static_cast<float>(a.k);
  }
  row_sums<T, M>(a, mean, true, sums);
#pragma unroll
  for (int m = 0; m < M; ++m) scale[m] = rsqrtf(sums[m] / static_cast<float>(a.k) + a.eps);
}

// Row m's transformed input at 16-byte vector i: its N elements, rounded to T. g, b: the norm's weight and bias
// at vector i (for a norm; b zero without a bias).
template <typename T, int N, int M>
__device__ void input_vector(const LinearArgs& a, int m, int i, const float (&mean)[M], const float (&scale)[M],
                             const T* g, const T* b, float (&u)[N]) {
  const T* row = static_cast<const T*>(a.x) + m * a.x_stride;
  const uint4 first = __ldg(reinterpret_cast<const uint4*>(row) + i);
  const T* e = reinterpret_cast<const T*>(&first);
  switch (a.input) {
    case LinearInput::none:
#pragma unroll
      for (int j = 0; j < N; ++j) u[j] = load(e + j);
      return;
    case LinearInput::activation:
#pragma unroll
      for (int j = 0; j < N; ++j) u[j] = rounded<T>(activate(load(e + j), a.activation));
      return;
    case LinearInput::gated: {
      const uint4 up = __ldg(reinterpret_cast<const uint4*>(row + a.k) + i);
      const T* f = reinterpret_cast<const T*>(&up);
#pragma unroll
      for (int j = 0; j < N; ++j) u[j] = rounded<T>(activate(load(e + j), a.activation) * load(f + j));
      return;
    }
    case LinearInput::rms_norm:
    case LinearInput::layer_norm:
#pragma unroll
      for (int j = 0; j < N; ++j) u[j] = rounded<T>((load(e + j) - mean[m]) * scale[m] * load(g + j) + load(b + j));
      return;
  }
}

template <int U, int C>
struct WeightVectors {
  uint4 v[U][C];
};

// The kUnroll vectors from `base` on (32 apart) of each of the warp's weight rows
template <int C>
__device__ inline WeightVectors<kUnroll, C> weight_vectors(const uint4* const (&w)[C], int base, int vectors) {
  WeightVectors<kUnroll, C> out;
#pragma unroll
  for (int r = 0; r < kUnroll; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (base + 32 * r < vectors) out.v[r][c] = __ldg(w[c] + base + 32 * r);
  return out;
}

// M: the rows the kernel is built for (a.rows <= M, the rest skipped)
template <typename T, int M>
__global__ void __launch_bounds__(kThreads) linear_rows(LinearArgs a) {
  constexpr int N = 16 / sizeof(T);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = (blockIdx.x * kWarps + warp) * kCols, vectors = a.k / N;
  const uint4* w[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c)  // a column past n reads the last one again, and is not stored
    w[c] = reinterpret_cast<const uint4*>(static_cast<const T*>(a.weight) +
                                          static_cast<int64_t>(min(first + c, a.n - 1)) * a.k);
  // the first weights are on their way while the norm's statistics are computed
  WeightVectors<kUnroll, kCols> current = weight_vectors(w, lane, vectors);
  float mean[M], scale[M];
#pragma unroll
  for (int m = 0; m < M; ++m) mean[m] = 0.0f, scale[m] = 1.0f;
  const bool norm = a.input == LinearInput::rms_norm || a.input == LinearInput::layer_norm;
  if (norm) norm_statistics<T, M>(a, mean, scale);  // every thread of the block takes part
  if (first >= a.n) return;
  float acc[kCols][M] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int base = lane; base < vectors; base += 32 * kUnroll) {
    const WeightVectors<kUnroll, kCols> next = weight_vectors(w, base + 32 * kUnroll, vectors);
#pragma unroll
    for (int r = 0; r < kUnroll; ++r) {
      const int i = base + 32 * r;
      if (i >= vectors) break;
      uint4 gv = zero, bv = zero;
      if (norm) gv = __ldg(reinterpret_cast<const uint4*>(a.norm_weight) + i);
      if (a.norm_bias != nullptr) bv = __ldg(reinterpret_cast<const uint4*>(a.norm_bias) + i);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m >= a.rows) break;
        float u[N];
        input_vector<T, N, M>(a, m, i, mean, scale, reinterpret_cast<const T*>(&gv),
                              reinterpret_cast<const T*>(&bv), u);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const T* we = reinterpret_cast<const T*>(&current.v[r][c]);
#pragma unroll
          for (int j = 0; j < N; ++j) acc[c][m] += load(we + j) * u[j];
        }
      }
    }
    current = next;
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int n = first + c;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float total = warp_sum(acc[c][m]);  // every lane takes part in the shuffles
      if (lane != 0 || m >= a.rows || n >= a.n) continue;
      T* out = static_cast<T*>(a.out) + m * a.out_stride + n;
      float value = total;
      if (a.bias != nullptr) value += load(static_cast<const T*>(a.bias) + n);
      if (a.accumulate) value += load(out);
      store(out, value);
    }
  }
}

template <typename T>
int launch(const LinearArgs& a, void* stream) {
  const dim3 grid(static_cast<unsigned>((a.n + kWarps * kCols - 1) / (kWarps * kCols)));
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.rows <= 1) linear_rows<T, 1><<<grid, kThreads, 0, s>>>(a);
  else if (a.rows <= 2) linear_rows<T, 2><<<grid, kThreads, 0, s>>>(a);
  else if (a.rows <= 4) linear_rows<T, 4><<<grid, kThreads, 0, s>>>(a);
  else linear_rows<T, kLinearMaxRows><<<grid, kThreads, 0, s>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_linear(const LinearArgs& args, void* stream) {
  if (args.rows == 0 || args.n == 0) return 0;
  if (args.rows > kLinearMaxRows || args.k <= 0) return static_cast<int>(cudaErrorInvalidValue);
  switch (args.dtype) {
    case Dtype::float32: return launch<float>(args, stream);
    case Dtype::bfloat16: return launch<__nv_bfloat16>(args, stream);
    case Dtype::float16: return launch<__half>(args, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace speculant::kernels
