// The built-in drafters: a neural draft model, unigram / bigram tables, prompt lookup.
#include "drafting/drafter.h"

#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <optional>
#include <chrono>

#include "math/cpu_kernels.h"
#include "errors.h"
#include "loop/interrupt.h"
#include "device/join.h"
#include "math/step.h"
#include "device/upload.h"

namespace speculant {

std::vector<TreeProposal> DraftRows::propose_tree(const std::vector<TreeDraft*>&, const SamplingConfig&, Siblings,
                                                  std::vector<at::Generator>&, bool) {
  fail("these draft rows propose chains only");
}

void DraftRows::advance_tree(int64_t, const std::vector<int64_t>&, const at::Tensor&, const std::vector<int64_t>&,
                             int64_t) {
  fail("these draft rows propose chains only");
}

std::unique_ptr<DraftRows> Drafter::tree_rows(int64_t, Shapes) { fail("{}", tree_obstacle()); }

at::Tensor SequenceDrafter::tree_laws(const std::vector<std::vector<int64_t>>&, const SamplingConfig&, at::Tensor*) {
  fail("{}", tree_obstacle());
}

int64_t SequenceDrafter::root_token() const { fail("{}", tree_obstacle()); }

std::unique_ptr<DraftRows> SequenceDrafter::tree_rows(int64_t count, Shapes shapes) {
  const std::string why = tree_obstacle();
  require(why.empty(), "{}", why);
  return rows(count, shapes);
}

TreeProposal SequenceDrafter::propose_tree(TreeDraft& draft, const SamplingConfig& config, Siblings siblings,
                                           at::Generator& generator) {
  std::vector<std::vector<int64_t>> paths{{}};  // each node's tokens after the root
  std::vector<at::Tensor> qs{at::Tensor()};
  while (!draft.expand().empty()) {
    std::vector<std::vector<int64_t>> level_paths;
    for (const int64_t v : draft.expand()) level_paths.push_back(paths[v]);
    at::Tensor scores;
    const at::Tensor q = tree_laws(level_paths, config, &scores);  // [n, V]
    for (size_t i = 0; i < draft.expand().size(); ++i) qs[draft.expand()[i]] = q.narrow(0, static_cast<int64_t>(i), 1);
    const at::Tensor drawn = draw_children(config.greedy() ? scores : q, draft.counts(), siblings, config.greedy(),
                                           {{&generator, q.size(0)}});
    const at::Tensor children = drawn.to(at::kCPU);  // host ids: the next level's paths need them
    std::vector<int64_t> ids(children.data_ptr<int64_t>(), children.data_ptr<int64_t>() + children.numel());
    std::vector<double> log_q;
    if (draft.values()) {
      const at::Tensor host = child_log_values(q, scores, drawn, draft.counts(), config.greedy()).to(at::kCPU);
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
  TreeProposal out;
  out.tree = draft.tree();
  std::vector<int64_t> tokens{root_token()};
  for (int64_t v = 1; v < draft.size(); ++v) tokens.push_back(draft.token(v));
  out.tokens = at::tensor(tokens, at::TensorOptions(device()).dtype(at::kLong));
  if (draft.size() == 1) return out;
  const at::Tensor zeros = at::zeros_like(qs[0]);  // leaves: no children, no law
  for (auto& q : qs) {
    if (!q.defined()) q = zeros;
  }
  out.q = at::cat(qs);
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A draft Model's rows. Invariant between iterations, per row: the model has cached the sequence except
// `pending`, which it is fed first in the next proposal (the last token; also the last proposed token when all
// were kept, since the model sampled that token but never ran on it). Step i of a proposal is one call for
// every row still drafting.
// With `sibling` (token trees: tree.h's sibling drafts), a second model's rows whose laws at the expanded nodes
// draw the children after the first. It is fed as the draft is, level by level, but only up to the deepest level
// with a node of two or more children (TreeDraft::last_branching_depth): deeper, every node has one child, drawn
// from the draft's law, so the sibling's law there is never read (its rows in TreeProposal::sibling_q are the
// draft's). The accepted nodes it was not fed it is fed with the next tree's root (its own pending tokens).
class ModelDraftRows final : public DraftRows {
 public:
  ModelDraftRows(std::unique_ptr<ModelRows> rows, at::Device device, int64_t vocab,
                 std::unique_ptr<ModelRows> sibling = nullptr)
      : rows_(std::move(rows)), sibling_(std::move(sibling)), device_(device), vocab_(vocab),
        pending_(rows_->count()), last_(rows_->count()), proposed_(rows_->count(), 0), tree_(rows_->count()),
        fed_(rows_->count()), tentative_(rows_->count(), 0), sibling_pending_(rows_->count()),
        sibling_tentative_(rows_->count(), 0), sibling_ran_(rows_->count(), false) {}

  void encode(const std::vector<at::Tensor>& sources) override {
    rows_->encode(sources);
    if (sibling_) sibling_->encode(sources);
  }
  void begin(const std::vector<at::Tensor>& prompts, const std::vector<std::vector<int64_t>>&) override {
    std::vector<at::Tensor> cached(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      const int64_t length = prompts[r].numel();
      cached[r] = prompts[r].narrow(0, 0, length - 1);
      pending_[r] = prompts[r].narrow(0, length - 1, 1);
      sibling_pending_[r] = pending_[r];
    }
    rows_->reset(cached);
    if (sibling_) sibling_->reset(cached);
  }

  std::vector<Proposal> propose(const std::vector<int64_t>& gammas, const SamplingConfig& config,
                                std::vector<at::Generator>& generators, bool profile) override {
    const size_t count = gammas.size();
    std::vector<Proposal> out(count);
    std::vector<std::vector<at::Tensor>> x_rows(count), q_rows(count), maxima(count);
    std::vector<at::Tensor> feed(count);
    int64_t steps = 0;
    for (size_t r = 0; r < count; ++r) {
      proposed_[r] = gammas[r];
      steps = std::max(steps, gammas[r]);
    }
    const bool sync = profile && device_.is_cuda();
    // On the accelerators' path a row's uniforms for the whole proposal come in one operation, already scaled
    // for the inverse CDF (where a draw per step took two operations per step): a row's draws still depend on its
    // generator alone, as when alone.
    const bool tensor_path = count > 0 && !cpu::host_kernels(pending_[0]);
    std::vector<at::Tensor> uniforms(count);
    if (!config.greedy() && tensor_path) {
      for (size_t r = 0; r < count; ++r) {
        if (gammas[r] > 0) uniforms[r] = scaled_uniforms({gammas[r], 1}, generators[r], pending_[r].device());
      }
    }
    // Rows drafting the same gamma on that path: each step's draws kept as the batch's tensors and stacked once at
    // the end (three operations, where joining each row's took three per row)
    const bool together = tensor_path && steps > 0 &&
                          std::all_of(gammas.begin(), gammas.end(), [&](int64_t g) { return g == steps; });
    std::vector<at::Tensor> step_q, step_tokens, step_maxima;
    // Rows with fixed shapes on that path: each step's draws run inside the step's call (in its CUDA graph where
    // captured: rows.h, extend_then), from each row's uniform of the step (all rows: one sitting the step out
    // draws from 0.5, read by nothing)
    const bool fused = tensor_path && steps > 0 && rows_->fixed_shapes() && draft_draws_fit(vocab_);
    const ModelRows::Then draw = [&config](const at::Tensor& last, const std::vector<at::Tensor>& in) {
      return packed_draft_draws(last, config, config.greedy() ? at::Tensor() : in[0]);
    };
    const std::string what = fmt::format("the draft's draws (T {}, top-k {}, top-p {})", config.temperature,
                                         config.top_k, config.top_p);
    // fused, sampled: [steps, R], step i's uniforms its row i
    const at::Tensor step_uniforms = fused && !config.greedy() ? by_step(uniforms, gammas, steps) : at::Tensor();
    for (int64_t i = 0; i < steps; ++i) {
      if (i > 0) check_interrupt();  // the decoder checked before the first
      for (size_t r = 0; r < count; ++r) {
        feed[r] = i < gammas[r] ? (i == 0 ? pending_[r] : x_rows[r].back()) : at::Tensor();
      }
      const auto start = Clock::now();
      std::vector<at::Tensor> logits;  // [k_r, V] for the rows still drafting
      at::Tensor packed;               // fused: every row's draws [R, V + 2]
      if (fused) {
        std::vector<at::Tensor> in;
        if (step_uniforms.defined()) in.push_back(step_uniforms.narrow(0, i, 1).t());
        packed = rows_->extend_then(feed, in, draw, what);
      } else {
        logits = rows_->extend(feed);
      }
      if (sync) torch::cuda::synchronize();
      const double seconds = seconds_since(start);
      std::vector<size_t> drafting;
      std::vector<at::Tensor> last;  // each drafting row's distribution after its last fed token
      std::vector<at::Generator*> drawing;
      std::vector<at::Tensor> drawn;  // the drafting rows' uniforms of this step, where drawn above
      for (size_t r = 0; r < count; ++r) {
        if (i >= gammas[r]) continue;
        out[r].seconds += seconds;  // a batched call takes this long for each row in it
        drafting.push_back(r);
        if (fused) continue;
        last.push_back(logits[r].narrow(0, logits[r].size(0) - 1, 1));
        drawing.push_back(&generators[r]);
        if (uniforms[r].defined()) drawn.push_back(uniforms[r].narrow(0, i, 1));
      }
      DraftBatch batch;
      std::vector<DraftDraw> draws;
      if (fused) {  // every row's, of which the drafting rows' are read
        batch = unpack_draft_draws(packed);
        for (const size_t r : drafting) {
          const auto row = static_cast<int64_t>(r);
          draws.push_back({batch.q.narrow(0, row, 1), batch.tokens.narrow(0, row, 1),
                           batch.maximum.narrow(0, row, 1), true});
        }
      } else {
        draws = draft_steps(last, config, drawing, drawn, together ? &batch : nullptr);
      }
      if (together) {
        step_q.push_back(batch.q);
        step_tokens.push_back(batch.tokens);
        if (batch.maximum.defined()) step_maxima.push_back(batch.maximum);
      }
      for (size_t j = 0; j < drafting.size(); ++j) {
        const size_t r = drafting[j];
        x_rows[r].push_back(draws[j].token);  // the next step's input
        if (!together) {
          q_rows[r].push_back(draws[j].q);
          if (draws[j].maximum.defined()) maxima[r].push_back(draws[j].maximum);
        }
        out[r].finite = out[r].finite && draws[j].finite;
      }
    }
    at::Tensor all_tokens, all_q, all_maxima;  // together: [R, gamma], [R, gamma, V], [R, gamma]
    if (together) {
      all_tokens = at::stack(step_tokens, 1);
      all_q = at::stack(step_q, 1);
      if (!step_maxima.empty()) all_maxima = at::stack(step_maxima, 1);
    }
    for (size_t r = 0; r < count; ++r) {
      if (gammas[r] == 0) continue;
      const auto row = static_cast<int64_t>(r);
      out[r].calls = gammas[r];
      out[r].tokens = together ? all_tokens.select(0, row) : at::cat(x_rows[r], 0);
      out[r].q = together ? all_q.select(0, row) : at::cat(q_rows[r], 0);
      if (together && all_maxima.defined()) out[r].maxima = all_maxima.select(0, row);
      if (!together && !maxima[r].empty()) out[r].maxima = at::cat(maxima[r], 0);
      last_[r] = out[r].tokens;
    }
    return out;
  }

  // Level 0 feeds each row's pending tokens (they join the cache) and expands the root; each later level feeds
  // the nodes its draft expands as tentative nodes (rows.h: extend_tree, numbered in the order they are fed) and
  // draws their children. Nodes that are never expanded (leaves) are never fed.
  std::vector<TreeProposal> propose_tree(const std::vector<TreeDraft*>& drafts, const SamplingConfig& config,
                                         Siblings siblings, std::vector<at::Generator>& generators,
                                         bool profile) override {
    const size_t count = drafts.size();
    TreeLevels found(count);
    std::vector<int64_t> sibling_until(count, -1);  // the deepest level the sibling runs at, per row
    for (size_t r = 0; r < count; ++r) {
      tree_[r].reset();
      fed_[r].clear();
      tentative_[r] = 0;
      sibling_tentative_[r] = 0;
      sibling_ran_[r] = false;
      if (drafts[r]) found.tokens[r].push_back(pending_[r].narrow(0, pending_[r].numel() - 1, 1));
      if (drafts[r] && sibling_) sibling_until[r] = drafts[r]->last_branching_depth();
    }
    const bool sync = profile && device_.is_cuda();
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
        sibling_feed[r] = first ? sibling_pending_[r] : feed[r];
        if (!first) sibling_nodes[r] = nodes[r];
        sibling_any = true;
      }
      std::optional<FusedLevel> fused = fused_level(drafts, feed, config, siblings, generators);
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
        if (!first) tentative_[r] += feed[r].numel();
        if (!sibling_feed[r].defined()) continue;
        if (first) sibling_ran_[r] = true;
        else sibling_tentative_[r] += feed[r].numel();
      }
      if (fused) {  // every fed row's level from the call's draws
        keep_fused_level(drafts, feed, *fused, found);
        continue;
      }
      draw_level(drafts, feed, sibling_feed, logits, sibling_logits, first, config, siblings, generators, found);
    }
    return finish_trees(drafts, found);
  }

  void advance_tree(int64_t row, const std::vector<int64_t>& path, const at::Tensor& t, const std::vector<int64_t>&,
                    int64_t) override {
    const std::optional<Tree> tree = std::move(tree_[row]);
    tree_[row].reset();
    if (!tree || tree->size() == 1) {  // the model ran on nothing: the old pending tokens and t next time
      pending_[row] = at::cat({pending_[row], t});
      if (sibling_) sibling_pending_[row] = at::cat({sibling_pending_[row], t});
      return;
    }
    // It ran on the pending tokens and on every expanded node: keep the fed part of the path (all of it but
    // perhaps its last node, a leaf). The sibling ran on a prefix of the levels (its first tentative nodes), or on
    // none: it keeps the path's nodes it ran on and is fed the rest with t next time, after its old pending
    // tokens where it did not run on them.
    std::vector<int64_t> fed, sibling_fed;
    std::vector<at::Tensor> behind;
    if (sibling_ && !sibling_ran_[row]) behind.push_back(sibling_pending_[row]);
    for (const int64_t v : path) {
      if (fed_[row][v] >= 0) fed.push_back(fed_[row][v]);
      if (!sibling_) continue;
      if (fed_[row][v] >= 0 && fed_[row][v] < sibling_tentative_[row]) {
        sibling_fed.push_back(fed_[row][v]);
      } else {
        behind.push_back(last_[row].narrow(0, v, 1));
      }
    }
    rows_->commit({row}, {fed});
    if (sibling_) {
      if (sibling_ran_[row]) sibling_->commit({row}, {sibling_fed});
      behind.push_back(t);
      sibling_pending_[row] = at::cat(behind);
    }
    const bool leaf = !path.empty() && fed_[row][path.back()] < 0;
    pending_[row] = leaf ? at::cat({last_[row].narrow(0, path.back(), 1), t}) : t;
  }

  void restart(int64_t row, int64_t length, const at::Tensor& t, int64_t) override {
    if (sibling_) sibling_pending_[row] = restart_row(*sibling_, row, sibling_pending_[row], length, t);
    pending_[row] = restart_row(*rows_, row, pending_[row], length, t);
  }

  void advance(int64_t row, int64_t accepted, const at::Tensor& t, const std::vector<int64_t>&, int64_t) override {
    require(!sibling_, "a sibling draft drafts token trees only");
    const int64_t proposed = proposed_[row];
    if (proposed == 0) {  // the model ran on nothing: it is fed the old pending tokens and t next time
      pending_[row] = at::cat({pending_[row], t});
    } else if (accepted < proposed) {
      // it ran on pending + x_1 .. x_{k-1}: keep what precedes the rejected token, t becomes pending
      rows_->truncate(row, rows_->length(row) - (proposed - 1 - accepted));
      pending_[row] = t;
    } else {  // all kept: it never ran on x_k
      pending_[row] = at::cat({last_[row].narrow(0, proposed - 1, 1), t});
    }
  }

 private:
  // A tree level's draws inside its model call (rows.h: extend_then for the root's children, extend_tree_then for a
  // later level's): every row's n expanded nodes' q, their k children each and their finiteness witnesses, from the
  // uniforms drawn before the call (tree.h: children_uniforms) as draw_children would draw them. After run(): q
  // [R n, V] (a view), tokens int64 [R n k] and maximum [R n], row r's from r n (a row not fed: values nothing reads).
  struct FusedLevel {
    int64_t nodes = 0, children = 0;  // n, k
    at::Tensor uniforms;              // sampled: [R n, width], a row not fed 0.5
    ModelRows::Then then;
    std::string what;
    at::Tensor q, tokens, maximum;

    void run(ModelRows& rows, const std::vector<at::Tensor>& feed, const std::vector<ModelRows::TreeNodes>& fed,
             bool first) {
      std::vector<at::Tensor> in;
      if (uniforms.defined()) in.push_back(uniforms);
      const at::Tensor packed = first ? rows.extend_then(feed, in, then, what)
                                      : rows.extend_tree_then(feed, fed, in, then, what);
      const int64_t vocab = packed.size(1) - children - 1;
      q = packed.narrow(1, 0, vocab);
      tokens = packed.narrow(1, vocab, children).to(at::kLong).flatten();
      maximum = packed.select(1, vocab + children);
    }
  };

  // The level's draws inside its call where they can run there: rows with fixed shapes on the accelerators' path,
  // and every fed row's level the same n nodes of k children each (a fixed shape's, not grown); else nothing.
  std::optional<FusedLevel> fused_level(const std::vector<TreeDraft*>& drafts, const std::vector<at::Tensor>& feed,
                                        const SamplingConfig& config, Siblings siblings,
                                        std::vector<at::Generator>& generators) const {
    // (not with a sibling draft: its draws need the sibling's call too)
    if (sibling_ || !rows_->fixed_shapes() || !draft_draws_fit(vocab_) || cpu::host_kernels(pending_[0])) {
      return std::nullopt;
    }
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
    if (n == 0 || k > vocab_) return std::nullopt;  // draw_children refuses more children than tokens, by name
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
                             ? children_uniforms(std::vector<int64_t>(n, k), siblings, {{&generators[r], n}}, device_)
                             : at::full({n, width}, 0.5, at::TensorOptions(device_).dtype(at::kDouble)));
      }
      level.uniforms = joined(blocks);
    }
    level.then = [config, siblings, k](const at::Tensor& logits, const std::vector<at::Tensor>& in) {
      const at::Tensor raw = logits.dim() == 3 ? logits.reshape({-1, logits.size(2)}) : logits;  // [R n, V]
      // the finiteness witnesses as draft steps take them (step.cpp): the maxima, or at T >= 1 the draws' masses
      const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0;
      at::Tensor maximum;
      const at::Tensor q = standardize_generic(raw, config, witness_is_mass ? nullptr : &maximum);
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

  // Each row's uniforms [gamma_r, 1] as the columns of one [steps, R] tensor, 0.5 for the steps a row sits out.
  at::Tensor by_step(const std::vector<at::Tensor>& uniforms, const std::vector<int64_t>& gammas, int64_t steps) const {
    std::vector<at::Tensor> columns;
    for (size_t r = 0; r < gammas.size(); ++r) {
      if (gammas[r] == steps) {
        columns.push_back(uniforms[r]);
        continue;
      }
      columns.push_back(at::full({steps, 1}, 0.5, at::TensorOptions(device_).dtype(at::kDouble)));
      if (gammas[r] > 0) columns.back().narrow(0, 0, gammas[r]).copy_(uniforms[r]);
    }
    return columns.size() == 1 ? columns[0] : at::cat(columns, 1);
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
        feed[r] = pending_[r];
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
        nodes[r].parents.push_back(parent == 0 ? -1 : fed_[r][parent]);
        fed_[r][v] = static_cast<int64_t>(nodes[r].parents.size()) - 1 + tentative_[r];
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
      fed_[r].resize(draft.size(), -1);
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
    const bool witness_is_mass = !config.greedy() && config.temperature >= 1.0 && !cpu::host_kernels(raw);
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
      host = at::cat({children.to(at::kDouble), values}).to(at::kCPU);
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
      fed_[r].resize(draft.size(), -1);
    }
  }

  // The proposals: each row's tree, its tokens breadth-first, and the laws every node's row holds.
  std::vector<TreeProposal> finish_trees(const std::vector<TreeDraft*>& drafts, TreeLevels& found) {
    const size_t count = drafts.size();
    std::vector<TreeProposal> out(count);
    for (size_t r = 0; r < count; ++r) {
      out[r].seconds = found.seconds[r];
      out[r].calls = found.calls[r];
      if (!drafts[r]) continue;
      out[r].tree = drafts[r]->tree();
      tree_[r] = out[r].tree;
      out[r].tokens = at::cat(found.tokens[r]);  // breadth-first: depth by depth
      if (out[r].tree.size() == 1) continue;
      found.q[r].resize(out[r].tree.size());
      for (auto& q : found.q[r]) {  // leaves: a row nothing reads (TreeProposal), the root's (it always has
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
      last_[r] = out[r].tokens;
    }
    return out;
  }

  std::unique_ptr<ModelRows> rows_, sibling_;
  at::Device device_;
  int64_t vocab_;
  std::vector<at::Tensor> pending_;  // [m] int64 on the device, per row
  std::vector<at::Tensor> last_;     // [k] the row's last proposal (a tree's: [N + 1], by node)
  std::vector<int64_t> proposed_;    // its length (chains)
  std::vector<std::optional<Tree>> tree_;   // the row's last tree (none: a chain, or no tree)
  std::vector<std::vector<int64_t>> fed_;   // per node of that tree: its tentative node, -1 if never fed
  std::vector<int64_t> tentative_;          // tentative nodes fed so far in the row's current tree
  std::vector<at::Tensor> sibling_pending_;  // the sibling's pending tokens, as pending_ (its own: it may lag)
  std::vector<int64_t> sibling_tentative_;   // tentative nodes fed to the sibling in the current tree
  std::vector<char> sibling_ran_;            // whether the sibling ran on the current tree's root
};

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling)
      : model_(std::move(model)), sibling_(std::move(sibling)) {}

  std::unique_ptr<DraftRows> rows(int64_t count, Shapes shapes) override {
    require(!sibling_, "a sibling draft drafts token trees only (tree=...), not chains");
    return std::make_unique<ModelDraftRows>(model_->rows(count, shapes), model_->device(), model_->vocab_size());
  }
  int64_t vocab_size() const override { return model_->vocab_size(); }
  at::Device device() const override { return model_->device(); }
  bool encoder_decoder() const override { return model_->encoder_decoder(); }
  std::optional<int64_t> max_length() const override {
    std::optional<int64_t> out = model_->max_length();
    if (const std::optional<int64_t> other = sibling_ ? sibling_->max_length() : std::nullopt) {
      out = out ? std::min(*out, *other) : *other;
    }
    return out;
  }
  std::optional<int64_t> max_source_length() const override { return model_->max_source_length(); }
  std::string name() const override { return sibling_ ? "model with a sibling draft" : "model"; }
  Model* model() override { return model_.get(); }
  std::vector<std::mutex*> locks() override {
    std::vector<std::mutex*> out{&model_->in_use()};
    if (sibling_) out.push_back(&sibling_->in_use());
    return out;
  }
  std::string tree_obstacle() const override {
    const std::string why = model_->tree_obstacle();
    if (!why.empty() || !sibling_) return why;
    const std::string sibling_why = sibling_->tree_obstacle();
    return sibling_why.empty() ? "" : fmt::format("the sibling draft: {}", sibling_why);
  }
  std::unique_ptr<DraftRows> tree_rows(int64_t count, Shapes shapes) override {
    return std::make_unique<ModelDraftRows>(model_->tree_rows(count, shapes), model_->device(), model_->vocab_size(),
                                            sibling_ ? sibling_->tree_rows(count, shapes) : nullptr);
  }

 private:
  std::shared_ptr<Model> model_, sibling_;
};

