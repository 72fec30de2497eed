// torch.ops.speculant.rms_norm and torch.ops.speculant.decode_attention, two of the exports' fused operations
// (python/speculant/models/export/llama.py, kernels="speculant"; the linear layers' are in linear.cpp): on the
// CPU each is the ATen composite it replaces, so that a CPU export with them computes what one without them does;
// on CUDA, where this build has the CUDA compiler, the kernels of decode_attention.cu and rms_norm.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#ifdef SPECULANT_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/device_tensors.h"
#endif

namespace speculant::kernels {
namespace {

// The largest call the split-KV kernel takes, in query rows per key/value head (a 16-token tree with four
// query heads per key head is 64); longer calls (prompts) are ATen's attention, whose tiles fill the device.
constexpr int64_t kKernelRows = 128;

// mask [T, S] or [Bm, 1, T, S] -> [Bm, T, S]
at::Tensor mask_rows(const at::Tensor& mask) { return mask.dim() == 2 ? mask.unsqueeze(0) : mask.squeeze(1); }

void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "decode_attention: q, k and v must be "
                    "[B, H, N, D] and [B, H, S, D], got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                    k.size(3) == q.size(3), "decode_attention: k and v must be [B, H, S, D] for q ", q.sizes(),
                    ", got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(mask.dim() == 2 || (mask.dim() == 4 && mask.size(1) == 1), "decode_attention: mask must be "
                    "[T, S] or [B, 1, T, S], got ", mask.sizes());
  const at::Tensor rows = mask_rows(mask);
  TORCH_CHECK_VALUE(rows.size(2) == k.size(2) && rows.size(1) >= 1 && q.size(2) % rows.size(1) == 0 &&
                    (rows.size(0) == 1 || rows.size(0) == q.size(0)), "decode_attention: mask ", mask.sizes(),
                    " does not fit q ", q.sizes(), " and k ", k.sizes(), " (S keys; T rows dividing N; B 1 or q's)");
  for (const at::Tensor* t : {&k, &v, &mask})
    TORCH_CHECK_VALUE(t->scalar_type() == q.scalar_type() && t->device() == q.device(), "decode_attention: q, k, "
                      "v and mask must share a dtype and device, got ", q.scalar_type(), " on ", q.device(),
                      " and ", t->scalar_type(), " on ", t->device());
}

// ATen's attention over the mask repeated for the N / T query heads stacked along q's rows (row i: mask row
// i % T), the computation the exports make without the fused operations.
at::Tensor attention_composite(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& mask, double scale) {
  check_attention(q, k, v, mask);
  const at::Tensor rows = mask_rows(mask);  // [Bm, T, S]
  const int64_t Bm = rows.size(0), T = rows.size(1), S = rows.size(2), N = q.size(2);
  const at::Tensor stacked = rows.unsqueeze(1).expand({Bm, N / T, T, S}).reshape({Bm, 1, N, S});
  return at::scaled_dot_product_attention(q, k, v, stacked, 0.0, false, scale);
}

void check_rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0), "rms_norm: weight must be "
                    "[C] for x [.., C], got ", weight.sizes(), " and ", x.sizes());
  TORCH_CHECK_VALUE(weight.scalar_type() == x.scalar_type() && weight.device() == x.device(), "rms_norm: x and "
                    "weight must share a dtype and device, got ", x.scalar_type(), " on ", x.device(), " and ",
                    weight.scalar_type(), " on ", weight.device());
}

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm(x, weight);
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

#ifdef SPECULANT_CUDA_KERNELS
at::Tensor last_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

at::Tensor attention_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                          const at::Tensor& mask_in, double scale) {
  check_attention(q_in, k_in, v_in, mask_in);
  const int64_t B = q_in.size(0), H = q_in.size(1), N = q_in.size(2), D = q_in.size(3), S = k_in.size(2);
  if (N > kKernelRows || (D != 64 && D != 128 && D != 256))
    return attention_composite(q_in, k_in, v_in, mask_in, scale);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  const at::Tensor mask = last_contiguous(mask_rows(mask_in));  // [Bm, T, S]
  at::Tensor out = at::empty({B, H, N, D}, q.options());
  AttentionArgs args{q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), out.data_ptr(), nullptr,
                     {q.stride(0), q.stride(1), q.stride(2)}, {k.stride(0), k.stride(1), k.stride(2)},
                     {v.stride(0), v.stride(1), v.stride(2)},
                     {mask.size(0) == 1 ? 0 : mask.stride(0), mask.stride(1), mask.stride(2)},
                     static_cast<int>(B), static_cast<int>(H), static_cast<int>(N), static_cast<int>(mask.size(1)),
                     static_cast<int>(S), static_cast<int>(D), 1, static_cast<float>(scale),
                     kernel_dtype(q, "decode_attention")};
  args.splits = attention_splits(args.batch, args.heads, args.rows, args.keys,
                                 at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  at::Tensor partial;
  if (args.splits > 1) {
    partial = at::empty({args.splits * B * H * N * (D + 2)}, q.options().dtype(at::kFloat));
    args.partial = partial.data_ptr<float>();
  }
  check_launch(launch_decode_attention(args, at::cuda::getCurrentCUDAStream().stream()), "decode_attention");
  return out;
}

at::Tensor rms_norm_cuda(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_rms_norm(x_in, weight_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t width = x.size(-1);
  check_launch(launch_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), width == 0 ? 0 : x.numel() / width,
                               width, static_cast<float>(eps), kernel_dtype(x, "rms_norm"),
                               at::cuda::getCurrentCUDAStream().stream()), "rms_norm");
  return y;
}
#endif

}  // namespace

TORCH_LIBRARY(speculant, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(speculant, CPU, m) {
  m.impl("rms_norm", rms_norm_composite);
  m.impl("decode_attention", attention_composite);
}

#ifdef SPECULANT_CUDA_KERNELS
TORCH_LIBRARY_IMPL(speculant, CUDA, m) {
  m.impl("rms_norm", rms_norm_cuda);
  m.impl("decode_attention", attention_cuda);
}
#endif

}  // namespace speculant::kernels
