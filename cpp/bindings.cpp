// Python bindings: the private extension `speculant._core`. The public API is python/speculant/.
#include <torch/extension.h>

#include <optional>
#include <string>

#include "aoti_model.h"
#include "beam.h"
#include "continuation.h"
#include "cpu_kernels.h"
#include "decoder.h"
#include "drafter.h"
#include "errors.h"
#include "interrupt.h"
#include "model.h"
#include "python_drafter.h"
#include "python_model.h"
#include "sampling.h"
#include "speculative.h"
#include "step.h"
#include "tree.h"

namespace py = pybind11;
using namespace speculant;

namespace {

SamplingConfig make_config(double temperature, int64_t top_k, double top_p, double lenience) {
  SamplingConfig config{temperature, top_k, top_p, lenience};
  config.validate();
  return config;
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
void python_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Signals are delivered to Python's main thread only: elsewhere there is nothing to check.
InterruptCheck signal_check() {
  py::module_ threading = py::module_::import("threading");
  return threading.attr("current_thread")().is(threading.attr("main_thread")()) ? python_signals : nullptr;
}

// "dynamic", "fixed" or "graphed" (rows.h); python/speculant/decoder.py chooses.
Shapes parse_shapes(const std::string& name, const char* what) {
  if (name == "dynamic") return Shapes::dynamic;
  if (name == "fixed") return Shapes::fixed;
  if (name == "graphed") return Shapes::graphed;
  fail("{} must be 'dynamic', 'fixed' or 'graphed', got '{}'", what, name);
}

// How a tree's siblings are drawn (tree.h); python/speculant/decoder.py checks the name first.
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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "speculant's C++ core: standardized sampling, speculative sampling, the Algorithm 1 engine.";

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
      .def_property_readonly("metadata", [](const Model& model) { return py::bytes(model.metadata()); });

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

  m.def("check_sampling", [](double temperature, int64_t top_k, double top_p,
                             double lenience) { make_config(temperature, top_k, top_p, lenience); },
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("lenience"));
  m.def("standardize",
        [](const at::Tensor& logits, double temperature, int64_t top_k, double top_p) {
          SamplingConfig config = make_config(temperature, top_k, top_p, 1.0);
          at::Tensor probs = standardize(logits, config);
          check_finite(logits, "logits");
          return probs;
        },
        py::arg("logits"), py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0);
  m.def("acceptance_probability",
        [](const at::Tensor& p_x, const at::Tensor& q_x, double lenience) {
          make_config(1.0, 0, 1.0, lenience);
          check_probabilities(p_x, "p_x");
          check_probabilities(q_x, "q_x");
          return acceptance_probability(p_x, q_x, lenience);
        },
        py::arg("p_x"), py::arg("q_x"), py::arg("lenience") = 1.0);
  m.def("residual",
        [](const at::Tensor& p, const at::Tensor& q) {
          check_probabilities(p, "p");
          check_probabilities(q, "q");
          require(p.sizes() == q.sizes(), "p and q must have the same shape, got [{}] and [{}]",
                  fmt::join(p.sizes(), ", "), fmt::join(q.sizes(), ", "));
          return residual(p, q);
        },
        py::arg("p"), py::arg("q"));
  m.def("verify",
        [](const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens,
           double temperature, int64_t top_k, double top_p, double lenience) {
          check_finite(target_logits, "target_logits");
          check_probabilities(q, "q");
          Verification v =
              verify(target_logits, q, draft_tokens, make_config(temperature, top_k, top_p, lenience));
          return py::make_tuple(v.accept_prob, v.next_dist);
        },
        py::arg("target_logits"), py::arg("q"), py::arg("draft_tokens"), py::arg("temperature") = 1.0,
        py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("lenience") = 1.0);
  m.def("sample",
        [](const at::Tensor& probs, uint64_t seed) {
          check_probabilities(probs, "probs");
          require(probs.dim() == 2 && (probs.sum(-1) > 0).all().item<bool>(),
                  "probs must be [n, vocab] with positive mass in every row");
          at::Generator generator = make_generator(probs.device(), seed);
          return sample(probs, generator);
        },
        py::arg("probs"), py::arg("seed"));
  m.def("_sample_generic",
        [](const at::Tensor& probs, uint64_t seed) {
          at::Generator generator = make_generator(probs.device(), seed);
          return sample_generic(probs, generator);
        },
        py::arg("probs"), py::arg("seed"));

  // The step kernels (step.h, cpu_kernels.h) for tests: the tensor path on CPU, and the host kernel with given
  // uniforms (so that a test can place them and know exactly which n and t must come out).
  m.def("_set_host_kernels", &cpu::set_host_kernels, py::arg("on"),
        "CPU tensors run the host kernels (True, the default) or the accelerators' tensor path; returns the previous "
        "setting (process-wide: speculant.testing.tensor_path)");
  m.def("_standardize_generic",
        [](const at::Tensor& logits, double temperature, int64_t top_k, double top_p) {
          return standardize_generic(logits, make_config(temperature, top_k, top_p, 1.0));
        },
        py::arg("logits"), py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0);
  m.def("_verify_step",
        [](const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens, double temperature,
           int64_t top_k, double top_p, double lenience, const std::vector<double>& uniforms) {
          const SamplingConfig config = make_config(temperature, top_k, top_p, lenience);
          require(target_logits.is_cpu() && q.is_cpu() && draft_tokens.is_cpu(), "the host kernel takes CPU tensors");
          require(q.dim() == 2 && target_logits.dim() == 2 && q.size(0) + 1 == target_logits.size(0) &&
                      q.size(1) == target_logits.size(1) && draft_tokens.numel() == q.size(0),
                  "shapes must be target_logits [gamma + 1, V], q [gamma, V], draft_tokens [gamma]");
          const at::Tensor drafted = draft_tokens.to(at::kLong).contiguous();
          require(drafted.numel() == 0 || (drafted.min().item<int64_t>() >= 0 &&
                                           drafted.max().item<int64_t>() < target_logits.size(1)),
                  "draft_tokens must be token ids in [0, {})", target_logits.size(1));
          size_t used = 0;
          cpu::Verdict v = cpu::verify(target_logits, q, drafted.const_data_ptr<int64_t>(), config, [&] {
            require(used < uniforms.size(), "uniforms: the kernel needed more than the {} given", uniforms.size());
            return uniforms[used++];
          });
          return py::make_tuple(v.accepted, v.token, v.betas, used);
        },
        py::arg("target_logits"), py::arg("q"), py::arg("draft_tokens"), py::arg("temperature"), py::arg("top_k"),
        py::arg("top_p"), py::arg("lenience"), py::arg("uniforms"));
  // Rows of (target_logits, q, draft_tokens), row i drawing from a generator seeded with seeds[i]: verify_rows, or
  // with generic=true its tensor path (what accelerators run) on any device. -> [(n, t, betas, finite)] per row.
  m.def("_verify_rows_seeded",
        [](const std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>>& rows, double temperature, int64_t top_k,
           double top_p, double lenience, const std::vector<uint64_t>& seeds, bool generic) {
          require(seeds.size() == rows.size(), "seeds: one per row ({}), got {}", rows.size(), seeds.size());
          const SamplingConfig config = make_config(temperature, top_k, top_p, lenience);
          std::vector<VerifyInput> inputs;
          std::vector<at::Generator> generators;
          for (size_t i = 0; i < rows.size(); ++i) {
            const auto& [target_logits, q, draft_tokens] = rows[i];
            inputs.push_back({target_logits, q, draft_tokens.to(at::kLong), at::Tensor(), true});
            generators.push_back(make_generator(target_logits.device(), seeds[i]));
          }
          std::vector<at::Generator*> pointers;
          for (at::Generator& generator : generators) pointers.push_back(&generator);
          std::vector<Verdict> verdicts = generic ? verify_rows_generic(inputs, config, pointers)
                                                  : verify_rows(inputs, config, pointers);
          py::list out;
          for (const Verdict& v : verdicts) out.append(py::make_tuple(v.accepted, v.host_token, v.betas, v.finite));
          return out;
        },
        py::arg("rows"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("lenience"),
        py::arg("seeds"), py::arg("generic"));

  // Token trees (tree.h), for the tests: the parents of a shape, a node's children, one tree's verification
  // drawn with each of `seeds` -> [(path, path_tokens, t, accepted_rank, finite)].
  m.def("_tree_parents", [](const std::vector<int64_t>& shape) { return Tree::from_shape(shape).parents(); },
        py::arg("shape"));
  // k children of one node (q [V], k an int) or counts[i] children of each of several (q [n, V], k a list); groups:
  // the rows of each generator, group g seeded with seed + g (default: one group).
  m.def("_draw_children",
        [](const at::Tensor& q, const py::object& k, const std::string& siblings_name, bool greedy, uint64_t seed,
           bool generic, std::vector<int64_t> groups, const std::optional<at::Tensor>& sibling_q) {
          const Siblings siblings = parse_siblings(siblings_name);
          const bool one = py::isinstance<py::int_>(k);
          const at::Tensor rows = one ? q.unsqueeze(0) : q;
          const std::vector<int64_t> counts = one ? std::vector<int64_t>{k.cast<int64_t>()}
                                                  : k.cast<std::vector<int64_t>>();
          if (groups.empty()) groups.push_back(rows.size(0));
          std::vector<at::Generator> generators;
          for (size_t g = 0; g < groups.size(); ++g) generators.push_back(make_generator(q.device(), seed + g));
          std::vector<DrawGroup> drawing;
          for (size_t g = 0; g < groups.size(); ++g) drawing.push_back({&generators[g], groups[g]});
          const at::Tensor sibling = !sibling_q ? at::Tensor() : one ? sibling_q->unsqueeze(0) : *sibling_q;
          return generic && !greedy ? draw_children_generic(rows, counts, siblings, drawing, nullptr, sibling)
                                    : draw_children(rows, counts, siblings, greedy, drawing, nullptr, sibling);
        },
        py::arg("q"), py::arg("k"), py::arg("siblings"), py::arg("greedy"), py::arg("seed"),
        py::arg("generic") = false, py::arg("groups") = std::vector<int64_t>{},
        py::arg("sibling_q") = std::optional<at::Tensor>());
  auto verify = [](const std::vector<std::tuple<std::vector<int64_t>, at::Tensor, at::Tensor, at::Tensor>>& trees,
                   double temperature, int64_t top_k, double top_p, double lenience, const std::string& siblings_name,
                   const std::vector<uint64_t>& seeds, bool generic, const std::vector<at::Tensor>& sibling_qs) {
    require(seeds.size() == trees.size(), "seeds: one per tree ({}), got {}", trees.size(), seeds.size());
    require(sibling_qs.empty() || sibling_qs.size() == trees.size(), "sibling_qs: none, or one per tree ({}), got {}",
            trees.size(), sibling_qs.size());
    const SamplingConfig config = make_config(temperature, top_k, top_p, lenience);
    std::vector<Tree> shapes;
    std::vector<at::Generator> generators;
    for (size_t i = 0; i < trees.size(); ++i) {
      shapes.emplace_back(std::get<0>(trees[i]));
      generators.push_back(make_generator(std::get<1>(trees[i]).device(), seeds[i]));
    }
    std::vector<TreeInput> rows;
    for (size_t i = 0; i < trees.size(); ++i) {
      rows.push_back({&shapes[i], std::get<1>(trees[i]), std::get<2>(trees[i]), std::get<3>(trees[i]).to(at::kLong),
                      at::Tensor(), &generators[i], sibling_qs.empty() ? at::Tensor() : sibling_qs[i]});
    }
    const Siblings siblings = parse_siblings(siblings_name);
    py::list out;
    for (const TreeVerdict& v : generic ? verify_trees_generic(rows, config, siblings)
                                        : verify_trees(rows, config, siblings)) {
      out.append(py::make_tuple(v.path, v.path_tokens, v.host_token, v.accepted_rank, v.finite));
    }
    return out;
  };
  // Several trees in one batch, tree i drawing from a generator seeded with seeds[i].
  m.def("_verify_trees_seeded", verify, py::arg("trees"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("lenience"), py::arg("siblings"), py::arg("seeds"), py::arg("generic") = false,
        py::arg("sibling_qs") = std::vector<at::Tensor>{});
  // One tree verified with each of `seeds` (a batch of copies of it).
  m.def("_verify_tree_seeded",
        [verify](const std::vector<int64_t>& parents, const at::Tensor& target_logits, const at::Tensor& q,
                 const at::Tensor& tokens, double temperature, int64_t top_k, double top_p, double lenience,
                 const std::string& siblings_name, const std::vector<uint64_t>& seeds, bool generic,
                 const std::optional<at::Tensor>& sibling_q) {
          return verify({seeds.size(), {parents, target_logits, q, tokens}}, temperature, top_k, top_p, lenience,
                        siblings_name, seeds, generic,
                        sibling_q ? std::vector<at::Tensor>(seeds.size(), *sibling_q) : std::vector<at::Tensor>{});
        },
        py::arg("parents"), py::arg("target_logits"), py::arg("q"), py::arg("tokens"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("lenience"), py::arg("siblings"), py::arg("seeds"),
        py::arg("generic") = false, py::arg("sibling_q") = std::optional<at::Tensor>());

  py::class_<Iteration>(m, "Iteration")
      .def_readonly("drafted", &Iteration::drafted)
      .def_readonly("accepted", &Iteration::accepted)
      .def_readonly("token", &Iteration::token)
      .def_readonly("bonus", &Iteration::bonus)
      .def_readonly("emitted", &Iteration::emitted)
      .def_readonly("inner", &Iteration::inner)
      .def_readonly("tree", &Iteration::tree)
      .def("__repr__", [](const Iteration& it) {
        return fmt::format("Iteration(drafted=[{}], accepted={}, token={}, bonus={})",
                           fmt::join(it.drafted, ", "), it.accepted, it.token, it.bonus ? "True" : "False");
      });

  py::class_<Stats>(m, "Stats")
      .def_readonly("gamma", &Stats::gamma)
      .def_readonly("iterations", &Stats::iterations)
      .def_readonly("target_calls", &Stats::target_calls)
      .def_readonly("draft_calls", &Stats::draft_calls)
      .def_readonly("new_tokens", &Stats::new_tokens)
      .def_readonly("drafted_tokens", &Stats::drafted_tokens)
      .def_readonly("accepted_tokens", &Stats::accepted_tokens)
      .def_readonly("beta_sum", &Stats::beta_sum)
      .def_readonly("beta_count", &Stats::beta_count)
      .def_readonly("drafted_per_position", &Stats::drafted_per_position)
      .def_readonly("accepted_per_position", &Stats::accepted_per_position)
      .def_readonly("tree_visits", &Stats::tree_visits)
      .def_readonly("tree_accepted", &Stats::tree_accepted)
      .def_readonly("tree_offered", &Stats::tree_offered)
      .def_property_readonly("tokens_per_target_call", &Stats::tokens_per_target_call)
      .def_property_readonly("acceptance_rate", &Stats::acceptance_rate)
      .def_property_readonly("alpha", &Stats::alpha)
      .def_readonly("draft_seconds", &Stats::draft_seconds)
      .def_readonly("target_seconds", &Stats::target_seconds)
      .def_property_readonly("other_seconds", &Stats::other_seconds)
      .def_readonly("total_seconds", &Stats::total_seconds)
      .def_readonly("seed", &Stats::seed)
      .def("as_dict", [](const Stats& s) {
        py::dict d;
        d["gamma"] = s.gamma;
        d["iterations"] = s.iterations;
        d["target_calls"] = s.target_calls;
        d["draft_calls"] = s.draft_calls;
        d["new_tokens"] = s.new_tokens;
        d["drafted_tokens"] = s.drafted_tokens;
        d["accepted_tokens"] = s.accepted_tokens;
        d["drafted_per_position"] = s.drafted_per_position;
        d["accepted_per_position"] = s.accepted_per_position;
        d["tree_visits"] = s.tree_visits;
        d["tree_accepted"] = s.tree_accepted;
        d["tree_offered"] = s.tree_offered;
        d["tokens_per_target_call"] = s.tokens_per_target_call();
        d["acceptance_rate"] = s.acceptance_rate();
        d["alpha"] = s.alpha();
        d["draft_seconds"] = s.draft_seconds;
        d["target_seconds"] = s.target_seconds;
        d["other_seconds"] = s.other_seconds();
        d["total_seconds"] = s.total_seconds;
        d["seed"] = s.seed;
        return d;
      })
      .def("__repr__", [](const Stats& s) {
        return fmt::format("Stats(new_tokens={}, target_calls={}, draft_calls={}, tokens_per_target_call={:.3f}, "
                           "acceptance_rate={:.3f}, alpha={:.3f}, total_seconds={:.4f})",
                           s.new_tokens, s.target_calls, s.draft_calls, s.tokens_per_target_call(),
                           s.acceptance_rate(), s.alpha(), s.total_seconds);
      });

  py::class_<Generation>(m, "Generation")
      .def_readonly("tokens", &Generation::tokens)
      .def_readonly("stats", &Generation::stats)
      .def_readonly("trace", &Generation::trace)
      .def_readonly("levels", &Generation::levels);

  py::class_<Drafter, std::shared_ptr<Drafter>>(m, "Drafter")
      .def_property_readonly("vocab_size", &Drafter::vocab_size)
      .def_property_readonly("device", [](const Drafter& d) { return d.device().str(); })
      .def_property_readonly("kind", &Drafter::name)
      .def_property_readonly("tree_obstacle", &Drafter::tree_obstacle);
  m.def("model_drafter", &model_drafter, py::arg("model"), py::arg("sibling") = nullptr);
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

  py::class_<BeamSearch>(m, "BeamSearch")
      .def_readonly("sequences", &BeamSearch::sequences)
      .def_readonly("scores", &BeamSearch::scores)
      .def_readonly("steps", &BeamSearch::steps)
      .def_readonly("target_calls", &BeamSearch::target_calls)
      .def_readonly("draft_calls", &BeamSearch::draft_calls)
      .def_readonly("target_tokens", &BeamSearch::target_tokens)
      .def_readonly("draft_tokens", &BeamSearch::draft_tokens)
      .def_readonly("steps_per_call", &BeamSearch::steps_per_call)
      .def_readonly("seconds", &BeamSearch::seconds)
      .def("__repr__", [](const BeamSearch& b) {
        return fmt::format("BeamSearch(steps={}, target_calls={}, draft_calls={}, target_tokens={}, "
                           "draft_tokens={}, seconds={:.4f})",
                           b.steps, b.target_calls, b.draft_calls, b.target_tokens, b.draft_tokens, b.seconds);
      });
  m.def(
      "beam_search",
      [](const std::shared_ptr<Model>& target, const std::shared_ptr<Model>& draft,
         const std::vector<int64_t>& prompt, const std::vector<int64_t>& source, int64_t beams, int64_t draft_beams,
         int64_t gamma, double length_penalty, const std::string& early_stopping, int64_t return_sequences,
         int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids) {
        require(target != nullptr, "target must be a model");
        BeamConfig config{beams, draft_beams, gamma, length_penalty, EarlyStopping::heuristic, return_sequences,
                          max_new_tokens, eos_token_ids};
        if (early_stopping == "true") {
          config.early_stopping = EarlyStopping::at_num_beams;
        } else if (early_stopping == "never") {
          config.early_stopping = EarlyStopping::never;
        } else {
          require(early_stopping == "false", "early_stopping must be False, True or 'never', got '{}'",
                  early_stopping);
        }
        InterruptScope interruptible(signal_check());
        py::gil_scoped_release release;
        return beam_search(*target, draft.get(), prompt, source, config);
      },
      py::arg("target"), py::arg("draft"), py::arg("prompt"), py::arg("source"), py::arg("beams"),
      py::arg("draft_beams"), py::arg("gamma"), py::arg("length_penalty"), py::arg("early_stopping"), py::arg("return_sequences"),
      py::arg("max_new_tokens"), py::arg("eos_token_ids"));

  py::class_<Decoder>(m, "Decoder")
      .def(py::init([](std::shared_ptr<Model> target, std::shared_ptr<Drafter> draft, int64_t gamma,
                       double temperature, int64_t top_k, double top_p, double lenience,
                       const std::string& target_shapes, const std::string& draft_shapes,
                       const std::vector<int64_t>& tree, const std::string& siblings,
                       std::optional<std::array<int64_t, 4>> growth) {
             std::optional<TreeGrowth> grown;
             if (growth) grown = TreeGrowth{(*growth)[0], (*growth)[1], (*growth)[2], (*growth)[3]};
             return Decoder(std::move(target), std::move(draft), gamma,
                            SamplingConfig{temperature, top_k, top_p, lenience},
                            parse_shapes(target_shapes, "target_shapes"), parse_shapes(draft_shapes, "draft_shapes"),
                            tree, parse_siblings(siblings), grown);
           }),
           py::arg("target"), py::arg("draft"), py::arg("gamma"), py::arg("temperature"), py::arg("top_k"),
           py::arg("top_p"), py::arg("lenience"), py::arg("target_shapes") = "dynamic",
           py::arg("draft_shapes") = "dynamic", py::arg("tree") = std::vector<int64_t>{},
           py::arg("siblings") = "without_replacement", py::arg("growth") = std::nullopt)
      .def(
          "generate_batch",
          [](const Decoder& decoder, const std::vector<std::vector<int64_t>>& prompts,
             const std::vector<std::vector<int64_t>>& sources, int64_t max_new_tokens,
             const std::vector<int64_t>& eos_token_ids, std::optional<uint64_t> seed, bool profile,
             const std::string& gamma_policy, std::optional<int64_t> max_gamma, double cost) {
            InterruptScope interruptible(signal_check());
            py::gil_scoped_release release;
            return decoder.generate_batch(prompts, sources, max_new_tokens, eos_token_ids, seed, profile,
                                          GammaSchedule{gamma_policy, max_gamma, cost});
          },
          py::arg("prompts"), py::arg("sources"), py::arg("max_new_tokens"), py::arg("eos_token_ids"),
          py::arg("seed"), py::arg("profile") = false, py::arg("gamma_policy") = "fixed",
          py::arg("max_gamma") = py::none(), py::arg("cost") = 0.0)
      .def(
          "as_draft",
          [](const Decoder& decoder, const std::string& gamma_policy, std::optional<int64_t> max_gamma, double cost) {
            return decoder.as_draft(GammaSchedule{gamma_policy, max_gamma, cost});
          },
          py::arg("gamma_policy") = "fixed", py::arg("max_gamma") = py::none(), py::arg("cost") = 0.0)
      .def_property_readonly("verification_graphs", &Decoder::verification_graphs);
}
