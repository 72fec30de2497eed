#pragma once
// The CUDA kernels' launchers (decode_attention.cu, linear.cu, rms_norm.cu, rotate_and_cache.cu): plain
// pointers, strides in elements and a stream, no torch types, so that nvcc compiles them without torch's
// headers. kernels/ops.cpp, linear.cpp and rotate_and_cache.cpp check the tensors and call these; each returns
// the launch's cudaError_t as an int (0 is success).
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

// What a fused linear layer (linear.cu) applies to its input rows before the matrix product.
enum class LinearInput { none, rms_norm, layer_norm, activation, gated };
enum class Activation { identity, silu, gelu, gelu_tanh, relu };

// The most input rows the fused linear kernel takes: a chain's verification (gamma + 1 <= 8 tokens); wider calls
// are ATen's matrix products, whose tiles use the tensor cores.
constexpr int kLinearMaxRows = 8;

// out [rows, n] (row stride out_stride) = u @ weight.T (+ bias) (+ out when accumulate), u [rows, k] the input x
// (row stride x_stride; gated: x [rows, 2k] = [gate | up], u = act(gate) * up) after `input`: nothing, RMSNorm or
// LayerNorm (norm_weight, norm_bias [k] or null, eps), or `activation`. weight [n, k] contiguous; x, weight and
// the norm's tensors 16-byte aligned and k, x_stride multiples of a 16-byte vector's elements; out not
// overlapping x. Computed in float32; u rounded to `dtype` as the ATen composite rounds it, out rounded once.
struct LinearArgs {
  const void* x;
  const void* weight;
  const void* bias;
  const void* norm_weight;
  const void* norm_bias;
  void* out;
  int64_t x_stride, out_stride;
  int rows, n, k;
  float eps;
  LinearInput input;
  Activation activation;
  bool accumulate;
  Dtype dtype;
};
int launch_linear(const LinearArgs& args, void* stream);

// A Llama layer's rotary embedding and cache write: qkv [B, T, (H + 2 H_kv) D] contiguous; each query head
// rotated into q [B, H, T, D], each key head rotated and each value head as it is into the cache at (kv, row,
// slot, head): row rows[b] (0 without rows), slot slots[b, t] (start + t without slots), D contiguous. cos, sin
// [1 | B, 1, T, D] contiguous (cos_row_stride 0 when one row serves all), sin's first half negated: out[d] =
// x[d] cos[d] + x[d + D/2] sin[d], out[d + D/2] = x[d + D/2] cos[d + D/2] + x[d] sin[d + D/2]. A row or slot
// outside [0, cache_rows) or [0, cache_slots), negative ones included, traps (the engine writes only its own).
struct RotaryArgs {
  const void* qkv;
  const void* cos;
  const void* sin;
  void* q;
  void* cache;
  const int64_t* rows;
  const int64_t* slots;
  int64_t cos_row_stride;
  int64_t cache_stride[4];  // kv, row, slot, head
  int64_t cache_rows, cache_slots;
  int batch, tokens, heads, kv_heads, head_dim;
  int64_t start;
  Dtype dtype;
};
int launch_rotate_and_cache(const RotaryArgs& args, void* stream);

}  // namespace speculant::kernels
