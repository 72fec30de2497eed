// Split-KV attention for calls of a few query rows (decoding, verification of chains and trees): each block
// takes up to kRows query rows of one (batch row, key/value head) over one chunk of the keys, so that a call of
// one token still spreads over the whole device; a second kernel combines the chunks' partial softmaxes. A
// block's warps take every kWarps-th key of the chunk, loading several keys before computing on them so that
// their loads overlap; each lane holds E = D / 32 dimensions of every query row, the running softmax (max m, sum
// l, the lane's slice of sum exp(s - m) v), and reads each key and value once for all the block's rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;       // query rows per block
constexpr int kMinChunk = 16;  // keys per chunk, at least
constexpr int kMaxSplits = 256;  // chunks per call, at most

template <int E>
struct Running {
  float m, l, o[E];
};

// The block's warps' running softmaxes for its rows merged: into out when the keys are one chunk, else into
// the chunk's slot of partial ([splits, B * H, N, D + 2]: sum exp(s - m) v, then m and l).
template <typename T, int E>
__device__ void merge_warps(const AttentionArgs& a, Running<E> (&run)[kRows], int split, int tile, int bh) {
  constexpr int D = 32 * E;
  __shared__ float ms[kWarps][kRows], ls[kWarps][kRows], os[kWarps][kRows][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < kRows; ++r) {
    if (lane == 0) ms[warp][r] = run[r].m, ls[warp][r] = run[r].l;
    for (int i = 0; i < E; ++i) os[warp][r][lane * E + i] = run[r].o[i];
  }
  __syncthreads();
  for (int index = threadIdx.x; index < kRows * D; index += kWarps * 32) {
    const int r = index / D, d = index % D, row = tile * kRows + r;
    if (row >= a.rows) continue;
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, ms[w][r]);
    if (m != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float factor = expf(ms[w][r] - m);
        l += ls[w][r] * factor;
        o += os[w][r][d] * factor;
      }
    }
    const size_t slot = static_cast<size_t>(bh) * a.rows + row;
    if (a.splits == 1) {
      store(static_cast<T*>(a.out) + slot * D + d, l == 0.0f ? 0.0f : o / l);  // NaN passes through
    } else {
      float* part = a.partial + (static_cast<size_t>(split) * a.batch * a.heads * a.rows + slot) * (D + 2);
      part[d] = o;
      if (d == 0) part[D] = m, part[D + 1] = l;
    }
  }
}

template <typename T, int E>
__global__ void __launch_bounds__(kWarps * 32) attend_chunk(AttentionArgs a) {
  const int split = blockIdx.x, tile = blockIdx.y, bh = blockIdx.z;
  const int b = bh / a.heads, h = bh % a.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = (a.keys + a.splits - 1) / a.splits;
  const int first = split * chunk, last = min(a.keys, first + chunk);
  const T* q = static_cast<const T*>(a.q) + b * a.q_stride[0] + h * a.q_stride[1] + lane * E;
  const T* k = static_cast<const T*>(a.k) + b * a.k_stride[0] + h * a.k_stride[1] + lane * E;
  const T* v = static_cast<const T*>(a.v) + b * a.v_stride[0] + h * a.v_stride[1] + lane * E;
  const T* mask = static_cast<const T*>(a.mask) + b * a.mask_stride[0];
  const int rows = min(kRows, a.rows - tile * kRows);

  float query[kRows][E];
  Running<E> run[kRows];
  for (int r = 0; r < kRows; ++r) {
    run[r].m = -INFINITY, run[r].l = 0.0f;
    for (int i = 0; i < E; ++i) {
      query[r][i] = r < rows ? load(q + (tile * kRows + r) * a.q_stride[2] + i) * a.scale : 0.0f;
      run[r].o[i] = 0.0f;
    }
  }
  constexpr int U = E >= 8 ? 2 : 4;  // keys a warp loads before it computes on them, so that their loads overlap
  for (int base = first + warp; base < last; base += kWarps * U) {
    float key[U][E], value[U][E], bias[U][kRows];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = base + u * kWarps;
      if (j >= last) break;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        key[u][i] = load(k + j * a.k_stride[2] + i);
        value[u][i] = load(v + j * a.v_stride[2] + i);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < rows)
          bias[u][r] = load(mask + (tile * kRows + r) % a.mask_rows * a.mask_stride[1] + j * a.mask_stride[2]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * kWarps >= last) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < E; ++i) s += query[r][i] * key[u][i];
        s = warp_sum(s) + bias[u][r];
        if (s == -INFINITY) continue;  // a masked key adds exp(-inf) = 0
        const float m = fmaxf(run[r].m, s), carry = expf(run[r].m - m), p = expf(s - m);
        run[r].l = run[r].l * carry + p;
