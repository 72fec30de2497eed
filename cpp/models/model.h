// The model interface the decoder runs (one causal LM with its own cache), and its TorchScript backends.
//
// Contract of a TorchScript model file, in one of two forms:
//  (a) cached: integer attribute `vocab_size` (and optionally `max_length`, 0 = unlimited) and methods
//        prefill(input_ids: Tensor[1, T]) -> Tensor[1, T, V]   clears the cache, then runs T >= 1 tokens
//        extend(input_ids: Tensor[1, k])  -> Tensor[1, k, V]   appends k >= 1 tokens after the cached ones
//        truncate(length: int) -> None                          keeps the first `length` cached positions
//        cache_length() -> int
//  (b) plain: forward(input_ids: Tensor[1, T]) -> Tensor[1, T, V], which any causal LM satisfies; run
//      without a cache, by recomputing the whole prefix at every call.
// Row j of the logits is the next-token distribution after token j. Logits are floating point.
// An encoder-decoder model (T5) has the cached form plus
//        encode(input_ids: Tensor[1, S]) -> None   runs the encoder on the source once, stores what every
//                                                    decoder call needs (cross-attention keys and values) and
//                                                    clears the decoder cache
//      and optionally the int attribute `max_source_length`; prefill / extend then run decoder tokens.
// A cached decoder-only module may also run batches natively (rows.h; export/cached.py writes them):
//        start_rows(batch: int) -> None          a cache of `batch` rows (their old contents stale)
//        extend_rows(input_ids[R, T], rows[R], positions[R, T], slots[R, T], keys: int) -> Tensor[R, T, V]
//      runs rows `rows` (ascending) in one call: token (r, j) sits at positions[r, j], its keys and values go
//      to cache slot slots[r, j] of row rows[r] (slot max_length is scratch, for padding), and it attends to
//      that row's slots s < keys with s <= positions[r, j]. The engine keeps each row's length. With fixed
//      shapes (rows.h, for CUDA graphs) every call passes every row (a row sitting it out is all padding) and
//      keys is a power-of-two bucket (native_rows.h), so that its shapes depend on its token count and bucket
//      alone, and it reads the slots in use rather than all max_length. extend_rows writes the cache
//      in place (index assignment into the tensors start_rows made, never rebinding an attribute to a new
//      tensor): a CUDA graph replays into the memory it captured. Fixed shapes check it (graphs.h), so a module
//      that rebinds is refused by name instead of replaying stale caches.
//      Token trees (tree.h) need two more:
//        extend_rows_masked(input_ids[R, T], rows[R], positions[R, T], slots[R, T], mask[R, T, S]) -> [R, T, V]
//      as extend_rows, but query (r, j) attends to exactly the slots s < S of its row where mask[r, j, s]
//      (the engine sets a real token's own slot; a padding token sees slot 0 only);
//        copy_slots(rows[R], sources[R, M], targets[R, M]) -> None
//      copies row rows[r]'s cache entries at slot sources[r, m] to targets[r, m], all reads before any write,
//      in place: how an accepted path moves into consecutive positions without recomputing a token.
//      Feature drafts (EAGLE, Medusa: python/speculant/models/feature_draft.py) read hidden states a module keeps
//      per cache slot, beside its keys and values, written by the same calls and moved by copy_slots:
//        record_features(layers: Optional[List[int]]) -> int   from now on keeps the LM head's input (layers
//            empty) or the outputs of decoder layers `layers` side by side in layer order (None: nothing);
//            returns the width F
//        features(row: int, length: int) -> Tensor[length, F]   slots [0, length) of batch row `row` (-1: the
//            batch-1 cache of prefill / extend)
//        feature_weights() -> (Tensor[V, C], Tensor[V, C])      the input embedding and the LM head's weight
// A file may carry metadata as the extra file `speculant.json` (what speculant.export writes).
// The interface is backend-neutral so that a torch.export / AOTInductor backend can sit beside TorchScript.
#pragma once

#include <ATen/ATen.h>
#include <torch/script.h>

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "models/rows.h"

namespace speculant {

class Model {
 public:
  virtual ~Model() = default;

  // Clears the cache and runs `tokens` (int64 [T], T >= 0, on device()). Returns nothing: the decoder
  // feeds the last prompt token with the first draft / verification call.
  virtual void reset(const at::Tensor& tokens) = 0;
  // Appends tokens (int64 [k], k >= 1, on device()); returns logits [k, V] for them.
  virtual at::Tensor extend(const at::Tensor& tokens) = 0;
  // Keeps the first `length` positions (rollback of rejected drafts).
  virtual void truncate(int64_t length) = 0;
  virtual int64_t length() const = 0;

  // Encoder-decoder models: runs the encoder on `source` (int64 [S], S >= 1, on device()) and clears the
  // decoder cache. Decoder-only models never get this call.
  virtual void encode(const at::Tensor& source) { (void)source; }
  bool encoder_decoder() const { return encoder_decoder_; }
  std::optional<int64_t> max_source_length() const { return max_source_length_; }
  // The file's `speculant.json` extra file, or "" when it has none.
  const std::string& metadata() const { return metadata_; }

  int64_t vocab_size() const { return vocab_size_; }
  std::optional<int64_t> max_length() const { return max_length_; }
  const at::Device& device() const { return device_; }
  virtual std::string form() const = 0;