// The rows of a batch as sequence drafters, one per row.
class SequenceRows final : public DraftRows {
 public:
  explicit SequenceRows(std::vector<SequenceDrafter*> drafters) : drafters_(std::move(drafters)) {}

  void encode(const std::vector<at::Tensor>& sources) override {
    for (size_t r = 0; r < drafters_.size(); ++r) drafters_[r]->encode(sources[r]);
  }
  void begin(const std::vector<at::Tensor>& prompts, const std::vector<std::vector<int64_t>>& host_prompts) override {
    for (size_t r = 0; r < drafters_.size(); ++r) drafters_[r]->begin(prompts[r], host_prompts[r]);
  }
  std::vector<Proposal> propose(const std::vector<int64_t>& gammas, const SamplingConfig& config,
                                std::vector<at::Generator>& generators, bool profile) override {
    std::vector<Proposal> out(drafters_.size());
    for (size_t r = 0; r < drafters_.size(); ++r) {
      if (gammas[r] > 0) out[r] = drafters_[r]->propose(gammas[r], config, generators[r], profile);
    }
    return out;
  }
  void advance(int64_t row, int64_t accepted, const at::Tensor& t, const std::vector<int64_t>& accepted_host,
               int64_t t_host) override {
    drafters_[row]->advance(accepted, t, accepted_host, t_host);
  }
  void restart(int64_t row, int64_t length, const at::Tensor& t, int64_t t_host) override {
    drafters_[row]->restart(length, t, t_host);
  }
  std::vector<TreeProposal> propose_tree(const std::vector<TreeDraft*>& drafts, const SamplingConfig& config,
                                         Siblings siblings, std::vector<at::Generator>& generators,
                                         bool) override {
    std::vector<TreeProposal> out(drafters_.size());
    for (size_t r = 0; r < drafters_.size(); ++r) {
      if (!drafts[r]) continue;
      const auto start = Clock::now();
      out[r] = drafters_[r]->propose_tree(*drafts[r], config, siblings, generators[r]);
      out[r].seconds = seconds_since(start);  // a drafter without a model: its time per drafted token is c
    }
    return out;
  }
  void advance_tree(int64_t row, const std::vector<int64_t>&, const at::Tensor&,
                    const std::vector<int64_t>& path_tokens, int64_t t_host) override {
    drafters_[row]->advance_tree(path_tokens, t_host);
  }

