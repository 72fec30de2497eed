// The drafter protocols' shared parts, and the engine's side of a drafter over one sequence: each row's context,
// the rows of a batch served one by one, token trees drawn from the drafter's laws.
#include "drafting/drafter.h"

#include <chrono>

#include "errors.h"
#include "device/read_back.h"

namespace speculant {

Commit Commit::accepted(std::vector<int64_t> path, std::vector<int64_t> tokens, at::Tensor t, int64_t t_host) {
  return {-1, std::move(path), std::move(tokens), std::move(t), t_host};
}

Commit Commit::restart(int64_t keep, at::Tensor t, int64_t t_host) { return {keep, {}, {}, std::move(t), t_host}; }

std::vector<Proposal> DraftRows::propose(const std::vector<Layout>& layouts, const SamplingConfig& config,
                                         Siblings siblings, std::vector<at::Generator>& generators, DraftMode mode) {
  std::vector<Proposal> out = draw(layouts, config, siblings, generators, mode);
  for (size_t r = 0; r < out.size(); ++r) {
    if (!layouts[r].tree) out[r].tree = Tree::from_shape(std::vector<int64_t>(out[r].size(), 1));
  }
  return out;
}

std::unique_ptr<DraftRows> Drafter::rows(int64_t count, Shapes shapes, bool trees) {
  if (trees) {
    const std::string why = facts_.tree_obstacle();
    require(why.empty(), "{}", why);
  }
  return make_rows(count, shapes, trees);
}

at::Tensor SequenceDrafter::laws(const std::vector<int64_t>&, const std::vector<std::vector<int64_t>>&,
                                 const SamplingConfig&, at::Tensor*) {
  fail("{}", tree_obstacle());
}

namespace {

using Clock = std::chrono::steady_clock;

// The tree `draft` lays out after `context`, level by level, each node's children drawn by draw_children from the
// drafter's law there.
Proposal draw_tree(SequenceDrafter& drafter, const std::vector<int64_t>& context, TreeDraft& draft,
                       const SamplingConfig& config, Siblings siblings, at::Generator& generator) {
  std::vector<std::vector<int64_t>> paths{{}};  // each node's tokens after the root
  std::vector<at::Tensor> qs{at::Tensor()};
  while (!draft.expand().empty()) {
    std::vector<std::vector<int64_t>> level_paths;
    for (const int64_t v : draft.expand()) level_paths.push_back(paths[v]);
    at::Tensor scores;
    const at::Tensor q = drafter.laws(context, level_paths, config, &scores);  // [n, V]
    for (size_t i = 0; i < draft.expand().size(); ++i) qs[draft.expand()[i]] = q.narrow(0, static_cast<int64_t>(i), 1);
    const at::Tensor drawn = draw_children(config.greedy() ? scores : q, draft.counts(), siblings, config.greedy(),
                                           {{&generator, q.size(0)}});
    const at::Tensor children = to_host(drawn);  // host ids: the next level's paths need them
    std::vector<int64_t> ids(children.data_ptr<int64_t>(), children.data_ptr<int64_t>() + children.numel());
    std::vector<double> log_q;
    if (draft.values()) {
      const at::Tensor host = to_host(child_log_values(q, scores, drawn, draft.counts(), config.greedy()));
      log_q.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    }
    const int64_t first = draft.size();
    draft.grow(ids, log_q);
    for (int64_t child = first; child < draft.size(); ++child) {
      paths.push_back(paths[draft.parent(child)]);
      paths.back().push_back(draft.token(child));
      qs.emplace_back();
    }
  }
  Proposal out;
  out.tree = draft.tree();
  std::vector<int64_t> tokens;
  for (int64_t v = 1; v < draft.size(); ++v) tokens.push_back(draft.token(v));
  out.tokens = at::tensor(tokens, at::TensorOptions(drafter.device()).dtype(at::kLong));
  if (draft.size() == 1) return out;
  const at::Tensor zeros = at::zeros_like(qs[0]);  // leaves: no children, no law
  for (auto& q : qs) {
    if (!q.defined()) q = zeros;
  }
  out.q = at::cat(qs);
  return out;
}

// The rows of a batch for a drafter over one sequence: each row's context kept on the host.
class SequenceRows final : public DraftRows {
 public:
  SequenceRows(SequenceDrafter& drafter, int64_t count) : drafter_(drafter), contexts_(count) {}

  void begin(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
             const std::vector<std::vector<int64_t>>& host_prompts) override {
    contexts_ = host_prompts;
  }
  std::vector<Proposal> draw(const std::vector<Layout>& layouts, const SamplingConfig& config, Siblings siblings,
                             std::vector<at::Generator>& generators, DraftMode) override {
    std::vector<Proposal> out(contexts_.size());
    for (size_t r = 0; r < contexts_.size(); ++r) {
      if (layouts[r].tree) {
        const auto start = Clock::now();
        out[r] = draw_tree(drafter_, contexts_[r], *layouts[r].tree, config, siblings, generators[r]);
        // a drafter without a model: its time per drafted token is c
        out[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
      } else if (layouts[r].gamma > 0) {
        out[r] = drafter_.propose(contexts_[r], layouts[r].gamma, config, generators[r]);
      }
    }
    return out;
  }
  void commit(int64_t row, const Commit& commit) override {
    std::vector<int64_t>& context = contexts_[row];
    if (commit.keep >= 0) context.resize(commit.keep);
    context.insert(context.end(), commit.tokens.begin(), commit.tokens.end());
    context.push_back(commit.t_host);
  }

 private:
  SequenceDrafter& drafter_;
  std::vector<std::vector<int64_t>> contexts_;  // per row: the prompt and every token emitted since
};

}  // namespace

std::unique_ptr<DraftRows> SequenceDrafter::make_rows(int64_t count, Shapes, bool) {
  return std::make_unique<SequenceRows>(*this, count);
}

}  // namespace speculant
