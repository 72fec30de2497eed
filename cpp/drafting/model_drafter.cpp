// A draft model's rows: chains step by step, token trees level by level, the model's cache kept to what the target
// accepted. Where the rows have fixed shapes on the accelerators' path, each step's draws run inside its call
// (fused_draws.h).
#include "drafting/model_drafter.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>

#include "device/join.h"
#include "device/upload.h"
#include "drafting/fused_draws.h"
#include "errors.h"
#include "device/read_back.h"
#include "loop/interrupt.h"
#include "math/step.h"

namespace speculant {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The probability each draw's token had under the law it was drawn from, q; at temperature 0, where q is a point
// mass, under the draft's softmax of `logits` (what transformers' ConfidenceCriteria reads there). Read on the host,
// once for the step.
std::vector<double> drawn_probabilities(const std::vector<DraftDraw>& draws, const std::vector<at::Tensor>& logits,
                                        bool greedy) {
  std::vector<at::Tensor> at_token;
  for (size_t j = 0; j < draws.size(); ++j) {
    const at::Tensor law = greedy ? at::softmax(logits[j].to(at::kFloat), -1) : draws[j].q;
    at_token.push_back(law.gather(1, draws[j].token.view({1, 1})).view({1}));
  }
  const at::Tensor host = to_host(joined(at_token).to(at::kDouble)).contiguous();
  return {host.const_data_ptr<double>(), host.const_data_ptr<double>() + host.numel()};
}

// A draft Model's rows. Invariant between iterations, per row: the model has cached the sequence except
// `pending`, which it is fed first in the next proposal (the last token; also the last proposed token when all
// were kept, since the model sampled that token but never ran on it). Step i of a proposal is one call for
// every row still drafting.
// With `sibling` (token trees: tree.h's sibling drafts), a second model's rows whose laws at the expanded nodes
// draw the children after the first. It is fed as the draft is, level by level, but only up to the deepest level
// with a node of two or more children (TreeDraft::last_branching_depth): deeper, every node has one child, drawn
// from the draft's law, so the sibling's law there is never read (its rows in Proposal::sibling_q are the
// draft's). The accepted nodes it was not fed it is fed with the next tree's root (its own pending tokens).
// With `stop_below` > 0 (chains) a row ends its proposal after a token its q gave less than that probability
// (model_drafter.h).
class ModelDraftRows final : public DraftRows {
 public:
  ModelDraftRows(std::unique_ptr<ModelRows> rows, at::Device device, int64_t vocab, bool trees,
                 std::unique_ptr<ModelRows> sibling = nullptr, double stop_below = 0.0)
      : rows_(std::move(rows)), sibling_(std::move(sibling)), device_(device), vocab_(vocab), trees_(trees),
        stop_below_(stop_below), row_(rows_->count()) {}

  void begin(const std::vector<at::Tensor>& sources, const std::vector<at::Tensor>& prompts,
             const std::vector<std::vector<int64_t>>&) override {
    if (!sources.empty()) {
      rows_->encode(sources);
      if (sibling_) sibling_->encode(sources);
    }
    std::vector<at::Tensor> cached(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      const int64_t length = prompts[r].numel();
      cached[r] = prompts[r].narrow(0, 0, length - 1);
      row_[r].pending = prompts[r].narrow(0, length - 1, 1);
      row_[r].sibling_pending = row_[r].pending;
    }
    rows_->reset(cached);
    if (sibling_) sibling_->reset(cached);
  }

  void commit(int64_t row, const Commit& commit) override {
    if (commit.keep >= 0) {
      if (sibling_) row_[row].sibling_pending = restart_row(*sibling_, row, row_[row].sibling_pending, commit.keep, commit.t);
      row_[row].pending = restart_row(*rows_, row, row_[row].pending, commit.keep, commit.t);
    } else if (trees_) {
      keep_path(row, commit.path, commit.t);
    } else {
      keep_chain(row, static_cast<int64_t>(commit.path.size()), commit.t);
    }
  }

