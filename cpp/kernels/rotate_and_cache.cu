// A Llama layer's rotary embedding and cache write in one kernel (launch.h's RotaryArgs): each thread takes one
// pair of dimensions (d, d + D/2) of one head of one token, rotates it in float32 (queries and keys; values pass
// as they are) and writes it, rounded once, to the queries' output or to the token's cache slot.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/element.cuh"
#include "kernels/launch.h"

namespace speculant::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) rotate_pairs(RotaryArgs a) {
  const int half = a.head_dim / 2, all = a.heads + 2 * a.kv_heads;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= static_cast<int64_t>(a.batch) * a.tokens * all * half) return;
  const int p = static_cast<int>(index % half);
  int64_t rest = index / half;
  const int h = static_cast<int>(rest % all);
  rest /= all;
  const int t = static_cast<int>(rest % a.tokens), b = static_cast<int>(rest / a.tokens);
  const T* x = static_cast<const T*>(a.qkv) + ((static_cast<int64_t>(b) * a.tokens + t) * all + h) * a.head_dim;
  float first = load(x + p), second = load(x + p + half);
  if (h < a.heads + a.kv_heads) {  // a query or key head: rotated
    const int64_t at = b * a.cos_row_stride + static_cast<int64_t>(t) * a.head_dim;
    const T* cos = static_cast<const T*>(a.cos) + at;
    const T* sin = static_cast<const T*>(a.sin) + at;
    const float rotated = first * load(cos + p) + second * load(sin + p);
    second = second * load(cos + p + half) + first * load(sin + p + half);
    first = rotated;
  }
  T* out;
  if (h < a.heads) {
    out = static_cast<T*>(a.q) + ((static_cast<int64_t>(b) * a.heads + h) * a.tokens + t) * a.head_dim;
  } else {
    const int value = h >= a.heads + a.kv_heads ? 1 : 0, head = h - a.heads - value * a.kv_heads;
    const int64_t row = a.rows != nullptr ? a.rows[b] : 0;
    const int64_t slot = a.slots != nullptr ? a.slots[static_cast<int64_t>(b) * a.tokens + t] : a.start + t;
    if (row < 0 || row >= a.cache_rows || slot < 0 || slot >= a.cache_slots) __trap();
    out = static_cast<T*>(a.cache) + value * a.cache_stride[0] + row * a.cache_stride[1] + slot * a.cache_stride[2] +
          head * a.cache_stride[3];
  }
  store(out + p, first);
  store(out + p + half, second);
}

template <typename T>
int launch(const RotaryArgs& a, void* stream) {
  const int64_t pairs = static_cast<int64_t>(a.batch) * a.tokens * (a.heads + 2 * a.kv_heads) * (a.head_dim / 2);
  const dim3 grid(static_cast<unsigned>((pairs + kThreads - 1) / kThreads));
  launch_kernel(rotate_pairs<T>, grid, kThreads, static_cast<cudaStream_t>(stream), a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_rotate_and_cache(const RotaryArgs& args, void* stream) {
  if (args.batch == 0 || args.tokens == 0 || args.head_dim == 0) return 0;
  return by_dtype(args.dtype, [&](auto element) { return launch<decltype(element)>(args, stream); });
}

}  // namespace speculant::kernels
