#include "math/sampling.h"

#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "math/cpu_kernels.h"
#include "errors.h"

namespace speculant {

void SamplingConfig::validate() const {
  require(std::isfinite(temperature) && temperature >= 0.0,
          "temperature must be a finite number >= 0 (0 selects argmax), got {}", temperature);
  require(top_k >= 0, "top_k must be >= 0 (0 turns it off), got {}", top_k);
  require(std::isfinite(top_p) && top_p > 0.0 && top_p <= 1.0,
          "top_p must be in (0, 1] (1 turns it off), got {}", top_p);
  require(std::isfinite(lenience) && lenience > 0.0 && lenience <= 1.0,
          "lenience must be in (0, 1] (1 is exact), got {}", lenience);
  require(verification == Verification::token || lenience == 1.0,
          "lenience must be 1 with verification='block' (A.5's bound is proven for the token rule), got {}", lenience);
}

namespace {

void check_matrix(const at::Tensor& t, const char* what) {
  require(t.dim() == 2, "{} must be a 2-D tensor [n, vocab], got {} dimensions", what, t.dim());
  require(at::isFloatingType(t.scalar_type()), "{} must be a floating-point tensor, got {}", what,
          std::string(c10::toString(t.scalar_type())));
  require(t.size(1) > 0, "{} must have a non-empty vocabulary dimension", what);
}

at::ScalarType working_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

at::Tensor standardize(const at::Tensor& logits, const SamplingConfig& config, at::Tensor* maxima) {
  check_matrix(logits, "logits");
  if (!cpu::runs_on_host(logits)) return standardize_as_tensors(logits, config, maxima);
  if (maxima) *maxima = row_maxima(logits);
  return cpu::standardize(logits, config, nullptr);
}

at::Tensor standardize_as_tensors(const at::Tensor& logits, const SamplingConfig& config, at::Tensor* maxima) {
  check_matrix(logits, "logits");
  const auto vocab = logits.size(1);
  at::Tensor x = logits.to(working_type(logits));  // [n, V]
  if (config.greedy()) {
    if (maxima) *maxima = row_maxima(x);
    return at::one_hot(x.argmax(-1), vocab).to(x.scalar_type());
  }
  // Shifting by the row maximum leaves the law unchanged and keeps (x - max) / T finite for T < 1 (a tiny T
  // would otherwise overflow to inf and give NaN); for T >= 1, x / T is no larger than x, and softmax shifts
  // by its own maximum: one operation fewer per call (each is a kernel launch on a GPU).
  if (config.temperature < 1.0) {
    const at::Tensor top = at::amax(x, -1, /*keepdim=*/true);  // [n, 1] (amax propagates NaN)
    if (maxima) *maxima = top.squeeze(-1);
    x = (x - top) / config.temperature;
  } else {
    if (maxima) *maxima = at::amax(x, -1);
    if (config.temperature != 1.0) x = x / config.temperature;
  }
  if (config.top_k > 0 && config.top_k < vocab) {
    at::Tensor kth = std::get<0>(x.topk(config.top_k, -1)).narrow(-1, config.top_k - 1, 1);  // [n, 1]
    x = x.masked_fill(x < kth, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(x, -1);  // [n, V]
  if (config.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);  // [n, V] each
    at::Tensor mass_before = sorted.cumsum(-1) - sorted;  // mass of the more probable tokens
    at::Tensor keep = at::zeros_like(probs, probs.options().dtype(at::kBool))
                          .scatter(-1, order, mass_before.to(at::kDouble) < config.top_p);  // [n, V]
    probs = probs.masked_fill(keep.logical_not(), 0.0);
    probs = probs / probs.sum(-1, /*keepdim=*/true);
  }
  return probs;
}

at::Tensor row_maxima(const at::Tensor& logits) {
  return at::amax(logits, -1).to(working_type(logits));  // amax propagates NaN; float64 stays float64
}

void check_finite(const at::Tensor& logits, const char* what) {
  require(at::isfinite(row_maxima(logits)).all().item<bool>(),
          "{} contain NaN or +inf, or a row that is entirely -inf", what);
}

at::Tensor sample_as_tensors(const at::Tensor& probs, at::Generator& generator) {
  check_matrix(probs, "probs");
  return sample_inverse_cdf(probs, at::rand({probs.size(0), 1}, generator, probs.options().dtype(at::kDouble)));
}

at::Tensor sample_inverse_cdf(const at::Tensor& probs, const at::Tensor& uniforms) {
  return sample_inverse_cdf_scaled(probs, uniforms.to(at::kDouble) * kBelowOne);
}

at::Tensor sample_inverse_cdf_scaled(const at::Tensor& probs, const at::Tensor& scaled, at::Tensor* mass) {
  check_matrix(probs, "probs");
  at::Tensor cdf = probs.to(at::kDouble).cumsum(-1);                          // [n, V], unnormalized
  at::Tensor total = cdf.narrow(-1, cdf.size(1) - 1, 1);                     // [n, 1]
  if (mass) *mass = total;
  at::Tensor target = scaled.to(at::kDouble) * total;                         // [n, m]
  // First cdf > target (right side): a zero-probability token has the cdf of its predecessor and is never
  // that first one. The clamp guards memory for a zero-mass or NaN row, which callers exclude (sampling.h) but
  // only learn of at their next read-back.
  return at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(-1).clamp_max(cdf.size(1) - 1);
}

at::Tensor scaled_uniforms(at::IntArrayRef shape, at::Generator& generator, const at::Device& device) {
  return at::empty(shape, at::TensorOptions(device).dtype(at::kDouble)).uniform_(0.0, kBelowOne, generator);
}

at::Tensor sample(const at::Tensor& probs, at::Generator& generator) {
  check_matrix(probs, "probs");
  return cpu::runs_on_host(probs) ? cpu::sample(probs, generator) : sample_as_tensors(probs, generator);
}

at::Generator make_generator(const at::Device& device, uint64_t seed) {
  at::Generator generator = device.is_cpu()
      ? at::make_generator<at::CPUGeneratorImpl>(seed)
      : at::globalContext().getAcceleratorHooksInterface(device.type()).getNewGenerator(device.index());
  generator.set_current_seed(seed);
  return generator;
}

}  // namespace speculant
