// Python bindings: the private extension `speculant._core`, one bind_* per concern (bindings.h). The public API
// is python/speculant/. The order registers each class before a default argument of its type.
#include "bindings/bindings.h"

using namespace speculant::bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "speculant's C++ core: standardized sampling, speculative sampling, the Algorithm 1 engine.";
  bind_models(m);
  bind_sampling(m);
  bind_trees(m);
  bind_results(m);
  bind_drafters(m);
  bind_loop(m);
}
