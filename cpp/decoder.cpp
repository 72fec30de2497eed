#include "decoder.h"

#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <random>

#include "errors.h"
#include "graphs.h"
#include "interrupt.h"
#include "step.h"

namespace speculant {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Accumulates the wall time of one phase into `total`, synchronizing an accelerator first when profiling.
class PhaseTimer {
 public:
  PhaseTimer(double& total, const at::Device& device, bool profile)
      : total_(total), sync_(profile && device.is_cuda()), start_(Clock::now()) {}
  ~PhaseTimer() {
    if (sync_) torch::cuda::synchronize();
    total_ += seconds_since(start_);
  }

 private:
  double& total_;
  bool sync_;
  Clock::time_point start_;
};

void check_ids(const std::vector<int64_t>& ids, const char* name, int64_t vocab) {
  require(!ids.empty(), "{} must hold at least one token id, got an empty sequence", name);
  for (size_t i = 0; i < ids.size(); ++i) {
    require(ids[i] >= 0 && ids[i] < vocab, "{}[{}] = {} is outside the vocabulary [0, {})", name, i, ids[i],
            vocab);
  }
}

void check_source_length(std::optional<int64_t> limit, const char* role, const std::string& name,
                         int64_t length) {
  if (limit) {
    require(length <= *limit, "{} model encodes at most max_source_length = {} tokens, {} has {}", role, *limit,
            name, length);
  }
}

void check_length(std::optional<int64_t> limit, const char* role, const std::string& name, int64_t needed) {
  if (limit) {
    require(needed <= *limit,
            "{} model holds at most max_length = {} positions, but {} plus max_new_tokens needs {} "
            "(prompt + max_new_tokens - 1)",
            role, *limit, name, needed);
  }
}

// Fixed shapes need a backend that has them; graphs, a CUDA model and a build with CUDA graphs.
void check_shapes(const Model* model, Shapes shapes, const char* role) {
  if (shapes == Shapes::dynamic) return;
  const std::string why = model->fixed_shapes_obstacle();
  require(why.empty(), "the {} ({} form) has no fixed-shape calls, so no CUDA graphs: {}", role, model->form(), why);
  if (shapes != Shapes::graphed) return;
  const std::string capture = model->capture_obstacle();
  require(capture.empty(), "the {} ({} form) cannot be captured into CUDA graphs: {}", role, model->form(), capture);
  require(model->device().is_cuda(), "CUDA graphs need a CUDA model; the {} is on {}", role,
          model->device().str());
  const std::string build = graphs_obstacle();
  require(build.empty(), "CUDA graphs of the {}: {}", role, build);
}

}  // namespace

