#include "drafting/python_drafter.h"

#include <torch/extension.h>

#include <chrono>
#include <cmath>

#include "errors.h"

namespace py = pybind11;

namespace speculant {
namespace {

// q [k, V] from Python, checked (`what` names it in messages, `rows` names k: "k" for proposals, "n" for one law
// per context): floating point, finite, nonnegative, each row summing to 1 within 1e-4; returned renormalized,
// float32 on `device`.
at::Tensor checked_laws(const at::Tensor& q, int64_t k, int64_t vocab, const at::Device& device, const char* what,
                        const char* rows) {
  require(q.dim() == 2 && q.size(0) == k && q.size(1) == vocab,
          "drafter: {} must have shape [{}, V] = [{}, {}], got [{}]", what, rows, k, vocab, fmt::join(q.sizes(), ", "));
  require(at::isFloatingType(q.scalar_type()), "drafter: {} must be floating point, got {}", what,
          std::string(c10::toString(q.scalar_type())));
  at::Tensor host = q.detach().to(at::kCPU, at::kDouble).contiguous();  // [k, V]
  require(at::isfinite(host).all().item<bool>() && (host >= 0).all().item<bool>(),
          "drafter: {} must be finite and nonnegative", what);
  at::Tensor sums = host.sum(1);  // [k]
  for (int64_t i = 0; i < k; ++i) {
    require(std::abs(sums[i].item<double>() - 1.0) <= 1e-4, "drafter: row {} of {} sums to {}, not 1", i, what,
            sums[i].item<double>());
  }
  return (host / sums.unsqueeze(1)).to(device, at::kFloat);
}

DrafterFacts python_facts(const py::object& score, int64_t vocab, const at::Device& device) {
  require(vocab >= 1, "vocab_size must be >= 1, got {}", vocab);
  const std::string why = score.is_none() ? "the python drafter proposes chains only; PythonDrafter(..., score=f), "
                                            "f(contexts) -> q [n, V], lets it propose trees"
                                          : "";
  return {"python", vocab, device, false, std::nullopt, std::nullopt, [why] { return why; }};
}

// The same callables serve every row of a batch: each is given the row's own context.
class PythonDrafter final : public SequenceDrafter {
 public:
  PythonDrafter(py::object propose, py::object score, int64_t vocab, const at::Device& device)
      : SequenceDrafter(python_facts(score, vocab, device)), propose_(std::move(propose)), score_(std::move(score)),
        vocab_(vocab), device_(device) {}
  ~PythonDrafter() override {
    py::gil_scoped_acquire gil;
    propose_ = py::object();
    score_ = py::object();
  }

  // score(contexts): one law per context (the sequence so far, then the path); greedy children are its top k.
  at::Tensor laws(const std::vector<int64_t>& history, const std::vector<std::vector<int64_t>>& paths,
                  const SamplingConfig&, at::Tensor* scores) override {
    at::Tensor q;
    {
      py::gil_scoped_acquire gil;
      py::list contexts;
      for (const auto& path : paths) {
        std::vector<int64_t> context = history;
        context.insert(context.end(), path.begin(), path.end());
        contexts.append(py::cast(context));
      }
      py::object result = call([&] { return score_(contexts); }, "score(contexts)", history.size());
      try {
        q = result.cast<at::Tensor>();
      } catch (const py::cast_error&) {
        fail("drafter: score(contexts) must return a torch.Tensor [n, V] of probabilities, one row per context");
      }
    }
    *scores = checked_laws(q, static_cast<int64_t>(paths.size()), vocab_, device_, "score(contexts)", "n");
    return *scores;
  }

  Proposal propose(const std::vector<int64_t>& history, int64_t gamma, const SamplingConfig&,
                   at::Generator&) override {
    std::vector<int64_t> tokens;
    at::Tensor q;
    {
      py::gil_scoped_acquire gil;
      py::object result = call([&] { return propose_(py::cast(history), gamma); },
                               fmt::format("propose(context, gamma={})", gamma), history.size());
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
    out.q = checked_laws(q, k, vocab_, device_, "q", "k");
    const at::Tensor host = out.q.to(at::kCPU);
    for (int64_t i = 0; i < k; ++i) {
      require(tokens[i] >= 0 && tokens[i] < vocab_, "drafter: token {} = {} is outside the vocabulary [0, {})",
              i, tokens[i], vocab_);
      require(host[i][tokens[i]].item<float>() > 0,
              "drafter: token {} = {} has probability 0 in its q row: it cannot have been drawn from it", i,
              tokens[i]);
    }
    out.tokens = at::tensor(tokens, at::TensorOptions(device_).dtype(at::kLong));
    return out;
  }

 private:
  // Calls Python (the GIL held); its exception keeps its type (KeyboardInterrupt included), with where it came
  // from as a note.
  template <typename Call>
  py::object call(const Call& body, const std::string& what, size_t length) const {
    try {
      return body();
    } catch (py::error_already_set& e) {
      if (py::hasattr(e.value(), "add_note")) {
        e.value().attr("add_note")(fmt::format("raised by the Python drafter's {} at context length {}", what,
                                               length));
      }
      throw;
    }
  }

  py::object propose_;
  py::object score_;  // None: chains only
  int64_t vocab_;
  at::Device device_;
};

}  // namespace

std::shared_ptr<Drafter> python_drafter(py::object propose, int64_t vocab_size, const at::Device& device,
                                        py::object score) {
  return std::make_shared<PythonDrafter>(std::move(propose), std::move(score), vocab_size, device);
}

}  // namespace speculant
