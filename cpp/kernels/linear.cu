// Linear layers of a few input rows (decoding and verification calls) with what comes before and after the
// matrix product fused in: out[m, n] = sum_k u[m, k] W[n, k] (+ bias[n]) (+ out[m, n], accumulating into a
// residual stream), where u is x, its RMSNorm or LayerNorm, an activation of it, or a gated activation of its
// halves ([gate | up]). Such a call reads each weight once, so it is bound by reading W. A block of kWarps
// warps computes kWarps * kCols columns, K in chunks of kChunk 16-byte vectors: each lane first loads its
// vectors of the chunk for the warp's columns, then, while they arrive, the block transforms the chunk of the
// input rows once into shared memory (in float32, rounded to T as the ATen composite rounds the transformed
// input), then each warp computes on both. A norm's statistics come before the first chunk, each block
// computing them for all rows (a LayerNorm's variance in a second pass over the row, about its mean). Every dot
// product is reduced in float32 across its warp and rounded once.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 2;      // output columns (weight rows) per warp: 16 per block
constexpr int kChunk = 256;   // 16-byte vectors of K per chunk: the block's transformed rows of a chunk in shared
constexpr int kPerLane = kChunk / 32;  // memory (8 rows: 32 KB), each lane's weight vectors of it in registers

template <typename T>
__device__ inline float rounded(float x) {
  T value;
  store(&value, x);
  return load(&value);
}

__device__ inline float activate(float x, Activation kind) {
  switch (kind) {
    case Activation::silu: return __fdividef(x, 1.0f + __expf(-x));
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

// Row m's transformed input at 16-byte vector i, rounded to T, as one vector of T.
template <typename T>
__device__ uint4 input_vector(const LinearArgs& a, int m, int i, float mean, float scale) {
  constexpr int N = 16 / sizeof(T);
  const T* row = static_cast<const T*>(a.x) + m * a.x_stride;
  const uint4 xv = __ldg(reinterpret_cast<const uint4*>(row) + i);
  if (a.input == LinearInput::none) return xv;
  const T* e = reinterpret_cast<const T*>(&xv);
  uint4 out, up, gv, bv = make_uint4(0, 0, 0, 0);
  T* u = reinterpret_cast<T*>(&out);
  if (a.input == LinearInput::gated) up = __ldg(reinterpret_cast<const uint4*>(row + a.k) + i);
  if (a.input == LinearInput::rms_norm || a.input == LinearInput::layer_norm) {
    gv = __ldg(reinterpret_cast<const uint4*>(a.norm_weight) + i);
    if (a.norm_bias != nullptr) bv = __ldg(reinterpret_cast<const uint4*>(a.norm_bias) + i);
  }
  const T* f = reinterpret_cast<const T*>(&up);
  const T* g = reinterpret_cast<const T*>(&gv);
  const T* b = reinterpret_cast<const T*>(&bv);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float x = load(e + j);
    switch (a.input) {
      case LinearInput::activation: store(u + j, activate(x, a.activation)); break;
      case LinearInput::gated: store(u + j, activate(x, a.activation) * load(f + j)); break;
      default: store(u + j, (x - mean) * scale * load(g + j) + load(b + j)); break;  // the norms (b 0 for RMS)
    }
  }
  return out;
}

// M: the rows the kernel is built for (a.rows <= M, the rest skipped). Every thread of the block reaches every
// __syncthreads: a warp whose columns lie past n computes on the last column and stores nothing.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads) linear_rows(LinearArgs a) {
  constexpr int N = 16 / sizeof(T);
  __shared__ uint4 staged[M][kChunk];  // the chunk's transformed input rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = (blockIdx.x * kWarps + warp) * kCols, vectors = a.k / N;
  const uint4* w[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    w[c] = reinterpret_cast<const uint4*>(static_cast<const T*>(a.weight) +
                                          static_cast<int64_t>(min(first + c, a.n - 1)) * a.k);
  __shared__ float row_mean[M], row_scale[M];  // each row's norm statistics
  float acc[kCols][M] = {};
  const bool norm = a.input == LinearInput::rms_norm || a.input == LinearInput::layer_norm;
  for (int start = 0; start < vectors; start += kChunk) {
    uint4 wv[kPerLane][kCols];  // this chunk's weights: on their way while the chunk's input is transformed
#pragma unroll
    for (int p = 0; p < kPerLane; ++p)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        if (start + lane + 32 * p < vectors) wv[p][c] = __ldg(w[c] + start + lane + 32 * p);
    if (start == 0) {
      float mean[M], scale[M];
#pragma unroll
      for (int m = 0; m < M; ++m) mean[m] = 0.0f, scale[m] = 1.0f;
      if (norm) norm_statistics<T, M>(a, mean, scale);
      if (threadIdx.x == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) row_mean[m] = mean[m], row_scale[m] = scale[m];
      }
    }
    __syncthreads();  // the statistics are written; the previous chunk's compute is done with staged[]
    for (int index = threadIdx.x; index < M * kChunk; index += kThreads) {
      const int m = index / kChunk, i = start + index % kChunk;
      if (m < a.rows && i < vectors)
        staged[m][index % kChunk] = input_vector<T>(a, m, i, row_mean[m], row_scale[m]);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kPerLane; ++p) {
      if (start + lane + 32 * p >= vectors) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m >= a.rows) break;
        const uint4 uv = staged[m][lane + 32 * p];
        const T* u = reinterpret_cast<const T*>(&uv);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const T* we = reinterpret_cast<const T*>(&wv[p][c]);
#pragma unroll
          for (int j = 0; j < N; ++j) acc[c][m] += load(we + j) * load(u + j);
        }
      }
    }
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
  if (a.rows <= 1) launch_kernel(linear_rows<T, 1>, grid, kThreads, s, a);
  else if (a.rows <= 2) launch_kernel(linear_rows<T, 2>, grid, kThreads, s, a);
  else if (a.rows <= 4) launch_kernel(linear_rows<T, 4>, grid, kThreads, s, a);
  else launch_kernel(linear_rows<T, kLinearMaxRows>, grid, kThreads, s, a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_linear(const LinearArgs& args, void* stream) {
  if (args.rows == 0 || args.n == 0) return 0;
  if (args.rows > kLinearMaxRows || args.k <= 0) return static_cast<int>(cudaErrorInvalidValue);
  return by_dtype(args.dtype, [&](auto element) { return launch<decltype(element)>(args, stream); });
}

}  // namespace speculant::kernels