  // A batch of `count` rows (rows.h), this model's cache being row 0's: one call for every row where the
  // backend runs batches natively, else row replicas (replica(), made once and kept for later batches). Valid
  // while the caller holds in_use(). Shapes other than dynamic need a backend with fixed-shape calls
  // (fixed_shapes_obstacle() empty; ValueError otherwise); the default rows() is for backends whose calls
  // have fixed shapes as they are (.pt2) or none.
  virtual std::unique_ptr<ModelRows> rows(int64_t count, Shapes shapes = Shapes::dynamic);
  // Whether rows() runs every row in one call (false: one call per row).
  virtual bool batched() const { return false; }
  // Why this backend has no fixed-shape calls (so no CUDA graphs), or "" when it has them.
  virtual std::string fixed_shapes_obstacle() const = 0;
  // Why its fixed-shape calls cannot be captured into CUDA graphs, or "" when they can.
  virtual std::string capture_obstacle() const { return fixed_shapes_obstacle(); }
  // Why a CUDA graph capture of this model failed (its calls then run uncaptured), or "" when none did.
  virtual std::string graph_failure() const { return ""; }
  // CUDA graphs this model holds now (one per captured width).
  virtual int64_t graphs_captured() const { return 0; }

  // Token trees (tree.h): why this backend cannot run a tree of drafts in one call, or "" when it can.
  virtual std::string tree_obstacle() const {
    return fmt::format("the {} form has no tree calls (the batched cached form's extend_rows_masked and "
                       "copy_slots, which speculant.export writes)", form());
  }
  // Why this model cannot hold several beams in one cache (beam.h): tree calls of one row, which for an
  // encoder-decoder model attend to the source ModelRows::encode gave it; "" when it can.
  virtual std::string beam_obstacle() const { return tree_obstacle(); }
  // A batch of `count` rows with tree calls (ModelRows::extend_tree / commit); ValueError with tree_obstacle().
  // Shapes as rows()'s. The default runs row replicas through the two calls below.
  virtual std::unique_ptr<ModelRows> tree_rows(int64_t count, Shapes shapes = Shapes::dynamic);
  // The tree calls of a backend run as row replicas (batch 1), ValueError by default. extend_masked appends
  // tokens (int64 [T]) at positions (int64 [T]) as cache entries length() .. length() + T - 1, token j
  // attending to exactly the entries e where mask[j, e] (bool [T, length() + T]); returns logits [T, V].
  // keep(entries) (int64 [M], ascending) keeps those cache entries, in order, as entries 0 .. M - 1.
  virtual at::Tensor extend_masked(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& mask);
  virtual void keep(const at::Tensor& entries);

  // Feature drafts: why this model cannot keep its hidden states per cache entry (the contract above), or "".
  virtual std::string features_obstacle() const {
    return fmt::format("the {} form keeps no hidden states for feature drafts", form());
  }
  // From now on keeps per cache entry the LM head's input (`layers` empty) or those decoder layers' outputs side
  // by side (nullopt: nothing, where the backend can stop: a .pt2 package records the view it was exported with,
  // always); returns the width. Graphs captured before are dropped (they record nothing).
  virtual int64_t record_features(const std::optional<std::vector<int64_t>>& layers);
  // [length, F]: row `row`'s features at its committed entries, in the rows of its latest batch (batch 1 of
  // dynamic shapes: this model's own cache, row 0), read between calls (after a tree's commit, not between its
  // extend_tree and commit: a replica's length then counts its tentative nodes). The default reads row
  // replicas' own_features().
  virtual at::Tensor features(int64_t row);
  // {the input embedding, the LM head's weight}, [V', C] each: what feature drafts share with the target.
  virtual std::vector<at::Tensor> feature_weights();

  // A model owns mutable cache state: one generation at a time (the decoder holds this while it runs).
  std::mutex& in_use() { return in_use_; }

 protected:
  int64_t vocab_size_ = 0;
  std::optional<int64_t> max_length_;
  at::Device device_ = at::kCPU;
  bool encoder_decoder_ = false;
  std::optional<int64_t> max_source_length_;
  std::string metadata_;

  // Another model with the same weights (shared where the backend can) and a cache of its own.
  virtual std::shared_ptr<Model> replica() = 0;
  // This model's features at its committed entries [length(), F] (features() of a backend run as replicas).
  virtual at::Tensor own_features();
  // The shapes of this model's calls from now on, which the default rows() tells each row's model: a backend
  // whose calls have fixed shapes as they are (.pt2) runs its decoding steps through its graph caches.
  virtual void use_shapes(Shapes shapes) { (void)shapes; }

 private:
  std::mutex in_use_;
  std::vector<std::shared_ptr<Model>> replicas_;  // rows 1, 2, ... of batches
};

// Loads a TorchScript file (or serialized bytes, `source` naming them in messages), moves it to `device`
// if given, checks it against the contract with a one-token probe, and returns the matching backend.
// Throws ValueError saying what is wrong with a file that does not follow the contract.
std::shared_ptr<Model> load_script_file(const std::string& path, std::optional<at::Device> device);
std::shared_ptr<Model> load_script_bytes(const std::string& bytes, const std::string& source,
                                         std::optional<at::Device> device);

}  // namespace speculant
