// torch.ops.speculant.linear and torch.ops.speculant.add_linear_, the exports' fused linear layers (kernels=
// "speculant"): a matrix product with the norm or activation before it and, for add_linear_, the residual add after
// it. On the CPU, and on CUDA for calls wider than linear.cu takes, each is the ATen composite it replaces
// (the norm or activation, then at::linear or addmm_ into the residual stream), so that an export with them
// computes what one without them does; on CUDA the kernel of linear.cu for calls of up to kLinearMaxRows rows.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/launch.h"

#ifdef SPECULANT_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/device_tensors.h"
#endif

namespace speculant::kernels {
namespace {

struct Input {
  LinearInput kind = LinearInput::none;
  Activation activation = Activation::identity;
};

constexpr const char* kInputs = "none, rms_norm, layer_norm, an activation (silu, gelu, gelu_tanh, relu) or "
                                "gated_ and an activation (gated_silu: silu(x[.., :K]) * x[.., K:])";

Activation activation_named(const std::string& name) {
  if (name == "silu") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  if (name == "relu") return Activation::relu;
  return Activation::identity;
}

Input parse_input(const std::string& name, const char* op) {
  if (name == "none") return {};
  if (name == "rms_norm") return {LinearInput::rms_norm};
  if (name == "layer_norm") return {LinearInput::layer_norm};
  const bool gated = name.rfind("gated_", 0) == 0;
  const Activation activation = activation_named(gated ? name.substr(6) : name);
  TORCH_CHECK_VALUE(activation != Activation::identity, op, ": input must be ", kInputs, ", got '", name, "'");
  return {gated ? LinearInput::gated : LinearInput::activation, activation};
}

bool is_norm(const Input& input) {
  return input.kind == LinearInput::rms_norm || input.kind == LinearInput::layer_norm;
}

void check_same(const at::Tensor& x, const std::optional<at::Tensor>& t, const char* op, const char* name) {
  if (!t.has_value()) return;
  TORCH_CHECK_VALUE(t->scalar_type() == x.scalar_type() && t->device() == x.device(), op, ": ", name,
                    " must share x's dtype and device, ", x.scalar_type(), " on ", x.device(), ", got ",
                    t->scalar_type(), " on ", t->device());
}

// K, the weight's input width, after checking every argument against it.
int64_t check_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const Input& input, const std::optional<at::Tensor>& norm_weight,
                     const std::optional<at::Tensor>& norm_bias, const char* op) {
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": weight must be [N, K], got ", weight.sizes());
  const int64_t k = weight.size(1), width = input.kind == LinearInput::gated ? 2 * k : k;
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == width, op, ": x must be [.., ", width, "] for weight ",
                    weight.sizes(), input.kind == LinearInput::gated ? " (a gated input: [gate | up])" : "",
                    ", got ", x.sizes());
  TORCH_CHECK_VALUE(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == weight.size(0)), op,
                    ": bias must be [", weight.size(0), "] for weight ", weight.sizes(), ", got ", bias->sizes());
  TORCH_CHECK_VALUE(is_norm(input) == norm_weight.has_value(), op, ": norm_weight is given exactly when input "
                    "is rms_norm or layer_norm");
  TORCH_CHECK_VALUE(!norm_bias.has_value() || input.kind == LinearInput::layer_norm, op,
                    ": norm_bias is for input = layer_norm only");
  for (const auto* t : {&norm_weight, &norm_bias})
    TORCH_CHECK_VALUE(!t->has_value() || ((*t)->dim() == 1 && (*t)->size(0) == k), op, ": norm_weight and "
                      "norm_bias must be [", k, "], got ", (*t)->sizes());
  check_same(x, weight, op, "weight");
  check_same(x, bias, op, "bias");
  check_same(x, norm_weight, op, "norm_weight");
  check_same(x, norm_bias, op, "norm_bias");
  return k;
}