 protected:
  // Rows made for trees draft the trees their layouts lay out; the others chains.
  std::vector<Proposal> draw(const std::vector<Layout>& layouts, const SamplingConfig& config, Siblings siblings,
                             std::vector<at::Generator>& generators, DraftMode mode) override {
    mode_ = mode;
    std::vector<int64_t> gammas;
    std::vector<TreeDraft*> trees;
    for (const Layout& layout : layouts) {
      gammas.push_back(layout.gamma);
      trees.push_back(layout.tree);
      require(trees_ || !layout.tree, "these draft rows were made for chains, not token trees");
    }
    return trees_ ? draw_trees(trees, config, siblings, generators) : draw_chains(gammas, config, generators);
  }

 private:
  std::vector<Proposal> draw_chains(const std::vector<int64_t>& gammas, const SamplingConfig& config,
                                    std::vector<at::Generator>& generators) {
    const size_t count = gammas.size();
    std::vector<Proposal> out(count);
    ChainSteps found(gammas);
    const ChainPlan plan = chain_plan(gammas, config, generators);
    const int64_t steps = count > 0 ? *std::max_element(gammas.begin(), gammas.end()) : 0;
    for (int64_t i = 0; i < steps; ++i) {
      if (std::none_of(found.limit.begin(), found.limit.end(), [i](int64_t k) { return i < k; })) break;
      if (i > 0) check_interrupt();  // the decoder checked before the first
      chain_step(i, plan, config, generators, found, out);
    }
    finish_chains(plan.together, found, out);
    return out;
  }

  // Level 0 feeds each row's pending tokens (they join the cache) and expands the root; each later level feeds
  // the nodes its draft expands as tentative nodes (rows.h: extend_tree, numbered in the order they are fed) and
  // draws their children. Nodes that are never expanded (leaves) are never fed.
  std::vector<Proposal> draw_trees(const std::vector<TreeDraft*>& drafts, const SamplingConfig& config,
                                   Siblings siblings, std::vector<at::Generator>& generators) {
    const size_t count = drafts.size();
    TreeLevels found(count);
    std::vector<int64_t> sibling_until(count, -1);  // the deepest level the sibling runs at, per row
    for (size_t r = 0; r < count; ++r) {
      row_[r].tree.reset();
      row_[r].fed.clear();
      row_[r].tentative = 0;
      row_[r].sibling_tentative = 0;
      row_[r].sibling_ran = false;
      if (drafts[r]) found.tokens[r].push_back(row_[r].pending.narrow(0, row_[r].pending.numel() - 1, 1));
      if (drafts[r] && sibling_) sibling_until[r] = drafts[r]->last_branching_depth();
    }
    const bool sync = mode_.profile && device_.is_cuda();
    for (bool first = true;; first = false) {
      std::vector<at::Tensor> feed(count);
      std::vector<ModelRows::TreeNodes> nodes(count);
      if (!tree_feed(drafts, found, first, feed, nodes)) break;
      if (!first) check_interrupt();  // the decoder checked before the first
      // the sibling's rows at this level: those whose tree branches here or deeper; at the root its own pending
      // tokens (the accepted nodes it was not fed, then the draft's pending ones)
      std::vector<at::Tensor> sibling_feed(count);
      std::vector<ModelRows::TreeNodes> sibling_nodes(count);
      bool sibling_any = false;
      for (size_t r = 0; r < count && sibling_; ++r) {
        if (!feed[r].defined() || (first ? 0 : drafts[r]->depth(drafts[r]->expand()[0])) > sibling_until[r]) continue;
        sibling_feed[r] = first ? row_[r].sibling_pending : feed[r];
        if (!first) sibling_nodes[r] = nodes[r];
        sibling_any = true;
      }
      std::optional<FusedLevel> fused =
          sibling_ || !mode_.tensors  // (a sibling's draws need its call too)
              ? std::nullopt
              : FusedLevel::plan(*rows_, drafts, feed, config, siblings, generators, vocab_, device_);
      const auto start = Clock::now();
      std::vector<at::Tensor> logits, sibling_logits;
      if (fused) {
        fused->run(*rows_, feed, nodes, first);
      } else {
        logits = first ? rows_->extend(feed) : rows_->extend_tree(feed, nodes);
        if (sibling_any) {
          sibling_logits = first ? sibling_->extend(sibling_feed) : sibling_->extend_tree(sibling_feed, sibling_nodes);
        }
      }
      if (sync) torch::cuda::synchronize();
      const double seconds = seconds_since(start);
      for (size_t r = 0; r < count; ++r) {
        if (!feed[r].defined()) continue;
        found.seconds[r] += seconds;
        found.calls[r] += sibling_feed[r].defined() ? 2 : 1;
        if (!first) row_[r].tentative += feed[r].numel();
        if (!sibling_feed[r].defined()) continue;
        if (first) row_[r].sibling_ran = true;
        else row_[r].sibling_tentative += feed[r].numel();
      }
      if (fused) {  // every fed row's level from the call's draws
        keep_fused_level(drafts, feed, *fused, found);
        continue;
      }
      draw_level(drafts, feed, sibling_feed, logits, sibling_logits, first, config, siblings, generators, found);
    }
    return finish_trees(drafts, found);
  }

