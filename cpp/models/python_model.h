// A model that lives in Python, such as a transformers model object (python/speculant/models/live.py): the
// Algorithm 1 loop stays in C++ and each model call re-enters Python, taking the GIL for the call only.
//
// `impl` is duck-typed. Attributes: vocab_size (int), max_length (int or None), max_source_length (int or
// None), encoder_decoder (bool), device (str), metadata (str, JSON). Methods, with the Model contract of
// model.h on flat int64 token tensors: reset(tokens[T]) -> None, extend(tokens[k]) -> logits[k, V],
// truncate(length) -> None, encode(source[S]) -> None (encoder-decoder models only). An exception raised in
// Python reaches the caller with its own type (KeyboardInterrupt included). Optional, for fixed-shape calls of
// its own (CUDA graphs: a feature draft's head, which runs them through a GraphCache bound as _core.GraphCache):
// fixed_shapes_obstacle() -> str ("" when it has them), use_shapes(str) ("dynamic", "fixed" or "graphed", before
// each generation's calls), graph_failure (str) and graphs_captured (int).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "models/model.h"

namespace speculant {

std::shared_ptr<Model> python_model(pybind11::object impl, const std::string& source);

}  // namespace speculant