Decoder::Decoder(std::shared_ptr<Model> target, std::shared_ptr<Drafter> draft, int64_t gamma,
                 SamplingConfig config, Shapes target_shapes, Shapes draft_shapes, std::vector<int64_t> tree,
                 Siblings siblings)
    : target_(std::move(target)), draft_(std::move(draft)), gamma_(gamma), config_(config),
      target_shapes_(target_shapes), draft_shapes_(draft_shapes), siblings_(siblings) {
  require(target_ != nullptr, "target must be a model");
  config_.validate();
  check_shapes(target_.get(), target_shapes_, "target");
  if (draft_ && draft_->model()) check_shapes(draft_->model(), draft_shapes_, "draft");
  if (!draft_) {
    require(gamma_ == 0, "gamma must be 0 without a draft model, got {}", gamma_);
    return;
  }
  require(gamma_ >= 1, "gamma must be an integer >= 1 (the number of draft tokens per iteration), got {}",
          gamma_);
  require(draft_->model() != target_.get(), "draft and target must be different model handles (each owns its "
                                            "cache); load the file twice to draft with the target itself");
  require(draft_->vocab_size() == target_->vocab_size(),
          "target and draft vocabularies differ: target vocab_size = {}, draft vocab_size = {}. Both models' "
          "logits must index one vocabulary, the same token ids. Models that share a tokenizer often pad their "
          "LM heads differently beyond it (to a multiple of 64 or 128): load the smaller one as a transformers "
          "model or save_pretrained directory with speculant.load(model_or_dir, vocab_size=<the larger size>), "
          "which gives its padded ids -inf logits (probability 0), so the output law stays exactly the "
          "target's. vocab_size= pads live models only: an exported file (.pt, .pt2) keeps the vocabulary it "
          "was exported with, so load that model from transformers (the object or its save_pretrained "
          "directory) instead of its file. A drafter from speculant.drafters takes the target's vocab_size when "
          "built. A draft with another tokenizer: SpeculativeDecoder(..., draft_tokenizer=, target_tokenizer=) "
          "drafts through text",
          target_->vocab_size(), draft_->vocab_size());
  require(draft_->model() == nullptr || draft_->encoder_decoder() == target_->encoder_decoder(),
          "target and draft must both be encoder-decoder models or both decoder-only: the target is {}, the "
          "draft is {}", target_->encoder_decoder() ? "encoder-decoder" : "decoder-only",
          draft_->encoder_decoder() ? "encoder-decoder" : "decoder-only");
  require(draft_->device() == target_->device(), "target and draft must be on the same device: target on {}, "
          "draft on {}", target_->device().str(), draft_->device().str());
  if (tree.empty()) return;
  require(static_cast<int64_t>(tree.size()) == gamma_, "gamma must be the tree's depth {}, got {}", tree.size(),
          gamma_);
  require(config_.lenience == 1.0, "lenience must be 1 with tree= (A.5's bound is proven for one draft per "
          "position, not for trees), got {}", config_.lenience);
  require(target_shapes_ == Shapes::dynamic && draft_shapes_ == Shapes::dynamic,
          "tree= runs dynamic shapes only: CUDA graphs and fixed shapes of tree calls are not built yet");
  const std::string target_why = target_->tree_obstacle(), draft_why = draft_->tree_obstacle();
  require(target_why.empty(), "tree=: the target ({} form) cannot verify a tree in one call: {}", target_->form(),
          target_why);
  require(draft_why.empty(), "tree=: the draft cannot propose trees: {}", draft_why);
  for (size_t depth = 0; depth <= tree.size(); ++depth) {
    trees_.push_back(Tree::from_shape(std::vector<int64_t>(tree.begin(), tree.begin() + depth)));
  }
  tree_shape_ = std::move(tree);
}

namespace {

// A row's name in messages: "prompt_ids" alone, "prompt_ids[2]" in a batch.
std::string row_name(const char* name, size_t row, size_t rows) {
  return rows == 1 ? std::string(name) : fmt::format("{}[{}]", name, row);
}

// One row of a batch between iterations: the target has cached the sequence except its last token,
// `pending`, which it is fed first in the next iteration; the drafter keeps its own state (drafter.h).
struct Row {
  Generation out;
  std::unique_ptr<GammaPolicy> policy;
  at::Generator generator;
  at::Tensor pending;           // [1] int64 on the device
  int64_t sequence_length = 0;  // tokens in the sequence, pending ones included
  bool running = true;
  // the current iteration
  int64_t limit = 0;            // most tokens to draft (a tree's depth)
  Proposal proposal;
  at::Tensor drafted;           // int64 [gamma] on the device
  const Tree* tree = nullptr;   // token trees: this iteration's tree and its drafts
  TreeProposal tree_proposal;
};

// One generate_batch call after its inputs are checked: the rows and the phases of an iteration of
// Algorithm 1 (draft, verify, accept and emit, roll back), each row on its own.
class Batch {
 public:
  struct Setup {
    Model& target;
    Drafter* draft;
    const SamplingConfig& config;
    int64_t max_new_tokens;
    const std::vector<int64_t>& eos_token_ids;
    bool profile;
    const std::vector<Tree>* trees;  // token trees (trees[i]: depth i); null for chains
    Siblings siblings;
  };

  Batch(const Setup& setup, std::vector<Row>& rows, std::unique_ptr<ModelRows> target_rows,
        std::unique_ptr<DraftRows> draft_rows)
      : s_(setup), rows_(rows), target_rows_(std::move(target_rows)), draft_rows_(std::move(draft_rows)),
        device_(setup.target.device()), start_(Clock::now()) {}

