// Split-KV attention for calls of a few query rows (decoding, verification of chains and trees): each block
// takes up to kRows query rows of one (batch row, key/value head) over one chunk of the keys, so that a call of
// one token still spreads over the whole device; a second kernel combines the chunks' partial softmaxes. A
// block's warps take every kWarps-th key of the chunk; each lane holds E = D / 32 dimensions of every query row,
// the running softmax (max m, sum l, the lane's slice of sum exp(s - m) v), and reads each key and value once
// for all the block's rows.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;       // query rows per block
constexpr int kMinChunk = 16;  // keys per chunk, at least

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
  for (int j = first + warp; j < last; j += kWarps) {
    float key[E], value[E];
    for (int i = 0; i < E; ++i) key[i] = load(k + j * a.k_stride[2] + i), value[i] = load(v + j * a.v_stride[2] + i);
    for (int r = 0; r < rows; ++r) {
      float s = 0.0f;
      for (int i = 0; i < E; ++i) s += query[r][i] * key[i];
      const int row = tile * kRows + r;
      s = warp_sum(s) + load(mask + (row % a.mask_rows) * a.mask_stride[1] + j * a.mask_stride[2]);
      if (s == -INFINITY) continue;  // a masked key adds exp(-inf) = 0
      const float m = fmaxf(run[r].m, s), carry = expf(run[r].m - m), p = expf(s - m);
      run[r].l = run[r].l * carry + p;
      for (int i = 0; i < E; ++i) run[r].o[i] = run[r].o[i] * carry + p * value[i];
      run[r].m = m;
    }
  }
  merge_warps<T, E>(a, run, split, tile, bh);
}

// One block per (query row, batch row and head), one thread per dimension: the chunks' partial softmaxes
// rescaled to their common max and summed.
template <typename T, int D>
__global__ void combine_splits(AttentionArgs a) {
  const int row = blockIdx.x, bh = blockIdx.y, d = threadIdx.x;
  const size_t slot = static_cast<size_t>(bh) * a.rows + row;
  const size_t stride = static_cast<size_t>(a.batch) * a.heads * a.rows * (D + 2);
  const float* part = a.partial + slot * (D + 2);
  float m = -INFINITY, l = 0.0f, o = 0.0f;
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, part[s * stride + D]);
  if (m != -INFINITY) {
    for (int s = 0; s < a.splits; ++s) {
      const float factor = expf(part[s * stride + D] - m);
      l += part[s * stride + D + 1] * factor;
      o += part[s * stride + d] * factor;
    }
  }
  store(static_cast<T*>(a.out) + slot * D + d, l == 0.0f ? 0.0f : o / l);
}

template <typename T, int E>
int launch(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(a.splits, (a.rows + kRows - 1) / kRows, a.batch * a.heads);
  attend_chunk<T, E><<<grid, kWarps * 32, 0, stream>>>(a);
  if (a.splits > 1) combine_splits<T, 32 * E><<<dim3(a.rows, a.batch * a.heads), 32 * E, 0, stream>>>(a);
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
  const int most = (keys + kMinChunk - 1) / kMinChunk;
  return wanted < 1 ? 1 : (wanted < most ? wanted : (most < 1 ? 1 : most));
}

int launch_decode_attention(const AttentionArgs& args, void* stream) {
  if (args.rows == 0 || args.batch * args.heads == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case Dtype::float32: return launch_width<float>(args, s);
    case Dtype::bfloat16: return launch_width<__nv_bfloat16>(args, s);
    case Dtype::float16: return launch_width<__half>(args, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace speculant::kernels
