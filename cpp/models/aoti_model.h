// The torch.export / AOTInductor backend of Model: a `.pt2` package (python/speculant/models/export/pt2.py writes
// them) run by torch's AOTI package loader, with no Python at run time.
//
// Contract of the package's model "model": run([input_ids int64 [1, k], cache_position int64 [k]]) ->
// [logits float [1, k, V]], cache_position = start .. start + k - 1. It keeps a static KV cache of
// `max_length` positions in its own buffers, writes the k tokens at those positions, and each query attends
// to cached positions <= its own, so slots past the newest one are masked: rollback only moves the position.
// Package metadata: "vocab_size", "max_length", "torch_version" (of the export) and "speculant.json".
// An encoder-decoder package (T5) adds "max_source_length" and a second model, "encoder":
// run([source int64 [1, S]]) -> [hidden, keys_0, values_0, ...] (the cross-attention inputs, computed once per
// source); the decoder model then takes them after its two inputs.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "models/model.h"

namespace speculant {

// Loads a .pt2 package and checks it against the contract (metadata, device, torch version, a one-token
// probe); ValueError naming the file and what is wrong.
std::shared_ptr<Model> load_pt2_file(const std::string& path, std::optional<at::Device> device);

}  // namespace speculant
