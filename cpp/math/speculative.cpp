#include "math/speculative.h"

#include <cmath>
#include <limits>
#include <utility>

#include "errors.h"

namespace speculant {

at::Tensor acceptance_probability(const at::Tensor& p_x, const at::Tensor& q_x, double lenience) {
  // In float64 whatever the inputs (l q can underflow in float16 or float32; p_x is promoted in the division).
  // Where l q is 0 the quotient is +inf for p(x) > 0, clamped to 1, and NaN for p(x) = 0, made 0: five tensor
  // operations (each a kernel launch on a GPU), where testing l q > 0 and p > 0 took nine.
  const at::Tensor q = q_x.to(at::kDouble);
  const at::Tensor ratio = at::div(p_x, lenience < 1.0 ? q * lenience : q).nan_to_num(0.0).clamp_max(1.0);
  return ratio.to(p_x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
}

double expected_kept(const std::vector<double>& ratios, double lenience, bool block) {
  double kept = 0.0, r = 1.0;
  for (const double ratio : ratios) {
    // r = 0 stays 0: a prefix the rule cannot keep is not revived by a later ratio of +inf (0 * inf)
    r = r == 0.0 ? 0.0 : block ? std::min(1.0, r * ratio) : r * std::min(1.0, ratio / lenience);
    kept += r;
  }
  return kept;
}

at::Tensor beta(const at::Tensor& p, const at::Tensor& q) { return at::minimum(p, q).sum(-1); }

ResidualParts residual_parts(const at::Tensor& p, const at::Tensor& q) {
  ResidualParts out;
  out.excess = p - q;                                       // [..., V]
  out.positive = out.excess.clamp_min(0.0);                 // [..., V]
  out.mass = out.positive.sum(-1, /*keepdim=*/true);        // [..., 1] = 1 - beta (A.1)
  return out;
}

void to_residual(at::Tensor& p, const ResidualParts& parts) {
  at::where_out(p, parts.mass > 0, parts.positive / parts.mass, p);
}

at::Tensor residual(const at::Tensor& p, const at::Tensor& q) {
  const ResidualParts parts = residual_parts(p, q);
  // positive <= mass elementwise, so the quotient stays in [0, 1] even for a subnormal mass.
  return at::where(parts.mass > 0, parts.positive / parts.mass.clamp_min(std::numeric_limits<double>::min()), p);
}

namespace {

// p_i(x_i) and q_i(x_i) [..., gamma] for the draft tokens [..., gamma], in p's and q's own types.
std::pair<at::Tensor, at::Tensor> at_drafts(const at::Tensor& p, const at::Tensor& q, const at::Tensor& index) {
  const int64_t gamma = index.size(-2);
  return {p.narrow(-2, 0, gamma).gather(-1, index).squeeze(-1), q.gather(-1, index).squeeze(-1)};
}

}  // namespace

at::Tensor lenient_argmax(const at::Tensor& target_logits, const at::Tensor& index, double lenience,
                          at::ScalarType type) {
  // on the raw distribution: p(x) >= l max p  <=>  logit(x) - max logit >= log l
  at::Tensor raw = target_logits.narrow(-2, 0, index.size(-2)).to(type);              // [..., gamma, V]
  return raw.gather(-1, index).squeeze(-1) - at::amax(raw, -1) >= std::log(lenience);  // [..., gamma]
}

at::Tensor accept_probabilities(const at::Tensor& p, const at::Tensor& q, const at::Tensor& draft_tokens,
                                const at::Tensor& target_logits, const SamplingConfig& config) {
  const at::Tensor index = draft_tokens.unsqueeze(-1);  // [..., gamma, 1]
  const auto [p_x, q_x] = at_drafts(p, q, index);
  at::Tensor accept = acceptance_probability(p_x, q_x.to(p.scalar_type()), config.lenience);  // [..., gamma]
  if (config.greedy() && config.lenience < 1.0) {
    accept = at::maximum(accept, lenient_argmax(target_logits, index, config.lenience, p.scalar_type())
                                          .to(accept.scalar_type()));
  }
  return accept;
}

Verification verify(const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens,
                    const SamplingConfig& config) {
  const int64_t gamma = draft_tokens.numel();
  require(target_logits.dim() == 2 && target_logits.size(0) == gamma + 1,
          "target_logits must be [gamma + 1, vocab] = [{}, vocab], got [{}]", gamma + 1,
          fmt::join(target_logits.sizes(), ", "));
  require(q.dim() == 2 && q.size(0) == gamma && q.size(1) == target_logits.size(1),
          "q must be [gamma, vocab] = [{}, {}], got [{}]", gamma, target_logits.size(1),
          fmt::join(q.sizes(), ", "));
  require(draft_tokens.scalar_type() == at::kLong && draft_tokens.dim() == 1,
          "draft_tokens must be a 1-D int64 tensor");
  const int64_t vocab = target_logits.size(1);
  require(gamma == 0 || (draft_tokens.min().item<int64_t>() >= 0 && draft_tokens.max().item<int64_t>() < vocab),
          "draft_tokens must be token ids in [0, {}) (the vocabulary of the logits)", vocab);
  Verification out;
  out.p = standardize(target_logits, config);
  out.accept_prob = accept_probabilities(out.p, q, draft_tokens, target_logits, config);
  at::Tensor q_padded = at::cat({q.to(out.p.scalar_type()), at::zeros_like(out.p.narrow(0, 0, 1))});  // [gamma+1, V]
  out.next_dist = residual(out.p, q_padded);
  return out;
}

}  // namespace speculant