  // Encodes the sources and runs each prompt but its last token through both models.
  void prefill(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& sources) {
    const auto long_options = at::TensorOptions(device_).dtype(at::kLong);
    std::vector<at::Tensor> prompt_tensors(rows_.size()), cached(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) {
      const auto length = static_cast<int64_t>(prompts[r].size());
      prompt_tensors[r] = at::tensor(prompts[r], long_options);  // [P]
      cached[r] = prompt_tensors[r].narrow(0, 0, length - 1);
      rows_[r].pending = prompt_tensors[r].narrow(0, length - 1, 1);  // [1]
      rows_[r].sequence_length = length;
      rows_[r].running = s_.max_new_tokens > 0;
    }
    if (s_.max_new_tokens == 0) return;
    // Encoder-decoder: each model encodes each source once (cross-attention keys and values included).
    std::vector<at::Tensor> source_tensors;
    for (const auto& source : sources) source_tensors.push_back(at::tensor(source, long_options));  // [S]
    timed(&Stats::target_seconds, [&] {
      if (!source_tensors.empty()) target_rows_->encode(source_tensors);
      target_rows_->reset(cached);
    });
    if (draft_rows_) {
      timed(&Stats::draft_seconds, [&] {
        if (!source_tensors.empty()) draft_rows_->encode(source_tensors);
        draft_rows_->begin(prompt_tensors, prompts);
      });
    }
  }

  bool running() const {
    return std::any_of(rows_.begin(), rows_.end(), [](const Row& row) { return row.running; });
  }

  // Draft: up to gamma tokens for each running row, from the row's gamma policy. A longer draft than the
  // tokens still wanted would be wasted work (any gamma keeps the law exact); limit 0 only in a row's last
  // iteration (one token still wanted): nothing to draft.
  void draft() {
    std::vector<int64_t> limits(rows_.size());
    bool drafting = false;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      const int64_t wanted = row.running && row.policy ? row.policy->next() : 0;
      row.limit = row.running ? std::min<int64_t>(wanted, s_.max_new_tokens - row.out.stats.new_tokens - 1) : 0;
      row.proposal = Proposal{};
      limits[r] = row.limit;
      drafting = drafting || row.limit > 0;
    }
    if (s_.trees) {
      draft_trees();
      return;
    }
    if (drafting) {
      check_interrupt();  // the drafter checks again before each of its own model calls
      std::vector<at::Generator> generators;
      for (Row& row : rows_) generators.push_back(row.generator);  // handles: the rows' own generators
      const auto draft_start = Clock::now();
      std::vector<Proposal> proposals = draft_rows_->propose(limits, s_.config, generators, s_.profile);
      const double draft_total = seconds_since(draft_start);
      for (size_t r = 0; r < rows_.size(); ++r) {
        Row& row = rows_[r];
        if (row.limit == 0) continue;
        row.proposal = std::move(proposals[r]);
        row.out.stats.draft_seconds += row.proposal.calls > 0 ? row.proposal.seconds : draft_total;  // a table's
        row.out.stats.draft_calls += row.proposal.calls;
      }
    }
    const auto long_options = at::TensorOptions(device_).dtype(at::kLong);
    for (Row& row : rows_) {
      const bool proposed = row.proposal.tokens.defined() && row.proposal.tokens.numel() > 0;
      row.drafted = proposed ? row.proposal.tokens : at::empty({0}, long_options);  // [gamma]
    }
  }

