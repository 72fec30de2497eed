// Beam search, plain and speculative (the paper's Appendix A.4), with transformers' semantics.
//
// The search is transformers' `_beam_search` (generation/utils.py, do_sample=False) step for step, with the same
// tensor operations on the same shapes, so that its ties break the same way. Each step, with w beams running:
//   scores = running score + log_softmax(logits) of each running beam, flattened to [1, w V];
//   the top K = max(2, 1 + #eos) w of them are the candidates; a candidate "finishes" if its token is an EOS or
//   the sequence reaches max_length;
//   the next running beams are the top w candidates, finished ones pushed down by -1e9;
//   the finished set keeps the best w of itself and the finished candidates among the top w, each scored
//   score / (generated length ** length_penalty), with transformers' -1e9 pushes (early_stopping=True and a full
//   set, the early-stop heuristic, candidates that did not finish);
//   the search ends when no running beam can improve the finished set (early_stopping: False, True, "never",
//   as transformers decides it), when every candidate finished, or at max_length.
//
// Speculative beam search (A.4). A draft model runs its own beam search of width u >= w for gamma steps from
// the target's running beams: at each level, the top u continuations (EOS excluded: they end a beam) of the
// level above by its accumulated log-probabilities, the running beams' target scores at the start. Every
// candidate (w + u gamma tokens) goes into one target call as a tree (each node attending to its ancestors).
// Then the target's own beam search steps run on the target's logits of those nodes for as long as each new
// running beam is a node of the tree (top_w(M_p) within the draft's top_u); the step whose running beams leave
// the tree is the call's last (the target's step after the last accepted level, at least one per call).
// Exactness: every step is the target's beam search step on the target's logits of the target's running beams
// (a node's logits are the target's for that node's sequence, whatever else was in the call), so the result
// is the target's beam search alone; the draft decides only how many steps one target call serves. In
// floating point the logits of a node come from a differently shaped call than transformers' batch of beams,
// so they may differ in the last bits, which changes the result only at a near-tie of scores.
//
// Caches: each model's cache holds the prompt and, as tentative tree nodes (rows.h), the tokens of every beam
// still running (the ancestors of the running beams, shared prefixes once), pruned after every target call;
// a beam's next token attends to its own ancestors only. Both models need tree calls (Model::beam_obstacle); an
// encoder-decoder's hold one row over the source it encoded, which every beam attends to.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"

namespace speculant {

// transformers' early_stopping: false (its heuristic), true (stop once num_beams sequences finished), "never".
enum class EarlyStopping { heuristic, at_num_beams, never };

struct BeamConfig {
  int64_t beams = 2;         // w, >= 1
  int64_t draft_beams = 0;   // u >= w (0: w)
  int64_t gamma = 0;         // draft levels per target call (0: no draft, plain beam search)
  double length_penalty = 1.0;
  EarlyStopping early_stopping = EarlyStopping::heuristic;
  int64_t return_sequences = 1;  // <= beams
  int64_t max_new_tokens = 1;    // >= 1
  std::vector<int64_t> eos_token_ids;
};

struct BeamSearch {
  std::vector<std::vector<int64_t>> sequences;  // the best return_sequences, new tokens only, best first
  std::vector<double> scores;                   // transformers' sequences_scores, the same order
  int64_t steps = 0;          // beam search steps run (each extends every running beam by one token)
  int64_t target_calls = 0;   // target calls after the prompt's
  int64_t draft_calls = 0;
  int64_t target_tokens = 0;  // tokens (tree nodes) the target ran after the prompt
  int64_t draft_tokens = 0;
  std::vector<int64_t> steps_per_call;  // per target call: the steps its logits served
  double seconds = 0.0;                 // the whole search, prompt included
};

// The beam search of `target` (with `draft` when config.gamma > 0, else draft may be null) after `prompt`
// (>= 1 token; an encoder-decoder's decoder prompt, its source in `source`, empty for decoder-only models).
// ValueError for a model without tree calls (Model::beam_obstacle), a bad config, or a search that outgrows a
// model's max_length. Locks both models while it runs.
BeamSearch beam_search(Model& target, Model* draft, const std::vector<int64_t>& prompt,
                       const std::vector<int64_t>& source, const BeamConfig& config);

}  // namespace speculant
