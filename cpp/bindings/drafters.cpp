// Python bindings: The drafters: the protocol's Python face and the built-in kinds' factories.
#include "bindings/bindings.h"

#include "drafting/drafter.h"
#include "drafting/model_drafter.h"
#include "drafting/prompt_lookup.h"
#include "drafting/python_drafter.h"
#include "drafting/tables.h"

namespace speculant::bindings {

void bind_drafters(py::module_& m) {
  py::class_<Drafter, std::shared_ptr<Drafter>>(m, "Drafter")
      .def_property_readonly("vocab_size", &Drafter::vocab_size)
      .def_property_readonly("device", [](const Drafter& d) { return d.device().str(); })
      .def_property_readonly("kind", &Drafter::name)
      .def_property_readonly("tree_obstacle", &Drafter::tree_obstacle);
  m.def("model_drafter", &model_drafter, py::arg("model"), py::arg("sibling") = nullptr,
        py::arg("stop_below") = 0.0);
  m.def("unigram_drafter",
        [](const at::Tensor& unigram, const std::string& device) { return unigram_drafter(unigram, at::Device(device)); },
        py::arg("unigram"), py::arg("device"));
  m.def("bigram_drafter",
        [](const at::Tensor& unigram, const at::Tensor& row_ptr, const at::Tensor& followers, const at::Tensor& counts,
           const std::string& device) {
          return bigram_drafter(unigram, row_ptr, followers, counts, at::Device(device));
        },
        py::arg("unigram"), py::arg("row_ptr"), py::arg("followers"), py::arg("counts"), py::arg("device"));
  m.def("prompt_lookup_drafter",
        [](int64_t vocab, int64_t min_ngram, int64_t max_ngram, const std::string& device) {
          return prompt_lookup_drafter(vocab, min_ngram, max_ngram, at::Device(device));
        },
        py::arg("vocab_size"), py::arg("min_ngram"), py::arg("max_ngram"), py::arg("device"));
  m.def("python_drafter",
        [](py::object propose, int64_t vocab, const std::string& device, py::object score) {
          return python_drafter(std::move(propose), vocab, at::Device(device), std::move(score));
        },
        py::arg("propose"), py::arg("vocab_size"), py::arg("device"), py::arg("score") = py::none());
}

}  // namespace speculant::bindings
