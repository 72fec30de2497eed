#include "step.h"

#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"
#include "speculative.h"

namespace speculant {
namespace {

bool all_finite(const at::Tensor& maxima) {  // a CPU tensor, read on the host
  if (!maxima.defined()) return true;
  const at::Tensor values = maxima.to(at::kDouble).contiguous();
  const double* data = values.const_data_ptr<double>();
  return std::all_of(data, data + values.numel(), [](double m) { return std::isfinite(m); });
}

at::Tensor scalar_token(int64_t token) {
  at::Tensor out = at::empty({1}, at::TensorOptions().dtype(at::kLong));
  *out.mutable_data_ptr<int64_t>() = token;
  return out;
}

}  // namespace

DraftDraw draft_step_generic(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  DraftDraw out;
  out.q = standardize_generic(logits, config, &out.maximum);  // [1, V]
  out.token = config.greedy() ? out.q.argmax(-1) : sample(out.q, generator);  // [1]
  return out;
}

DraftDraw draft_step(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  if (!logits.is_cpu()) return draft_step_generic(logits, config, generator);
  DraftDraw out;
  std::vector<uint8_t> finite;
  out.q = cpu::standardize(logits, config, &finite);  // [1, V]
  out.finite = finite[0] != 0;
  cpu::GeneratorUniform uniform(generator);
  out.token = scalar_token(cpu::draw(out.q, 0, config.greedy(), [&uniform] { return uniform(); }));
  return out;
}

Verdict verify_step_generic(const at::Tensor& target_logits, const at::Tensor& q_in, const at::Tensor& drafted_in,
                            const at::Tensor& draft_maxima, bool draft_finite, const SamplingConfig& config,
                            at::Generator& generator) {
  const int64_t gamma = drafted_in.defined() ? drafted_in.numel() : 0;
  const auto long_options = target_logits.options().dtype(at::kLong);
  at::Tensor drafted = gamma > 0 ? drafted_in : at::empty({0}, long_options);     // [gamma]
  at::Tensor target_maxima;
  at::Tensor p = standardize_generic(target_logits, config, &target_maxima);      // [gamma + 1, V]
  at::Tensor q = gamma > 0 ? q_in.to(p.scalar_type()) : p.narrow(0, 0, 0);        // [gamma, V]
  at::Tensor q_padded = at::constant_pad_nd(q, {0, 0, 0, 1});                     // [gamma + 1, V], q_{gamma+1} = 0
  at::Tensor accept_prob = accept_probabilities(p, q, drafted, target_logits, config);  // [gamma]

  // n = min({i - 1 | r_i > p_i(x) / q_i(x)} U {gamma}), then t ~ residual(p_{n+1}, q_{n+1}).
  at::Tensor r = at::rand({gamma}, generator, accept_prob.options());              // [gamma]
  at::Tensor n = (r < accept_prob).to(at::kLong).cumprod(0).sum().view({1});      // [1] leading acceptances
  at::Tensor dist = residual(p.index_select(0, n), q_padded.index_select(0, n));  // [1, V]
  at::Tensor t = config.greedy() ? dist.argmax(-1) : sample(dist, generator);     // [1]
  at::Tensor beta = at::minimum(p.narrow(0, 0, gamma), q).sum(-1);                // [gamma]
  at::Tensor maxima = draft_maxima.defined() ? at::cat({draft_maxima, target_maxima}) : target_maxima;
  at::Tensor bad = at::isfinite(maxima).all().logical_not().view({1});            // [1]

  // The iteration's one device -> host transfer, in float64 (token ids are exact there up to 2^53):
  // [n, bad, x_1 .. x_gamma, t, beta_1 .. beta_gamma].
  at::Tensor host = at::cat({n.to(at::kDouble), bad.to(at::kDouble), drafted.to(at::kDouble), t.to(at::kDouble),
                             beta.to(at::kDouble)}).cpu();
  const double* h = host.const_data_ptr<double>();
  Verdict out;
  out.accepted = static_cast<int64_t>(h[0]);
  out.finite = draft_finite && h[1] == 0;
  for (int64_t i = 0; i < gamma; ++i) out.drafted.push_back(static_cast<int64_t>(h[2 + i]));
  out.host_token = static_cast<int64_t>(h[2 + gamma]);
  out.token = t;
  out.betas.assign(h + 3 + gamma, h + 3 + gamma + std::min(out.accepted + 1, gamma));
  return out;
}

Verdict verify_step(const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& drafted,
                    const at::Tensor& draft_maxima, bool draft_finite, const SamplingConfig& config,
                    at::Generator& generator) {
  if (!target_logits.is_cpu()) {
    return verify_step_generic(target_logits, q, drafted, draft_maxima, draft_finite, config, generator);
  }
  const int64_t gamma = drafted.defined() ? drafted.numel() : 0;
  Verdict out;
  const at::Tensor drafted_host = gamma > 0 ? drafted.contiguous() : at::Tensor();
  const int64_t* x = gamma > 0 ? drafted_host.const_data_ptr<int64_t>() : nullptr;
  out.drafted.assign(x, x + gamma);
  const at::Tensor q_rows = gamma > 0 ? q : at::Tensor(at::empty({0, target_logits.size(1)}));  // plain decoding
  cpu::GeneratorUniform uniform(generator);
  cpu::Verdict v = cpu::verify(target_logits, q_rows, x, config, [&uniform] { return uniform(); });
  out.accepted = v.accepted;
  out.host_token = v.token;
  out.token = scalar_token(v.token);
  out.betas = std::move(v.betas);
  out.finite = v.finite && draft_finite && all_finite(draft_maxima);
  return out;
}

}  // namespace speculant