  // How a chain proposal runs, fixed for its steps.
  struct ChainPlan {
    bool sync = false;  // profiling on CUDA: each call's time waits for the device
    // On the accelerators' path a row's uniforms for the whole proposal come in one operation, already scaled
    // for the inverse CDF (where a draw per step took two operations per step): a row's draws still depend on
    // its generator alone, as when alone.
    std::vector<at::Tensor> uniforms;
    // Rows drafting the same gamma on that path: each step's draws kept as the batch's tensors and stacked once
    // at the end (three operations, where joining each row's took three per row)
    bool together = false;
    std::optional<FusedSteps> fused;  // rows with fixed shapes on that path: each step's draws inside its call
  };

  // What a chain proposal gathers, step by step: the drafts each row makes (gammas, or fewer where the
  // confidence stops), each row's tokens, laws and finiteness witnesses, or (together) each step's for the batch.
  struct ChainSteps {
    explicit ChainSteps(const std::vector<int64_t>& gammas)
        : limit(gammas), x(gammas.size()), q(gammas.size()), maxima(gammas.size()) {}
    std::vector<int64_t> limit;
    std::vector<std::vector<at::Tensor>> x, q, maxima;
    std::vector<at::Tensor> step_q, step_tokens, step_maxima;
  };

  ChainPlan chain_plan(const std::vector<int64_t>& gammas, const SamplingConfig& config,
                       std::vector<at::Generator>& generators) const {
    const size_t count = gammas.size();
    ChainPlan plan;
    plan.sync = mode_.profile && device_.is_cuda();
    const bool tensor_path = count > 0 && mode_.tensors;
    plan.uniforms.resize(count);
    if (!config.greedy() && tensor_path) {
      for (size_t r = 0; r < count; ++r) {
        if (gammas[r] > 0) plan.uniforms[r] = scaled_uniforms({gammas[r], 1}, generators[r], row_[r].pending.device());
      }
    }
    const int64_t steps = count > 0 ? *std::max_element(gammas.begin(), gammas.end()) : 0;
    plan.together = tensor_path && steps > 0 && stop_below_ == 0.0 &&
                    std::all_of(gammas.begin(), gammas.end(), [&](int64_t g) { return g == steps; });
    if (tensor_path && stop_below_ == 0.0) {
      plan.fused = FusedSteps::plan(*rows_, gammas, config, plan.uniforms, vocab_, device_);
    }
    return plan;
  }

