// How a row's token tree (tree.h) is drafted, level by level: a shape fixed in advance, or a tree grown by the
// draft's confidence under a node budget (EAGLE-2, Li et al. 2024), kept exact.
//
// Growth. A node's value is its path's draft log probability: value(root) = 0 and value(child x of v) =
// value(v) + log q_v(x), q_v the draft's standardized law at v (at temperature 0, where that law is a point
// mass, the softmax of the draft's raw logits). Level by level, the `width` nodes of the newest depth with the
// highest values (ties: the earlier node) each get `children` children, the highest value first, until `budget`
// drafts are placed (the last expanded node may get fewer) or the tree is `depth` deep.
//
// Exactness. tree.h's argument needs, at every node v, children drawn from q_v the way verify_tree assumes,
// with their number k_v fixed before they are drawn. Here k_v is a function of the tokens and values of nodes
// no deeper than v, all drawn before v's children, never of those children. Conditioned on everything drawn up
// to v's depth, v's children and their verification are exactly what tree.h analyzes for a fixed k_v, so the
// token emitted at v is distributed as the target's given the path, and by induction the whole output is. That
// the shape depends on v's own token or its siblings' only decides where later draws happen.
// What is not done: EAGLE-2 also reranks the finished tree and drops its nodes of lowest value. That removes
// children because of their own tokens, which conditions the kept ones (without replacement a later sibling's
// law depends on the earlier ones; with it, the kept count would depend on the drawn values), so at temperature
// > 0 the verified law would no longer be q_v's and the output would be biased. A budget is met here by
// choosing, before each level is drawn, where its nodes go.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "math/tree.h"

namespace speculant {

struct TreeGrowth {
  int64_t budget = 1;    // drafts (nodes besides the root), >= 1
  int64_t depth = 1;     // the deepest level, >= 1
  int64_t children = 1;  // per expanded node, >= 1
  int64_t width = 1;     // nodes expanded per level, >= 1
};

// A row's tree while it is drafted. expand() lists the nodes the drafter runs through the draft at this level
// (all of the newest depth, ascending; empty: the tree is complete) and counts() how many children each gets;
// the drafter draws them, expand()[0]'s first, and calls grow() with each child's token and, for a grown tree,
// its log q (values() says whether they are wanted). New nodes are numbered from size() on, breadth-first.
class TreeDraft {
 public:
  // Follows a tree given whole.
  explicit TreeDraft(const Tree& shape);
  // Grows by `growth`, within at most `budget` drafts and `depth` levels (the row's own limits).
  TreeDraft(const TreeGrowth& growth, int64_t budget, int64_t depth);

  const std::vector<int64_t>& expand() const { return expand_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  bool values() const { return growth_.has_value(); }
  // The children of expand() in order: their tokens (host ids) and, when values(), log q at each (else empty).
  void grow(const std::vector<int64_t>& tokens, const std::vector<double>& log_q);
  int64_t size() const { return static_cast<int64_t>(parent_.size()); }
  int64_t parent(int64_t node) const { return parent_[node]; }
  int64_t depth(int64_t node) const { return depth_[node]; }
  int64_t token(int64_t node) const { return token_[node]; }  // the root's: -1 (the drafter knows it)
  // The deepest depth with a node of two or more children, where a later child is drawn (-1: none): a fixed
  // shape's; for a grown tree, whose branching is not known in advance, its depth limit.
  int64_t last_branching_depth() const;
  Tree tree() const { return Tree(parent_); }

 private:
  void next_level();

  const Tree* shape_ = nullptr;
  std::optional<TreeGrowth> growth_;
  int64_t budget_ = 0, levels_ = 0;  // a grown tree's drafts still to place, and its depth limit
  std::vector<int64_t> parent_, depth_, token_;
  std::vector<double> value_;
  std::vector<int64_t> expand_, counts_;
};

// The values a grown tree needs of the children drawn at n nodes (draw_children's output, counts[i] for node i):
// log q at each (q [n, V]: the standardized rows they were drawn from); at temperature 0 (greedy) the log_softmax of
// the raw rows [n, V] instead. float64 [sum counts] on the rows' device.
at::Tensor child_log_values(const at::Tensor& q, const at::Tensor& raw, const at::Tensor& children,
                            const std::vector<int64_t>& counts, bool greedy);

// What every iteration drafts: a fixed shape (by_depth[i]: its first i depths) or a grown tree.
struct TreePlan {
  std::vector<Tree> by_depth;
  std::optional<TreeGrowth> growth;

  // The draft of an iteration with at most `depth` levels and `nodes` nodes (the root included, >= 1).
  TreeDraft draft(int64_t depth, int64_t nodes) const;
};

}  // namespace speculant