 private:
  std::vector<SequenceDrafter*> drafters_;
};

// Unigram / bigram tables. The rows are built on the host, standardized and sampled on the device.
class TableDrafter final : public SequenceDrafter {
 public:
  TableDrafter(const at::Tensor& unigram, std::optional<std::array<at::Tensor, 3>> bigram, const at::Device& device)
      : device_(device) {
    require(unigram.dim() == 1 && unigram.numel() > 0, "unigram must be a 1-D tensor of probabilities [V]");
    unigram_ = unigram.to(at::kDouble).contiguous();
    require(at::isfinite(unigram_).all().item<bool>() && (unigram_ > 0).all().item<bool>(),
            "unigram probabilities must be finite and positive (smooth the counts)");
    unigram_ = unigram_ / unigram_.sum();
    log_unigram_ = unigram_.log().to(at::kFloat).to(device_).view({1, -1});  // [1, V]
    if (bigram) {
      const int64_t vocab = unigram_.numel();
      row_ptr_ = (*bigram)[0].to(at::kLong).contiguous();
      followers_ = (*bigram)[1].to(at::kLong).contiguous();
      counts_ = (*bigram)[2].to(at::kDouble).contiguous();
      require(row_ptr_.dim() == 1 && row_ptr_.numel() == vocab + 1, "row_ptr must have V + 1 = {} entries, got {}",
              vocab + 1, row_ptr_.numel());
      require(followers_.numel() == counts_.numel() && row_ptr_[vocab].item<int64_t>() == followers_.numel() &&
                  row_ptr_[0].item<int64_t>() == 0,
              "followers and counts must hold row_ptr[V] = {} entries", row_ptr_[vocab].item<int64_t>());
      require(followers_.numel() == 0 || (followers_.min().item<int64_t>() >= 0 &&
                                           followers_.max().item<int64_t>() < vocab),
              "followers must be token ids in [0, {})", vocab);
      require(counts_.numel() == 0 || (counts_ > 0).all().item<bool>(), "bigram counts must be positive");
      require((row_ptr_.narrow(0, 1, vocab) >= row_ptr_.narrow(0, 0, vocab)).all().item<bool>(),
              "row_ptr must be nondecreasing");
    }
  }

