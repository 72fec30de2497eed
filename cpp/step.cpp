#include "step.h"

#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"
#include "join.h"
#include "read_back.h"
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
  // tokens 0 (the host tests a row's own drafts only); the per-row operations are the padding of shorter rows and
  // the draws. A row's uniforms come in one operation, float64 and scaled for the inverse CDF: a coin per draft,
  // then a draw for each position's candidate t (of the padded positions, read by nothing).
  std::vector<at::Tensor> logits(count), qs(count), tokens(count), uniforms(count), draws(count);
  ReadBack read;
  std::vector<size_t> draft_parts(count, SIZE_MAX);  // each row's draft witnesses, where given
  for (int64_t i = 0; i < count; ++i) {
    const VerifyInput& row = rows[i];
    const int64_t pad = g - gammas[i];
    auto padded = [pad](const at::Tensor& t, std::vector<int64_t> pads, double value) {
      return pad == 0 ? t : at::constant_pad_nd(t, pads, value);
    };
    logits[i] = padded(row.target_logits, {0, 0, 0, pad}, 0.0);                            // [G + 1, V]
    qs[i] = gammas[i] > 0 ? padded(row.q, {0, 0, 0, pad}, 0.0) : at::zeros({g, vocab}, work);  // [G, V]
    tokens[i] = gammas[i] > 0 ? padded(row.drafted, {0, pad}, 0) : at::zeros({g}, long_options);  // [G]
    uniforms[i] = scaled_uniforms({2 * gammas[i] + 1}, *generators[i], first.device());
    draws[i] = padded(uniforms[i].narrow(0, gammas[i], gammas[i] + 1), {0, pad}, 0.5);  // [G + 1]
    if (row.draft_maxima.defined() && row.draft_maxima.numel() > 0) draft_parts[i] = read.add(row.draft_maxima);
  }
  const at::Tensor target_logits = stacked(logits);                                    // [R, G + 1, V]
  // finiteness witnesses: the rows' maxima where standardizing computes them, else (T >= 1) the candidates' mass
  const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
  at::Tensor witness;
  at::Tensor p = standardize_generic(target_logits.reshape({count * (g + 1), vocab}), config,
                                     witness_is_mass ? nullptr : &witness)
                     .view({count, g + 1, vocab});                                      // [R, G + 1, V]
  const at::Tensor q = stacked(qs).to(work.dtype());                                   // [R, G, V]
  const at::Tensor drafted = stacked(tokens);                                          // [R, G]
  const at::Tensor index = drafted.unsqueeze(-1);
  at::Tensor front = p.narrow(1, 0, g);                                                // [R, G, V]
  const size_t p_part = read.add(front.gather(-1, index)), q_part = read.add(q.gather(-1, index));
  const size_t lenient_part = config.greedy() && config.lenience < 1.0
                                  ? read.add(lenient_argmax(target_logits, index, config.lenience, p.scalar_type()))
                                  : SIZE_MAX;
  // Every position's law of t, in place: residual(p_i, q_i) after a rejection of draft i (p_i where it has no
  // mass), p_{G+1} after all G accepted; then every position's candidate.
  const at::Tensor excess = front - q, positive = excess.clamp_min(0.0);
  const at::Tensor mass = positive.sum(-1, /*keepdim=*/true);  // [R, G, 1]: 1 - beta_i (A.1)
  at::where_out(front, mass > 0, positive / mass, front);
  const at::Tensor dist = p.view({count * (g + 1), vocab});
  at::Tensor candidate_mass;
  const at::Tensor candidates = (config.greedy() ? dist.argmax(-1)
                                                 : sample_inverse_cdf_scaled(dist, joined(draws).view({-1, 1}),
                                                                             &candidate_mass))
                                    .view({count, g + 1});
  if (witness_is_mass) witness = candidate_mass;

  // The batch's one device -> host transfer (read_back.h). Finiteness is checked on the host.
  std::vector<size_t> uniform_parts;
  for (const at::Tensor& u : uniforms) uniform_parts.push_back(read.add(u));
  const size_t mass_part = read.add(mass), candidate_part = read.add(candidates), drafted_part = read.add(drafted);
  const size_t witness_part = read.add(witness);
  read.read();
  const double *p_x = read.at(p_part), *q_x = read.at(q_part), *masses = read.at(mass_part);
  const double *ts = read.at(candidate_part), *xs = read.at(drafted_part), *witnesses = read.at(witness_part);
  const auto finite = [](const double* begin, int64_t size) {
    return std::all_of(begin, begin + size, [](double value) { return std::isfinite(value); });
  };
  std::vector<Verdict> out(count);
  for (int64_t i = 0; i < count; ++i) {
    Verdict& v = out[i];
    const int64_t gamma = gammas[i];
    const double* coin = read.at(uniform_parts[i]);
    // n = the first draft whose test fails: r < min(1, p(x) / (l q(x))) as r l q(x) < p(x), in float64 (the same
    // event without a division: q(x) = 0 < p(x) accepts, p(x) = 0 never does), or A.5's argmax variant
    v.accepted = gamma;
    for (int64_t j = 0; j < gamma; ++j) {
      const double r = coin[j] / kBelowOne;
      const int64_t cell = i * g + j;
      const bool accepted = r * config.lenience * q_x[cell] < p_x[cell] ||
                            (lenient_part != SIZE_MAX && read.at(lenient_part)[cell] != 0);
      if (!accepted) {
        v.accepted = j;
        break;
      }
    }
    v.finite = rows[i].draft_finite && finite(witnesses + i * (g + 1), g + 1) &&
               (draft_parts[i] == SIZE_MAX || finite(read.at(draft_parts[i]), rows[i].draft_maxima.numel()));
    for (int64_t j = 0; j < gamma; ++j) v.drafted.push_back(static_cast<int64_t>(xs[i * g + j]));
    v.host_token = static_cast<int64_t>(ts[i * (g + 1) + v.accepted]);
    v.token = candidates.select(0, i).narrow(0, v.accepted, 1);
    for (int64_t j = 0; j < std::min(v.accepted + 1, gamma); ++j) v.betas.push_back(1.0 - masses[i * g + j]);
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