  // Verify: Algorithm 1 runs M_p on prefix + [x_1 .. x_gamma] in parallel (one call for every running row),
  // then every running row's n leading acceptances and t ~ residual(p_{n+1}, q_{n+1}) at once (step.h), each
  // row with its own generator. Returns the verdicts of the running rows, in row order.
  std::vector<Verdict> verify() {
    std::vector<at::Tensor> inputs(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (rows_[r].running) inputs[r] = at::cat({rows_[r].pending, rows_[r].drafted});
    }
    check_interrupt();
    std::vector<at::Tensor> logits;
    timed(&Stats::target_seconds, [&] { logits = target_rows_->extend(inputs); });  // [pending + gamma, V]
    std::vector<VerifyInput> checks;
    std::vector<at::Generator*> generators;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!row.running) continue;
      const int64_t gamma = row.drafted.numel();
      checks.push_back({logits[r].narrow(0, logits[r].size(0) - gamma - 1, gamma + 1), row.proposal.q,
                        row.drafted, row.proposal.maxima, row.proposal.finite});
      generators.push_back(&row.generator);
    }
    return verify_rows(checks, s_.config, generators);
  }

  // Accept and emit, then roll back, for each running row (verdicts in row order, as verify returns them).
  void accept(std::vector<Verdict>& verdicts) {
    size_t next = 0;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!row.running) continue;
      Verdict& verdict = verdicts[next++];
      require_finite(row, r, verdict.finite);
      Iteration it = record(row, verdict);
      if (emitted_last(row, it)) continue;
      roll_back(static_cast<int64_t>(r), verdict, it);
      row.out.trace.push_back(std::move(it));
    }
  }

  // Token trees (tree.h): one target call for every running row's tree, then each row's multi-draft
  // verification. Returns the verdicts of the running rows, in row order.
  std::vector<TreeVerdict> verify_trees() {
    std::vector<at::Tensor> inputs(rows_.size());
    std::vector<ModelRows::TreeNodes> nodes(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!row.running) continue;
      const Tree& tree = *row.tree;
      const int64_t size = tree.size();
      inputs[r] = size > 1 ? at::cat({row.pending, row.tree_proposal.tokens.narrow(0, 1, size - 1)}) : row.pending;
      for (int64_t v = 0; v < size; ++v) {
        nodes[r].offsets.push_back(tree.depth(v));
        nodes[r].parents.push_back(tree.parent(v));
      }
    }
    check_interrupt();
    std::vector<at::Tensor> logits;
    timed(&Stats::target_seconds, [&] { logits = target_rows_->extend_tree(inputs, nodes); });  // [N + 1, V]
    std::vector<TreeVerdict> verdicts;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!row.running) continue;
      const at::Tensor q = row.tree_proposal.q.defined() ? row.tree_proposal.q : at::zeros_like(logits[r]);
      verdicts.push_back(verify_tree(*row.tree, logits[r], q, inputs[r], s_.config, s_.siblings, row.generator,
                                     row.tree_proposal.maxima));
    }
    return verdicts;
  }

  // Accept and emit, then roll back, for each running row's tree (verdicts as verify_trees returns them).
  void accept_trees(std::vector<TreeVerdict>& verdicts) {
    size_t next = 0;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!row.running) continue;
      TreeVerdict& verdict = verdicts[next++];
      require_finite(row, r, verdict.finite);
      Iteration it = record_tree(row, verdict);
      if (emitted_last(row, it)) continue;
      std::vector<int64_t> kept{0};  // the root (the pending token) and the accepted path
      kept.insert(kept.end(), verdict.path.begin(), verdict.path.end());
      target_rows_->commit(static_cast<int64_t>(r), kept);
      if (draft_rows_) {
        draft_rows_->advance_tree(static_cast<int64_t>(r), verdict.path, verdict.token, verdict.path_tokens,
                                  verdict.host_token);
      }
      row.pending = verdict.token;
      row.sequence_length += it.accepted + 1;
      row.out.trace.push_back(std::move(it));
    }
  }

  void finish() {
    for (Row& row : rows_) {
      if (row.out.stats.total_seconds == 0.0) row.out.stats.total_seconds = seconds_since(start_);
    }
  }

 private:
  // Runs `phase`, charging its time to every running row's `field` (model calls of a phase serve them all).
  template <typename Phase>
  void timed(double Stats::*field, const Phase& phase) {
    double seconds = 0.0;
    {
      PhaseTimer timer(seconds, device_, s_.profile);
      phase();
    }
    for (Row& row : rows_) {
      if (row.running) row.out.stats.*field += seconds;
    }
  }

  // The iteration's statistics: drafted and accepted per position, the betas (Theorem 3.5), the gamma policy.
  Iteration record(Row& row, Verdict& verdict) {
    Stats& stats = row.out.stats;
    const int64_t gamma = row.drafted.numel(), accepted = verdict.accepted;
    Iteration it;
    it.drafted = std::move(verdict.drafted);
    it.accepted = accepted;
    it.token = verdict.host_token;
    it.bonus = accepted == gamma;
    stats.target_calls += 1;
    stats.iterations += 1;
    stats.drafted_tokens += gamma;
    stats.accepted_tokens += accepted;
    for (int64_t i = 0; i < gamma; ++i) {
      stats.drafted_per_position[i] += 1;
      stats.accepted_per_position[i] += i < accepted;
    }
    const auto verified = static_cast<int64_t>(verdict.betas.size());  // min(accepted + 1, gamma)
    double beta_sum = 0.0;
    for (const double beta : verdict.betas) beta_sum += beta;
    stats.beta_sum += beta_sum;
    stats.beta_count += verified;
    if (row.policy && row.limit > 0) row.policy->observe(gamma, accepted, beta_sum, verified);
    return it;
  }

  // Token trees: each running row's tree (its first `limit` depths), drafted level by level for all rows at once.
  // Every node of a tree takes a cache slot until the accepted path is kept, so near max_length a row's tree
  // loses depths until its nodes fit beside the cached tokens (any tree chosen before drawing keeps the law
  // exact); the root alone always fits (check_inputs).
  void draft_trees() {
    std::vector<const Tree*> trees(rows_.size(), nullptr);
    bool drafting = false;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      while (row.running && row.limit > 0 && !fits(row.sequence_length - 1 + (*s_.trees)[row.limit].size())) {
        row.limit -= 1;
      }
      row.tree = row.running ? &(*s_.trees)[row.limit] : nullptr;
      row.tree_proposal = TreeProposal{};
      if (row.running && row.limit > 0) trees[r] = row.tree;
      drafting = drafting || trees[r] != nullptr;
    }
    if (!drafting) return;
    check_interrupt();
    std::vector<at::Generator> generators;
    for (Row& row : rows_) generators.push_back(row.generator);
    std::vector<TreeProposal> proposals =
        draft_rows_->propose_tree(trees, s_.config, s_.siblings, generators, s_.profile);
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (!trees[r]) continue;
      Row& row = rows_[r];
      row.tree_proposal = std::move(proposals[r]);
      row.out.stats.draft_seconds += row.tree_proposal.seconds;
      row.out.stats.draft_calls += row.tree_proposal.calls;
    }
  }

  // Whether both models' caches hold this many positions.
  bool fits(int64_t positions) const {
    const std::optional<int64_t> target = s_.target.max_length();
    const std::optional<int64_t> draft = s_.draft ? s_.draft->max_length() : std::nullopt;
    return (!target || positions <= *target) && (!draft || positions <= *draft);
  }

  // A tree iteration's statistics: the path as the accepted drafts, every node as drafted, the depths and
  // ranks of the acceptances (Stats::tree_visits / tree_accepted), the betas of the path's nodes.
  Iteration record_tree(Row& row, TreeVerdict& verdict) {
    Stats& stats = row.out.stats;
    const Tree& tree = *row.tree;
    const auto accepted = static_cast<int64_t>(verdict.path.size());
    Iteration it;
    it.drafted = verdict.path_tokens;
    it.accepted = accepted;
    it.token = verdict.host_token;
    it.bonus = accepted == tree.depth() && tree.depth() > 0;
    stats.target_calls += 1;
    stats.iterations += 1;
    stats.drafted_tokens += tree.size() - 1;
    stats.accepted_tokens += accepted;
    for (int64_t i = 0; i < tree.depth(); ++i) {
      stats.drafted_per_position[i] += 1;
      stats.accepted_per_position[i] += i < accepted;
    }
    for (size_t i = 0; i < verdict.accepted_rank.size(); ++i) {
      const int64_t node = i == 0 ? 0 : verdict.path[i - 1];
      if (tree.children(node) == 0) continue;
      stats.tree_visits[i] += 1;
      if (verdict.accepted_rank[i] >= 0) stats.tree_accepted[i][verdict.accepted_rank[i]] += 1;
    }
    for (const double beta : verdict.betas) stats.beta_sum += beta;
    stats.beta_count += static_cast<int64_t>(verdict.betas.size());
    return it;
  }

  // ValueError unless the verification of row r saw finite logits.
  void require_finite(const Row& row, size_t r, bool finite) const {
    require(finite, "model returned NaN or +inf logits, or an all -inf row, at sequence position {}{} "
            "(checked in every draft and target call)", row.sequence_length,
            rows_.size() == 1 ? std::string() : fmt::format(" of row {}", r));
  }

  // Emits the iteration's tokens; when that ends the row, records the iteration and the row's time and returns
  // true (nothing to roll back).
  bool emitted_last(Row& row, Iteration& it) {
    if (!emit(row, it)) return false;
    row.out.trace.push_back(std::move(it));
    row.running = false;
    row.out.stats.total_seconds = seconds_since(start_);
    return true;
  }

  // Emits x_1 .. x_n, t, stopping at max_new_tokens or just after an EOS. Returns whether the row stopped.
  bool emit(Row& row, Iteration& it) {
    Stats& stats = row.out.stats;
    for (int64_t i = 0; i <= it.accepted; ++i) {
      const int64_t token = i < it.accepted ? it.drafted[i] : it.token;
      row.out.tokens.push_back(token);
      it.emitted += 1;
      stats.new_tokens += 1;
      if (stats.new_tokens == s_.max_new_tokens || is_eos(token)) return true;
    }
    return false;
  }

  bool is_eos(int64_t token) const {
    return std::find(s_.eos_token_ids.begin(), s_.eos_token_ids.end(), token) != s_.eos_token_ids.end();
  }

  // Roll back: the target ran on pending + x_1..x_gamma; keep the accepted prefix, t becomes pending. The
  // draft's rollback is bookkeeping: counted in other_seconds, not in c's draft time.
  void roll_back(int64_t r, const Verdict& verdict, const Iteration& it) {
    Row& row = rows_[r];
    target_rows_->truncate(r, row.sequence_length + it.accepted);
    if (draft_rows_) {
      draft_rows_->advance(r, it.accepted, verdict.token,
                           std::vector<int64_t>(it.drafted.begin(), it.drafted.begin() + it.accepted), it.token);
    }
    row.pending = verdict.token;
    row.sequence_length += it.accepted + 1;
  }

  const Setup& s_;
  std::vector<Row>& rows_;
  std::unique_ptr<ModelRows> target_rows_;
  std::unique_ptr<DraftRows> draft_rows_;
  at::Device device_;
  Clock::time_point start_;
};

}  // namespace