  void begin(const at::Tensor&, const std::vector<int64_t>& host_prompt) override { last_ = host_prompt.back(); }

  Proposal propose(int64_t gamma, const SamplingConfig& config, at::Generator& generator, bool) override {
    Proposal out;
    if (gamma == 0) return out;
    std::vector<at::Tensor> x_rows, q_rows;
    int64_t previous = last_;
    for (int64_t i = 0; i < gamma; ++i) {
      DraftDraw draw = draft_step(logits_after(previous), config, generator);  // finite: log probabilities
      q_rows.push_back(draw.q);
      x_rows.push_back(draw.token);
      if (bigram()) previous = draw.token.item<int64_t>();  // the next row depends on it (a scalar read per token)
    }
    out.tokens = at::cat(x_rows, 0);
    out.q = at::cat(q_rows, 0);
    return out;
  }

  void advance(int64_t, const at::Tensor&, const std::vector<int64_t>&, int64_t t_host) override { last_ = t_host; }
  void restart(int64_t, const at::Tensor&, int64_t t_host) override { last_ = t_host; }
  std::shared_ptr<SequenceDrafter> replica() const override { return std::make_shared<TableDrafter>(*this); }

  // A table scores any continuation: its row after the path's last token, standardized as a draft model's.
  std::string tree_obstacle() const override { return ""; }
  int64_t root_token() const override { return last_; }
  at::Tensor tree_laws(const std::vector<std::vector<int64_t>>& paths, const SamplingConfig& config,
                       at::Tensor* scores) override {
    std::vector<at::Tensor> rows;
    for (const auto& path : paths) rows.push_back(logits_after(path.empty() ? last_ : path.back()));
    *scores = at::cat(rows);  // [n, V] log probabilities
    return standardize(*scores, config);
  }

