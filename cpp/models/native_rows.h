// A batch run natively by a backend with a cache of rows (model.h: start_rows / extend_rows): one call per
// step for the rows taking part, each row's length kept here. Tokens are right-padded to the call's width; a
// padding token is written to the scratch slot max_length, so no row's cache is touched beyond its tokens,
// and rollback only moves a row's length.
//
// Shapes (rows.h): dynamic calls run the rows taking part over the slots in use. Fixed and graphed step calls,
// tree calls among them, run every row (a row sitting the call out is all padding) over a bucket of slots: the
// smallest power of two (at least kSmallestBucket, at most max_length) that holds every taking part row's
// positions (a tree call's mask [R, W, bucket]). So their shapes depend on the width and the bucket alone, and
// their attention reads about the slots in use, not the cache's capacity; graphed ones replay CUDA graphs
// (graphs.h), one per width, bucket and kind of call (a 4096-slot cache: 9 buckets). Prefills (over their
// bucket too) and copy_slots run eagerly. A fixed-shape call
// can carry its caller's work on its logits (rows.h: extend_then, extend_tree_then: the draft's draws), inside
// its graph, keyed by the width and that work.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/graphs.h"
#include "models/rows.h"

namespace speculant {

// The fewest slots a fixed-shape call reads (a short sequence's attention costs little next to the weights).
inline constexpr int64_t kSmallestBucket = 16;

// The backend's call: logits [R, T, V] for ids [R, T] in rows `rows` [R] (ascending), token (r, j) at
// positions[r, j], written to slots[r, j], attending to its row's slots s < keys with s <= positions[r, j].
using RowsCall = std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& positions,
                                          const at::Tensor& slots, int64_t keys)>;

// Token trees (model.h: extend_rows_masked, copy_slots): the call with an explicit mask [R, T, S] of the slots
// each token attends to, and the move of cache entries between slots of a row.
struct TreeCalls {
  std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& positions,
                           const at::Tensor& slots, const at::Tensor& mask)>
      masked;
  std::function<void(const at::Tensor& rows, const at::Tensor& sources, const at::Tensor& targets)> copy;
  // Encoder-decoder modules (one row): encodes the source (int64 [S]) the row's calls attend to.
  std::function<void(const at::Tensor& source)> encode;
};

// `count` rows of a cache of max_length slots (+ the scratch one) on `device`. `graphs` (fixed and graphed
// shapes) is the model's: it outlives the rows, and the backend clears it when the cache is reallocated.
// `tree`: the backend's tree calls, or empty functions when it has none. A row's tentative tree nodes sit in
// the slots after its length, in the order they were appended. `lengths`, where given, holds the rows' lengths
// (resized to `count`) for the backend to read while the rows live (its features: model.h).
std::unique_ptr<ModelRows> native_rows(RowsCall call, int64_t count, int64_t max_length, at::Device device,
                                       std::string source, Shapes shapes, GraphCache* graphs, TreeCalls tree = {},
                                       std::shared_ptr<std::vector<int64_t>> lengths = nullptr);

}  // namespace speculant
