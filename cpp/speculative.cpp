#include "speculative.h"

#include <cmath>
#include <limits>

#include "errors.h"

namespace speculant {

at::Tensor acceptance_probability(const at::Tensor& p_x, const at::Tensor& q_x, double lenience) {
  // In float64 whatever the inputs (l q can underflow in float16 or float32); where l q is 0 the ratio is
  // 1 for p(x) > 0 and 0 for p(x) = 0.
  const at::Tensor p = p_x.to(at::kDouble), denominator = q_x.to(at::kDouble) * lenience;
  const at::Tensor ratio = at::where(denominator > 0, p / denominator, (p > 0).to(at::kDouble)).clamp_max(1.0);
  return ratio.to(p_x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
}

at::Tensor residual(const at::Tensor& p, const at::Tensor& q) {
  at::Tensor excess = (p - q).clamp_min(0.0);          // [..., V]
  at::Tensor mass = excess.sum(-1, /*keepdim=*/true);  // [..., 1] = 1 - beta (A.1)
  // excess <= mass elementwise, so the quotient stays in [0, 1] even for a subnormal mass.
  return at::where(mass > 0, excess / mass.clamp_min(std::numeric_limits<double>::min()), p);
}

at::Tensor accept_probabilities(const at::Tensor& p, const at::Tensor& q, const at::Tensor& draft_tokens,
                                const at::Tensor& target_logits, const SamplingConfig& config) {
  const int64_t gamma = draft_tokens.size(-1);
  at::Tensor index = draft_tokens.unsqueeze(-1);                                        // [..., gamma, 1]
  at::Tensor p_x = p.narrow(-2, 0, gamma).gather(-1, index).squeeze(-1);               // [..., gamma]
  at::Tensor q_x = q.gather(-1, index).squeeze(-1).to(p.scalar_type());                // [..., gamma]
  at::Tensor accept = acceptance_probability(p_x, q_x, config.lenience);               // [..., gamma]
  if (config.greedy() && config.lenience < 1.0) {
    // A.5, argmax variant, on the raw distribution: p(x) >= l max p  <=>  logit(x) - max logit >= log l.
    at::Tensor raw = target_logits.narrow(-2, 0, gamma).to(p.scalar_type());           // [..., gamma, V]
    at::Tensor margin = raw.gather(-1, index).squeeze(-1) - at::amax(raw, -1);          // [..., gamma]
    accept = at::maximum(accept, (margin >= std::log(config.lenience)).to(accept.scalar_type()));
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