  int64_t vocab_size() const override { return unigram_.numel(); }
  at::Device device() const override { return device_; }
  std::string name() const override { return bigram() ? "bigram" : "unigram"; }

 private:
  bool bigram() const { return row_ptr_.defined(); }

  // log q(. | previous) [1, V] on the device, kept once built (a row costs about ten tensor operations, more than
  // the draw from it) while the kept rows hold at most kCachedFloats values
  at::Tensor logits_after(int64_t previous) {
    if (!bigram()) return log_unigram_;
    if (rows_.empty()) rows_.resize(unigram_.numel());
    at::Tensor& kept = rows_[previous];
    if (kept.defined()) return kept;
    at::Tensor row = build_row(previous);
    if (cached_ + row.numel() <= kCachedFloats) {
      kept = row;
      cached_ += row.numel();
    }
    return row;
  }

  at::Tensor build_row(int64_t previous) const {
    // host tensors: read through pointers, not with per-element tensor ops
    const int64_t* row_ptr = row_ptr_.data_ptr<int64_t>();
    const int64_t begin = row_ptr[previous], end = row_ptr[previous + 1];
    if (begin == end) return log_unigram_;  // never seen followed by anything: the unigram
    at::Tensor counts = counts_.narrow(0, begin, end - begin);
    const double* c = counts_.data_ptr<double>();
    const double distinct = static_cast<double>(end - begin), total = std::accumulate(c + begin, c + end, 0.0);
    at::Tensor row = unigram_ * distinct;  // [V] Witten-Bell: T(a) u(b) + c(a, b), over c(a) + T(a)
    row.index_add_(0, followers_.narrow(0, begin, end - begin), counts);
    return (row / (total + distinct)).log().to(at::kFloat).to(device_).view({1, -1});
  }

