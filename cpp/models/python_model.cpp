#include "models/python_model.h"

#include <torch/extension.h>

#include "errors.h"

namespace py = pybind11;

namespace speculant {
namespace {

std::optional<int64_t> optional_int(const py::object& value) {
  if (value.is_none()) return std::nullopt;
  return value.cast<int64_t>();
}

class PythonModel final : public Model {
 public:
  PythonModel(py::object impl, std::string source) : impl_(std::move(impl)), source_(std::move(source)) {
    vocab_size_ = impl_.attr("vocab_size").cast<int64_t>();
    require(vocab_size_ > 0, "model {}: vocab_size must be positive, got {}", source_, vocab_size_);
    max_length_ = optional_int(impl_.attr("max_length"));
    max_source_length_ = optional_int(impl_.attr("max_source_length"));
    encoder_decoder_ = impl_.attr("encoder_decoder").cast<bool>();
    device_ = at::Device(impl_.attr("device").cast<std::string>());
    metadata_ = impl_.attr("metadata").cast<std::string>();
    form_ = impl_.attr("form").cast<std::string>();
  }
  ~PythonModel() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  void encode(const at::Tensor& source) override {
    py::gil_scoped_acquire gil;
    impl_.attr("encode")(source);
    length_ = 0;
  }
  void reset(const at::Tensor& tokens) override {
    py::gil_scoped_acquire gil;
    impl_.attr("reset")(tokens);
    length_ = tokens.numel();
  }
  at::Tensor extend(const at::Tensor& tokens) override {
    const int64_t k = tokens.numel();
    at::Tensor logits = checked(k, [&] { return impl_.attr("extend")(tokens); }, "extend");
    length_ += k;
    return logits;  // [k, V]
  }
  void truncate(int64_t length) override {
    py::gil_scoped_acquire gil;
    impl_.attr("truncate")(length);
    length_ = length;
  }
  int64_t length() const override { return length_; }
  std::string form() const override { return form_; }  // "live", or "compiled" (compiled_live.py)
  // A Python model with fixed-shape calls of its own (feature_draft.py: a feature draft's head) says so through
  // fixed_shapes_obstacle(), takes the engine's shapes through use_shapes("dynamic" | "fixed" | "graphed") and
  // reports its graphs through graph_failure and graphs_captured.
  std::string fixed_shapes_obstacle() const override {
    {
      py::gil_scoped_acquire gil;
      if (py::hasattr(impl_, "fixed_shapes_obstacle")) {
        return impl_.attr("fixed_shapes_obstacle")().cast<std::string>();
      }
    }
    if (form_ == "compiled") {
      return "a compiled live model's calls run through torch.compile, which replays CUDA graphs of its own on "
             "a GPU; the engine captures none around them";
    }
    return "a live model runs through Python; export it with speculant.export (TorchScript or .pt2) for "
           "fixed-shape calls";
  }
  void use_shapes(Shapes shapes) override {
    py::gil_scoped_acquire gil;
    if (!py::hasattr(impl_, "use_shapes")) return;
    impl_.attr("use_shapes")(shapes == Shapes::graphed ? "graphed" : shapes == Shapes::fixed ? "fixed" : "dynamic");
  }
  std::string graph_failure() const override {
    py::gil_scoped_acquire gil;
    return py::hasattr(impl_, "graph_failure") ? impl_.attr("graph_failure").cast<std::string>() : "";
  }
  int64_t graphs_captured() const override {
    py::gil_scoped_acquire gil;
    return py::hasattr(impl_, "graphs_captured") ? impl_.attr("graphs_captured").cast<int64_t>() : 0;
  }
  // live.py's tree calls: transformers' forward with a 4-D attention mask and position_ids, its cache's
  // entries selected in place; tree_obstacle() probes once whether the model honours them.
  std::string tree_obstacle() const override {
    py::gil_scoped_acquire gil;
    if (!py::hasattr(impl_, "tree_obstacle")) return Model::tree_obstacle();
    return impl_.attr("tree_obstacle")().cast<std::string>();
  }
  // Beams hold their token tree in one cache through the same calls (live.py: the same probe).
  std::string beam_obstacle() const override {
    py::gil_scoped_acquire gil;
    if (!py::hasattr(impl_, "beam_obstacle")) return tree_obstacle();
    return impl_.attr("beam_obstacle")().cast<std::string>();
  }
  at::Tensor extend_masked(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& mask) override {
    const int64_t k = tokens.numel();
    at::Tensor logits = checked(k, [&] { return impl_.attr("extend_masked")(tokens, positions, mask); },
                                "extend_masked");
    length_ += k;
    return logits;
  }
  void keep(const at::Tensor& entries) override {
    py::gil_scoped_acquire gil;
    impl_.attr("keep")(entries);
    length_ = entries.numel();
  }
  // live.py's replica(): the same module object with a cache of its own.
  std::shared_ptr<Model> replica() override {
    py::gil_scoped_acquire gil;
    return std::make_shared<PythonModel>(impl_.attr("replica")(), source_);
  }

 private:
  // The logits [k, V] that `call` (a Python call returning them) gives for k tokens, checked.
  template <typename Call>
  at::Tensor checked(int64_t k, const Call& call, const char* name) const {
    at::Tensor logits;
    {
      py::gil_scoped_acquire gil;
      py::object out = call();
      require(THPVariable_Check(out.ptr()), "model {}: {}() must return a Tensor of logits", source_, name);
      logits = THPVariable_Unpack(out.ptr());
    }
    require(logits.dim() == 2 && logits.size(0) == k && logits.size(1) == vocab_size_,
            "model {}: {}() on {} token(s) must return logits [{}, {}], got [{}]", source_, name, k, k,
            vocab_size_, fmt::join(logits.sizes(), ", "));
    require(at::isFloatingType(logits.scalar_type()), "model {}: {}() must return floating-point logits", source_,
            name);
    return logits;
  }

  py::object impl_;
  std::string source_;
  std::string form_;
  int64_t length_ = 0;
};

}  // namespace

std::shared_ptr<Model> python_model(py::object impl, const std::string& source) {
  return std::make_shared<PythonModel>(std::move(impl), source);
}

}  // namespace speculant
