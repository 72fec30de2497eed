// Standardized sampling (Leviathan, Kalman & Matias 2023, §2.2).
//
// Notation (the paper's, used throughout speculant): p = target model M_p, q = draft model M_q,
// gamma = draft length, beta / alpha = acceptance, l = lenience, c = cost coefficient.
//
// Every sampling method is cast into plain sampling from an adjusted distribution: logits go through
// temperature, top-k and top-p and come out as probabilities. One SamplingConfig produces both p and q,
// so target and draft can never be standardized differently.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>

namespace speculant {

struct SamplingConfig {
  // 0 selects argmax, an explicit mode (no sentinel arithmetic); otherwise logits are divided by it.
  double temperature = 1.0;
  // 0 = off; otherwise keep the k largest logits (and every logit tied with the k-th).
  int64_t top_k = 0;
  // 1 = off; otherwise keep the smallest set of most probable tokens whose mass reaches top_p.
  double top_p = 1.0;
  // A.5: l in (0, 1]; 1 is the exact algorithm.
  double lenience = 1.0;
  // How a chain's drafts are verified: token by token (Algorithm 1), or as a block (Sun et al., ICLR 2025: tree.h),
  // which keeps at least as many in expectation. Temperature 0 verifies both alike; a block takes lenience 1.
  enum class Verification { token, block };
  Verification verification = Verification::token;

  bool greedy() const { return temperature == 0.0; }
  // A chain is verified as a block: sampled (at temperature 0 the block's verdicts are the token rule's).
  bool block() const { return verification == Verification::block && !greedy(); }
  // Throws ValueError naming the first parameter outside its allowed range.
  void validate() const;
};

// logits [n, V] (float16/bfloat16/float32/float64) -> probabilities [n, V], float64 if the logits are
// float64, else float32. Order: temperature, top-k, top-p, renormalize. Greedy: one-hot at the argmax
// (first index on ties). Does not check finiteness; when `maxima` is given it receives row_maxima(logits),
// which standardize computes anyway, so that callers can check finiteness without a second reduction.
// CPU logits run the host kernel of cpu_kernels.h; standardize_as_tensors is the tensor-op implementation that
// accelerators run, exposed so that tests check it too.
at::Tensor standardize(const at::Tensor& logits, const SamplingConfig& config, at::Tensor* maxima = nullptr);
at::Tensor standardize_as_tensors(const at::Tensor& logits, const SamplingConfig& config, at::Tensor* maxima = nullptr);

// logits [n, V] -> row maxima [n] (float64 for float64 logits, else float32), which are finite exactly when a row has no NaN and no +inf and is
// not entirely -inf (-inf alone is a masked token and is allowed). One reduction per call, no host sync: the
// decoding loop checks the maxima of all its calls at once, with the iteration's one transfer.
at::Tensor row_maxima(const at::Tensor& logits);

// Throws ValueError (naming `what`) unless every row maximum is finite. Syncs: for use outside the loop.
void check_finite(const at::Tensor& logits, const char* what);

// One token per row of probs [n, V] (rows need not be normalized, but must have positive mass) ->
// int64 [n], by inverse CDF in float64 with one uniform per row from `generator`. A zero-probability
// token is never returned.
at::Tensor sample(const at::Tensor& probs, at::Generator& generator);
// The tensor path (tensor operations on any device; what accelerators run). sample() takes the host kernel of
// cpu_kernels.h on CPU, with the same law; this one is exposed so that tests check it too.
at::Tensor sample_as_tensors(const at::Tensor& probs, at::Generator& generator);
// What sample_as_tensors does with its uniforms: uniforms float64 [n, m] in [0, 1), drawn by the caller; m draws
// from each row: int64 [n] for m = 1, else [n, m].
at::Tensor sample_inverse_cdf(const at::Tensor& probs, const at::Tensor& uniforms);
// The same with the uniforms already multiplied by kBelowOne (a caller that draws several at once scales them in
// one operation, not one per call); `mass`, when given, receives each row's total mass [n, 1] in float64, which
// is finite exactly when the row is (softmax rows are NaN for non-finite logits): a finiteness check for free.
at::Tensor sample_inverse_cdf_scaled(const at::Tensor& probs, const at::Tensor& scaled, at::Tensor* mass = nullptr);

// Inverse-CDF sampling draws the first token whose cumulative mass exceeds u * total * kBelowOne, u in [0, 1):
// the largest double strictly below 1, so the target stays below the total even after rounding.
inline constexpr double kBelowOne = 1.0 - 4 * std::numeric_limits<double>::epsilon();

// Uniforms times kBelowOne, float64 of `shape` on `device`, in one operation: uniform on [0, kBelowOne), which
// is rand()'s draw times kBelowOne (the same arithmetic), for sample_inverse_cdf_scaled.
at::Tensor scaled_uniforms(at::IntArrayRef shape, at::Generator& generator, const at::Device& device);

// A generator on `device` seeded with `seed` (CPU or an accelerator, through ATen's hooks).
at::Generator make_generator(const at::Device& device, uint64_t seed);

}  // namespace speculant
