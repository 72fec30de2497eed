// What one row's verification decided, for chains and token trees alike: a chain is the tree [1] * gamma
// (tree.h), its path the nodes 1 .. n of the n drafts kept.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace speculant {

struct Verdict {
  std::vector<int64_t> path;         // the accepted nodes, root excluded, by depth
  std::vector<int64_t> path_tokens;  // their tokens: the drafts kept
  at::Tensor token;                  // int64 [1] on the device: t, after the last accepted node (the model input
                                     // of the next iteration)
  int64_t host_token = 0;            // t
  std::vector<int64_t> drafted;      // a chain's drafts x_1 .. x_gamma (trees: empty; their nodes are the tree's)
  // For each node on the path, the root included, the rank of the child accepted there (-1: none, or a leaf); a
  // chain's are 0 but the last.
  std::vector<int64_t> accepted_rank;
  std::vector<double> betas;  // beta = sum_x min(p, q) at each position verified (Theorem 3.5): a chain's
                              // min(n + 1, gamma) positions, a tree's internal nodes on the path
  // A chain's p_i(x_i) / q_i(x_i) at each of its gamma positions (0 where p_i(x_i) = 0, +inf where q_i(x_i) = 0 <
  // p_i(x_i); at T = 0, +inf where the test keeps x_i), for expected_kept() (speculative.h). Trees: empty.
  std::vector<double> ratios;
  // A tree's drafts kept in expectation on these drafts by the rule that verified it, its coins integrated out
  // (tree.h: expected_kept; at T = 0 its n). Chains: NaN (their ratios give both rules').
  double kept_in_expectation = std::numeric_limits<double>::quiet_NaN();
  bool finite = true;         // every target row (and every draft row given) had finite logits

  int64_t accepted() const { return static_cast<int64_t>(path.size()); }
  // A chain's verdict: the first n of `drafted` kept, nodes 1 .. n.
  void keep_chain(int64_t n) {
    path.resize(n);
    for (int64_t i = 0; i < n; ++i) path[i] = i + 1;
    path_tokens.assign(drafted.begin(), drafted.begin() + n);
  }
};

}  // namespace speculant
