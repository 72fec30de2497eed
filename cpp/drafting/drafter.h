// What proposes the draft tokens of Algorithm 1. Any proposal keeps the output law exact as long as each
// x_i was drawn from the q_i it reports (the verification corrects for q whatever it is), so drafters may be
// neural (a draft Model with its own cache), negligible-cost tables (unigram / bigram, the paper's Table 3),
// copies from the context (prompt lookup, §3.6: q is the point mass on the proposed token) or Python code.
//
// Protocol, per sequence and generation: begin(prompt) (after encode(source) for encoder-decoders), then per iteration
// propose(gamma) -> k <= gamma tokens, then advance(accepted, t): the sequence grew by the first `accepted`
// proposed tokens and t. A drafter may propose fewer than gamma tokens (k = 0: the iteration runs the target
// alone), for example when prompt lookup finds no match. Between iterations, restart(length, t) cuts the
// sequence to its first `length` tokens and appends t: how a hierarchical draft (hierarchy.h) takes back the
// drafts its own target rejected.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/rows.h"
#include "math/sampling.h"
#include "loop/stats.h"
#include "math/tree.h"
#include "drafting/tree_growth.h"

namespace speculant {

struct Proposal {
  at::Tensor tokens;  // int64 [k] on the device
  at::Tensor q;       // [k, V] the distributions the tokens were drawn from (rows sum to 1), on the device
  at::Tensor maxima;  // [k'] row maxima of raw logits still to check for NaN / +inf (may be undefined)
  bool finite = true;  // the raw logits checked on the host were finite
  double seconds = 0.0;  // time inside model calls (the rest of propose counts as the engine's)
  int64_t calls = 0;     // draft model calls made
  std::vector<Iteration> inner;  // a hierarchical draft's iterations that made these tokens (hierarchy.h)
};

// A tree of drafts for one row (tree.h).
struct TreeProposal {
  Tree tree;          // the tree drafted (the root alone when the row drafted nothing)
  at::Tensor tokens;  // int64 [N + 1] on the device: node i's token; node 0 is the root, the row's last token
  at::Tensor q;       // [N + 1, V] row i: the standardized law node i's children were drawn from (leaves: not read)
  at::Tensor maxima;  // finiteness witnesses of the raw logits still to check (row maxima or draw masses; may be
                      // undefined)
  at::Tensor sibling_q;  // [N + 1, V] as q, the law children 1 .. k - 1 were drawn from: a sibling draft's (tree.h;
                         // undefined without one)
  double seconds = 0.0;
  int64_t calls = 0;
};

// The drafter state of a batch's rows (rows.h), the protocol above for each row r.
class DraftRows {
 public:
  virtual ~DraftRows() = default;
  virtual void encode(const std::vector<at::Tensor>& sources) = 0;
  // Each row's sequence so far: int64 [P_r >= 1] on the device, and its host copy.
  virtual void begin(const std::vector<at::Tensor>& prompts, const std::vector<std::vector<int64_t>>& host_prompts) = 0;
  // Up to gammas[r] tokens for each row (0: that row drafts nothing), row r drawing with generators[r].
  virtual std::vector<Proposal> propose(const std::vector<int64_t>& gammas, const SamplingConfig& config,
                                        std::vector<at::Generator>& generators, bool profile) = 0;
  // Row r's target kept the first `accepted` proposed tokens and appended t (on the device and on the host).
  virtual void advance(int64_t row, int64_t accepted, const at::Tensor& t, const std::vector<int64_t>& accepted_host,
                       int64_t t_host) = 0;
  // Row r's sequence is now its first `length` tokens (1 <= length <= its length) followed by t.
  virtual void restart(int64_t row, int64_t length, const at::Tensor& t, int64_t t_host) = 0;
  // A hierarchical draft's statistics of row r at each level below (hierarchy.h); empty for other drafters.
  virtual std::vector<Stats> levels(int64_t row) const {
    (void)row;
    return {};
  }

  // Token trees (drafters with Drafter::tree_obstacle() empty): for each row the tree drafts[r] lays out, level
  // by level (tree_growth.h; nullptr: the row drafts nothing), each node's children drawn from the draft's q at
  // it by draw_children (greedy: the top k of its raw logits), row r with generators[r]. Then advance_tree(row,
  // path, t, ...): row r's target kept the tree nodes `path` (root excluded, by depth), whose tokens are
  // path_tokens, and appended t.
  virtual std::vector<TreeProposal> propose_tree(const std::vector<TreeDraft*>& drafts, const SamplingConfig& config,
                                                 Siblings siblings, std::vector<at::Generator>& generators,
                                                 bool profile);
  virtual void advance_tree(int64_t row, const std::vector<int64_t>& path, const at::Tensor& t,
                            const std::vector<int64_t>& path_tokens, int64_t t_host);
};

// What the decoder holds: a drafter of some kind, which makes the state of `count` rows per generation.
class Drafter {
 public:
  Drafter() = default;
  Drafter(const Drafter&) {}  // a copy (a replica) has a lock of its own
  Drafter& operator=(const Drafter&) = delete;
  virtual ~Drafter() = default;
  // `shapes`: of a draft model's calls (rows.h); drafters without a model have no model calls to shape.
  virtual std::unique_ptr<DraftRows> rows(int64_t count, Shapes shapes) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual at::Device device() const = 0;
  virtual bool encoder_decoder() const { return false; }
  virtual std::optional<int64_t> max_length() const { return std::nullopt; }
  virtual std::optional<int64_t> max_source_length() const { return std::nullopt; }
  virtual std::string name() const = 0;
  // The model (if any) that drafts: the decoder checks its shapes and kind against the target's.
  virtual Model* model() { return nullptr; }
  // What the decoder locks for a generation: the mutex of each model whose cache this drafter uses (a
  // hierarchical draft has several), or the drafter's own.
  virtual std::vector<std::mutex*> locks() { return {model() ? &model()->in_use() : &in_use_}; }
  // Why this drafter cannot propose token trees, or "" when it can; tree_rows: rows that can (ValueError), their
  // model's calls shaped as rows()'s.
  virtual std::string tree_obstacle() const {
    return fmt::format("the {} drafter proposes chains only; a tree of drafts needs a draft model", name());
  }
  virtual std::unique_ptr<DraftRows> tree_rows(int64_t count, Shapes shapes);