  // Step i of a chain proposal: one call for every row still drafting, and its draws.
  void chain_step(int64_t i, const ChainPlan& plan, const SamplingConfig& config,
                  std::vector<at::Generator>& generators, ChainSteps& found, std::vector<Proposal>& out) {
    const size_t count = out.size();
    std::vector<at::Tensor> feed(count);
    for (size_t r = 0; r < count; ++r) {
      feed[r] = i < found.limit[r] ? (i == 0 ? row_[r].pending : found.x[r].back()) : at::Tensor();
    }
    const auto start = Clock::now();
    std::vector<at::Tensor> logits;  // [k_r, V] for the rows still drafting
    DraftBatch batch;                // fused: every row's draws
    if (plan.fused) {
      batch = plan.fused->run(*rows_, i, feed);
    } else {
      logits = rows_->extend(feed);
    }
    if (plan.sync) torch::cuda::synchronize();
    const double seconds = seconds_since(start);
    std::vector<size_t> drafting;
    std::vector<at::Tensor> last;  // each drafting row's distribution after its last fed token
    std::vector<at::Generator*> drawing;
    std::vector<at::Tensor> drawn;  // the drafting rows' uniforms of this step, where drawn in the plan
    for (size_t r = 0; r < count; ++r) {
      if (i >= found.limit[r]) continue;
      out[r].seconds += seconds;  // a batched call takes this long for each row in it
      drafting.push_back(r);
      if (plan.fused) continue;
      last.push_back(logits[r].narrow(0, logits[r].size(0) - 1, 1));
      drawing.push_back(&generators[r]);
      if (plan.uniforms[r].defined()) drawn.push_back(plan.uniforms[r].narrow(0, i, 1));
    }
    std::vector<DraftDraw> draws;
    if (plan.fused) {  // every row's, of which the drafting rows' are read
      for (const size_t r : drafting) {
        const auto row = static_cast<int64_t>(r);
        draws.push_back({batch.q.narrow(0, row, 1), batch.tokens.narrow(0, row, 1), batch.maximum.narrow(0, row, 1),
                         true});
      }
    } else {
      draws = draft_steps(last, config, drawing, drawn, plan.together ? &batch : nullptr);
    }
    if (plan.together) {
      found.step_q.push_back(batch.q);
      found.step_tokens.push_back(batch.tokens);
      if (batch.maximum.defined()) found.step_maxima.push_back(batch.maximum);
    }
    for (size_t j = 0; j < drafting.size(); ++j) {
      const size_t r = drafting[j];
      found.x[r].push_back(draws[j].token);  // the next step's input
      if (!plan.together) {
        found.q[r].push_back(draws[j].q);
        if (draws[j].maximum.defined()) found.maxima[r].push_back(draws[j].maximum);
      }
      out[r].finite = out[r].finite && draws[j].finite;
    }
    if (stop_below_ > 0.0) {  // the confidence stop: it reads the draft's own draws only, so the law stays exact
      const std::vector<double> probability = drawn_probabilities(draws, last, config.greedy());
      for (size_t j = 0; j < drafting.size(); ++j) {
        if (probability[j] < stop_below_) found.limit[drafting[j]] = i + 1;
      }
    }
  }

