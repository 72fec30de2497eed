#include "math/tree.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>

#include "math/cpu_kernels.h"
#include "errors.h"
#include "device/join.h"
#include "device/upload.h"

namespace speculant {

Tree::Tree(std::vector<int64_t> parent) : parent_(std::move(parent)) {
  require(!parent_.empty() && parent_[0] == -1, "a tree's node 0 is its root, with parent -1");
  const auto size = static_cast<int64_t>(parent_.size());
  depth_.assign(size, 0);
  first_child_.assign(size, -1);
  children_.assign(size, 0);
  for (int64_t i = 1; i < size; ++i) {
    const int64_t up = parent_[i];
    require(up >= 0 && up < i, "tree node {} has parent {}: a node's parent comes before it (breadth-first order)",
            i, up);
    require(i == 1 || up >= parent_[i - 1],
            "tree node {} has parent {} after a node with parent {}: siblings must be contiguous, in "
            "breadth-first order (parents nondecreasing)", i, up, parent_[i - 1]);
    depth_[i] = depth_[up] + 1;
    require(depth_[i] >= depth_[i - 1], "tree node {} is shallower than node {}: breadth-first order", i, i - 1);
    if (children_[up]++ == 0) first_child_[up] = i;
  }
}

Tree Tree::from_shape(const std::vector<int64_t>& shape) {
  std::vector<int64_t> parent{-1};
  int64_t level_begin = 0, level_end = 1;  // the nodes of the current depth
  for (size_t i = 0; i < shape.size(); ++i) {
    require(shape[i] >= 1, "tree[{}] = {}: every depth needs at least one child per node", i, shape[i]);
    require(static_cast<double>(level_end - level_begin) * static_cast<double>(shape[i]) <= 4096.0,
            "tree: depth {} would hold more than 4096 nodes", i + 1);
    for (int64_t node = level_begin; node < level_end; ++node) {
      for (int64_t k = 0; k < shape[i]; ++k) parent.push_back(node);
    }
    level_begin = level_end;
    level_end = static_cast<int64_t>(parent.size());
  }
  return Tree(std::move(parent));
}

double expected_kept(const Tree& tree, const std::vector<double>& chances, bool block) {
  // reach[v]: the token rule's P(v kept); traversal's prod over the subtrees before v's of (1 - r_s)
  std::vector<double> reach(tree.size(), 1.0);
  double kept = 0.0;
  for (int64_t node = 0; node < tree.size(); ++node) {
    double passed = 1.0;  // prod (1 - c_s) over the earlier children
    for (int64_t j = 0, first = tree.first_child(node); j < tree.children(node); ++j) {
      const double chance = chances[first + j];
      reach[first + j] = reach[node] * passed * (block ? 1.0 : chance);
      kept += block ? reach[first + j] * chance : reach[first + j];
      passed *= 1.0 - chance;
    }
  }
  return kept;
}

std::vector<int64_t> Tree::post_order() const {
  std::vector<int64_t> out, stack{0}, next(size(), 0);  // next: the rank of the child to visit next
  while (!stack.empty()) {
    const int64_t node = stack.back();
    if (next[node] < children_[node]) {
      stack.push_back(first_child_[node] + next[node]++);
    } else {
      out.push_back(node);
      stack.pop_back();
    }
  }
  return out;
}

int64_t Tree::max_children() const { return *std::max_element(children_.begin(), children_.end()); }

namespace {

void check_counts(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings, bool greedy,
                  const std::vector<DrawGroup>& groups, const at::Tensor& sibling_q) {
  require(q.dim() == 2 && q.size(0) == static_cast<int64_t>(counts.size()) && q.size(1) > 0,
          "draw_children: q must be [nodes, V] with one row per count, got {} rows for {} counts", q.size(0),
          counts.size());
  if (sibling_q.defined()) {
    require(sibling_q.sizes() == q.sizes(), "draw_children: the siblings' law must be shaped as q [{}, {}]",
            q.size(0), q.size(1));
    require(greedy || independent_draws(siblings), "a sibling draft's children are independent draws: siblings "
            "'coupled' or 'with_replacement'");
  }
  int64_t grouped = 0;
  for (const DrawGroup& group : groups) {
    require(group.generator != nullptr && group.rows >= 1, "draw_children: every group has a generator and rows");
    grouped += group.rows;
  }
  require(grouped == q.size(0), "draw_children: the groups hold {} rows of q's {}", grouped, q.size(0));
  for (const int64_t k : counts) {
    require(k >= 1, "draw_children: every node's count must be >= 1, got {}", k);
    require(!greedy || k <= q.size(1), "a node's {} children at temperature 0 are the draft's top {}, but V = {}", k,
            k, q.size(1));
    require(greedy || siblings != Siblings::top || k <= q.size(1),
            "a node's {} top children are the draft's top {} and one draw, but V = {}", k, k - 1, q.size(1));
  }
}

// The tokens of a [n, K] table (row i's first counts[i] of its K columns), row after row: int64 [sum counts].
at::Tensor leading_columns(const at::Tensor& table, const std::vector<int64_t>& counts) {
  const int64_t width = table.size(1);
  if (std::all_of(counts.begin(), counts.end(), [width](int64_t k) { return k == width; })) return table.flatten();
  std::vector<int64_t> cells;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t j = 0; j < counts[i]; ++j) cells.push_back(static_cast<int64_t>(i) * width + j);
  }
  return table.flatten().index_select(0, upload(cells, table.device()));
}

}  // namespace

