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
  if (!cpu::host_kernels(logits)) return draft_step_generic(logits, config, generator);
  DraftDraw out;
  std::vector<uint8_t> finite;
  out.q = cpu::standardize(logits, config, &finite);  // [1, V]
  out.finite = finite[0] != 0;
  cpu::GeneratorUniform uniform(generator);
  out.token = scalar_token(cpu::draw(out.q, 0, config.greedy(), [&uniform] { return uniform(); }));
  return out;
}

std::vector<Verdict> verify_rows_generic(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                         const std::vector<at::Generator*>& generators) {
  const auto count = static_cast<int64_t>(rows.size());
  if (count == 0) return {};
  std::vector<int64_t> gammas(count);
  int64_t g = 0;  // G: the longest draft
  for (int64_t i = 0; i < count; ++i) {
    gammas[i] = rows[i].drafted.defined() ? rows[i].drafted.numel() : 0;
    g = std::max(g, gammas[i]);
  }
  const at::Tensor& first = rows.front().target_logits;
  const int64_t vocab = first.size(1);
  const auto long_options = first.options().dtype(at::kLong);
  const auto work = first.options().dtype(first.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  // Every row padded to G drafts: logits with rows of zeros, q with zero rows, tokens 0 (never accepted below).
  std::vector<at::Tensor> logits(count), qs(count), tokens(count), uniforms(count), draws(count), draft_bad(count);
  for (int64_t i = 0; i < count; ++i) {
    const VerifyInput& row = rows[i];
    const int64_t pad = g - gammas[i];
    logits[i] = at::constant_pad_nd(row.target_logits, {0, 0, 0, pad}, 0.0);                      // [G + 1, V]
    qs[i] = gammas[i] > 0 ? at::constant_pad_nd(row.q.to(work.dtype()), {0, 0, 0, pad + 1}, 0.0)  // [G + 1, V]
                          : at::zeros({g + 1, vocab}, work);
    tokens[i] = gammas[i] > 0 ? at::constant_pad_nd(row.drafted, {0, pad}, 0) : at::zeros({g}, long_options);
    at::Generator& generator = *generators[i];
    // The row's draws in verify order: one uniform per draft token, then (sampling) the residual's uniform.
    const at::Tensor r = at::rand({gammas[i]}, generator, work);
    uniforms[i] = at::constant_pad_nd(r.to(at::kDouble), {0, pad}, 2.0);  // [G]: a padded draft fails r < 1
    if (!config.greedy()) draws[i] = at::rand({1, 1}, generator, first.options().dtype(at::kDouble));
    draft_bad[i] = row.draft_maxima.defined() && row.draft_maxima.numel() > 0
                       ? at::isfinite(row.draft_maxima).all().logical_not()
                       : at::zeros({}, first.options().dtype(at::kBool));
  }
  at::Tensor target_logits = at::stack(logits);                                          // [R, G + 1, V]
  at::Tensor target_maxima;
  at::Tensor p = standardize_generic(target_logits.view({count * (g + 1), vocab}), config, &target_maxima)
                     .view({count, g + 1, vocab});                                       // [R, G + 1, V]
  at::Tensor q_padded = at::stack(qs);                                                   // [R, G + 1, V], q_{G+1} = 0
  at::Tensor q = q_padded.narrow(1, 0, g);                                               // [R, G, V]
  at::Tensor drafted = at::stack(tokens);                                                // [R, G]
  at::Tensor accept_prob = accept_probabilities(p, q, drafted, target_logits, config);  // [R, G]

  // n = min({i - 1 | r_i > p_i(x) / q_i(x)} U {gamma}), then t ~ residual(p_{n+1}, q_{n+1}).
  at::Tensor accepted = at::stack(uniforms) < accept_prob.to(at::kDouble);               // [R, G]
  at::Tensor n = accepted.to(at::kLong).cumprod(1).sum(1);                               // [R]
  at::Tensor at_n = n.view({count, 1, 1}).expand({count, 1, vocab});
  at::Tensor dist = residual(p.gather(1, at_n).squeeze(1), q_padded.gather(1, at_n).squeeze(1));  // [R, V]
  at::Tensor t = config.greedy() ? dist.argmax(-1) : sample_inverse_cdf(dist, at::cat(draws));  // [R]
  at::Tensor beta = at::minimum(p.narrow(1, 0, g), q).sum(-1);                          // [R, G]
  at::Tensor bad = at::isfinite(target_maxima.view({count, g + 1})).all(1).logical_not()
                       .logical_or(at::stack(draft_bad));                                // [R]

  // The batch's one device -> host transfer, in float64 (token ids are exact there up to 2^53), row i:
  // [n, bad, x_1 .. x_G, t, beta_1 .. beta_G].
  at::Tensor host = at::cat({n.to(at::kDouble).unsqueeze(1), bad.to(at::kDouble).unsqueeze(1),
                             drafted.to(at::kDouble), t.to(at::kDouble).unsqueeze(1), beta.to(at::kDouble)},
                            1).cpu();                                                    // [R, 2 G + 3]
  const double* h = host.const_data_ptr<double>();
  std::vector<Verdict> out(count);
  for (int64_t i = 0; i < count; ++i, h += 2 * g + 3) {
    Verdict& v = out[i];
    const int64_t gamma = gammas[i];
    v.accepted = static_cast<int64_t>(h[0]);
    v.finite = rows[i].draft_finite && h[1] == 0;
    for (int64_t j = 0; j < gamma; ++j) v.drafted.push_back(static_cast<int64_t>(h[2 + j]));
    v.host_token = static_cast<int64_t>(h[2 + g]);
    v.token = t.narrow(0, i, 1);
    v.betas.assign(h + 3 + g, h + 3 + g + std::min(v.accepted + 1, gamma));
  }
  return out;
}

std::vector<Verdict> verify_rows(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                 const std::vector<at::Generator*>& generators) {
  if (rows.empty() || !cpu::host_kernels(rows.front().target_logits)) return verify_rows_generic(rows, config, generators);
  std::vector<Verdict> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const VerifyInput& row = rows[i];
    const int64_t gamma = row.drafted.defined() ? row.drafted.numel() : 0;
    Verdict& v = out[i];
    const at::Tensor drafted_host = gamma > 0 ? row.drafted.contiguous() : at::Tensor();
    const int64_t* x = gamma > 0 ? drafted_host.const_data_ptr<int64_t>() : nullptr;
    v.drafted.assign(x, x + gamma);
    const at::Tensor q_rows = gamma > 0 ? row.q : at::empty({0, row.target_logits.size(1)});  // plain decoding
    cpu::GeneratorUniform uniform(*generators[i]);
    cpu::Verdict cv = cpu::verify(row.target_logits, q_rows, x, config, [&uniform] { return uniform(); });
    v.accepted = cv.accepted;
    v.host_token = cv.token;
    v.token = scalar_token(cv.token);
    v.betas = std::move(cv.betas);
    v.finite = cv.finite && row.draft_finite && all_finite(row.draft_maxima);
  }
  return out;
}

}  // namespace speculant