  // The proposals from what the steps gathered; each row remembers its chain for the commit.
  void finish_chains(bool together, ChainSteps& found, std::vector<Proposal>& out) {
    at::Tensor all_tokens, all_q, all_maxima;  // together: [R, gamma], [R, gamma, V], [R, gamma]
    if (together) {
      all_tokens = at::stack(found.step_tokens, 1);
      all_q = at::stack(found.step_q, 1);
      if (!found.step_maxima.empty()) all_maxima = at::stack(found.step_maxima, 1);
    }
    for (size_t r = 0; r < out.size(); ++r) {
      row_[r].proposed = found.limit[r];
      if (found.limit[r] == 0) continue;
      const auto row = static_cast<int64_t>(r);
      out[r].calls = found.limit[r];
      out[r].tokens = together ? all_tokens.select(0, row) : at::cat(found.x[r], 0);
      out[r].q = together ? all_q.select(0, row) : at::cat(found.q[r], 0);
      if (together && all_maxima.defined()) out[r].maxima = all_maxima.select(0, row);
      if (!together && !found.maxima[r].empty()) out[r].maxima = at::cat(found.maxima[r], 0);
      row_[r].last = out[r].tokens;
    }
  }
  // Row r's target kept the tree nodes `path` of its last tree and appended t.
  void keep_path(int64_t row, const std::vector<int64_t>& path, const at::Tensor& t) {
    const std::optional<Tree> tree = std::move(row_[row].tree);
    row_[row].tree.reset();
    if (!tree || tree->size() == 1) {  // the model ran on nothing: the old pending tokens and t next time
      row_[row].pending = at::cat({row_[row].pending, t});
      if (sibling_) row_[row].sibling_pending = at::cat({row_[row].sibling_pending, t});
      return;
    }
    // It ran on the pending tokens and on every expanded node: keep the fed part of the path (all of it but
    // perhaps its last node, a leaf). The sibling ran on a prefix of the levels (its first tentative nodes), or on
    // none: it keeps the path's nodes it ran on and is fed the rest with t next time, after its old pending
    // tokens where it did not run on them.
    std::vector<int64_t> fed, sibling_fed;
    std::vector<at::Tensor> behind;
    if (sibling_ && !row_[row].sibling_ran) behind.push_back(row_[row].sibling_pending);
    for (const int64_t v : path) {
      if (row_[row].fed[v] >= 0) fed.push_back(row_[row].fed[v]);
      if (!sibling_) continue;
      if (row_[row].fed[v] >= 0 && row_[row].fed[v] < row_[row].sibling_tentative) {
        sibling_fed.push_back(row_[row].fed[v]);
      } else {
        behind.push_back(row_[row].last.narrow(0, v, 1));
      }
    }
    rows_->commit({row}, {fed});
    if (sibling_) {
      if (row_[row].sibling_ran) sibling_->commit({row}, {sibling_fed});
      behind.push_back(t);
      row_[row].sibling_pending = at::cat(behind);
    }
    const bool leaf = !path.empty() && row_[row].fed[path.back()] < 0;
    row_[row].pending = leaf ? at::cat({row_[row].last.narrow(0, path.back(), 1), t}) : t;
  }

  // Row r's target kept the first `accepted` tokens of its last chain and appended t.
  void keep_chain(int64_t row, int64_t accepted, const at::Tensor& t) {
    const int64_t proposed = row_[row].proposed;
    if (proposed == 0) {  // the model ran on nothing: it is fed the old pending tokens and t next time
      row_[row].pending = at::cat({row_[row].pending, t});
    } else if (accepted < proposed) {
      // it ran on pending + x_1 .. x_{k-1}: keep what precedes the rejected token, t becomes pending
      rows_->truncate(row, rows_->length(row) - (proposed - 1 - accepted));
      row_[row].pending = t;
    } else {  // all kept: it never ran on x_k
      row_[row].pending = at::cat({row_[row].last.narrow(0, proposed - 1, 1), t});
    }
  }

  // What a tree proposal gathers per row, level by level: the tokens of each depth (depth 0: the root), in node
  // order; each expanded node's law (q) and the sibling draft's (sibling_q); the raw rows' finiteness witnesses;
  // the draft's calls and their seconds.
  struct TreeLevels {
    explicit TreeLevels(size_t count)
        : tokens(count), q(count), sibling_q(count), maxima(count), seconds(count), calls(count) {}
    std::vector<std::vector<at::Tensor>> tokens, q, sibling_q, maxima;
    std::vector<double> seconds;
    std::vector<int64_t> calls;
  };

  // A level's feed per row (none: the row's tree is done) and its tentative nodes; false when no row feeds.
  bool tree_feed(const std::vector<TreeDraft*>& drafts, const TreeLevels& found, bool first,
                 std::vector<at::Tensor>& feed, std::vector<ModelRows::TreeNodes>& nodes) {
    const size_t count = drafts.size();
    bool any = false;
    for (size_t r = 0; r < count; ++r) {
      if (!drafts[r] || drafts[r]->expand().empty()) continue;
      any = true;
      if (first) {
        feed[r] = row_[r].pending;
        continue;
      }
      // the nodes expanded are of the newest depth: all of it, or some of its nodes
      const at::Tensor& newest = found.tokens[r].back();
      const int64_t first_node = drafts[r]->size() - newest.numel();
      std::vector<int64_t> picked;
      for (const int64_t v : drafts[r]->expand()) {
        picked.push_back(v - first_node);
        nodes[r].offsets.push_back(drafts[r]->depth(v) - 1);
        const int64_t parent = drafts[r]->parent(v);
        nodes[r].parents.push_back(parent == 0 ? -1 : row_[r].fed[parent]);
        row_[r].fed[v] = static_cast<int64_t>(nodes[r].parents.size()) - 1 + row_[r].tentative;
      }
      feed[r] = static_cast<int64_t>(picked.size()) == newest.numel()
                    ? newest  // expand() ascends: all of the depth, in order
                    : newest.index_select(0, upload(picked, device_));
    }
    return any;
  }

