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
#include <memory>
#include <vector>

namespace speculant {

class Model;

// How a batch's model calls are shaped. dynamic: each call runs the rows taking part, padded to their
// longest token count, over the cache slots in use. fixed: each step call runs every row, padded to the
// call's width W, over every cache slot (each row's own mask hides the rest), so that its shapes depend on W
// alone. graphed: fixed, each width's call captured once into a CUDA graph and replayed (graphs.h).
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
};

// Row r is models[r] (all distinct, each with its own cache); one call per row that takes part.
std::unique_ptr<ModelRows> replica_rows(std::vector<Model*> models);

}  // namespace speculant
