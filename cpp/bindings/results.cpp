// Python bindings: What a generation returns: Iteration, Stats, Generation.
#include "bindings/bindings.h"

#include "loop/decoder.h"
#include "loop/stats.h"

namespace speculant::bindings {

void bind_results(py::module_& m) {
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
      .def_readonly("token_kept_sum", &Stats::token_kept_sum)
      .def_readonly("block_kept_sum", &Stats::block_kept_sum)
      .def_readonly("predicted_iterations", &Stats::predicted_iterations)
      .def_property_readonly("token_expected_tokens", [](const Stats& s) { return s.expected_tokens(false); })
      .def_property_readonly("block_expected_tokens", [](const Stats& s) { return s.expected_tokens(true); })
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
        d["token_expected_tokens"] = s.expected_tokens(false);
        d["block_expected_tokens"] = s.expected_tokens(true);
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
}

}  // namespace speculant::bindings
