#pragma once
// The CUDA kernels' launchers (decode_attention.cu, rms_norm.cu): plain pointers, strides in elements and a
// stream, no torch types, so that nvcc compiles them without torch's headers. kernels/ops.cpp checks the
// tensors and calls these; each returns the launch's cudaError_t as an int (0 is success).
#include <cstdint>

namespace speculant::kernels {

enum class Dtype { float32, bfloat16, float16 };

// Attention of N query rows per (batch row, key/value head) over S keys, split along the keys into `splits`
// chunks whose partial results a second kernel combines (split-KV, "flash decoding"). q [B, H, N, D],
// k, v [B, H, S, D] and mask [Bm, T, S] (additive, Bm 1 or B, query row i reads mask row i % T) in `dtype`, the
// last dimension contiguous; out [B, H, N, D] contiguous. partial: splits * B * H * N * (D + 2) floats, when
// splits > 1.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;
  void* out;
  float* partial;
  int64_t q_stride[3];     // b, h, n
  int64_t k_stride[3];     // b, h, s
  int64_t v_stride[3];     // b, h, s
  int64_t mask_stride[3];  // b (0 when broadcast), t, s
  int batch, heads, rows, mask_rows, keys, head_dim, splits;
  float scale;
  Dtype dtype;
};

// The number of key chunks that fills the device: about two blocks per multiprocessor.
int attention_splits(int batch, int heads, int rows, int keys, int multiprocessors);
int launch_decode_attention(const AttentionArgs& args, void* stream);

// y = x * rsqrt(mean(x^2) + eps) * weight over each of `rows` contiguous rows of `width`, in float32, rounded
// to `dtype` once.
int launch_rms_norm(const void* x, const void* weight, void* y, int64_t rows, int64_t width, float eps,
                    Dtype dtype, void* stream);

}  // namespace speculant::kernels