  // Every fed row's level from a fused call's draws.
  void keep_fused_level(const std::vector<TreeDraft*>& drafts, const std::vector<at::Tensor>& feed,
                        const FusedLevel& fused, TreeLevels& found) {
    const size_t count = drafts.size();
    for (size_t r = 0; r < count; ++r) {
      if (!feed[r].defined()) continue;
      const TreeDraft& draft = *drafts[r];
      const auto row = static_cast<int64_t>(r), n = fused.nodes, k = fused.children;
      found.maxima[r].push_back(fused.maximum.narrow(0, row * n, n));
      found.q[r].resize(draft.size());
      for (int64_t i = 0; i < n; ++i) found.q[r][draft.expand()[i]] = fused.q.narrow(0, row * n + i, 1);
      found.tokens[r].push_back(fused.tokens.narrow(0, row * n * k, n * k));
      drafts[r]->grow(std::vector<int64_t>(n * k, -1), {});
      row_[r].fed.resize(draft.size(), -1);
    }
  }

  // Every fed row's level at once from the level's logits: one standardization, one draw of the children (each
  // row from its own generator, as alone); the sibling's laws beside the draft's where it ran. Row r's level rows:
  // after its last pending token (the root), or one per expanded node.
  void draw_level(const std::vector<TreeDraft*>& drafts, const std::vector<at::Tensor>& feed,
                  const std::vector<at::Tensor>& sibling_feed, const std::vector<at::Tensor>& logits,
                  const std::vector<at::Tensor>& sibling_logits, bool first, const SamplingConfig& config,
                  Siblings siblings, std::vector<at::Generator>& generators, TreeLevels& found) {
    const size_t count = drafts.size();
    const bool sibling_any = !sibling_logits.empty();
    std::vector<size_t> level;
    std::vector<at::Tensor> raws, sibling_raws;
    std::vector<int64_t> counts, sizes;  // every node's child count; each row's children
    std::vector<DrawGroup> groups;
    bool grown = false;
    for (size_t r = 0; r < count; ++r) {
      if (!feed[r].defined()) continue;
      const TreeDraft& draft = *drafts[r];
      const auto n = static_cast<int64_t>(draft.expand().size());
      auto level_rows = [&](const at::Tensor& all, const at::Tensor& fed) {
        return first ? all.narrow(0, fed.numel() - 1, 1) : all.narrow(0, 0, n);
      };
      raws.push_back(level_rows(logits[r], feed[r]));
      if (sibling_any) {  // a row without the sibling here has one child per node: the draft's rows, never read
        sibling_raws.push_back(sibling_feed[r].defined() ? level_rows(sibling_logits[r], sibling_feed[r])
                                                         : raws.back());
      }
      counts.insert(counts.end(), draft.counts().begin(), draft.counts().end());
      sizes.push_back(std::accumulate(draft.counts().begin(), draft.counts().end(), int64_t{0}));
      groups.push_back({&generators[r], n});
      level.push_back(r);
      grown = grown || draft.values();
    }
    const at::Tensor raw = joined(raws);  // [nodes, V]
    // The raw rows' finiteness witnesses: their maxima, or on the accelerators' path when sampling at T >= 1 the
    // draws' masses (standardizing needs no row maximum there: step.cpp's draft steps do the same)
    const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0 && mode_.tensors;
    at::Tensor maximum, sibling_maximum, sibling_raw, sibling_q;
    const at::Tensor q = standardize(raw, config, witness_is_mass ? nullptr : &maximum);
    if (sibling_any) {
      require(!grown, "a sibling draft drafts trees of a fixed shape, not grown ones");
      sibling_raw = joined(sibling_raws);
      sibling_q = standardize(sibling_raw, config, &sibling_maximum);
    }
    const at::Tensor children =  // [sum counts] on the device
        draw_children(config.greedy() ? raw : q, counts, siblings, config.greedy(), groups,
                      witness_is_mass ? &maximum : nullptr, config.greedy() ? sibling_raw : sibling_q);
    if (witness_is_mass) maximum = maximum.squeeze(1);
    // A fixed shape needs no host copy of its tokens; a grown one reads the level's tokens and values (one read
    // for every row).
    at::Tensor host;
    if (grown) {
      const at::Tensor values = child_log_values(q, raw, children, counts, config.greedy());
      host = to_host(at::cat({children.to(at::kDouble), values}));
    }
    for (size_t j = 0, node = 0, child = 0; j < level.size(); node += groups[j].rows, child += sizes[j], ++j) {
      const size_t r = level[j];
      TreeDraft& draft = *drafts[r];
      const int64_t k = sizes[j];
      found.maxima[r].push_back(maximum.narrow(0, node, groups[j].rows));
      found.q[r].resize(draft.size());
      for (int64_t i = 0; i < groups[j].rows; ++i) found.q[r][draft.expand()[i]] = q.narrow(0, node + i, 1);
      if (sibling_any) {
        found.maxima[r].push_back(sibling_maximum.narrow(0, node, groups[j].rows).to(maximum.scalar_type()));
        found.sibling_q[r].resize(draft.size());
        for (int64_t i = 0; i < groups[j].rows; ++i) {
          found.sibling_q[r][draft.expand()[i]] = sibling_q.narrow(0, node + i, 1);
        }
      }
      found.tokens[r].push_back(children.narrow(0, child, k));
      std::vector<int64_t> ids(k, -1);
      std::vector<double> log_q;
      if (draft.values()) {
        const double* h = host.const_data_ptr<double>();
        for (int64_t i = 0; i < k; ++i) ids[i] = static_cast<int64_t>(h[child + i]);
        log_q.assign(h + children.numel() + child, h + children.numel() + child + k);
      }
      draft.grow(ids, log_q);
      row_[r].fed.resize(draft.size(), -1);
    }
  }

