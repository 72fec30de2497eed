// What proposes the draft tokens of Algorithm 1. Any proposal keeps the output law exact as long as each
// x_i was drawn from the q_i it reports (the verification corrects for q whatever it is), so drafters may be
// neural (a draft Model with its own cache), negligible-cost tables (unigram / bigram, the paper's Table 3),
// copies from the context (prompt lookup, §3.6: q is the point mass on the proposed token) or Python code.
//
// Two protocols, one per kind of state. A drafter over one sequence (SequenceDrafter) writes propose(context, gamma) ->
// k <= gamma tokens with their q, and, to draft token trees, laws(context, paths): the engine keeps the contexts,
// serves a batch's rows one by one and draws trees from the laws. A drafter with state on the device (a draft model's
// caches, a hierarchical draft's batch) writes DraftRows over a batch's rows: begin, draw (a chain or a tree for each
// row, as its Layout says), and commit (what the target kept, or a restart). A drafter may propose fewer than gamma
// tokens (k = 0: the iteration runs the target alone), for example when prompt lookup finds no match.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/rows.h"
#include "math/sampling.h"
#include "loop/stats.h"
#include "math/tree.h"
#include "drafting/tree_growth.h"

namespace speculant {

// What one row drafts in an iteration (DraftRows::propose): a chain of at most `gamma` drafts (the tree [1] * k,
// k <= gamma: a chain drafter may stop early), or the tree a TreeDraft lays out level by level (tree_growth.h).
struct Layout {
  int64_t gamma = 0;          // a chain's most drafts (0 and no tree: the row drafts nothing)
  TreeDraft* tree = nullptr;  // a tree's plan, or null for a chain
  bool drafts() const { return tree != nullptr || gamma > 0; }
};

// How a generation's drafts run, chosen by the loop once per generation (Batch): on the tensor path (accelerators,
// or a CPU under speculant.testing.tensor_path) a drafter may draw a proposal's uniforms at once, run rows of one
// gamma together and fuse its draws into fixed-shape model calls; on the host kernels it does none of these. profile:
// the time of each model call waits for the device.
struct DraftMode {
  bool tensors = false;
  bool profile = false;
};

// One row's drafts for one iteration, chains and trees alike: a chain of k drafts is the tree [1] * k (tree.h).
struct Proposal {
  Tree tree;          // the tree drafted (the root alone when the row drafted nothing)
  at::Tensor tokens;  // int64 [N] on the device: node i's token at i - 1 (node 0, the root, is the row's last token)
  at::Tensor q;       // [n, V] on the device, rows summing to 1: row i the law node i's children were drawn from. A
                      // chain gives N rows (its leaf has none), a tree N + 1 (its leaves' rows are not read).
  at::Tensor sibling_q;  // as q, the law children 1 .. k - 1 were drawn from: a sibling draft's (tree.h; undefined
                         // without one)
  at::Tensor maxima;  // finiteness witnesses of the raw logits still to check (row maxima or draw masses; may be
                      // undefined)
  bool finite = true;    // the raw logits checked on the host were finite
  double seconds = 0.0;  // time inside model calls (the rest of propose counts as the engine's)
  int64_t calls = 0;     // draft model calls made
  std::vector<Iteration> inner;  // a hierarchical draft's iterations that made these tokens (hierarchy.h)

  int64_t size() const { return tokens.defined() ? tokens.numel() : 0; }  // N
};

// What row r's target kept of its drafter's last proposal, or a restart: DraftRows::commit.
struct Commit {
  // -1: the sequence grew by the drafts `path` and t. Else a restart: the sequence is now its first `keep`
  // tokens (1 <= keep <= its length) followed by t (how a hierarchical draft takes back the drafts its own
  // target rejected: hierarchy.h); path is empty.
  int64_t keep = -1;
  std::vector<int64_t> path;    // the kept drafts by depth: a tree's node ids (the root excluded); a chain's
                                // 1 .. accepted, the nodes of the tree [1] * gamma
  std::vector<int64_t> tokens;  // their token ids, on the host
  at::Tensor t;                 // the token the target appended: int64 [1] on the device
  int64_t t_host = 0;           // and on the host