at::Tensor activated(const at::Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::silu: return at::silu(x);
    case Activation::gelu: return at::gelu(x, "none");
    case Activation::gelu_tanh: return at::gelu(x, "tanh");
    case Activation::relu: return at::relu(x);
    case Activation::identity: break;
  }
  return x;
}

// The matrix product's input as the exports compute it without the fused operations (export/cached.py: a gated
// SiLU as gate * sigmoid(gate) * up).
at::Tensor transformed(const at::Tensor& x, const Input& input, const std::optional<at::Tensor>& norm_weight,
                       const std::optional<at::Tensor>& norm_bias, double eps, int64_t k) {
  switch (input.kind) {
    case LinearInput::none: return x;
    case LinearInput::rms_norm: return at::rms_norm(x, {k}, norm_weight, eps);
    case LinearInput::layer_norm: return at::layer_norm(x, {k}, norm_weight, norm_bias, eps);
    case LinearInput::activation: return activated(x, input.activation);
    case LinearInput::gated: {
      const at::Tensor gate = x.narrow(-1, 0, k), up = x.narrow(-1, k, k);
      if (input.activation == Activation::silu) return gate * at::sigmoid(gate) * up;
      return activated(gate, input.activation) * up;
    }
  }
  return x;
}

void check_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(shape) && out.is_contiguous(), "add_linear_: out must be "
                    "contiguous and ", at::IntArrayRef(shape), " for x ", x.sizes(), " and weight ", weight.sizes(),
                    ", got ", out.sizes(), out.is_contiguous() ? "" : " (not contiguous)");
  check_same(x, out, "add_linear_", "out");
  TORCH_CHECK_VALUE(at::get_overlap_status(out, x) == at::MemOverlapStatus::No, "add_linear_: out must not "
                    "overlap x");
}

// ATen's computation of each operation, on arguments already checked (k: the weight's input width)
at::Tensor linear_aten(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       const Input& input, const std::optional<at::Tensor>& norm_weight,
                       const std::optional<at::Tensor>& norm_bias, double eps, int64_t k) {
  return at::linear(transformed(x, input, norm_weight, norm_bias, eps, k), weight, bias);
}

at::Tensor& add_linear_aten(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const Input& input, int64_t k) {
  at::Tensor flat = out.view({-1, weight.size(0)});
  flat.addmm_(transformed(x, input, std::nullopt, std::nullopt, 0.0, k).reshape({-1, k}), weight.t());
  if (bias.has_value()) flat.add_(*bias);
  return out;
}

// add_linear_'s input, parsed, after checking every argument against it; K
std::pair<Input, int64_t> check_add_linear(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, c10::string_view input_name) {
  const Input input = parse_input(std::string(input_name), "add_linear_");
  TORCH_CHECK_VALUE(!is_norm(input), "add_linear_: input must not be a norm (the residual stream is its input's "
                    "source), got '", input_name, "'");
  const int64_t k = check_linear(x, weight, bias, input, std::nullopt, std::nullopt, "add_linear_");
  check_out(out, x, weight);
  return {input, k};
}

at::Tensor linear_composite(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            c10::string_view input_name, const std::optional<at::Tensor>& norm_weight,
                            const std::optional<at::Tensor>& norm_bias, double eps) {
  const Input input = parse_input(std::string(input_name), "linear");
  const int64_t k = check_linear(x, weight, bias, input, norm_weight, norm_bias, "linear");
  return linear_aten(x, weight, bias, input, norm_weight, norm_bias, eps, k);
}

at::Tensor& add_linear_composite(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::string_view input_name) {
  const auto [input, k] = check_add_linear(out, x, weight, bias, input_name);
  return add_linear_aten(out, x, weight, bias, input, k);
}

