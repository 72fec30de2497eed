// Python bindings: The loops: beam search and the speculative Decoder.
#include "bindings/bindings.h"

#include "drafting/drafter.h"
#include "loop/beam.h"
#include "loop/decoder.h"

namespace speculant::bindings {

void bind_loop(py::module_& m) {
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
                       std::optional<std::array<int64_t, 4>> growth, const std::string& verification) {
             std::optional<TreeGrowth> grown;
             if (growth) grown = TreeGrowth{(*growth)[0], (*growth)[1], (*growth)[2], (*growth)[3]};
             return Decoder(std::move(target), std::move(draft), gamma,
                            SamplingConfig{temperature, top_k, top_p, lenience, parse_verification(verification)},
                            parse_shapes(target_shapes, "target_shapes"), parse_shapes(draft_shapes, "draft_shapes"),
                            tree, parse_siblings(siblings), grown);
           }),
           py::arg("target"), py::arg("draft"), py::arg("gamma"), py::arg("temperature"), py::arg("top_k"),
           py::arg("top_p"), py::arg("lenience"), py::arg("target_shapes") = "dynamic",
           py::arg("draft_shapes") = "dynamic", py::arg("tree") = std::vector<int64_t>{},
           py::arg("siblings") = "without_replacement", py::arg("growth") = std::nullopt,
           py::arg("verification") = "token")
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

}  // namespace speculant::bindings
