// What one generation measured: counts, acceptance, alpha (Corollary 3.6), time split, and the trace.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace speculant {

// One run of Algorithm 1 (the paper's Figure 1 line): `drafted` are the draft's guesses, the first
// `accepted` were kept, and `token` is the correction (n < gamma) or the bonus token (all accepted).
// Tokens past max_new_tokens or an EOS are cut from what is returned, not from `drafted`.
struct Iteration {
  std::vector<int64_t> drafted;
  int64_t accepted = 0;
  int64_t token = 0;
  bool bonus = false;
  int64_t emitted = 0;  // tokens this iteration added to the output (accepted + 1 unless cut)
  std::vector<Iteration> inner;  // a hierarchical draft's iterations that drafted `drafted` (hierarchy.h)
  std::vector<int64_t> tree;     // token trees: the iteration's tree as breadth-first parents (tree.h)
};

struct Stats {
  int64_t gamma = 0;
  int64_t iterations = 0;
  int64_t target_calls = 0;
  int64_t draft_calls = 0;
  int64_t new_tokens = 0;
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> drafted_per_position;   // [min(max_gamma, max(max_new_tokens - 1, 1))] how often draft position i was verified
  std::vector<int64_t> accepted_per_position;  // [the same] how often it was accepted
  // Corollary 3.6: alpha = E[sum_x min(p, q)], averaged over the verified positions whose prefix is the
  // generated sequence (every position up to and including the first rejection).
  double beta_sum = 0.0;
  int64_t beta_count = 0;
  // The drafts kept in expectation by each rule on the drafts verified, over `predicted_iterations`: a chain's by
  // both rules, from its ratios (speculative.h: expected_kept; block: NaN at lenience < 1, which the block rule
  // refuses); a tree's by the rule that ran (tree.h: expected_kept; traversal's is block's), the other's NaN but at
  // T = 0, where the two rules' verdicts are one.
  double token_kept_sum = 0.0;
  double block_kept_sum = 0.0;
  int64_t predicted_iterations = 0;
  // Token trees (tree.h): at depth i, how often the accepted path reached a node whose children were tried
  // (tree_visits[i]) and how often its rank-j child was the one accepted (tree_accepted[i][j]); their ratio
  // estimates Sequoia's per-depth, per-rank acceptance. tree_offered[i][j]: how often such a node had a rank-j
  // child at all (tree_visits[i] for every rank of a shape; fewer for the later ranks of grown and given trees,
  // whose nodes of one depth have different numbers of children). Empty for chains.
  std::vector<int64_t> tree_visits;
  std::vector<std::vector<int64_t>> tree_accepted;
  std::vector<std::vector<int64_t>> tree_offered;
  // Time inside the models' calls (prefill and extend); everything else (sampling math, verification,
  // bookkeeping, cache rollback, the host transfer) is other_seconds.
  double draft_seconds = 0.0;
  double target_seconds = 0.0;
  double total_seconds = 0.0;
  uint64_t seed = 0;

  double tokens_per_target_call() const {
    return target_calls ? static_cast<double>(new_tokens) / target_calls : 0.0;
  }
  double acceptance_rate() const;  // accepted / drafted; NaN when nothing was drafted
  double alpha() const;            // NaN when nothing was drafted
  // 1 + the mean drafts kept per iteration by that rule: its tokens per target call on these drafts (NaN: none).
  double expected_tokens(bool block) const {
    return predicted_iterations ? 1.0 + (block ? block_kept_sum : token_kept_sum) / predicted_iterations
                                : std::numeric_limits<double>::quiet_NaN();
  }
  double other_seconds() const { return total_seconds - draft_seconds - target_seconds; }
};

inline double Stats::acceptance_rate() const {
  return drafted_tokens ? static_cast<double>(accepted_tokens) / drafted_tokens : std::numeric_limits<double>::quiet_NaN();
}
inline double Stats::alpha() const { return beta_count ? beta_sum / beta_count : std::numeric_limits<double>::quiet_NaN(); }

}  // namespace speculant