#ifdef SPECULANT_CUDA_KERNELS
// a tensor the kernel reads as packed 16-byte vectors, or none
bool packed(const std::optional<at::Tensor>& t) {
  return !t.has_value() || (t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
}

// x's rows [rows, width] as the kernel reads them, or nothing where the call is ATen's: too many rows, a dtype
// the kernel lacks, sizes past its int indices, or widths and addresses off its 16-byte vectors.
std::optional<at::Tensor> kernel_rows(const at::Tensor& x, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& norm_weight,
                                      const std::optional<at::Tensor>& norm_bias) {
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return std::nullopt;
  at::Tensor rows = x.reshape({-1, x.size(-1)});
  const int64_t vector = 16 / x.element_size(), k = weight.size(1);
  constexpr int64_t kMaxIndex = std::numeric_limits<int>::max();
  if (rows.size(0) == 0 || rows.size(0) > kLinearMaxRows || k == 0 || k % vector != 0 || 2 * k > kMaxIndex ||
      weight.size(0) > kMaxIndex)
    return std::nullopt;
  if (rows.stride(1) != 1 || rows.stride(0) % vector != 0) rows = rows.contiguous();
  const bool aligned = reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 == 0;
  if (!aligned || !packed(weight) || !packed(norm_weight) || !packed(norm_bias)) return std::nullopt;
  return rows;
}

void run_kernel(const at::Tensor& rows, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                const Input& input, const std::optional<at::Tensor>& norm_weight,
                const std::optional<at::Tensor>& norm_bias, double eps, at::Tensor& out, bool accumulate,
                const char* op) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const auto pointer = [](const std::optional<at::Tensor>& t) -> const void* {
    return t.has_value() ? t->data_ptr() : nullptr;
  };
  const at::Tensor contiguous_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
  const LinearArgs args{rows.data_ptr(), weight.data_ptr(), bias.has_value() ? contiguous_bias.data_ptr() : nullptr,
                        pointer(norm_weight), pointer(norm_bias), out.data_ptr(), rows.stride(0), weight.size(0),
                        static_cast<int>(rows.size(0)), static_cast<int>(weight.size(0)),
                        static_cast<int>(weight.size(1)), static_cast<float>(eps), input.kind, input.activation,
                        accumulate, kernel_dtype(rows, op)};
  check_launch(launch_linear(args, at::cuda::getCurrentCUDAStream().stream()), op);
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::string_view input_name, const std::optional<at::Tensor>& norm_weight,
                       const std::optional<at::Tensor>& norm_bias, double eps) {
  const Input input = parse_input(std::string(input_name), "linear");
  const int64_t k = check_linear(x, weight, bias, input, norm_weight, norm_bias, "linear");
  const std::optional<at::Tensor> rows = kernel_rows(x, weight, norm_weight, norm_bias);
  if (!rows.has_value()) return linear_aten(x, weight, bias, input, norm_weight, norm_bias, eps, k);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  at::Tensor out = at::empty(shape, x.options());
  run_kernel(*rows, weight, bias, input, norm_weight, norm_bias, eps, out, false, "linear");
  return out;
}

at::Tensor& add_linear_cuda(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::string_view input_name) {
  const auto [input, k] = check_add_linear(out, x, weight, bias, input_name);
  const std::optional<at::Tensor> rows = kernel_rows(x, weight, std::nullopt, std::nullopt);
  if (!rows.has_value()) return add_linear_aten(out, x, weight, bias, input, k);
  run_kernel(*rows, weight, bias, input, std::nullopt, std::nullopt, 0.0, out, true, "add_linear_");
  return out;
}
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(speculant, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str input=\"none\", Tensor? norm_weight=None, "
        "Tensor? norm_bias=None, float eps=0.0) -> Tensor");
  m.def("add_linear_(Tensor(a!) out, Tensor x, Tensor weight, Tensor? bias=None, str input=\"none\") -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(speculant, CPU, m) {
  m.impl("linear", linear_composite);
  m.impl("add_linear_", add_linear_composite);
}

#ifdef SPECULANT_CUDA_KERNELS
TORCH_LIBRARY_IMPL(speculant, CUDA, m) {
  m.impl("linear", linear_cuda);
  m.impl("add_linear_", add_linear_cuda);
}
#endif

}  // namespace speculant::kernels