  static constexpr int64_t kCachedFloats = int64_t{1} << 24;  // 64 MB of float rows

  at::Device device_;
  at::Tensor unigram_, log_unigram_, row_ptr_, followers_, counts_;
  std::vector<at::Tensor> rows_;  // [V] the rows built so far (undefined: not yet, or past the budget)
  int64_t cached_ = 0;            // floats held in rows_
  int64_t last_ = 0;
};

class PromptLookupDrafter final : public HostHistoryDrafter {
 public:
  PromptLookupDrafter(int64_t vocab, int64_t min_ngram, int64_t max_ngram, const at::Device& device)
      : vocab_(vocab), min_ngram_(min_ngram), max_ngram_(max_ngram), device_(device) {
    require(vocab >= 1, "vocab_size must be >= 1, got {}", vocab);
    require(min_ngram >= 1 && max_ngram >= min_ngram,
            "prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram = {}, max_ngram = {}", min_ngram,
            max_ngram);
  }

  Proposal propose(int64_t gamma, const SamplingConfig&, at::Generator&, bool) override {
    Proposal out;
    std::vector<int64_t> continuation = lookup(gamma);
    if (continuation.empty()) return out;
    auto options = at::TensorOptions(device_).dtype(at::kLong);
    out.tokens = at::tensor(continuation, options);                            // [k]
    out.q = at::one_hot(out.tokens, vocab_).to(at::kFloat);                    // [k, V] point masses
    return out;
  }

