#include "step.h"

#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"
#include "join.h"
#include "speculative.h"

namespace speculant {
namespace {

at::Tensor scalar_token(int64_t token) {
  at::Tensor out = at::empty({1}, at::TensorOptions().dtype(at::kLong));
  *out.mutable_data_ptr<int64_t>() = token;
  return out;
}

}  // namespace

std::vector<DraftDraw> draft_steps_generic(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                           const std::vector<at::Generator*>& generators,
                                           const std::vector<at::Tensor>& scaled, DraftBatch* batch) {
  if (logits.empty()) return {};
  at::Tensor maxima;  // each row's finiteness witness: its raw maximum, or (sampling at T >= 1) its mass
  const at::Tensor rows = joined(logits);  // [R, V]
  // at T >= 1 standardizing needs no row maximum, and the draw's mass tells as well whether the row is finite
  const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
  const at::Tensor q = standardize_generic(rows, config, witness_is_mass ? nullptr : &maxima);
  at::Tensor tokens;  // [R]
  if (config.greedy()) {
    tokens = q.argmax(-1);
  } else {  // row r's one uniform, given or from its own generator (as sample() draws it alone)
    std::vector<at::Tensor> u = scaled;
    if (u.empty()) {
      for (at::Generator* generator : generators) {
        u.push_back(scaled_uniforms({1, 1}, *generator, q.device()));
      }
    }
    at::Tensor mass;
    tokens = sample_inverse_cdf_scaled(q, joined(u), &mass);
    if (witness_is_mass) maxima = mass.squeeze(1);
  }
  if (batch) *batch = {q, tokens, maxima};
  std::vector<DraftDraw> out(logits.size());
  for (size_t r = 0; r < logits.size(); ++r) {
    const auto i = static_cast<int64_t>(r);
    out[r].q = q.narrow(0, i, 1);
    out[r].token = tokens.narrow(0, i, 1);
    out[r].maximum = maxima.narrow(0, i, 1);
  }
  return out;
}

std::vector<DraftDraw> draft_steps(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                   const std::vector<at::Generator*>& generators,
                                   const std::vector<at::Tensor>& scaled, DraftBatch* batch) {
  if (logits.empty() || !cpu::host_kernels(logits.front())) {
    return draft_steps_generic(logits, config, generators, scaled, batch);
  }
  std::vector<DraftDraw> out;
  for (size_t r = 0; r < logits.size(); ++r) out.push_back(draft_step(logits[r], config, *generators[r]));
  return out;
}

DraftDraw draft_step_generic(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  return draft_steps_generic({logits}, config, {&generator})[0];
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
  // Every row padded to G drafts (rows of G drafts are as they are): logits with rows of zeros, q with zero rows,
  // tokens 0 (never accepted below); the per-row operations are the padding of shorter rows and the draws.
  std::vector<at::Tensor> logits(count), qs(count), tokens(count), uniforms(count), draws(count), draft_maxima;
  std::vector<int64_t> draft_rows(count, 0);  // how many draft maxima each row has to check
  for (int64_t i = 0; i < count; ++i) {
    const VerifyInput& row = rows[i];
    const int64_t pad = g - gammas[i];
    auto padded = [pad](const at::Tensor& t, std::vector<int64_t> pads, double value) {
      return pad == 0 ? t : at::constant_pad_nd(t, pads, value);
    };
    logits[i] = padded(row.target_logits, {0, 0, 0, pad}, 0.0);                            // [G + 1, V]
    qs[i] = gammas[i] > 0 ? padded(row.q, {0, 0, 0, pad}, 0.0) : at::zeros({g, vocab}, work);  // [G, V]
    tokens[i] = gammas[i] > 0 ? padded(row.drafted, {0, pad}, 0) : at::zeros({g}, long_options);  // [G]
    // The row's draws in one operation, float64: one uniform per draft token, then the residual's uniform.
    const at::Tensor block = at::rand({gammas[i] + 1}, *generators[i], first.options().dtype(at::kDouble));
    uniforms[i] = padded(block.narrow(0, 0, gammas[i]), {0, pad}, 2.0);  // [G]: a padded draft fails r < 1
    draws[i] = block.narrow(0, gammas[i], 1).view({1, 1});
    if (row.draft_maxima.defined() && row.draft_maxima.numel() > 0) {
      draft_maxima.push_back(row.draft_maxima.flatten());
      draft_rows[i] = row.draft_maxima.numel();
    }
  }
  at::Tensor target_logits = stacked(logits);                                          // [R, G + 1, V]
  at::Tensor target_maxima;
  at::Tensor p = standardize_generic(target_logits.reshape({count * (g + 1), vocab}), config, &target_maxima)
                     .view({count, g + 1, vocab});                                       // [R, G + 1, V]
  at::Tensor q = stacked(qs).to(work.dtype());                                         // [R, G, V]
  at::Tensor q_padded = at::constant_pad_nd(q, {0, 0, 0, 1}, 0.0);                       // [R, G + 1, V], q_{G+1} = 0
  at::Tensor drafted = stacked(tokens);                                                // [R, G]

  // n = min({i - 1 | r_i > p_i(x) / q_i(x)} U {gamma}), then t ~ residual(p_{n+1}, q_{n+1}).
  at::Tensor accepted = accept_draws(p, q, drafted, target_logits, stacked(uniforms), config);  // [R, G]
  at::Tensor n = accepted.to(at::kLong).cumprod(1).sum(1);                               // [R]
  at::Tensor at_n = n.view({count, 1, 1}).expand({count, 1, vocab});
  at::Tensor dist = residual(p.gather(1, at_n).squeeze(1), q_padded.gather(1, at_n).squeeze(1));  // [R, V]
  at::Tensor t = config.greedy() ? dist.argmax(-1) : sample_inverse_cdf(dist, joined(draws));  // [R]
  at::Tensor beta = at::minimum(p.narrow(1, 0, g), q).sum(-1);                          // [R, G]

  // The batch's one device -> host transfer, in float64 (token ids are exact there up to 2^53; the cat converts
  // every part), in blocks: n [R], x [R, G], t [R], beta [R, G], the target rows' maxima [R, G + 1], then every
  // draft row's finiteness witness [D], row after row. Finiteness is checked on the host.
  std::vector<at::Tensor> parts{n, drafted.flatten(), t, beta.flatten(), target_maxima.flatten()};
  if (!draft_maxima.empty()) parts.push_back(joined(draft_maxima));
  int64_t total = 0;
  for (const at::Tensor& part : parts) total += part.numel();
  at::Tensor joined_parts = at::empty({total}, n.options().dtype(at::kDouble));
  at::cat_out(joined_parts, parts);
  const at::Tensor host = joined_parts.cpu();
  const double* ns = host.const_data_ptr<double>();
  const double *xs = ns + count, *ts = xs + count * g, *betas = ts + count, *maxima = betas + count * g;
  const double* witness = maxima + count * (g + 1);
  const auto finite = [](const double* begin, int64_t size) {
    return std::all_of(begin, begin + size, [](double value) { return std::isfinite(value); });
  };
  std::vector<Verdict> out(count);
  for (int64_t i = 0; i < count; ++i) {
    Verdict& v = out[i];
    const int64_t gamma = gammas[i];
    v.accepted = static_cast<int64_t>(ns[i]);
    v.finite = rows[i].draft_finite && finite(maxima + i * (g + 1), g + 1) && finite(witness, draft_rows[i]);
    witness += draft_rows[i];
    for (int64_t j = 0; j < gamma; ++j) v.drafted.push_back(static_cast<int64_t>(xs[i * g + j]));
    v.host_token = static_cast<int64_t>(ts[i]);
    v.token = t.narrow(0, i, 1);
    v.betas.assign(betas + i * g, betas + i * g + std::min(v.accepted + 1, gamma));
  }
  return out;
}

std::vector<Verdict> verify_rows(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                 const std::vector<at::Generator*>& generators) {
  if (rows.empty() || !cpu::host_kernels(rows.front().target_logits)) {
    return verify_rows_generic(rows, config, generators);
  }
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
    v.finite = cv.finite && row.draft_finite && cpu::all_finite(row.draft_maxima);
  }
  return out;
}

}  // namespace speculant
