// The pieces of the extension `speculant._core` (module.cpp): one bind_* per concern, and the argument parsers
// they share. The public API is python/speculant/.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <string>

#include "errors.h"
#include "loop/interrupt.h"
#include "math/sampling.h"
#include "math/tree.h"
#include "models/rows.h"

namespace speculant::bindings {

namespace py = pybind11;

SamplingConfig make_config(double temperature, int64_t top_k, double top_p, double lenience,
                           const std::string& verification = "token");
SamplingConfig::Verification parse_verification(const std::string& name);
std::optional<at::Device> parse_device(const std::optional<std::string>& device);
// Signals are delivered to Python's main thread only: elsewhere there is nothing to check (interrupt.h).
InterruptCheck signal_check();
Shapes parse_shapes(const std::string& name, const char* what);
Siblings parse_siblings(const std::string& name);
void check_probabilities(const at::Tensor& t, const char* what);

void bind_models(py::module_& m);
void bind_sampling(py::module_& m);
void bind_trees(py::module_& m);
void bind_results(py::module_& m);
void bind_drafters(py::module_& m);
void bind_loop(py::module_& m);

}  // namespace speculant::bindings
