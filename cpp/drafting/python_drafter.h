// A drafter written in Python: a callable propose(context: list[int], gamma: int) -> (tokens, q) returning
// k <= gamma token ids and the [k, V] distributions they were drawn from. The engine checks what it returns
// (shape, finiteness, normalization, q(x_i) > 0) and raises ValueError naming what is wrong.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "drafting/drafter.h"

namespace speculant {

// `score` (None: chains only): score(contexts: list[list[int]]) -> q [n, V], the law after each context, from
// which the engine draws a token tree's children (SequenceDrafter::laws).
std::shared_ptr<Drafter> python_drafter(pybind11::object propose, int64_t vocab_size, const at::Device& device,
                                        pybind11::object score);

}  // namespace speculant
