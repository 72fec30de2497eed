// The decoding loop: Algorithm 1 (SpeculativeDecodingStep) repeated until max_new_tokens or an EOS, over a
// target and a draft Model with cache rollback. gamma = 0 without a draft is plain autoregressive decoding
// through the same code.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "loop/batch.h"
#include "drafting/drafter.h"
#include "drafting/gamma_policy.h"
#include "models/model.h"
#include "math/sampling.h"
#include "loop/stats.h"
#include "math/tree.h"
#include "device/verification_graphs.h"
#include "drafting/tree_growth.h"

namespace speculant {

class Decoder {
 public:
  // draft may be null only with gamma = 0. Validates everything it is given (ValueError). The shapes of each
  // model's calls (rows.h): anything but dynamic needs a backend with fixed-shape calls
  // (Model::fixed_shapes_obstacle) and graphed a CUDA model.
  // `tree` (tree.h): a shape [k_1 .. k_d], or a tree's breadth-first parents [-1, ...] (any shape, e.g.
  // Sequoia's), drafts a tree of depth d = gamma per iteration, its children drawn per `siblings`, verified in
  // one target call; `growth` instead grows one by the draft's confidence
  // (tree_growth.h; its depth = gamma); neither: a chain of gamma drafts. Trees need both models' tree calls and
  // lenience 1; with fixed shapes or graphs, fixed-shape tree calls (Model::tree_rows).
  Decoder(std::shared_ptr<Model> target, std::shared_ptr<Drafter> draft, int64_t gamma, SamplingConfig config,
          Shapes target_shapes = Shapes::dynamic, Shapes draft_shapes = Shapes::dynamic,
          std::vector<int64_t> tree = {}, Siblings siblings = Siblings::coupled,
          std::optional<TreeGrowth> growth = std::nullopt);

  // A batch: row r generates up to max_new_tokens after prompts[r] (token ids, at least one; for an
  // encoder-decoder pair the decoder's start, usually its decoder_start_token_id). sources[r] is row r's
  // encoder input, which each model encodes once per generation: required for encoder-decoder models, and
  // `sources` empty for decoder-only ones. Each row drafts, verifies, accepts and stops on its own, with its
  // own gamma policy, statistics and trace, and its own random streams keyed by seed + r (mod 2^64; streams.h): it
  // gets what a batch of one gives it with that seed, token for token in float32 (half-precision batched calls may
  // round differently) (std::random_device seeds when absent, reported in
  // stats). Each step is one batched call of each model for the rows still running where the backend
  // supports it (Model::batched()), one call per row otherwise. A row's model times are those of the calls
  // it took part in; its total_seconds is the time until it finished. `profile` synchronizes an accelerator
  // around the model calls so the time split is exact; without it only the host-side time of the launches
  // is attributed there. One call at a time per decoder: a concurrent one raises std::runtime_error.
  // A row stops just after any of eos_token_ids (none: empty).
  std::vector<Generation> generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                         const std::vector<std::vector<int64_t>>& sources, int64_t max_new_tokens,
                                         const std::vector<int64_t>& eos_token_ids, std::optional<uint64_t> seed,
                                         bool profile, const GammaSchedule& schedule = {}) const;

  // This decoder as the draft of another (hierarchy.h): its target drafts with its drafter, gamma tokens per
  // iteration as `schedule` evolves it. Needs a drafter, a chain (no tree) and lenience 1; ValueError otherwise.
  std::shared_ptr<Drafter> as_draft(const GammaSchedule& schedule) const;

  int64_t gamma() const { return gamma_; }
  // With fixed shapes or graphs (verification_graphs.h; not for grown trees): the verifications keyed so far,
  // how many are captured, and why their capture failed ("" if it has not); zeros without.
  std::tuple<int64_t, int64_t, std::string> verification_graphs() const {
    if (!verify_graphs_) return {0, 0, ""};
    return {verify_graphs_->keys(), verify_graphs_->captured(), verify_graphs_->failure()};
  }
  const SamplingConfig& config() const { return config_; }

 private:
  // ValueError naming the first input outside what generate_batch accepts.
  void check_inputs(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& sources,
                    int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids) const;

  std::shared_ptr<Model> target_;
  std::shared_ptr<Drafter> draft_;
  int64_t gamma_;
  SamplingConfig config_;
  Shapes target_shapes_, draft_shapes_;
  std::vector<int64_t> tree_shape_;  // the ranks the statistics count per depth (empty for chains)
  std::optional<TreePlan> trees_;    // none for chains
  Siblings siblings_;
  // With fixed shapes or graphs (not for grown trees): the verification through fixed-shape buffers too, captured
  // with graphs (verification_graphs.h); shared by copies, which share the models
  std::shared_ptr<VerificationGraphs> verify_graphs_;
  // Set while a generate call runs: a second call from another thread at the same time is refused (decoders
  // that merely share a model wait for it instead: the model's lock).
  std::shared_ptr<std::atomic<bool>> busy_ = std::make_shared<std::atomic<bool>>(false);
};

// Locks every mutex (each once, however often listed), none while blocking on another: no hold-and-wait.
std::vector<std::unique_lock<std::mutex>> lock_all(std::vector<std::mutex*> mutexes);

}  // namespace speculant