std::vector<Generation> Decoder::generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                                const std::vector<std::vector<int64_t>>& sources,
                                                int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids,
                                                std::optional<uint64_t> seed, bool profile,
                                                const GammaSchedule& schedule) const {
  if (busy_->exchange(true)) {
    throw std::runtime_error("this decoder is already generating in another thread; a decoder runs one "
                             "generation at a time: create one decoder per thread (decoders may share models)");
  }
  struct Release {
    std::atomic<bool>& flag;
    ~Release() { flag = false; }
  } release{*busy_};
  check_inputs(prompts, sources, max_new_tokens, eos_token_ids);
  require(trees_.empty() || schedule.policy == "fixed", "gamma_policy must be \"fixed\" with tree= (the tree's "
          "shape is the draft's), got \"{}\"", schedule.policy);
  const size_t count = prompts.size();

  std::vector<Row> rows(count);
  const at::Device device = target_->device();
  for (size_t r = 0; r < count; ++r) {
    Row& row = rows[r];
    if (draft_) {
      // default max_gamma 2 gamma, saturating; no iteration drafts more than max_new_tokens - 1 tokens
      const int64_t twice = gamma_ > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max()
                                                                            : 2 * gamma_;
      row.policy = make_gamma_policy(schedule.policy, gamma_, schedule.max_gamma.value_or(twice), schedule.cost,
                                     max_new_tokens - 1);
    }
    Stats& stats = row.out.stats;
    const int64_t max_gamma = row.policy ? row.policy->max_gamma() : 0;
    stats.gamma = gamma_;
    stats.drafted_per_position.assign(max_gamma, 0);
    stats.accepted_per_position.assign(max_gamma, 0);
    stats.tree_visits.assign(tree_shape_.size(), 0);
    for (const int64_t children : tree_shape_) stats.tree_accepted.emplace_back(children, 0);
    stats.seed = seed ? *seed + r : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    row.generator = make_generator(device, stats.seed);
  }

  // No model call records an autograd graph, whatever its parameters' requires_grad (Python callbacks of
  // live models run on this thread and see the same mode).
  c10::InferenceMode inference_mode;

  // One generation at a time per model and drafter: each owns mutable state (its replicas included).
  std::unique_lock<std::mutex> target_lock(target_->in_use(), std::defer_lock);
  std::unique_lock<std::mutex> draft_lock;
  if (draft_) {
    // a draft model's cache may be shared by several drafters (one per decoder): lock the model itself
    std::mutex& draft_mutex = draft_->model() ? draft_->model()->in_use() : draft_->in_use();
    draft_lock = std::unique_lock<std::mutex>(draft_mutex, std::defer_lock);
    std::lock(target_lock, draft_lock);
  } else {
    target_lock.lock();
  }

  const bool trees = !trees_.empty();
  const Batch::Setup setup{*target_,      draft_.get(), config_,  max_new_tokens, eos_token_ids,
                           profile,       trees ? &trees_ : nullptr, siblings_};
  const auto rows_count = static_cast<int64_t>(count);
  std::unique_ptr<ModelRows> target_rows =
      trees ? target_->tree_rows(rows_count) : target_->rows(rows_count, target_shapes_);
  std::unique_ptr<DraftRows> draft_rows;
  if (draft_) draft_rows = trees ? draft_->tree_rows(rows_count) : draft_->rows(rows_count, draft_shapes_);
  Batch batch(setup, rows, std::move(target_rows), std::move(draft_rows));
  batch.prefill(prompts, sources);
  while (batch.running()) {  // Algorithm 1, each phase for every running row
    batch.draft();
    if (trees) {
      std::vector<TreeVerdict> verdicts = batch.verify_trees();
      batch.accept_trees(verdicts);
    } else {
      std::vector<Verdict> verdicts = batch.verify();
      batch.accept(verdicts);
    }
  }
  batch.finish();
  std::vector<Generation> out;
  out.reserve(count);
  for (Row& row : rows) out.push_back(std::move(row.out));
  return out;
}