at::Tensor draw_children(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings, bool greedy,
                         const std::vector<DrawGroup>& groups, at::Tensor* mass, const at::Tensor& sibling_q) {
  check_counts(q, counts, siblings, greedy, groups, sibling_q);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  if (greedy) {
    if (!sibling_q.defined() || widest == 1) return leading_columns(top_tokens(q, widest), counts);
    return leading_columns(at::cat({top_tokens(q, 1), top_tokens(sibling_q, widest - 1)}, 1), counts);
  }
  if (!cpu::runs_on_host(q)) return draw_children_as_tensors(q, counts, siblings, groups, mass, sibling_q);
  std::vector<at::Tensor> drawn;
  int64_t i = 0;
  for (const DrawGroup& group : groups) {
    cpu::GeneratorUniform uniform(*group.generator);
    for (const int64_t end = i + group.rows; i < end; ++i) {
      drawn.push_back(cpu::draw_children(q[i], counts[i], siblings, [&uniform] { return uniform(); },
                                         sibling_q.defined() ? sibling_q[i] : at::Tensor()));
    }
  }
  return joined(drawn);
}

at::Tensor top_tokens(const at::Tensor& q, int64_t k) {
  // each row's k highest scores, the first index on ties: on the host a partial sort, else argmax for one (one
  // pass), else a stable descending sort (BENCHMARKS.md: what the sort cost a greedy tree on the host)
  if (cpu::runs_on_host(q)) return cpu::top_tokens(q, k);
  if (k == 1) return q.argmax(-1, /*keepdim=*/true);
  return std::get<1>(q.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, k);
}