  std::mutex& in_use() { return in_use_; }

 private:
  std::mutex in_use_;
};

// A drafter that follows one sequence (tables, prompt lookup, Python code): a batch runs one replica per row
// (this one is row 0's; the others are made once and kept).
class SequenceDrafter : public Drafter {
 public:
  SequenceDrafter() = default;
  SequenceDrafter(const SequenceDrafter& other) : Drafter(other) {}  // replicas keep no replicas
  virtual void encode(const at::Tensor& source) { (void)source; }
  virtual void begin(const at::Tensor& prompt, const std::vector<int64_t>& host_prompt) = 0;
  virtual Proposal propose(int64_t gamma, const SamplingConfig& config, at::Generator& generator, bool profile) = 0;
  virtual void advance(int64_t accepted, const at::Tensor& t, const std::vector<int64_t>& accepted_host,
                       int64_t t_host) = 0;
  virtual void restart(int64_t length, const at::Tensor& t, int64_t t_host) = 0;
  // An independent drafter of the same kind and parameters.
  virtual std::shared_ptr<SequenceDrafter> replica() const = 0;

  std::unique_ptr<DraftRows> rows(int64_t count, Shapes shapes) override;

  // Token trees, for drafters that give a law after any continuation (tree_obstacle() empty): tree_laws(paths)
  // is, for each path (the tokens after the sequence's last one, root_token()), the law q [n, V] (rows sum to
  // 1, on the device) a node's children are drawn from there, and *scores [n, V] the values whose top k are its
  // children at temperature 0 (their log_softmax: a grown tree's values there). propose_tree drafts the tree
  // `draft` lays out from them, level by level.
  virtual at::Tensor tree_laws(const std::vector<std::vector<int64_t>>& paths, const SamplingConfig& config,
                               at::Tensor* scores);
  virtual int64_t root_token() const;
  TreeProposal propose_tree(TreeDraft& draft, const SamplingConfig& config, Siblings siblings,
                            at::Generator& generator);
  void advance_tree(const std::vector<int64_t>& path_tokens, int64_t t_host) {
    advance(static_cast<int64_t>(path_tokens.size()), at::Tensor(), path_tokens, t_host);
  }
  std::unique_ptr<DraftRows> tree_rows(int64_t count, Shapes shapes) override;

 private:
  std::vector<std::shared_ptr<SequenceDrafter>> replicas_;
};

// A drafter that keeps the sequence on the host (prompt lookup, Python drafters): history() is the prompt
// followed by every token emitted so far.
class HostHistoryDrafter : public SequenceDrafter {
 public:
  int64_t root_token() const override { return history_.back(); }
  void begin(const at::Tensor&, const std::vector<int64_t>& host_prompt) override { history_ = host_prompt; }
  void advance(int64_t, const at::Tensor&, const std::vector<int64_t>& accepted_host, int64_t t_host) override {
    history_.insert(history_.end(), accepted_host.begin(), accepted_host.end());
    history_.push_back(t_host);
  }
  void restart(int64_t length, const at::Tensor&, int64_t t_host) override {
    history_.resize(length);
    history_.push_back(t_host);
  }

 protected:
  const std::vector<int64_t>& history() const { return history_; }

 private:
  std::vector<int64_t> history_;
};

// A neural draft model M_q with its own cache, sampled with the same standardization as the target (§2.2). With
// `sibling` (token trees only; tree.h's sibling drafts) a second model runs beside it on the same tree nodes (down to
// the deepest level that branches), with its own cache: each node's first child comes from the draft's law, the
// later children from the sibling's.
std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling = nullptr);

// Unigram / bigram tables over the vocabulary: log_unigram [V]; a bigram adds, per previous token a, the
// observed followers in CSR form (row_ptr [V + 1], followers, counts), smoothed with Witten-Bell
// interpolation: q(b | a) = (c(a, b) + T(a) u(b)) / (c(a) + T(a)), T(a) = distinct followers of a.
std::shared_ptr<Drafter> unigram_drafter(const at::Tensor& unigram, const at::Device& device);
std::shared_ptr<Drafter> bigram_drafter(const at::Tensor& unigram, const at::Tensor& row_ptr,
                                        const at::Tensor& followers, const at::Tensor& counts,
                                        const at::Device& device);

// Prompt lookup: the longest n-gram (max_ngram down to min_ngram) ending the sequence that occurred before
// in it; proposes (with q the point mass) the tokens that followed its latest earlier occurrence.
std::shared_ptr<Drafter> prompt_lookup_drafter(int64_t vocab_size, int64_t min_ngram, int64_t max_ngram,
                                               const at::Device& device);

}  // namespace speculant
