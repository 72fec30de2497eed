#include "math/step.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "math/cpu_kernels.h"
#include "device/join.h"
#include "device/read_back.h"
#include "math/speculative.h"
#include "device/verification_graphs.h"

namespace speculant {
namespace {

at::Tensor scalar_token(int64_t token) {
  at::Tensor out = at::empty({1}, at::TensorOptions().dtype(at::kLong));
  *out.mutable_data_ptr<int64_t>() = token;
  return out;
}

// Every row's draft step from its logits rows [R, V]: q, the tokens [R] and each row's finiteness witness (its raw
// maximum, or at T >= 1 its mass: standardizing there needs no maximum, and the draw's mass tells as well whether
// the row is finite). `scaled`: each row's uniform [R, 1] (sampled only).
DraftBatch draw_rows(const at::Tensor& rows, const SamplingConfig& config, const at::Tensor& scaled) {
  DraftBatch out;
  const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
  out.q = standardize_generic(rows, config, witness_is_mass ? nullptr : &out.maximum);
  if (config.greedy()) {
    out.tokens = out.q.argmax(-1);
  } else {
    at::Tensor mass;
    out.tokens = sample_inverse_cdf_scaled(out.q, scaled, &mass);
    if (witness_is_mass) out.maximum = mass.squeeze(1);
  }
  return out;
}

}  // namespace

bool draft_draws_fit(int64_t vocab) { return vocab <= (int64_t{1} << 24); }

at::Tensor packed_draft_draws(const at::Tensor& logits, const SamplingConfig& config, const at::Tensor& scaled) {
  const DraftBatch draws = draw_rows(logits, config, scaled);
  const auto type = draws.q.scalar_type();
  return at::cat({draws.q, draws.tokens.to(type).unsqueeze(1), draws.maximum.to(type).unsqueeze(1)}, 1);
}

DraftBatch unpack_draft_draws(const at::Tensor& packed) {
  const int64_t vocab = packed.size(1) - 2;
  return {packed.narrow(1, 0, vocab), packed.select(1, vocab).to(at::kLong), packed.select(1, vocab + 1)};
}

std::vector<DraftDraw> draft_steps_generic(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                           const std::vector<at::Generator*>& generators,
                                           const std::vector<at::Tensor>& scaled, DraftBatch* batch) {
  if (logits.empty()) return {};
  std::vector<at::Tensor> u = scaled;  // row r's uniform, given or from its own generator (as sample() draws it alone)
  if (u.empty() && !config.greedy()) {
    for (at::Generator* generator : generators) u.push_back(scaled_uniforms({1, 1}, *generator, logits[0].device()));
  }
  const DraftBatch draws = draw_rows(joined(logits), config, config.greedy() ? at::Tensor() : joined(u));
  if (batch) *batch = draws;
  std::vector<DraftDraw> out(logits.size());
  for (size_t r = 0; r < logits.size(); ++r) {
    const auto i = static_cast<int64_t>(r);
    out[r].q = draws.q.narrow(0, i, 1);
    out[r].token = draws.tokens.narrow(0, i, 1);
    out[r].maximum = draws.maximum.narrow(0, i, 1);
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

namespace {

constexpr size_t kNone = SIZE_MAX;  // a part not read back

// Where a chain verification's read-back holds what (read_back.h): fixed by its key (the rows' drafts, the settings,
// the shapes), so that a graph's replay, which runs none of the code that placed the parts, is read as the run that
// captured it (verification_graphs.h).
struct ChainPlan {
  size_t p = kNone, q = kNone, lenient = kNone, mass = kNone, candidates = kNone, drafted = kNone, witness = kNone,
         uniforms = kNone;
  std::vector<size_t> draft_parts;  // each row's draft witnesses (kNone: none given)
  std::vector<int64_t> offsets;
  at::Tensor candidates_tensor;     // int64 [R, G + 1] on the device: the run's own (none kept for a replay)

  bool same_places(const ChainPlan& other) const { return offsets == other.offsets && ids() == other.ids(); }
  std::vector<size_t> ids() const {
    std::vector<size_t> out{p, q, lenient, mass, candidates, drafted, witness, uniforms};
    out.insert(out.end(), draft_parts.begin(), draft_parts.end());
    return out;
  }
};

bool has_witnesses(const VerifyInput& row) { return row.draft_maxima.defined() && row.draft_maxima.numel() > 0; }

// The device's part of the verification of R rows, row i with gamma_i drafts, padded to G (rows of G drafts are as
// they are): `in` is the target's logits [R, G + 1, V] (padded rows of zeros), q [R, G, V] (zero rows), the drafts
// int64 [R, G] (padded with 0: the host tests a row's own drafts only), every row's uniforms joined (row i: 2 gamma_i
// + 1, float64 and scaled for the inverse CDF: a coin per draft, then a draw for each position's candidate t), then
// each row's draft witnesses where given. Returns everything the host reads, packed into one float64 tensor; `plan`
// says where.
at::Tensor chain_device_work(const std::vector<VerifyInput>& rows, const std::vector<int64_t>& gammas, int64_t g,
                             const SamplingConfig& config, const std::vector<at::Tensor>& in, ChainPlan& plan) {
  const auto count = static_cast<int64_t>(rows.size());
  const at::Tensor& target_logits = in[0];                                             // [R, G + 1, V]
  const int64_t vocab = target_logits.size(2);
  ReadBack read;
  plan.draft_parts.assign(rows.size(), kNone);
  for (size_t i = 0, next = 4; i < rows.size(); ++i) {
    if (has_witnesses(rows[i])) plan.draft_parts[i] = read.add(in[next++]);
  }
  // finiteness witnesses: the rows' maxima where standardizing computes them, else (T >= 1) the candidates' mass
  const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
  at::Tensor witness;
  at::Tensor p = standardize_generic(target_logits.reshape({count * (g + 1), vocab}), config,
                                     witness_is_mass ? nullptr : &witness)
                     .view({count, g + 1, vocab});                                      // [R, G + 1, V]
  const at::Tensor q = in[1].to(p.scalar_type());                                      // [R, G, V]
  const at::Tensor& drafted = in[2];                                                   // [R, G]
  const at::Tensor index = drafted.unsqueeze(-1);
  at::Tensor front = p.narrow(1, 0, g);                                                // [R, G, V]
  plan.p = read.add(front.gather(-1, index));
  plan.q = read.add(q.gather(-1, index));
  if (config.greedy() && config.lenience < 1.0) {
    plan.lenient = read.add(lenient_argmax(target_logits, index, config.lenience, p.scalar_type()));
  }
  // Every position's law of t, in place: residual(p_i, q_i) after a rejection of draft i (p_i where it has no
  // mass), p_{G+1} after all G accepted; then every position's candidate.
  const ResidualParts residual = residual_parts(front, q);  // mass [R, G, 1]: 1 - beta_i (A.1)
  to_residual(front, residual);
  const at::Tensor dist = p.view({count * (g + 1), vocab});
  at::Tensor candidates;
  if (config.greedy()) {
    candidates = dist.argmax(-1);
  } else {  // each row's draws, after its coins, padded to G + 1 (a padded position's candidate is read by nothing)
    std::vector<at::Tensor> draws;
    for (int64_t i = 0, offset = 0; i < count; offset += 2 * gammas[i] + 1, ++i) {
      const at::Tensor own = in[3].narrow(0, offset + gammas[i], gammas[i] + 1);
      draws.push_back(gammas[i] == g ? own : at::constant_pad_nd(own, {0, g - gammas[i]}, 0.5));
    }
    at::Tensor candidate_mass;
    candidates = sample_inverse_cdf_scaled(dist, joined(draws).view({-1, 1}), &candidate_mass);
    if (witness_is_mass) witness = candidate_mass;
  }
  plan.candidates_tensor = candidates.view({count, g + 1});
  plan.uniforms = read.add(in[3]);
  plan.mass = read.add(residual.mass);
  plan.candidates = read.add(candidates);
  plan.drafted = read.add(drafted);
  plan.witness = read.add(witness);
  at::Tensor packed = read.pack();
  plan.offsets = read.offsets();
  return packed;
}

// A chain verification's key in the graphs: everything its operations' shapes and order depend on.
std::string chain_key(const std::vector<VerifyInput>& rows, const std::vector<int64_t>& gammas,
                      const SamplingConfig& config, const std::vector<at::Tensor>& in) {
  std::vector<int64_t> witnesses;
  for (const VerifyInput& row : rows) witnesses.push_back(has_witnesses(row) ? row.draft_maxima.numel() : 0);
  return fmt::format("the verification of chains (T {}, top-k {}, top-p {}, lenience {}, logits {}, q {}, V {}): "
                     "drafts [{}], witnesses [{}]", config.temperature, config.top_k, config.top_p, config.lenience,
                     c10::toString(in[0].scalar_type()), c10::toString(in[1].scalar_type()), in[0].size(2),
                     fmt::join(gammas, ", "), fmt::join(witnesses, ", "));
}

}  // namespace

std::vector<Verdict> verify_rows_generic(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                         const std::vector<at::Generator*>& generators, VerificationGraphs* graphs) {
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
  // chain_device_work's inputs: the per-row operations are the padding of shorter rows and the draws (a row's
  // uniforms in one operation, from its own generator)
  std::vector<at::Tensor> logits(count), qs(count), tokens(count), uniforms(count);
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
  }
  std::vector<at::Tensor> in{stacked(logits), stacked(qs), stacked(tokens), joined(uniforms)};
  for (const VerifyInput& row : rows) {
    if (has_witnesses(row)) in.push_back(row.draft_maxima);
  }
  ChainPlan ran;                 // without graphs: this run's
  const ChainPlan* plan = &ran;  // with graphs: the key's, from its first run
  at::Tensor packed, candidates;  // candidates: int64 [R, G + 1] on the device
  auto graphed = graphs ? graphs->run<ChainPlan>(chain_key(rows, gammas, config, in), in,
                                                 [&](const std::vector<at::Tensor>& buffers, ChainPlan& run) {
                                                   at::Tensor out = chain_device_work(rows, gammas, g, config,
                                                                                      buffers, run);
                                                   run.candidates_tensor = at::Tensor();
                                                   return out;
                                                 })
                        : std::nullopt;
  if (graphed) {
    std::tie(packed, plan) = *graphed;
    candidates = packed.narrow(0, plan->offsets[plan->candidates], count * (g + 1)).to(at::kLong).view({count, g + 1});
  } else {
    packed = chain_device_work(rows, gammas, g, config, in, ran);
    candidates = ran.candidates_tensor;
  }
  ReadBack read(plan->offsets);  // the batch's one device -> host transfer; finiteness is checked on the host
  read.load(packed);
  const double *p_x = read.at(plan->p), *q_x = read.at(plan->q), *masses = read.at(plan->mass);
  const double *ts = read.at(plan->candidates), *xs = read.at(plan->drafted), *witnesses = read.at(plan->witness);
  const auto finite = [](const double* begin, int64_t size) {
    return std::all_of(begin, begin + size, [](double value) { return std::isfinite(value); });
  };
  std::vector<Verdict> out(count);
  for (int64_t i = 0, offset = 0; i < count; offset += 2 * gammas[i] + 1, ++i) {
    Verdict& v = out[i];
    const int64_t gamma = gammas[i];
    const double* coin = read.at(plan->uniforms) + offset;
    // n = the first draft whose test fails: r < min(1, p(x) / (l q(x))) in float64, or A.5's argmax variant
    int64_t n = gamma;
    for (int64_t j = 0; j < gamma; ++j) {
      const double r = coin[j] / kBelowOne;
      const int64_t cell = i * g + j;
      const bool accepted = r < acceptance(p_x[cell], q_x[cell], config.lenience) ||
                            (plan->lenient != kNone && read.at(plan->lenient)[cell] != 0);
      if (!accepted) {
        n = j;
        break;
      }
    }
    v.finite = rows[i].draft_finite && finite(witnesses + i * (g + 1), g + 1) &&
               (plan->draft_parts[i] == kNone || finite(read.at(plan->draft_parts[i]), rows[i].draft_maxima.numel()));
    for (int64_t j = 0; j < gamma; ++j) v.drafted.push_back(static_cast<int64_t>(xs[i * g + j]));
    v.keep_chain(n);
    v.host_token = static_cast<int64_t>(ts[i * (g + 1) + n]);
    v.token = candidates.select(0, i).narrow(0, n, 1);
    for (int64_t j = 0; j < std::min(n + 1, gamma); ++j) v.betas.push_back(1.0 - masses[i * g + j]);
  }
  return out;
}

std::vector<Verdict> verify_rows(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                 const std::vector<at::Generator*>& generators, VerificationGraphs* graphs) {
  if (rows.empty() || !cpu::host_kernels(rows.front().target_logits)) {
    return verify_rows_generic(rows, config, generators, graphs);
  }
  std::vector<Verdict> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const VerifyInput& row = rows[i];
    const int64_t gamma = row.drafted.defined() ? row.drafted.numel() : 0;
    Verdict& v = out[i];
    const at::Tensor drafted_host = gamma > 0 ? row.drafted.contiguous() : at::Tensor();
    const int64_t* x = gamma > 0 ? drafted_host.const_data_ptr<int64_t>() : nullptr;
    const at::Tensor q_rows = gamma > 0 ? row.q : at::empty({0, row.target_logits.size(1)});  // plain decoding
    cpu::GeneratorUniform uniform(*generators[i]);
    v = cpu::verify(row.target_logits, q_rows, x, config, [&uniform] { return uniform(); });
    v.token = scalar_token(v.host_token);
    v.finite = v.finite && row.draft_finite && cpu::all_finite(row.draft_maxima);
  }
  return out;
}

}  // namespace speculant
