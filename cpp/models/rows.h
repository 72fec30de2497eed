// Batches: B independent sequences ("rows") of one model, each with its own cache length, so that ragged
// acceptance never recomputes an accepted token and a finished row sits the remaining calls out.
//
// A backend that can run every row in one call (the TorchScript exports: script_model.cpp) provides its own
// ModelRows; any other backend runs a batch as row replicas: one Model per row (Model::replica(), sharing the
// weights where the backend can), called one after the other. Both give each row exactly what a batch-1
// generation of that row computes, so each row's output law is the target's own.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace speculant {

class Model;

// How a batch's model calls are shaped. dynamic: each call runs the rows taking part, padded to their
// longest token count, over the cache slots in use. fixed: each step call runs every row, padded to the
// call's width W, over a power-of-two bucket of cache slots that holds the rows' positions (native_rows.h; each
// row's own mask hides the rest), so that its shapes depend on W and the bucket alone. graphed: fixed, each
// (width, bucket)'s call captured once into a CUDA graph and replayed (graphs.h).
enum class Shapes { dynamic, fixed, graphed };

class ModelRows {
 public:
  virtual ~ModelRows() = default;
  virtual int64_t count() const = 0;
  // Encoder-decoder models: row r encodes sources[r] (int64 [S_r], S_r >= 1) and clears its decoder cache.
  virtual void encode(const std::vector<at::Tensor>& sources) = 0;
  // Clears every row's cache and runs tokens[r] (int64 [T_r], T_r >= 0) in row r.
  virtual void reset(const std::vector<at::Tensor>& tokens) = 0;
  // Appends tokens[r] (int64 [k_r]) to row r; an undefined tensor leaves row r out of the call. Returns the
  // logits [k_r, V] of each row that took part (undefined for the others).
  virtual std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) = 0;
  // Keeps row r's first `length` positions (rollback of rejected drafts).
  virtual void truncate(int64_t row, int64_t length) = 0;
  virtual int64_t length(int64_t row) const = 0;

  // Whether every step call runs every row over fixed shapes (Shapes::fixed, graphed), so that what a step's
  // caller computes from its logits can run inside the call (extend_then).
  virtual bool fixed_shapes() const { return false; }
  // extend(tokens), then `then(last, inputs)` in the same call, where last [R, V] holds each row's logits after its
  // last new token (every row in row order, a row sitting the call out included: its row of the result is not
  // meant to be read); returns then's result. Inside the step's CUDA graph where it is captured (`inputs` copied
  // into its buffers with the call's), so `what` names `then` and everything it depends on besides the shapes of
  // the call and of `inputs` (the graph's key). Rows with fixed_shapes() only (ValueError otherwise).
  using Then = std::function<at::Tensor(const at::Tensor& last, const std::vector<at::Tensor>& inputs)>;
  virtual at::Tensor extend_then(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& inputs,
                                 const Then& then, const std::string& what);

  // Token trees (tree.h), for backends with tree calls (Model::tree_obstacle() empty; ValueError otherwise).
  // Appends tentative nodes to each row r with tokens[r] defined (int64 [T_r]; undefined: the row sits the
  // call out), in one call: node j at position length(r) + nodes[r].offsets[j], attending to the row's cached
  // positions, to itself, and to the tentative nodes up its chain of parents (nodes[r].parents[j]: an index
  // among the row's tentative nodes, numbered in the order they were appended; -1: none). Returns the logits
  // [T_r, V] of each row that took part.
  struct TreeNodes {
    std::vector<int64_t> offsets, parents;
  };
  virtual std::vector<at::Tensor> extend_tree(const std::vector<at::Tensor>& tokens,
                                              const std::vector<TreeNodes>& nodes);
  // extend_tree(tokens, nodes), then `then(logits, inputs)` inside the call as extend_then does, logits [R, W, V]
  // every row's (W: the widest row's tokens). Rows with fixed_shapes() only (ValueError otherwise).
  virtual at::Tensor extend_tree_then(const std::vector<at::Tensor>& tokens, const std::vector<TreeNodes>& nodes,
                                      const std::vector<at::Tensor>& inputs, const Then& then,
                                      const std::string& what);
  // Each row rows[i] keeps its tentative nodes paths[i] (a chain down its tree, in order) at positions length(r),
  // length(r) + 1, ..., their cache entries moved there without recomputing a token; the others are dropped.
  // Native rows move every row's entries in one call.
  virtual void commit(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& paths);
  // Row r keeps the tentative nodes `nodes` (ascending, each one's parent kept too or -1) as its tentative
  // nodes 0 .. M - 1, in that order, their cache entries moved there without recomputing a token; the others
  // are dropped. Beam search (beam.h) keeps its beams' ancestors this way, a tree of them, uncommitted.
  virtual void prune(int64_t row, const std::vector<int64_t>& nodes);
};

// A row's tentative tree nodes (ModelRows::extend_tree), numbered in the order they were appended: node n is
// the row's cache entry length + n until commit keeps a path of them or truncate drops them all.
class TentativeTree {
 public:
  // Appends `nodes` (k of them) to a row with `length` committed entries. For new node j: positions[j] =
  // length + nodes.offsets[j], and visible[j * stride + e] is set for the entries e it attends to: the
  // committed ones (e < length), its ancestors' and its own (length + n). ValueError for a parent that is not
  // an earlier node.
  void append(const ModelRows::TreeNodes& nodes, int64_t length, int64_t* positions, bool* visible, int64_t stride);
  // ValueError unless `path` goes down the tree from a root (path[0]'s parent -1, each next node a child).
  void check_path(const std::vector<int64_t>& path, int64_t row) const;
  // Keeps `nodes` (prune's argument, checked: ValueError otherwise) renumbered 0 .. M - 1.
  void keep(const std::vector<int64_t>& nodes, int64_t row);
  int64_t size() const { return static_cast<int64_t>(parents_.size()); }
  bool empty() const { return parents_.empty(); }
  void clear() { parents_.clear(); }

 private:
  std::vector<int64_t> parents_;
};

// A row whose model has cached its sequence except `pending` (its last tokens, [m] int64 on the device): keeps
// the sequence's first `length` tokens (1 <= length <= cached + m) and appends t ([1]); returns the new pending
// tokens (t, after whatever of the old pending ones the cut keeps).
at::Tensor restart_row(ModelRows& rows, int64_t row, const at::Tensor& pending, int64_t length, const at::Tensor& t);

// Row r is models[r] (all distinct, each with its own cache); one call per row that takes part. With tree
// calls where the models have them (Model::extend_masked and keep).
std::unique_ptr<ModelRows> replica_rows(std::vector<Model*> models);

}  // namespace speculant