at::Tensor children_uniforms(const std::vector<int64_t>& counts, Siblings siblings,
                             const std::vector<DrawGroup>& groups, const at::Device& device) {
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  // Each group's uniforms for columns [0, columns(g)) of its rows, as it draws them alone (scaled for the inverse
  // CDF: the same arithmetic as rand()'s draw times kBelowOne), padded to `width` columns with values nothing reads.
  auto uniforms = [&](const std::function<int64_t(size_t, int64_t, int64_t)>& columns, int64_t width) {
    std::vector<at::Tensor> parts;
    int64_t begin = 0;
    for (size_t g = 0; g < groups.size(); begin += groups[g].rows, ++g) {
      const int64_t drawn = columns(g, begin, begin + groups[g].rows);
      const at::Tensor u = drawn > 0 ? scaled_uniforms({groups[g].rows, drawn}, *groups[g].generator, device)
                                     : at::empty({groups[g].rows, 0}, at::TensorOptions(device).dtype(at::kDouble));
      parts.push_back(drawn < width ? at::constant_pad_nd(u, {0, width - drawn}, 0.5) : u);
    }
    return joined(parts);  // [n, width]
  };
  auto group_widest = [&](size_t, int64_t begin, int64_t end) {
    return *std::max_element(counts.begin() + begin, counts.begin() + end);
  };
  if (independent_draws(siblings)) return uniforms(group_widest, widest);
  if (siblings == Siblings::top) return uniforms([](size_t, int64_t, int64_t) { return int64_t{1}; }, 1);
  // without replacement: column j for the groups with rows of more than j children, one column after the other
  std::vector<at::Tensor> columns;
  for (int64_t j = 0; j < widest; ++j) {
    columns.push_back(uniforms([&](size_t g, int64_t begin, int64_t end) {
      return int64_t{group_widest(g, begin, end) > j};
    }, 1));
  }
  return columns.size() == 1 ? columns[0] : at::cat(columns, 1);
}

at::Tensor draw_children_with(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings,
                              const at::Tensor& uniforms, at::Tensor* mass, const at::Tensor& sibling_q) {
  const at::Tensor rows = q.to(at::kDouble);  // [n, V]
  const int64_t n = rows.size(0);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  // each row's total mass from its first draw (rows it left unchanged, or only its zeroed tokens): NaN exactly
  // where q's row is
  at::Tensor* first_mass = mass;
  auto draw = [&](const at::Tensor& from, const at::Tensor& u) {
    at::Tensor* out = first_mass;
    first_mass = nullptr;
    return sample_inverse_cdf_scaled(from, u, out);
  };
  if (independent_draws(siblings) && sibling_q.defined() && widest > 1) {  // column 0 from q, the rest from s
    const at::Tensor first = draw(rows, uniforms.narrow(1, 0, 1)).view({n, 1});
    const at::Tensor rest = sample_inverse_cdf_scaled(sibling_q.to(at::kDouble), uniforms.narrow(1, 1, widest - 1));
    return leading_columns(at::cat({first, rest.view({n, widest - 1})}, 1), counts);
  }
  if (independent_draws(siblings)) {  // every row's draws in one pass, then each row's first counts[i]
    return leading_columns(draw(rows, uniforms).view({n, widest}), counts);
  }
  if (siblings == Siblings::top) {  // every row's top count - 1 tokens (one count for all), then one draw
    const int64_t fixed = counts[0] - 1;
    const at::Tensor top = top_tokens(rows, fixed);  // [n, k - 1]
    const at::Tensor left = fixed > 0 ? rows.scatter(1, top, 0.0) : rows;
    return at::cat({top, draw(left, uniforms).unsqueeze(1)}, 1).flatten();
  }
  // Without replacement: column j of every row from what that row's earlier columns left. Once a row's support is
  // used up its remaining children are drawn from a zero row (an arbitrary token), and verify_tree never accepts
  // them.
  std::vector<at::Tensor> columns;
  at::Tensor left = rows.clone();
  for (int64_t j = 0; j < widest; ++j) {
    const at::Tensor x = draw(left, uniforms.narrow(1, j, 1)).unsqueeze(1);  // [n, 1]
    if (j + 1 < widest) left.scatter_(1, x, 0.0);
    columns.push_back(x);
  }
  return leading_columns(at::cat(columns, 1), counts);
}

