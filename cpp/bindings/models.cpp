// Python bindings: The models: Model and its loaders (TorchScript files and bytes, .pt2 packages, Python objects),
// greedy continuations of one model (cross-tokenizer drafts), and the graph cache of a Python model's fixed-shape
// calls (python/speculant/models/feature_draft.py).
#include "bindings/bindings.h"

#include <pybind11/functional.h>

#include "device/graphs.h"

#include "loop/interrupt.h"
#include "models/aoti_model.h"
#include "models/continuation.h"
#include "models/model.h"
#include "models/python_model.h"

namespace speculant::bindings {

void bind_models(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model")
      .def_property_readonly("vocab_size", &Model::vocab_size)
      .def_property_readonly("max_length", &Model::max_length)
      .def_property_readonly("device", [](const Model& model) { return model.device().str(); })
      .def_property_readonly("form", &Model::form)
      .def_property_readonly("batched", &Model::batched)
      .def_property_readonly("fixed_shapes_obstacle", &Model::fixed_shapes_obstacle)
      .def_property_readonly("capture_obstacle", &Model::capture_obstacle)
      .def_property_readonly("graph_failure", &Model::graph_failure)
      .def_property_readonly("graphs_captured", &Model::graphs_captured)
      .def_property_readonly("tree_obstacle", &Model::tree_obstacle)
      .def_property_readonly("beam_obstacle", &Model::beam_obstacle)
      .def_property_readonly("encoder_decoder", &Model::encoder_decoder)
      .def_property_readonly("max_source_length", &Model::max_source_length)
      .def_property_readonly("metadata", [](const Model& model) { return py::bytes(model.metadata()); })
      .def_property_readonly("features_obstacle", &Model::features_obstacle)
      .def("record_features", &Model::record_features, py::arg("layers"))
      .def("features", &Model::features, py::arg("row"))
      .def("feature_weights", &Model::feature_weights);

  m.def("load_file",
        [](const std::string& path, const std::optional<std::string>& device) {
          return load_script_file(path, parse_device(device));
        },
        py::arg("path"), py::arg("device") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("load_bytes",
        [](const py::bytes& data, const std::string& source, const std::optional<std::string>& device) {
          std::string bytes = data;
          py::gil_scoped_release release;
          return load_script_bytes(bytes, source, parse_device(device));
        },
        py::arg("data"), py::arg("source"), py::arg("device") = py::none());

  m.def("load_pt2",
        [](const std::string& path, const std::optional<std::string>& device) {
          return load_pt2_file(path, parse_device(device));
        },
        py::arg("path"), py::arg("device") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("python_model", &python_model, py::arg("impl"), py::arg("source"));

  // GraphCache::run(key, inputs, call) with `call` a Python function of the static buffers; `state` a Python
  // function returning (name, tensor) pairs that the calls must write in place.
  py::class_<GraphCache>(m, "GraphCache")
      .def(py::init([](bool capture, const py::function& state) {
             GraphCache::State tensors = [state] {
               py::gil_scoped_acquire gil;
               std::vector<std::pair<std::string, const void*>> out;
               for (const auto& [name, tensor] : state().cast<std::vector<std::pair<std::string, at::Tensor>>>()) {
                 out.emplace_back(name, tensor.const_data_ptr());
               }
               return out;
             };
             return std::make_unique<GraphCache>(capture, std::move(tensors));
           }),
           py::arg("capture"), py::arg("state"))
      .def(
          "run",
          [](GraphCache& self, int64_t width, bool tree, int64_t keys, const std::vector<at::Tensor>& inputs,
             const std::function<at::Tensor(const std::vector<at::Tensor>&)>& call) {
            require(!inputs.empty(), "GraphCache.run: inputs must hold at least one tensor");
            return self.run(CallKey{width, tree, keys, ""}, inputs, call);
          },
          py::arg("width"), py::arg("tree"), py::arg("keys"), py::arg("inputs"), py::arg("call"))
      .def("clear", &GraphCache::clear)
      .def_property_readonly("failure", &GraphCache::failure)
      .def_property_readonly("captured", &GraphCache::captured);

  py::class_<GreedyContinuation>(m, "GreedyContinuation")
      .def(py::init<std::shared_ptr<Model>>(), py::arg("model"))
      .def(
          "__call__",
          [](GreedyContinuation& self, const std::vector<int64_t>& ids, int64_t count) {
            InterruptScope interruptible(signal_check());
            py::gil_scoped_release release;
            return self(ids, count);
          },
          py::arg("ids"), py::arg("count"))
      .def_property_readonly("reused", &GreedyContinuation::reused);
}

}  // namespace speculant::bindings
