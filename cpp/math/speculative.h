// Speculative sampling (§2.3, Appendix A.1), the verification step of Algorithm 1, and lenience (A.5).
//
// To sample x ~ p we sample x ~ q, keep it with probability min(1, p(x) / q(x)), and otherwise sample
// from the residual p' = norm(max(0, p - q)). The output is distributed exactly as p (A.1).
//
// Lenience l in (0, 1] (A.5) compares p(x) with l * q(x) instead: x is kept with probability
// min(1, p(x) / (l q(x))). We keep the exact residual norm(max(0, p - q)). With it,
//   P(x) = min(q(x), p(x)/l) + (1 - alpha_l) * max(0, p(x) - q(x)) / (1 - alpha)   where
//   alpha_l = sum min(q, p/l) >= alpha = sum min(p, q),
// so tokens with q(x) >= p(x) get at most p(x)/l and the others at most p(x): no token is ever sampled with
// probability above p(x)/l, the guarantee A.5 states, and l = 1 is the exact algorithm. The alternative
// norm(max(0, p - l q)) would put residual mass on tokens that acceptance already over-samples and loses
// that bound.
//
// With temperature 0 (argmax), p and q are one-hot and the same formulas give exact argmax agreement. The
// lenient argmax variant of A.5 accepts draft token x when softmax(logits)(x) >= l * max softmax(logits)
// (the paper prints the inequality reversed); the emitted token is then argmax p as usual.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <vector>

#include "math/sampling.h"

namespace speculant {

// The rules once per form: on the host, one token (or one row) at a time, for the CPU kernels and for the host's
// part of the accelerators' verification (tree_verification.cpp); as tensors below them.

// p(x) / (l q(x)), the ratio the test min(1, .) reads: 0 where p(x) = 0 (or NaN: callers check finiteness
// themselves), +inf where l q(x) = 0 < p(x).
inline double acceptance_ratio(double p_x, double q_x, double lenience) {
  if (!(p_x > 0)) return 0.0;
  const double scaled = q_x * lenience;
  return scaled > 0 ? p_x / scaled : std::numeric_limits<double>::infinity();
}

// min(1, p(x) / (l q(x))) for one token: acceptance_probability() on the host.
inline double acceptance(double p_x, double q_x, double lenience) {
  return std::min(1.0, acceptance_ratio(p_x, q_x, lenience));
}

// The drafts a chain's rule keeps in expectation given the ratios p_i(x_i) / q_i(x_i) at its positions, without its
// coins: sum_i P(n >= i | x_1 .. x_i). Algorithm 1 keeps position i with prod_(j <= i) min(1, ratio_j / l); the block
// rule (tree.h) with r_i = min(1, r_(i-1) ratio_i), the lemma P(x_1..i drafted, tau >= i) = q(x_1..i) r_i. Averaged
// over iterations it estimates the rule's E[n] from the drafts alone (its coins integrated out), for the rule that ran
// and for the other one on the same drafts.
double expected_kept(const std::vector<double>& ratios, double lenience, bool block);

// Theorem 3.5's beta = sum_x min(p(x), q(x)), once per form: one row of V on the host (summed in float64), and
// over the last dimension of p, q [..., V] as tensors.
template <typename T>
double beta(const T* p, const T* q, int64_t vocab) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < vocab; ++v) sum += std::min(p[v], q[v]);
  return sum;
}
at::Tensor beta(const at::Tensor& p, const at::Tensor& q);

// max(0, p(x) - q(x)) in float64, the difference taken in the operands' type.
template <typename T>
double excess(T p_x, T q_x) {
  return std::max(0.0, static_cast<double>(p_x - q_x));
}

// The residual's mass sum_x max(0, p - q) = 1 - beta (A.1) over one row of V.
template <typename T>
double residual_mass(const T* p, const T* q, int64_t vocab) {
  double mass = 0.0;
#pragma omp simd reduction(+ : mass)
  for (int64_t v = 0; v < vocab; ++v) mass += excess(p[v], q[v]);
  return mass;
}

// One token's probability under residual(p, q), whose mass is `mass`: p(x) itself where that is 0.
inline double residual_at(double p_x, double q_x, double mass) { return mass > 0 ? excess(p_x, q_x) / mass : p_x; }

// Elementwise min(1, p(x) / (l q(x))): 0 where p(x) = 0, 1 where q(x) = 0 < p(x) (and 0 for a NaN p(x): callers
// check the logits' finiteness themselves).
at::Tensor acceptance_probability(const at::Tensor& p_x, const at::Tensor& q_x, double lenience);

// p, q [..., V] -> norm(max(0, p - q)) [..., V]. A row whose residual mass is zero (p == q there) returns p
// itself: a rejection is then an event of probability zero, and p keeps the row a valid distribution.
at::Tensor residual(const at::Tensor& p, const at::Tensor& q);

// residual()'s parts for p, q [..., V]: the excess p - q, its positive part, and the rows' mass [..., 1] = 1 - beta.
// to_residual() then turns p into residual(p, q) in place (the verifications' tensor path: no new tensor).
struct ResidualParts {
  at::Tensor excess, positive, mass;
};
ResidualParts residual_parts(const at::Tensor& p, const at::Tensor& q);
void to_residual(at::Tensor& p, const ResidualParts& parts);

// Algorithm 1's acceptance test for the gamma draft tokens. p [..., gamma + 1, V] and q [..., gamma, V]
// standardized, draft_tokens int64 [..., gamma], target_logits [..., gamma + 1, V] (read only by the
// argmax-lenience variant); leading dimensions are rows of a batch. Returns [..., gamma]: P(draft token i is
// accepted | the tokens before it were accepted).
at::Tensor accept_probabilities(const at::Tensor& p, const at::Tensor& q, const at::Tensor& draft_tokens,
                                const at::Tensor& target_logits, const SamplingConfig& config);

// A.5's argmax variant of the test (temperature 0, lenience l < 1): bool [..., gamma], whether each draft token x
// has p(x) >= l max p under the raw target distribution. target_logits [..., gamma + 1, V], index int64
// [..., gamma, 1]; computed in `type`.
at::Tensor lenient_argmax(const at::Tensor& target_logits, const at::Tensor& index, double lenience,
                          at::ScalarType type);

// The token after n acceptances is drawn from residual(p_{n+1}, q_{n+1}) with q_{gamma+1} = 0: since
// residual(p, 0) = p, the bonus token needs no special case. Callers keep q as [gamma + 1, V] with a zero
// last row ("padded").

// Everything about one iteration of Algorithm 1 once both models have run, for all n at once (tests and
// analysis; the decoder's host walk evaluates only the nodes it reaches, its tensor path every node:
// tree_verification.cpp).
struct Verification {
  at::Tensor p;            // [gamma + 1, V] standardized target distributions p_1 .. p_{gamma+1}
  at::Tensor accept_prob;  // [gamma]
  at::Tensor next_dist;    // [gamma + 1, V] row n: law of the emitted token after n acceptances:
                           //   residual(p_{n+1}, q_{n+1}) for n < gamma, p_{gamma+1} for n = gamma
};

// target_logits [gamma + 1, V], q [gamma, V] (the draft's standardized distributions, the ones the draft
// tokens were sampled from), draft_tokens int64 [gamma]. gamma may be 0 (plain decoding).
Verification verify(const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens,
                    const SamplingConfig& config);

}  // namespace speculant