  static Commit accepted(std::vector<int64_t> path, std::vector<int64_t> tokens, at::Tensor t, int64_t t_host);
  static Commit restart(int64_t keep, at::Tensor t, int64_t t_host);
};

// The drafter state of a batch's rows for one generation (rows.h): begin, then per iteration propose, then commit
// for every row.
class DraftRows {
 public:
  virtual ~DraftRows() = default;
  // Each row's source (encoder-decoders; empty for decoder-only models) and sequence so far: int64 [P_r >= 1]
  // on the device, and its host copy.
  virtual void begin(const std::vector<at::Tensor>& sources, const std::vector<at::Tensor>& prompts,
                     const std::vector<std::vector<int64_t>>& host_prompts) = 0;
  // Each row's drafts as layouts[r] has them, row r drawing with generators[r]: a chain of up to gamma tokens, or
  // the tree the row's TreeDraft lays out, each node's children drawn from the draft's q there by draw_children
  // (greedy: the top k of its raw logits) the way `siblings` says. Only rows made for trees (Drafter::rows) draft
  // trees. Every proposal's tree is set: a chain's from its tokens.
  std::vector<Proposal> propose(const std::vector<Layout>& layouts, const SamplingConfig& config, Siblings siblings,
                                std::vector<at::Generator>& generators, DraftMode mode);
  virtual void commit(int64_t row, const Commit& commit) = 0;
  // A hierarchical draft's statistics of row r at each level below (hierarchy.h); empty for other drafters.
  virtual std::vector<Stats> levels(int64_t row) const {
    (void)row;
    return {};
  }

 protected:
  // propose's drafts; propose sets a chain's tree.
  virtual std::vector<Proposal> draw(const std::vector<Layout>& layouts, const SamplingConfig& config,
                                     Siblings siblings, std::vector<at::Generator>& generators, DraftMode mode) = 0;
};

// What the decoder checks a drafter by, fixed when the drafter is made.
struct DrafterFacts {
  std::string name;
  int64_t vocab_size = 0;
  at::Device device = at::kCPU;
  bool encoder_decoder = false;
  std::optional<int64_t> max_length, max_source_length;
  // Why it cannot propose token trees, or "" when it can: asked only when trees are (a model answers with a probe
  // call, which a compiled model would compile).
  std::function<std::string()> tree_obstacle = [] { return std::string(); };
  Model* model = nullptr;      // the model that drafts, if any: the decoder checks its shapes and kind
  std::vector<std::mutex*> locks;  // what a generation locks: the mutex of each model whose cache it uses (a
                                   // hierarchical draft has several); none: the drafter's own
};

// What the decoder holds: a drafter of some kind, which makes the state of `count` rows per generation.
class Drafter {
 public:
  explicit Drafter(DrafterFacts facts) : facts_(std::move(facts)) {}
  Drafter(const Drafter&) = delete;
  Drafter& operator=(const Drafter&) = delete;
  virtual ~Drafter() = default;

  // `shapes`: of a draft model's calls (rows.h); `trees`: rows that propose token trees (ValueError naming
  // tree_obstacle() when the drafter cannot).
  std::unique_ptr<DraftRows> rows(int64_t count, Shapes shapes, bool trees);

  const std::string& name() const { return facts_.name; }
  int64_t vocab_size() const { return facts_.vocab_size; }
  at::Device device() const { return facts_.device; }
  bool encoder_decoder() const { return facts_.encoder_decoder; }
  std::optional<int64_t> max_length() const { return facts_.max_length; }
  std::optional<int64_t> max_source_length() const { return facts_.max_source_length; }
  std::string tree_obstacle() const { return facts_.tree_obstacle(); }
  Model* model() const { return facts_.model; }
  std::vector<std::mutex*> locks() {
    return facts_.locks.empty() ? std::vector<std::mutex*>{&in_use_} : facts_.locks;
  }

 protected:
  virtual std::unique_ptr<DraftRows> make_rows(int64_t count, Shapes shapes, bool trees) = 0;

 private:
  DrafterFacts facts_;
  std::mutex in_use_;
};

// The protocol a new drafter over one sequence writes (tables, prompt lookup, Python code): the engine keeps
// each row's context (the prompt and every token emitted since), runs the rows of a batch one by one, and
// draws a token tree's children from laws().
class SequenceDrafter : public Drafter {
 public:
  using Drafter::Drafter;
  // Up to gamma >= 1 tokens to follow `context` (host ids), each drawn with `generator` from the q row reported
  // with it (rows sum to 1, on the device). Fewer (none: the iteration runs the target alone) is fine.
  virtual Proposal propose(const std::vector<int64_t>& context, int64_t gamma, const SamplingConfig& config,
                           at::Generator& generator) = 0;
  // Token trees (drafters whose facts name no tree obstacle): for each path (the tokens after `context`), the law
  // q [n, V] a node's children are drawn from there (rows sum to 1, on the device), and *scores [n, V] the values
  // whose top k are its children at temperature 0 (their log_softmax: a grown tree's values there).
  virtual at::Tensor laws(const std::vector<int64_t>& context, const std::vector<std::vector<int64_t>>& paths,
                          const SamplingConfig& config, at::Tensor* scores);

 protected:
  std::unique_ptr<DraftRows> make_rows(int64_t count, Shapes shapes, bool trees) final;
};

}  // namespace speculant
