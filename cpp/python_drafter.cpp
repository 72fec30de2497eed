#include "python_drafter.h"

#include <torch/extension.h>

#include <chrono>
#include <cmath>

#include "errors.h"

namespace py = pybind11;

namespace speculant {
namespace {

class PythonDrafter final : public HostHistoryDrafter {
 public:
  PythonDrafter(py::object propose, int64_t vocab, const at::Device& device)
      : propose_(std::move(propose)), vocab_(vocab), device_(device) {
    require(vocab >= 1, "vocab_size must be >= 1, got {}", vocab);
  }
  ~PythonDrafter() override {
    py::gil_scoped_acquire gil;
    propose_ = py::object();
  }

  Proposal propose(int64_t gamma, const SamplingConfig&, at::Generator&, bool) override {
    std::vector<int64_t> tokens;
    at::Tensor q;
    {
      py::gil_scoped_acquire gil;
      py::object result;
      try {
        result = propose_(py::cast(history()), gamma);
      } catch (py::error_already_set& e) {
        // the exception keeps its type (KeyboardInterrupt included), with where it came from as a note
        if (py::hasattr(e.value(), "add_note")) {
          e.value().attr("add_note")(fmt::format("raised by the Python drafter's propose(context, gamma={}) at "
                                                 "context length {}", gamma, history().size()));
        }
        throw;
      }
      require(py::isinstance<py::tuple>(result) && py::len(result) == 2,
              "drafter: propose(context, gamma) must return a tuple (tokens, q), got {}",
              std::string(py::str(py::type::of(result).attr("__name__"))));
      py::tuple pair = result.cast<py::tuple>();
      try {
        tokens = pair[0].cast<std::vector<int64_t>>();
      } catch (const py::cast_error&) {
        fail("drafter: tokens must be a sequence of int token ids");
      }
      if (!tokens.empty()) {
        try {
          q = pair[1].cast<at::Tensor>();
        } catch (const py::cast_error&) {
          fail("drafter: q must be a torch.Tensor [k, V] of probabilities (None only with no tokens)");
        }
      }
    }
    const int64_t k = static_cast<int64_t>(tokens.size());
    require(k <= gamma, "drafter: proposed {} tokens, more than gamma = {}", k, gamma);
    Proposal out;
    if (k == 0) return out;
    require(q.dim() == 2 && q.size(0) == k && q.size(1) == vocab_,
            "drafter: q must have shape [k, V] = [{}, {}], got [{}]", k, vocab_, fmt::join(q.sizes(), ", "));
    require(at::isFloatingType(q.scalar_type()), "drafter: q must be floating point, got {}",
            std::string(c10::toString(q.scalar_type())));
    at::Tensor host = q.detach().to(at::kCPU, at::kDouble).contiguous();  // [k, V]
    require(at::isfinite(host).all().item<bool>() && (host >= 0).all().item<bool>(),
            "drafter: q must be finite and nonnegative");
    at::Tensor sums = host.sum(1);  // [k]
    for (int64_t i = 0; i < k; ++i) {
      require(std::abs(sums[i].item<double>() - 1.0) <= 1e-4, "drafter: row {} of q sums to {}, not 1",
              i, sums[i].item<double>());
      require(tokens[i] >= 0 && tokens[i] < vocab_, "drafter: token {} = {} is outside the vocabulary [0, {})",
              i, tokens[i], vocab_);
      require(host[i][tokens[i]].item<double>() > 0,
              "drafter: token {} = {} has probability 0 in its q row: it cannot have been drawn from it", i,
              tokens[i]);
    }
    out.tokens = at::tensor(tokens, at::TensorOptions(device_).dtype(at::kLong));
    out.q = (host / sums.unsqueeze(1)).to(device_, at::kFloat);
    return out;
  }

  int64_t vocab_size() const override { return vocab_; }
  at::Device device() const override { return device_; }
  std::string name() const override { return "python"; }
  // The same callable: it is given each row's own context.
  std::shared_ptr<SequenceDrafter> replica() const override {
    py::gil_scoped_acquire gil;
    return std::make_shared<PythonDrafter>(propose_, vocab_, device_);
  }

 private:
  py::object propose_;
  int64_t vocab_;
  at::Device device_;
};

}  // namespace

std::shared_ptr<Drafter> python_drafter(py::object propose, int64_t vocab_size, const at::Device& device) {
  return std::make_shared<PythonDrafter>(std::move(propose), vocab_size, device);
}

}  // namespace speculant
