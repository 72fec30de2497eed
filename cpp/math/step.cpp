#include "math/step.h"

#include <cstdint>
#include <vector>

#include "math/cpu_kernels.h"
#include "device/join.h"
#include "math/speculative.h"

namespace speculant {
namespace {

// Every row's draft step from its logits rows [R, V]: q, the tokens [R] and each row's finiteness witness (its raw
// maximum, or at T >= 1 its mass: standardizing there needs no maximum, and the draw's mass tells as well whether
// the row is finite). `scaled`: each row's uniform [R, 1] (sampled only).
DraftBatch draw_rows(const at::Tensor& rows, const SamplingConfig& config, const at::Tensor& scaled) {
  DraftBatch out;
  const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
  out.q = standardize_as_tensors(rows, config, witness_is_mass ? nullptr : &out.maximum);
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

std::vector<DraftDraw> draft_steps_as_tensors(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
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
  if (logits.empty() || !cpu::runs_on_host(logits.front())) {
    return draft_steps_as_tensors(logits, config, generators, scaled, batch);
  }
  std::vector<DraftDraw> out;
  for (size_t r = 0; r < logits.size(); ++r) out.push_back(draft_step(logits[r], config, *generators[r]));
  return out;
}

DraftDraw draft_step_as_tensors(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  return draft_steps_as_tensors({logits}, config, {&generator})[0];
}

DraftDraw draft_step(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  if (!cpu::runs_on_host(logits)) return draft_step_as_tensors(logits, config, generator);
  DraftDraw out;
  std::vector<uint8_t> finite;
  out.q = cpu::standardize(logits, config, &finite);  // [1, V]
  out.finite = finite[0] != 0;
  cpu::GeneratorUniform uniform(generator);
  out.token = cpu::token_tensor(cpu::draw(out.q, 0, config.greedy(), [&uniform] { return uniform(); }));
  return out;
}

}  // namespace speculant