  int64_t vocab_size() const override { return vocab_; }
  at::Device device() const override { return device_; }
  std::string name() const override { return "prompt_lookup"; }
  std::shared_ptr<SequenceDrafter> replica() const override {
    return std::make_shared<PromptLookupDrafter>(vocab_, min_ngram_, max_ngram_, device_);
  }

 private:
  // The tokens after the latest earlier occurrence of the longest matching suffix n-gram, at most gamma.
  std::vector<int64_t> lookup(int64_t gamma) const {
    const int64_t length = static_cast<int64_t>(history().size());
    for (int64_t n = std::min(max_ngram_, length - 1); n >= min_ngram_; --n) {
      const int64_t* suffix = history().data() + length - n;
      for (int64_t start = length - n - 1; start >= 0; --start) {  // latest occurrence first
        if (std::equal(suffix, suffix + n, history().data() + start)) {
          const int64_t from = start + n, count = std::min(gamma, length - from);
          return {history().begin() + from, history().begin() + from + count};
        }
      }
    }
    return {};
  }

  int64_t vocab_, min_ngram_, max_ngram_;
  at::Device device_;
};

}  // namespace

std::unique_ptr<DraftRows> SequenceDrafter::rows(int64_t count, Shapes) {
  while (static_cast<int64_t>(replicas_.size()) < count - 1) replicas_.push_back(replica());
  std::vector<SequenceDrafter*> drafters{this};
  for (int64_t r = 1; r < count; ++r) drafters.push_back(replicas_[r - 1].get());
  return std::make_unique<SequenceRows>(std::move(drafters));
}

