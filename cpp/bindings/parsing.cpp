// The argument parsers and the interrupt check every binding shares (bindings.h).
#include "bindings/bindings.h"

namespace speculant::bindings {

SamplingConfig make_config(double temperature, int64_t top_k, double top_p, double lenience,
                           const std::string& verification) {
  SamplingConfig config{temperature, top_k, top_p, lenience, parse_verification(verification)};
  config.validate();
  return config;
}

// How a chain is verified (sampling.h); python/speculant/decoding/decoder.py checks the name first.
SamplingConfig::Verification parse_verification(const std::string& name) {
  if (name == "token") return SamplingConfig::Verification::token;
  if (name == "block") return SamplingConfig::Verification::block;
  fail("verification must be 'token' or 'block', got '{}'", name);
}

std::optional<at::Device> parse_device(const std::optional<std::string>& device) {
  if (!device) return std::nullopt;
  try {
    return at::Device(*device);
  } catch (const c10::Error&) {
    fail("device must be a torch device string such as 'cpu' or 'cuda:0', got '{}'", *device);
  }
}

// Python's pending signal handlers (SIGINT: KeyboardInterrupt), run between model calls (interrupt.h).
static void python_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

InterruptCheck signal_check() {
  py::module_ threading = py::module_::import("threading");
  return threading.attr("current_thread")().is(threading.attr("main_thread")()) ? python_signals : nullptr;
}

// "dynamic", "fixed" or "graphed" (rows.h); python/speculant/decoding/decoder.py chooses.
Shapes parse_shapes(const std::string& name, const char* what) {
  if (name == "dynamic") return Shapes::dynamic;
  if (name == "fixed") return Shapes::fixed;
  if (name == "graphed") return Shapes::graphed;
  fail("{} must be 'dynamic', 'fixed' or 'graphed', got '{}'", what, name);
}

// How a tree's siblings are drawn (tree.h); python/speculant/decoding/decoder.py checks the name first.
Siblings parse_siblings(const std::string& name) {
  if (name == "without_replacement") return Siblings::without_replacement;
  if (name == "with_replacement") return Siblings::with_replacement;
  if (name == "top") return Siblings::top;
  if (name == "coupled") return Siblings::coupled;
  fail("siblings must be 'without_replacement', 'with_replacement', 'top' or 'coupled', got '{}'", name);
}

void check_probabilities(const at::Tensor& t, const char* what) {
  require(at::isFloatingType(t.scalar_type()), "{} must be floating point", what);
  require(at::isfinite(t).all().item<bool>() && (t >= 0).all().item<bool>(),
          "{} must be finite and non-negative", what);
}


}  // namespace speculant::bindings