void Decoder::check_inputs(const std::vector<std::vector<int64_t>>& prompts,
                           const std::vector<std::vector<int64_t>>& sources, int64_t max_new_tokens,
                           const std::vector<int64_t>& eos_token_ids) const {
  const size_t count = prompts.size();
  require(count >= 1, "prompt_ids must hold at least one prompt, got an empty batch");
  const int64_t vocab = target_->vocab_size();
  for (size_t r = 0; r < count; ++r) check_ids(prompts[r], row_name("prompt_ids", r, count).c_str(), vocab);
  if (!target_->encoder_decoder()) {
    require(sources.empty(), "encoder_input_ids is only for encoder-decoder models; the target is a "
                             "decoder-only model (prompt_ids holds its whole context)");
  } else {
    require(!sources.empty(), "the target is an encoder-decoder model: pass encoder_input_ids (the source "
                              "sequence) as well as prompt_ids (the decoder's start)");
    require(sources.size() == count, "encoder_input_ids holds {} sources for {} prompts: pass one source per "
            "prompt", sources.size(), count);
    for (size_t r = 0; r < count; ++r) {
      const std::string name = row_name("encoder_input_ids", r, count);
      check_ids(sources[r], name.c_str(), vocab);
      const auto length = static_cast<int64_t>(sources[r].size());
      check_source_length(target_->max_source_length(), "target", name, length);
      if (draft_) check_source_length(draft_->max_source_length(), "draft", name, length);
    }
  }
  require(max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", max_new_tokens);
  for (const int64_t eos : eos_token_ids) {
    require(eos >= 0 && eos < vocab, "eos_token_id {} is outside the vocabulary [0, {})", eos, vocab);
  }
  for (size_t r = 0; r < count; ++r) {
    const int64_t needed = static_cast<int64_t>(prompts[r].size()) + max_new_tokens - 1;
    const std::string name = row_name("prompt_ids", r, count);
    check_length(target_->max_length(), "target", name, needed);
    if (draft_) check_length(draft_->max_length(), "draft", name, needed);
  }
}

}  // namespace speculant