std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling) {
  require(model != nullptr, "draft must be a model");
  if (sibling) {
    require(sibling.get() != model.get(), "sibling_draft must be another model than the draft (each keeps a cache)");
    require(sibling->vocab_size() == model->vocab_size(), "sibling_draft's vocabulary ({}) must be the draft's ({})",
            sibling->vocab_size(), model->vocab_size());
    require(sibling->device() == model->device(), "sibling_draft must be on the draft's device {}, got {}",
            model->device().str(), sibling->device().str());
    require(!sibling->encoder_decoder() && !model->encoder_decoder(),
            "sibling_draft: decoder-only models only (token trees of encoder-decoders draft with one model)");
  }
  return std::make_shared<ModelDrafter>(std::move(model), std::move(sibling));
}

std::shared_ptr<Drafter> unigram_drafter(const at::Tensor& unigram, const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::nullopt, device);
}

std::shared_ptr<Drafter> bigram_drafter(const at::Tensor& unigram, const at::Tensor& row_ptr,
                                        const at::Tensor& followers, const at::Tensor& counts,
                                        const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::array<at::Tensor, 3>{row_ptr, followers, counts}, device);
}

std::shared_ptr<Drafter> prompt_lookup_drafter(int64_t vocab_size, int64_t min_ngram, int64_t max_ngram,
                                               const at::Device& device) {
  return std::make_shared<PromptLookupDrafter>(vocab_size, min_ngram, max_ngram, device);
}

}  // namespace speculant