at::Tensor draw_children_as_tensors(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings,
                                 const std::vector<DrawGroup>& groups, at::Tensor* mass, const at::Tensor& sibling_q) {
  check_counts(q, counts, siblings, /*greedy=*/false, groups, sibling_q);
  const bool one_count = std::all_of(counts.begin(), counts.end(), [&](int64_t k) { return k == counts[0]; });
  if (siblings == Siblings::top && !one_count) {  // row by row: each its top count - 1 tokens, then one draw
    std::vector<at::Tensor> drawn, masses(q.size(0));
    int64_t i = 0;
    for (const DrawGroup& group : groups) {
      for (const int64_t end = i + group.rows; i < end; ++i) {
        drawn.push_back(draw_children_as_tensors(q.narrow(0, i, 1), {counts[i]}, siblings, {{group.generator, 1}},
                                              &masses[i]));
      }
    }
    if (mass) *mass = at::cat(masses);
    return at::cat(drawn);
  }
  return draw_children_with(q, counts, siblings, children_uniforms(counts, siblings, groups, q.device()), mass,
                            sibling_q);
}

void check_tree_input(const TreeInput& row, const SamplingConfig& config, Siblings siblings) {
  const int64_t size = row.tree->size();
  require(row.target_logits.dim() == 2 && row.target_logits.size(0) == size,
          "target_logits must be [tree nodes, V] = [{}, V], got {} rows", size, row.target_logits.size(0));
  const bool chain = row.chain_form();
  const int64_t rows = chain ? size - 1 : size;  // a chain's form: its drafts' rows only
  require(row.q.dim() == 2 && row.q.size(0) == rows && row.q.size(1) == row.target_logits.size(1),
          "q must be [{}, V] = [{}, {}]", chain ? "drafts" : "tree nodes", rows, row.target_logits.size(1));
  require(row.tokens.dim() == 1 && row.tokens.size(0) == rows && row.tokens.scalar_type() == at::kLong,
          "tokens must be int64 [{}] = [{}]", chain ? "drafts" : "tree nodes", rows);
  require(row.tree->chain() || !config.block() || siblings != Siblings::coupled,
          "verification='block' on a tree is traversal verification (tree.h), proven for siblings 'with_replacement', "
          "'without_replacement' and 'top'; siblings 'coupled' take verification='token'");
  require(row.coins != nullptr && row.correction != nullptr && row.coins != row.correction,
          "a verification's coins and its correction draw from two streams (streams.h)");
  require(chain || config.lenience == 1.0, "lenience must be 1 with a tree of drafts (A.5's bound is proven for one "
          "draft per position); got {}", config.lenience);
  if (row.sibling_q.defined()) {
    require(!chain, "a chain in its own form has no sibling law");
    require(row.sibling_q.sizes() == row.q.sizes(), "sibling_q must be shaped as q: [{}, {}]", size,
            row.target_logits.size(1));
    require(config.greedy() || independent_draws(siblings), "a sibling draft's children are independent draws: "
            "siblings 'coupled' or 'with_replacement'");
  }
}

std::vector<Verdict> verify_drafts(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                      Siblings siblings, VerificationGraphs* graphs) {
  if (rows.empty()) return {};
  if (!cpu::runs_on_host(rows.front().target_logits)) return verify_drafts_as_tensors(rows, config, siblings, graphs);
  std::vector<Verdict> out;
  for (const TreeInput& row : rows) {
    check_tree_input(row, config, siblings);
    const at::Tensor host_tokens = row.tokens.contiguous();
    {
      cpu::GeneratorUniform coin(*row.coins), correction(*row.correction);
      const cpu::Uniform coins = [&coin] { return coin(); }, draw = [&correction] { return correction(); };
      const int64_t* tokens = host_tokens.const_data_ptr<int64_t>();
      out.push_back(row.chain_form()
                        ? cpu::verify(row.target_logits, row.q, tokens, config, coins, draw)
                        : cpu::verify_tree(*row.tree, row.target_logits, row.q, tokens, config, siblings, coins, draw,
                                           row.sibling_q));
    }
    Verdict& verdict = out.back();
    verdict.finite = verdict.finite && row.draft_finite && cpu::all_finite(row.draft_maxima);
    verdict.token = cpu::token_tensor(verdict.host_token);
  }
  return out;
}

}  // namespace speculant
