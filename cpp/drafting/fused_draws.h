// Draws inside the draft model's call: the execution strategy a draft model's rows take when they have fixed
// shapes on the accelerators' path. A chain step's or a tree level's draws run in the same call as the model
// (rows.h: extend_then, extend_tree_then), inside its CUDA graph where it is captured, from uniforms drawn before
// the call from each row's generator. They are the draws the unfused path makes from the same uniforms (step.h's
// packed_draft_draws, tree.h's draw_children_with), so the strategy changes where the draws run, not what they are.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "drafting/tree_growth.h"
#include "math/sampling.h"
#include "math/step.h"
#include "math/tree.h"
#include "models/rows.h"

namespace speculant {

// A chain proposal's steps: step i's call draws every row's token from the row's uniform of step i (a row sitting
// the step out draws from 0.5, read by nothing).
class FusedSteps {
 public:
  // The strategy for a proposal of gammas[r] tokens per row, each row's uniforms [gamma_r, 1] already drawn
  // (sampling; undefined for a row drafting nothing), or nothing where it does not apply: rows without fixed
  // shapes, no steps, or a vocabulary too large for the packed draws.
  static std::optional<FusedSteps> plan(const ModelRows& rows, const std::vector<int64_t>& gammas,
                                        const SamplingConfig& config, const std::vector<at::Tensor>& uniforms,
                                        int64_t vocab, const at::Device& device);
  // Step i's call on `feed` (rows.h: extend), with every row's draws.
  DraftBatch run(ModelRows& rows, int64_t i, const std::vector<at::Tensor>& feed) const;

 private:
  at::Tensor uniforms_;  // sampled: [steps, R], step i's uniforms its row i
  ModelRows::Then draw_;
  std::string what_;
};

// A tree level's draws: every row's n expanded nodes' q, their k children each and their finiteness witnesses, as
// draw_children would draw them. After run(): q [R n, V] (a view), tokens int64 [R n k] and maximum [R n], row r's
// from r n (a row not fed: values nothing reads).
struct FusedLevel {
  // The strategy for the level `drafts` expand (feed[r] undefined: row r's tree is done), or nothing where it does
  // not apply: rows without fixed shapes, grown trees, fed rows whose levels differ in nodes or children, or more
  // children than tokens (draw_children refuses that by name).
  static std::optional<FusedLevel> plan(const ModelRows& rows, const std::vector<TreeDraft*>& drafts,
                                        const std::vector<at::Tensor>& feed, const SamplingConfig& config,
                                        Siblings siblings, std::vector<at::Generator>& generators, int64_t vocab,
                                        const at::Device& device);
  // The level's call (rows.h: extend_then at the root, extend_tree_then below it) with its draws.
  void run(ModelRows& rows, const std::vector<at::Tensor>& feed, const std::vector<ModelRows::TreeNodes>& fed,
           bool first);

  int64_t nodes = 0, children = 0;  // n, k
  at::Tensor uniforms;              // sampled: [R n, width], a row not fed 0.5
  ModelRows::Then then;
  std::string what;
  at::Tensor q, tokens, maximum;
};

}  // namespace speculant