#pragma unroll
        for (int i = 0; i < E; ++i) run[r].o[i] = run[r].o[i] * carry + p * value[u][i];
        run[r].m = m;
      }
    }
  }
  merge_warps<T, E>(a, run, split, tile, bh);
}

// One block per (query row, batch row and head), one thread per dimension: the chunks' partial softmaxes
// rescaled to their common max and summed. Each chunk's max and sum are read once, by one thread, into shared
// memory with their factors exp(m_s - m); each thread's loads over the chunks are then independent of each other.
template <typename T, int D>
__global__ void __launch_bounds__(D) combine_splits(AttentionArgs a) {
  __shared__ float factor[kMaxSplits], weighted[kMaxSplits];
  const int row = blockIdx.x, bh = blockIdx.y, d = threadIdx.x;
  const size_t slot = static_cast<size_t>(bh) * a.rows + row;
  const size_t stride = static_cast<size_t>(a.batch) * a.heads * a.rows * (D + 2);
  const float* part = a.partial + slot * (D + 2);
  for (int s = d; s < a.splits; s += D) factor[s] = part[s * stride + D], weighted[s] = part[s * stride + D + 1];
  __syncthreads();
  float m = -INFINITY;
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, factor[s]);
  __syncthreads();  // every thread has read the maxima before they become factors
  for (int s = d; s < a.splits; s += D) {
    const float f = m == -INFINITY ? 0.0f : expf(factor[s] - m);
    factor[s] = f, weighted[s] *= f;
  }
  __syncthreads();
  float l = 0.0f, o = 0.0f;
#pragma unroll 4
  for (int s = 0; s < a.splits; ++s) {
    l += weighted[s];
    o += part[s * stride + d] * factor[s];
  }
  store(static_cast<T*>(a.out) + slot * D + d, l == 0.0f ? 0.0f : o / l);
}

template <typename T, int E>
int launch(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(a.splits, (a.rows + kRows - 1) / kRows, a.batch * a.heads);
  launch_kernel(attend_chunk<T, E>, grid, kWarps * 32, stream, a);
  if (a.splits > 1) launch_kernel(combine_splits<T, 32 * E>, dim3(a.rows, a.batch * a.heads), 32 * E, stream, a);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_width(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64: return launch<T, 2>(a, stream);
    case 128: return launch<T, 4>(a, stream);
    case 256: return launch<T, 8>(a, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int attention_splits(int batch, int heads, int rows, int keys, int multiprocessors) {
  const int blocks = batch * heads * ((rows + kRows - 1) / kRows);
  const int wanted = (2 * multiprocessors + blocks - 1) / blocks;
  const int most = std::min((keys + kMinChunk - 1) / kMinChunk, kMaxSplits);
  return std::max(1, std::min(wanted, most));
}

int launch_decode_attention(const AttentionArgs& args, void* stream) {
  if (args.rows == 0 || args.batch * args.heads == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(args.dtype, [&](auto element) { return launch_width<decltype(element)>(args, s); });
}

}  // namespace speculant::kernels
