// Where the tensor path of verification (tree_verification.cpp) finds each row's nodes, q rows, tokens and uniforms
// in a batch's joined inputs, chains and trees alike. What it takes from those inputs in the layout's order is a
// view where the rows lie in order (a lone chain's all do), else one gather by an index uploaded once.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "math/sampling.h"
#include "math/tree.h"

namespace speculant {

// A batch of trees: every row's nodes one after the other (row r's node i is the batch's node base[r] + i), and
// their q rows and tokens joined (a chain-form row, tree.h, has no q row for its leaf and no token for its root).
struct Nodes {
  explicit Nodes(const std::vector<TreeInput>& rows);

  // of the batch's node, in the batch's numbering
  int64_t children(int64_t node) const { return tree(row_of[node]).children(node - base[row_of[node]]); }
  int64_t depth(int64_t node) const { return tree(row_of[node]).depth(node - base[row_of[node]]); }
  int64_t first_child(int64_t node) const {
    const int64_t r = row_of[node];
    return base[r] + tree(r).first_child(node - base[r]);
  }
  // where a node's q row and token are in the joined q and tokens (a root's token is not read)
  int64_t q_row(int64_t node) const { return q_base[row_of[node]] + node - base[row_of[node]]; }
  int64_t token(int64_t node) const {
    const int64_t r = row_of[node];
    return token_base[r] + node - base[r] - (chain_form[r] ? 1 : 0);
  }
  // a chain-form row's drafts: its tokens, read back
  std::vector<int64_t> drafts(int64_t r, const double* token) const {
    return {token + token_base[r], token + token_base[r + 1]};
  }
  const Tree& tree(int64_t r) const { return *rows[r].tree; }
  at::Tensor every_row(at::Tensor TreeInput::*field) const;

  const std::vector<TreeInput>& rows;
  std::vector<int64_t> base, q_base, token_base, row_of;
  std::vector<bool> chain_form;
  int64_t size = 0, widest = 1;
  at::Tensor tokens;          // [nodes'], int64
  bool siblings_law = false;  // the rows' later children drawn from a sibling law (TreeInput::sibling_q)
};

bool consecutive(const std::vector<int64_t>& rows);
// The rows of `from` listed in `rows`: a view where they are consecutive, else one gather by `index`, their copy on
// the device (undefined where consecutive).
at::Tensor take_rows(const at::Tensor& from, const std::vector<int64_t>& rows, const at::Tensor& index);
// Writes `values` into those rows of `to`, in place.
void put_rows(at::Tensor& to, const std::vector<int64_t>& rows, const at::Tensor& index, const at::Tensor& values);

// What a verification takes from its inputs, in which order, and where each row's uniforms are.
//
// Internal nodes first, by child count descending, so that step j's nodes (those with more than j children) are the
// leading M_j rows; then the leaves. Taken: the rows of p in that order, the internal nodes' q rows, their children's
// tokens [M, K] (past a node's count: its first child again, never read); sampled also each position's candidate
// uniform and the children's coins [M, K] (past a node's count: its first child's, never read). Sampled, each row's
// uniforms come from its own generator, as alone, in one operation: a coin per (internal node in tree order, child
// of the row's widest node) from its coin stream, then one per node for its candidate t from its correction stream
// (streams.h). Greedy draws none.
//
// Traversal verification (verification = block, tree.h): the internal nodes by depth first (then by child count
// descending, so that a depth's nodes with more than j children lead its range), their ranges by depth, and for each
// node the index of its edge in [M, K] (its parent's position times K plus its rank; the root's 0, never read).
struct Layout {
  Layout(const Nodes& nodes, const SamplingConfig& config);

  // Every row's uniforms (its block from its own generator), float64, scaled (sampling.h); sampled only.
  at::Tensor uniforms(const Nodes& nodes, const at::Device& device) const;
  // The lists taken, in the index's order.
  std::vector<const std::vector<int64_t>*> taken() const;

  bool greedy, block;
  std::vector<int64_t> order, position;  // position -> node, node -> position
  int64_t internal = 0;                   // M
  std::vector<int64_t> leading;           // M_j: the internal nodes with more than j children (j = 0 .. K)
  std::vector<int64_t> coin_at;           // an internal node's first coin in the uniforms
  std::vector<int64_t> uniform_sizes;     // each row's block of uniforms
  // taken: the order above, q_rows [M], children [M, K]; sampled also draw_of [nodes], coins [M, K]
  std::vector<int64_t> q_rows, children, draw_of, coins;
  std::vector<int64_t> level_start;  // block: where each depth's internal nodes begin, then M
  std::vector<int64_t> edge_of;      // taken, block: [nodes]
  std::vector<int64_t> index;  // the taken lists joined, one upload; empty where every one is a view
};

// A verification's device inputs: every row's logits [nodes, V], q and tokens joined, then (sampled) the uniforms,
// where the rows have a sibling law (tree.h) their sibling_q joined, where the layout has one its index, and each
// row's draft witnesses where given. `taken[i]`: the index's part for the layout's i-th list (undefined: a view).
struct DeviceInputs {
  DeviceInputs(const std::vector<at::Tensor>& in, const Nodes& nodes, const Layout& layout);
  at::Tensor logits, q, tokens, uniforms, sibling;
  std::vector<at::Tensor> taken;
  size_t witnesses = 0;  // the first row's draft witnesses in `in`
};

}  // namespace speculant