  // The proposals: each row's tree, its tokens breadth-first, and the laws every node's row holds.
  std::vector<Proposal> finish_trees(const std::vector<TreeDraft*>& drafts, TreeLevels& found) {
    const size_t count = drafts.size();
    std::vector<Proposal> out(count);
    for (size_t r = 0; r < count; ++r) {
      out[r].seconds = found.seconds[r];
      out[r].calls = found.calls[r];
      if (!drafts[r]) continue;
      out[r].tree = drafts[r]->tree();
      row_[r].tree = out[r].tree;
      row_[r].last = at::cat(found.tokens[r]);  // breadth-first: depth by depth, the root first
      out[r].tokens = row_[r].last.narrow(0, 1, out[r].tree.size() - 1);
      if (out[r].tree.size() == 1) continue;
      found.q[r].resize(out[r].tree.size());
      for (auto& q : found.q[r]) {  // leaves: a row nothing reads (Proposal), the root's (it always has
        if (!q.defined()) q = found.q[r][0];  // children here)
      }
      out[r].q = at::cat(found.q[r]);
      if (sibling_) {
        found.sibling_q[r].resize(out[r].tree.size());
        // leaves and nodes the sibling did not run on: the draft's rows (nothing reads them)
        for (size_t v = 0; v < found.sibling_q[r].size(); ++v) {
          if (!found.sibling_q[r][v].defined()) found.sibling_q[r][v] = found.q[r][v];
        }
        out[r].sibling_q = at::cat(found.sibling_q[r]);
      }
      if (!found.maxima[r].empty()) out[r].maxima = at::cat(found.maxima[r]);
    }
    return out;
  }

