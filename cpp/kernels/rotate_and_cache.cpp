// torch.ops.speculant.rotate_and_cache: a Llama layer's rotary embedding of its queries and keys and the write of
// its keys and values into the cache, in one operation (the exports' kernels="speculant"). On the CPU it is the
// ATen composite the exports run without it (llama.py's rotate, then cached.py's cached_kv), so that an export
// with it computes what one without it does; on CUDA, where this build has the CUDA compiler, the kernel of
// rotate_and_cache.cu.
#include <ATen/ATen.h>
#include <ATen/core/List.h>
#include <torch/library.h>

#include <optional>

#include "kernels/launch.h"

#ifdef SPECULANT_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/device_tensors.h"
#endif

namespace speculant::kernels {
namespace {

struct Shape {
  int64_t batch, tokens, head_dim;
};

// qkv [B, T, (H + 2 H_kv) D]; cos, sin [1 | B, 1, T, D]; the cache [2, H_kv, M, D] with start + T <= M (batch 1:
// rows and slots none), or [2, B', M + 1, H_kv, D] with rows [B] and slots [B, T] (int64).
Shape check(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cache,
            const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& slots, int64_t start,
            int64_t heads, int64_t kv_heads) {
  TORCH_CHECK_VALUE(heads >= 1 && kv_heads >= 1 && qkv.dim() == 3 && qkv.size(2) % (heads + 2 * kv_heads) == 0 &&
                    qkv.size(2) / (heads + 2 * kv_heads) % 2 == 0, "rotate_and_cache: qkv must be [B, T, (heads + 2 "
                    "kv_heads) D] with D even, got ", qkv.sizes(), " for heads = ", heads, ", kv_heads = ", kv_heads);
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (heads + 2 * kv_heads);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK_VALUE(t->dim() == 4 && (t->size(0) == 1 || t->size(0) == B) && t->size(1) == 1 &&
                      t->size(2) == T && t->size(3) == D && t->size(0) == cos.size(0), "rotate_and_cache: cos and "
                      "sin must both be [1, 1, ", T, ", ", D, "] or both [", B, ", 1, ", T, ", ", D, "], got ",
                      cos.sizes(), " and ", sin.sizes());
  for (const at::Tensor* t : {&cos, &sin, &cache})
    TORCH_CHECK_VALUE(t->scalar_type() == qkv.scalar_type() && t->device() == qkv.device(), "rotate_and_cache: "
                      "cos, sin and the cache must share qkv's dtype and device, ", qkv.scalar_type(), " on ",
                      qkv.device(), ", got ", t->scalar_type(), " on ", t->device());
  TORCH_CHECK_VALUE(rows.has_value() == slots.has_value(), "rotate_and_cache: rows and slots come together");
  if (!rows.has_value()) {
    TORCH_CHECK_VALUE(B == 1 && cache.dim() == 4 && cache.size(0) == 2 && cache.size(1) == kv_heads &&
                      cache.size(3) == D && start >= 0 && start + T <= cache.size(2), "rotate_and_cache: batch 1 "
                      "takes a cache [2, ", kv_heads, ", M, ", D, "] with start + T <= M, got ", cache.sizes(),
                      " at start ", start, " for qkv ", qkv.sizes());
  } else {
    TORCH_CHECK_VALUE(cache.dim() == 5 && cache.size(0) == 2 && cache.size(3) == kv_heads && cache.size(4) == D &&
                      rows->dim() == 1 && rows->size(0) == B && slots->dim() == 2 && slots->size(0) == B &&
                      slots->size(1) == T && rows->scalar_type() == at::kLong && slots->scalar_type() == at::kLong &&
                      rows->device() == qkv.device() && slots->device() == qkv.device(), "rotate_and_cache: rows "
                      "take a cache [2, B', M + 1, ", kv_heads, ", ", D, "], rows [", B, "] and slots [", B, ", ",
                      T, "] (int64, on qkv's device), got ", cache.sizes(), ", ", rows->sizes(), " and ",
                      slots->sizes());
  }
  return {B, T, D};
}

// x * cos + [x2, x1] * sin over the last dimension (sin's first half negated: llama.py's rotary tables)
at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
}

// ATen's computation, on arguments already checked (s: their shape)
at::Tensor aten(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& cache,
                const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& slots, int64_t start,
                int64_t heads, int64_t kv_heads, const Shape& s) {
  const at::Tensor x = qkv.reshape({s.batch, s.tokens, heads + 2 * kv_heads, s.head_dim}).transpose(1, 2);
  const at::Tensor r = rotated(x.narrow(1, 0, heads + kv_heads), cos, sin);  // [B, H + H_kv, T, D]
  const at::Tensor kv = at::stack({r.narrow(1, heads, kv_heads), x.narrow(1, heads + kv_heads, kv_heads)});
  if (!rows.has_value()) {
    cache.narrow(2, start, s.tokens).copy_(kv.select(1, 0));  // [2, H_kv, T, D]
  } else {
    const c10::List<std::optional<at::Tensor>> index{std::nullopt, rows->unsqueeze(1).expand_as(*slots), *slots};
    cache.index_put_(index, kv.transpose(2, 3));  // [2, B, T, H_kv, D]
  }
  return r.narrow(1, 0, heads);  // [B, H, T, D]
}

at::Tensor composite(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& cache,
                     const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& slots, int64_t start,
                     int64_t heads, int64_t kv_heads) {
  const Shape s = check(qkv, cos, sin, cache, rows, slots, start, heads, kv_heads);
  return aten(qkv, cos, sin, cache, rows, slots, start, heads, kv_heads, s);
}

#ifdef SPECULANT_CUDA_KERNELS
at::Tensor rotate_and_cache_cuda(const at::Tensor& qkv_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                                 at::Tensor& cache, const std::optional<at::Tensor>& rows_in,
                                 const std::optional<at::Tensor>& slots_in, int64_t start, int64_t heads,
                                 int64_t kv_heads) {
  const Shape s = check(qkv_in, cos_in, sin_in, cache, rows_in, slots_in, start, heads, kv_heads);
  if (cache.stride(-1) != 1)  // the kernel writes each head's D elements contiguously
    return aten(qkv_in, cos_in, sin_in, cache, rows_in, slots_in, start, heads, kv_heads, s);
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const at::Tensor qkv = qkv_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const at::Tensor rows = rows_in.has_value() ? rows_in->contiguous() : at::Tensor();
  const at::Tensor slots = slots_in.has_value() ? slots_in->contiguous() : at::Tensor();
  at::Tensor q = at::empty({s.batch, heads, s.tokens, s.head_dim}, qkv.options());
  const bool batched = rows_in.has_value();
  RotaryArgs args{qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), cache.data_ptr(),
                  batched ? rows.data_ptr<int64_t>() : nullptr, batched ? slots.data_ptr<int64_t>() : nullptr,
                  cos.size(0) == 1 ? 0 : cos.stride(0),
                  // kv, row, slot, head: the batch-1 cache [2, H_kv, M, D] has one row
                  {cache.stride(0), batched ? cache.stride(1) : 0, cache.stride(2),
                   batched ? cache.stride(3) : cache.stride(1)},
                  batched ? cache.size(1) : 1, cache.size(2),
                  static_cast<int>(s.batch), static_cast<int>(s.tokens), static_cast<int>(heads),
                  static_cast<int>(kv_heads), static_cast<int>(s.head_dim), start,
                  kernel_dtype(qkv, "rotate_and_cache")};
  check_launch(launch_rotate_and_cache(args, at::cuda::getCurrentCUDAStream().stream()), "rotate_and_cache");
  return q;
}
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(speculant, m) {
  m.def("rotate_and_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) cache, Tensor? rows, Tensor? slots, "
        "int start, int heads, int kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(speculant, CPU, m) { m.impl("rotate_and_cache", composite); }

#ifdef SPECULANT_CUDA_KERNELS
TORCH_LIBRARY_IMPL(speculant, CUDA, m) { m.impl("rotate_and_cache", rotate_and_cache_cuda); }
#endif

}  // namespace speculant::kernels
