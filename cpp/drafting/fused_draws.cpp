#include "drafting/fused_draws.h"

#include <fmt/format.h>

#include <algorithm>

#include "device/join.h"

namespace speculant {

std::optional<FusedSteps> FusedSteps::plan(const ModelRows& rows, const std::vector<int64_t>& gammas,
                                           const SamplingConfig& config, const std::vector<at::Tensor>& uniforms,
                                           int64_t vocab, const at::Device& device) {
  const int64_t steps = gammas.empty() ? 0 : *std::max_element(gammas.begin(), gammas.end());
  if (steps == 0 || !rows.fixed_shapes() || !draft_draws_fit(vocab)) return std::nullopt;
  FusedSteps out;
  out.draw_ = [config](const at::Tensor& last, const std::vector<at::Tensor>& in) {
    return packed_draft_draws(last, config, config.greedy() ? at::Tensor() : in[0]);
  };
  out.what_ = fmt::format("the draft's draws (T {}, top-k {}, top-p {})", config.temperature, config.top_k,
                          config.top_p);
  if (config.greedy()) return out;
  // each row's uniforms as the columns of one [steps, R] tensor, 0.5 for the steps a row sits out
  std::vector<at::Tensor> columns;
  for (size_t r = 0; r < gammas.size(); ++r) {
    if (gammas[r] == steps) {
      columns.push_back(uniforms[r]);
      continue;
    }
    columns.push_back(at::full({steps, 1}, 0.5, at::TensorOptions(device).dtype(at::kDouble)));
    if (gammas[r] > 0) columns.back().narrow(0, 0, gammas[r]).copy_(uniforms[r]);
  }
  out.uniforms_ = columns.size() == 1 ? columns[0] : at::cat(columns, 1);
  return out;
}

DraftBatch FusedSteps::run(ModelRows& rows, int64_t i, const std::vector<at::Tensor>& feed) const {
  std::vector<at::Tensor> in;
  if (uniforms_.defined()) in.push_back(uniforms_.narrow(0, i, 1).t());
  return unpack_draft_draws(rows.extend_then(feed, in, draw_, what_));
}

std::optional<FusedLevel> FusedLevel::plan(const ModelRows& rows, const std::vector<TreeDraft*>& drafts,
                                           const std::vector<at::Tensor>& feed, const SamplingConfig& config,
                                           Siblings siblings, std::vector<at::Generator>& generators, int64_t vocab,
                                           const at::Device& device) {
  if (!rows.fixed_shapes() || !draft_draws_fit(vocab)) return std::nullopt;
  int64_t n = 0, k = 0;
  for (size_t r = 0; r < drafts.size(); ++r) {
    if (!feed[r].defined()) continue;
    const TreeDraft& draft = *drafts[r];
    const auto nodes = static_cast<int64_t>(draft.expand().size());
    const std::vector<int64_t>& counts = draft.counts();
    if (draft.values() || std::any_of(counts.begin(), counts.end(), [&](int64_t c) { return c != counts[0]; }) ||
        (n > 0 && (nodes != n || counts[0] != k))) {
      return std::nullopt;
    }
    n = nodes;
    k = counts[0];
  }
  if (n == 0 || k > vocab) return std::nullopt;  // draw_children refuses more children than tokens, by name
  FusedLevel level;
  level.nodes = n;
  level.children = k;
  level.what = fmt::format("the draft's children ({} per node, siblings {}, T {}, top-k {}, top-p {})", k,
                           static_cast<int>(siblings), config.temperature, config.top_k, config.top_p);
  if (!config.greedy()) {
    const int64_t width = siblings == Siblings::top ? 1 : k;
    std::vector<at::Tensor> blocks;
    for (size_t r = 0; r < drafts.size(); ++r) {
      blocks.push_back(feed[r].defined()
                           ? children_uniforms(std::vector<int64_t>(n, k), siblings, {{&generators[r], n}}, device)
                           : at::full({n, width}, 0.5, at::TensorOptions(device).dtype(at::kDouble)));
    }
    level.uniforms = joined(blocks);
  }
  level.then = [config, siblings, k](const at::Tensor& logits, const std::vector<at::Tensor>& in) {
    const at::Tensor raw = logits.dim() == 3 ? logits.reshape({-1, logits.size(2)}) : logits;  // [R n, V]
    // the finiteness witnesses as draft steps take them (step.cpp): the maxima, or at T >= 1 the draws' masses
    const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
    at::Tensor maximum;
    const at::Tensor q = standardize_as_tensors(raw, config, witness_is_mass ? nullptr : &maximum);
    const at::Tensor children =
        config.greedy() ? top_tokens(raw, k)
                        : draw_children_with(q, std::vector<int64_t>(raw.size(0), k), siblings, in[0],
                                             witness_is_mass ? &maximum : nullptr);
    if (witness_is_mass) maximum = maximum.squeeze(1);
    const auto type = q.scalar_type();
    return at::cat({q, children.reshape({-1, k}).to(type), maximum.to(type).unsqueeze(1)}, 1);
  };
  return level;
}

void FusedLevel::run(ModelRows& rows, const std::vector<at::Tensor>& feed,
                     const std::vector<ModelRows::TreeNodes>& fed, bool first) {
  std::vector<at::Tensor> in;
  if (uniforms.defined()) in.push_back(uniforms);
  const at::Tensor packed =
      first ? rows.extend_then(feed, in, then, what) : rows.extend_tree_then(feed, fed, in, then, what);
  const int64_t vocab = packed.size(1) - children - 1;
  q = packed.narrow(1, 0, vocab);
  tokens = packed.narrow(1, vocab, children).to(at::kLong).flatten();
  maximum = packed.select(1, vocab + children);
}

}  // namespace speculant