  std::unique_ptr<ModelRows> rows_, sibling_;
  at::Device device_;
  int64_t vocab_;
  bool trees_;  // the rows draft token trees (else chains)
  DraftMode mode_;  // the current proposal's (draw)
  double stop_below_;  // chains: the confidence stop (0: none)
  // One row's state between iterations (the class comment's invariant).
  struct Row {
    at::Tensor pending;             // [m] int64 on the device: fed first in the next proposal
    at::Tensor last;                // [k] the row's last proposal (a tree's: [N + 1], by node)
    int64_t proposed = 0;           // its length (chains)
    std::optional<Tree> tree;       // the row's last tree (none: a chain, or no tree)
    std::vector<int64_t> fed;       // per node of that tree: its tentative node, -1 if never fed
    int64_t tentative = 0;          // tentative nodes fed so far in the row's current tree
    at::Tensor sibling_pending;     // the sibling's pending tokens, as pending (its own: it may lag)
    int64_t sibling_tentative = 0;  // tentative nodes fed to the sibling in the current tree
    bool sibling_ran = false;       // whether the sibling ran on the current tree's root
  };
  std::vector<Row> row_;
};

// The facts of a draft model (with its sibling's limits and lock where it has one).
DrafterFacts model_facts(Model& model, Model* sibling) {
  DrafterFacts facts{sibling ? "model with a sibling draft" : "model", model.vocab_size(), model.device(),
                     model.encoder_decoder(), model.max_length(), model.max_source_length(),
                     [&model, sibling] {
                       const std::string why = model.tree_obstacle();
                       const std::string sibling_why = sibling ? sibling->tree_obstacle() : "";
                       return !why.empty() || sibling_why.empty() ? why
                                                                   : fmt::format("the sibling draft: {}", sibling_why);
                     },
                     &model, {&model.in_use()}};
  if (!sibling) return facts;
  if (const std::optional<int64_t> other = sibling->max_length()) {
    facts.max_length = facts.max_length ? std::min(*facts.max_length, *other) : *other;
  }
  facts.locks.push_back(&sibling->in_use());
  return facts;
}

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling, double stop_below)
      : Drafter(model_facts(*model, sibling.get())), model_(std::move(model)), sibling_(std::move(sibling)),
        stop_below_(stop_below) {}

 protected:
  std::unique_ptr<DraftRows> make_rows(int64_t count, Shapes shapes, bool trees) override {
    if (!trees) {
      require(!sibling_, "a sibling draft drafts token trees only (tree=...), not chains");
      return std::make_unique<ModelDraftRows>(model_->rows(count, shapes), model_->device(), model_->vocab_size(),
                                              false, nullptr, stop_below_);
    }
    require(stop_below_ == 0.0, "draft_confidence stops chains: a token tree's levels are laid out before it is "
            "drawn (tree= with draft_confidence)");
    return std::make_unique<ModelDraftRows>(model_->tree_rows(count, shapes), model_->device(), model_->vocab_size(),
                                            true, sibling_ ? sibling_->tree_rows(count, shapes) : nullptr);
  }

 private:
  std::shared_ptr<Model> model_, sibling_;
  double stop_below_;
};

}  // namespace

std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling,
                                       double stop_below) {
  require(model != nullptr, "draft must be a model");
  require(stop_below >= 0.0 && stop_below <= 1.0, "draft_confidence must be in [0, 1] (0: no stop), got {}",
          stop_below);
  if (sibling) {
    require(sibling.get() != model.get(), "sibling_draft must be another model than the draft (each keeps a cache)");
    require(sibling->vocab_size() == model->vocab_size(), "sibling_draft's vocabulary ({}) must be the draft's ({})",
            sibling->vocab_size(), model->vocab_size());
    require(sibling->device() == model->device(), "sibling_draft must be on the draft's device {}, got {}",
            model->device().str(), sibling->device().str());
    require(!sibling->encoder_decoder() && !model->encoder_decoder(),
            "sibling_draft: decoder-only models only (token trees of encoder-decoders draft with one model)");
  }
  return std::make_shared<ModelDrafter>(std::move(model), std::move(sibling), stop_below);
}

}  // namespace speculant
