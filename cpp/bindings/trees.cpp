// Python bindings: Token trees for the tests: shapes, children's draws, and chains and trees verified with given
// seeds.
#include "bindings/bindings.h"

#include "math/streams.h"
#include "math/tree.h"

namespace speculant::bindings {
namespace {

void bind_chain_verification(py::module_& m) {
  // Rows of (target_logits, q, draft_tokens), row i drawing from a generator seeded with seeds[i]: each row the
  // chain [1] * gamma in its own form (tree.h: TreeInput) through verify_drafts, or with as_tensors=true its tensor
  // path (what accelerators run) on any device, by the rule `verification` names ('token' or 'block').
  // -> [(n, t, betas, finite, ratios)] per row (Verdict's).
  m.def("_verify_rows_seeded",
        [](const std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>>& rows, double temperature, int64_t top_k,
           double top_p, double lenience, const std::vector<uint64_t>& seeds, bool as_tensors,
           const std::string& verification) {
          require(seeds.size() == rows.size(), "seeds: one per row ({}), got {}", rows.size(), seeds.size());
          const SamplingConfig config = make_config(temperature, top_k, top_p, lenience, verification);
          std::vector<Tree> chains;
          std::vector<Streams> streams;  // row i's, seeded with seeds[i] (streams.h)
          chains.reserve(rows.size());
          streams.reserve(rows.size());
          std::vector<TreeInput> inputs;
          for (size_t i = 0; i < rows.size(); ++i) {
            const auto& [target_logits, q, draft_tokens] = rows[i];
            chains.push_back(Tree::from_shape(std::vector<int64_t>(draft_tokens.numel(), 1)));
            streams.emplace_back(target_logits.device(), seeds[i]);
            inputs.push_back({&chains.back(), target_logits, q, draft_tokens.to(at::kLong), at::Tensor(),
                              &streams.back().coins, &streams.back().correction});
          }
          const Siblings one = Siblings::with_replacement;  // one child per node
          std::vector<Verdict> verdicts = as_tensors ? verify_drafts_as_tensors(inputs, config, one)
                                                     : verify_drafts(inputs, config, one);
          py::list out;
          for (const Verdict& v : verdicts) {
            out.append(py::make_tuple(v.accepted(), v.host_token, v.betas, v.finite, v.ratios));
          }
          return out;
        },
        py::arg("rows"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("lenience"),
        py::arg("seeds"), py::arg("as_tensors"), py::arg("verification") = "token");
}

}  // namespace

void bind_trees(py::module_& m) {
  bind_chain_verification(m);
  // Token trees (tree.h), for the tests: the parents of a shape, a node's children, one tree's verification
  // drawn with each of `seeds` -> [(path, path_tokens, t, accepted_rank, finite, kept_in_expectation)].
  m.def("_tree_parents", [](const std::vector<int64_t>& shape) { return Tree::from_shape(shape).parents(); },
        py::arg("shape"));
  // k children of one node (q [V], k an int) or counts[i] children of each of several (q [n, V], k a list); groups:
  // the rows of each generator, group g seeded with seed + g (default: one group).
  m.def("_draw_children",
        [](const at::Tensor& q, const py::object& k, const std::string& siblings_name, bool greedy, uint64_t seed,
           bool as_tensors, std::vector<int64_t> groups, const std::optional<at::Tensor>& sibling_q) {
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
          return as_tensors && !greedy ? draw_children_as_tensors(rows, counts, siblings, drawing, nullptr, sibling)
                                    : draw_children(rows, counts, siblings, greedy, drawing, nullptr, sibling);
        },
        py::arg("q"), py::arg("k"), py::arg("siblings"), py::arg("greedy"), py::arg("seed"),
        py::arg("as_tensors") = false, py::arg("groups") = std::vector<int64_t>{},
        py::arg("sibling_q") = std::optional<at::Tensor>());
  auto verify = [](const std::vector<std::tuple<std::vector<int64_t>, at::Tensor, at::Tensor, at::Tensor>>& trees,
                   double temperature, int64_t top_k, double top_p, double lenience, const std::string& siblings_name,
                   const std::vector<uint64_t>& seeds, bool as_tensors, const std::vector<at::Tensor>& sibling_qs,
                   const std::string& verification) {
    require(seeds.size() == trees.size(), "seeds: one per tree ({}), got {}", trees.size(), seeds.size());
    require(sibling_qs.empty() || sibling_qs.size() == trees.size(), "sibling_qs: none, or one per tree ({}), got {}",
            trees.size(), sibling_qs.size());
    const SamplingConfig config = make_config(temperature, top_k, top_p, lenience, verification);
    std::vector<Tree> shapes;
    std::vector<Streams> streams;  // tree i's, seeded with seeds[i] (streams.h)
    for (size_t i = 0; i < trees.size(); ++i) {
      shapes.emplace_back(std::get<0>(trees[i]));
      streams.emplace_back(std::get<1>(trees[i]).device(), seeds[i]);
    }
    std::vector<TreeInput> rows;
    for (size_t i = 0; i < trees.size(); ++i) {
      rows.push_back({&shapes[i], std::get<1>(trees[i]), std::get<2>(trees[i]), std::get<3>(trees[i]).to(at::kLong),
                      at::Tensor(), &streams[i].coins, &streams[i].correction,
                      sibling_qs.empty() ? at::Tensor() : sibling_qs[i]});
    }
    const Siblings siblings = parse_siblings(siblings_name);
    py::list out;
    for (const Verdict& v : as_tensors ? verify_drafts_as_tensors(rows, config, siblings)
                                        : verify_drafts(rows, config, siblings)) {
      out.append(py::make_tuple(v.path, v.path_tokens, v.host_token, v.accepted_rank, v.finite, v.kept_in_expectation));
    }
    return out;
  };
  // Several trees in one batch, tree i drawing from a generator seeded with seeds[i], by the rule `verification`
  // names ('token', or 'block': traversal verification).
  m.def("_verify_trees_seeded", verify, py::arg("trees"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("lenience"), py::arg("siblings"), py::arg("seeds"), py::arg("as_tensors") = false,
        py::arg("sibling_qs") = std::vector<at::Tensor>{}, py::arg("verification") = "token");
  // One tree verified with each of `seeds` (a batch of copies of it).
  m.def("_verify_tree_seeded",
        [verify](const std::vector<int64_t>& parents, const at::Tensor& target_logits, const at::Tensor& q,
                 const at::Tensor& tokens, double temperature, int64_t top_k, double top_p, double lenience,
                 const std::string& siblings_name, const std::vector<uint64_t>& seeds, bool as_tensors,
                 const std::optional<at::Tensor>& sibling_q, const std::string& verification) {
          return verify({seeds.size(), {parents, target_logits, q, tokens}}, temperature, top_k, top_p, lenience,
                        siblings_name, seeds, as_tensors,
                        sibling_q ? std::vector<at::Tensor>(seeds.size(), *sibling_q) : std::vector<at::Tensor>{},
                        verification);
        },
        py::arg("parents"), py::arg("target_logits"), py::arg("q"), py::arg("tokens"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("lenience"), py::arg("siblings"), py::arg("seeds"),
        py::arg("as_tensors") = false, py::arg("sibling_q") = std::optional<at::Tensor>(),
        py::arg("verification") = "token");
}

}  // namespace speculant::bindings
