#include "tree.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "cpu_kernels.h"
#include "errors.h"
#include "join.h"
#include "speculative.h"
#include "upload.h"

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

int64_t Tree::max_children() const { return *std::max_element(children_.begin(), children_.end()); }

namespace {

void check_counts(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings, bool greedy,
                  const std::vector<DrawGroup>& groups) {
  require(q.dim() == 2 && q.size(0) == static_cast<int64_t>(counts.size()) && q.size(1) > 0,
          "draw_children: q must be [nodes, V] with one row per count, got {} rows for {} counts", q.size(0),
          counts.size());
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
                         const std::vector<DrawGroup>& groups) {
  check_counts(q, counts, siblings, greedy, groups);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  if (greedy) return leading_columns(top_tokens(q, widest), counts);
  if (!cpu::host_kernels(q)) return draw_children_generic(q, counts, siblings, groups);
  std::vector<at::Tensor> drawn;
  int64_t i = 0;
  for (const DrawGroup& group : groups) {
    cpu::GeneratorUniform uniform(*group.generator);
    for (const int64_t end = i + group.rows; i < end; ++i) {
      drawn.push_back(cpu::draw_children(q[i], counts[i], siblings, [&uniform] { return uniform(); }));
    }
  }
  return joined(drawn);
}

at::Tensor top_tokens(const at::Tensor& q, int64_t k) {
  // each row's k highest scores, the first index on ties (a stable descending sort)
  return std::get<1>(q.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, k);
}

at::Tensor draw_children_generic(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings,
                                 const std::vector<DrawGroup>& groups) {
  check_counts(q, counts, siblings, /*greedy=*/false, groups);
  const at::Tensor rows = q.to(at::kDouble);  // [n, V]
  const int64_t n = rows.size(0);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  // Each group's uniforms for columns [0, columns(g)) of its rows, as it draws them alone, padded to `width`
  // columns with values nothing reads.
  auto uniforms = [&](const std::function<int64_t(size_t, int64_t, int64_t)>& columns, int64_t width) {
    std::vector<at::Tensor> parts;
    int64_t begin = 0;
    for (size_t g = 0; g < groups.size(); begin += groups[g].rows, ++g) {
      const int64_t drawn = columns(g, begin, begin + groups[g].rows);
      const at::Tensor u = drawn > 0 ? at::rand({groups[g].rows, drawn}, *groups[g].generator, rows.options())
                                     : at::empty({groups[g].rows, 0}, rows.options());
      parts.push_back(drawn < width ? at::constant_pad_nd(u, {0, width - drawn}, 0.5) : u);
    }
    return joined(parts);  // [n, width]
  };
  auto group_widest = [&](size_t, int64_t begin, int64_t end) {
    return *std::max_element(counts.begin() + begin, counts.begin() + end);
  };
  if (independent_draws(siblings)) {  // every row's draws in one pass, then each row's first counts[i]
    return leading_columns(sample_inverse_cdf(rows, uniforms(group_widest, widest)).view({n, widest}), counts);
  }
  if (siblings == Siblings::top) {  // rows of one count at once: their top count - 1 tokens, then one draw
    const bool one_count = std::all_of(counts.begin(), counts.end(), [&](int64_t k) { return k == counts[0]; });
    if (!one_count) {
      std::vector<at::Tensor> drawn;
      int64_t i = 0;
      for (const DrawGroup& group : groups) {
        for (const int64_t end = i + group.rows; i < end; ++i) {
          drawn.push_back(draw_children_generic(q.narrow(0, i, 1), {counts[i]}, siblings, {{group.generator, 1}}));
        }
      }
      return at::cat(drawn);
    }
    const int64_t fixed = counts[0] - 1;
    const at::Tensor top = top_tokens(rows, fixed);  // [n, k - 1]
    const at::Tensor left = fixed > 0 ? rows.scatter(1, top, 0.0) : rows;
    const at::Tensor one = uniforms([](size_t, int64_t, int64_t) { return int64_t{1}; }, 1);
    return at::cat({top, sample_inverse_cdf(left, one).unsqueeze(1)}, 1).flatten();
  }
  // Without replacement: column j of every row from what that row's earlier columns left (a group draws column j
  // while it has rows with more than j children). Once a row's support is used up its remaining children are drawn
  // from a zero row (an arbitrary token), and verify_tree never accepts them.
  std::vector<at::Tensor> columns;
  at::Tensor left = rows.clone();
  for (int64_t j = 0; j < widest; ++j) {
    const at::Tensor u = uniforms([&](size_t g, int64_t begin, int64_t end) {
      return int64_t{group_widest(g, begin, end) > j};
    }, 1);
    const at::Tensor x = sample_inverse_cdf(left, u).unsqueeze(1);  // [n, 1]
    if (j + 1 < widest) left.scatter_(1, x, 0.0);
    columns.push_back(x);
  }
  return leading_columns(at::cat(columns, 1), counts);
}

namespace {

void check_tree_inputs(const Tree& tree, const at::Tensor& target_logits, const at::Tensor& q,
                       const at::Tensor& tokens, const SamplingConfig& config) {
  const int64_t size = tree.size();
  require(target_logits.dim() == 2 && target_logits.size(0) == size,
          "target_logits must be [tree nodes, V] = [{}, V], got {} rows", size, target_logits.size(0));
  require(q.dim() == 2 && q.size(0) == size && q.size(1) == target_logits.size(1),
          "q must be [tree nodes, V] = [{}, {}]", size, target_logits.size(1));
  require(tokens.dim() == 1 && tokens.size(0) == size && tokens.scalar_type() == at::kLong,
          "tokens must be int64 [tree nodes] = [{}]", size);
  require(config.lenience == 1.0, "lenience must be 1 with a tree of drafts (A.5's bound is proven for one "
          "draft per position); got {}", config.lenience);
}

}  // namespace

std::vector<TreeVerdict> verify_trees(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                      Siblings siblings) {
  if (rows.empty()) return {};
  if (!cpu::host_kernels(rows.front().target_logits)) return verify_trees_generic(rows, config, siblings);
  std::vector<TreeVerdict> out;
  for (const TreeInput& row : rows) {
    check_tree_inputs(*row.tree, row.target_logits, row.q, row.tokens, config);
    const at::Tensor host_tokens = row.tokens.contiguous();
    {
      cpu::GeneratorUniform uniform(*row.generator);
      out.push_back(cpu::verify_tree(*row.tree, row.target_logits, row.q, host_tokens.const_data_ptr<int64_t>(),
                                     config, siblings, [&uniform] { return uniform(); }));
    }
    TreeVerdict& verdict = out.back();
    verdict.finite = verdict.finite && cpu::all_finite(row.draft_maxima);
    verdict.token = at::tensor({verdict.host_token}, row.tokens.options());
  }
  return out;
}

std::vector<TreeVerdict> verify_trees_generic(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                              Siblings siblings) {
  if (rows.empty()) return {};
  // Every row's nodes one after the other: row r's node i is node base[r] + i of the batch.
  const auto count = static_cast<int64_t>(rows.size());
  std::vector<int64_t> base(count + 1, 0), widths(count);
  int64_t k_max = 1;
  for (int64_t r = 0; r < count; ++r) {
    const TreeInput& row = rows[r];
    check_tree_inputs(*row.tree, row.target_logits, row.q, row.tokens, config);
    base[r + 1] = base[r] + row.tree->size();
    widths[r] = std::max<int64_t>(row.tree->max_children(), 1);
    k_max = std::max(k_max, widths[r]);
  }
  const int64_t size = base[count];
  auto every_row = [&](at::Tensor TreeInput::*field) {
    std::vector<at::Tensor> parts;
    for (const TreeInput& row : rows) parts.push_back(row.*field);
    return joined(parts);
  };
  const at::Tensor target_logits = every_row(&TreeInput::target_logits), q = every_row(&TreeInput::q);
  const at::Tensor tokens = every_row(&TreeInput::tokens);

  // The internal nodes (with children) M, their children as an [M, K] table padded with their row's root, and
  // their child counts: one upload.
  std::vector<int64_t> internal, child_nodes, counts, index_of(size, -1), internal_in(count + 1, 0);
  for (int64_t r = 0; r < count; ++r) {
    const Tree& tree = *rows[r].tree;
    for (int64_t node = 0; node < tree.size(); ++node) {
      if (tree.children(node) == 0) continue;
      index_of[base[r] + node] = static_cast<int64_t>(internal.size());
      internal.push_back(base[r] + node);
      counts.push_back(tree.children(node));
      for (int64_t j = 0; j < k_max; ++j) {
        child_nodes.push_back(base[r] + (j < tree.children(node) ? tree.first_child(node) + j : 0));
      }
    }
    internal_in[r + 1] = static_cast<int64_t>(internal.size());
  }
  const auto m = static_cast<int64_t>(internal.size());

  at::Tensor maxima;
  at::Tensor p = standardize_generic(target_logits, config, &maxima);  // [nodes, V]
  at::Tensor dist = p.clone();  // row i: the law of t if the walk stops at node i
  at::Tensor accept = at::zeros({m, k_max}, p.options());  // [M, K]
  at::Tensor beta = at::zeros({m}, p.options());
  if (m > 0) {
    std::vector<int64_t> layout(internal);
    layout.insert(layout.end(), child_nodes.begin(), child_nodes.end());
    layout.insert(layout.end(), counts.begin(), counts.end());
    const at::Tensor index = upload(layout, p.device());
    const at::Tensor nodes = index.narrow(0, 0, m);                                                // [M]
    const at::Tensor x = tokens.index_select(0, index.narrow(0, m, m * k_max)).view({m, k_max});   // [M, K]
    const at::Tensor count = index.narrow(0, m + m * k_max, m);                                    // [M]
    at::Tensor p_j = p.index_select(0, nodes);                                                     // [M, V]
    const at::Tensor q_nodes = q.to(p.scalar_type()).index_select(0, nodes);                       // [M, V]
    at::Tensor q_left = q_nodes;  // the law child j was drawn from, given every rejection before it
    bool normalized = true;       // q_left is (q itself, until the first coupled or without-replacement step)
    beta = at::minimum(p_j, q_nodes).sum(-1);
    const at::Tensor greedy_token = p_j.argmax(-1);                                                // [M]
    constexpr double tiny = std::numeric_limits<double>::min();
    std::vector<at::Tensor> columns;
    for (int64_t j = 0; j < k_max; ++j) {
      const at::Tensor has = count > j;                                                            // [M]
      const at::Tensor x_j = x.select(1, j).unsqueeze(1);                                          // [M, 1]
      if (config.greedy()) {
        columns.push_back((x_j.squeeze(1) == greedy_token).logical_and(has).to(p.scalar_type()));
        continue;
      }
      // q_j: q_left renormalized (a zero row: no draft left). Top: the first k - 1 children's q_j is the point mass
      // at x_j (tree.h).
      at::Tensor q_j = normalized ? q_left : q_left / q_left.sum(-1, /*keepdim=*/true).clamp_min(tiny);
      if (siblings == Siblings::top) {
        q_j = at::where((count - 1 > j).unsqueeze(1), at::zeros_like(q_j).scatter(1, x_j, 1.0), q_j);
      }
      const at::Tensor q_x = q_j.gather(1, x_j);                                                   // [M, 1]
      at::Tensor a = acceptance_probability(p_j.gather(1, x_j), q_x, 1.0);                         // [M, 1]
      at::Tensor next;  // the law of child j + 1 given a rejection here, unnormalized
      if (siblings == Siblings::coupled && j + 1 < k_max) {
        // tree.h's coins in closed form: a token a of ratio r = p_j(a) / q_j(a) < 1 is rejected with probability
        // min(1, (1 - r) / w) when the next child is in H_j and max(0, 1 - r / (1 - w)) when it is not (w = q(H_j),
        // the next child being a draw of q); tokens of r >= 1 never are. Times q_j(a), for every token:
        const at::Tensor in_h = p_j > q_j;                                                         // [M, V]
        const at::Tensor w = (q_nodes * in_h).sum(-1, /*keepdim=*/true);                           // [M, 1]
        const at::Tensor reject_in = at::minimum(q_j, (q_j - p_j).clamp_min(0.0) / w.clamp_min(tiny));
        const at::Tensor reject_out = (q_j - p_j / (1 - w).clamp_min(tiny)).clamp_min(0.0);
        const at::Tensor next_in_h = in_h.gather(1, x.select(1, j + 1).unsqueeze(1));              // [M, 1]
        const at::Tensor rejected = at::where(next_in_h, reject_in.gather(1, x_j), reject_out.gather(1, x_j)) /
                                    q_x.clamp_min(tiny);                                           // [M, 1]
        a = at::where((count > j + 1).unsqueeze(1), 1 - rejected.clamp_max(1.0), a);
        next = q_nodes * at::where(in_h, reject_in.sum(-1, /*keepdim=*/true), reject_out.sum(-1, /*keepdim=*/true));
      }
      // a child q_j could not have drawn (its support used up) is never accepted
      columns.push_back(at::where(has.unsqueeze(1).logical_and(q_x > 0), a, 0.0).squeeze(1));
      // a rejection leaves the residual, once x_j is tried (rows without a child j keep theirs)
      p_j = at::where(has.unsqueeze(1), residual(p_j, q_j), p_j);
      if (j + 1 == k_max) break;
      // child j + 1's law (read only in rows that have that child): given the rejection (coupled), without x_j
      // (without replacement, top), or q again (with replacement)
      if (next.defined() || !independent_draws(siblings)) {
        q_left = next.defined() ? next : q_left.scatter(1, x_j, 0.0);
        normalized = false;
      }
    }
    accept = at::stack(columns, 1);                                                                // [M, K]
    if (!config.greedy()) dist.index_copy_(0, nodes, p_j);  // every child rejected: t ~ p_{k+1}
  }
  // Draws, each row from its generator as alone, in one operation per row (float64): one uniform per (internal
  // node, child of its tree's widest), then one per node for its candidate t. Columns past a row's widest get 2,
  // which no acceptance passes.
  std::vector<at::Tensor> coins, draws, draft_maxima;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t internal = internal_in[r + 1] - internal_in[r], nodes = rows[r].tree->size();
    const at::Tensor block = at::rand({internal * widths[r] + (config.greedy() ? 0 : nodes)}, *rows[r].generator,
                                      p.options().dtype(at::kDouble));
    const at::Tensor u = block.narrow(0, 0, internal * widths[r]).view({internal, widths[r]});
    coins.push_back(widths[r] < k_max ? at::constant_pad_nd(u, {0, k_max - widths[r]}, 2.0) : u);
    if (!config.greedy()) draws.push_back(block.narrow(0, internal * widths[r], nodes).view({nodes, 1}));
    if (rows[r].draft_maxima.defined()) draft_maxima.push_back(rows[r].draft_maxima.to(maxima.scalar_type()));
  }
  const at::Tensor accepted = joined(coins) < accept;                                              // [M, K]
  const at::Tensor candidates = config.greedy() ? dist.argmax(-1) : sample_inverse_cdf(dist, joined(draws));
  // per node and per draft row: not finite (NaN or +inf in the raw logits)
  const at::Tensor bad = at::isfinite(draft_maxima.empty() ? maxima : at::cat({maxima, joined(draft_maxima)}))
                             .logical_not();

  // The one device -> host read, in float64: [accepted (M K), candidates (nodes), tokens (nodes), beta (M), bad].
  const at::Tensor host = at::cat({accepted.flatten().to(at::kDouble), candidates.to(at::kDouble),
                                   tokens.to(at::kDouble), beta.to(at::kDouble), bad.to(at::kDouble)}).cpu();
  const double* flags = host.const_data_ptr<double>();
  const double* candidate = flags + m * k_max;
  const double* token = candidate + size;
  const double* betas = token + size;
  const double* bad_node = betas + m;
  const double* bad_draft = bad_node + size;
  std::vector<TreeVerdict> out(count);
  for (int64_t r = 0; r < count; ++r) {
    const Tree& tree = *rows[r].tree;
    TreeVerdict& verdict = out[r];
    const int64_t drafted = rows[r].draft_maxima.defined() ? rows[r].draft_maxima.numel() : 0;
    verdict.finite = std::none_of(bad_node + base[r], bad_node + base[r + 1], [](double b) { return b != 0; }) &&
                     std::none_of(bad_draft, bad_draft + drafted, [](double b) { return b != 0; });
    bad_draft += drafted;
    for (int64_t node = 0;;) {
      const int64_t at = base[r] + node, row = index_of[at];
      int64_t chosen = -1;
      if (row >= 0) {
        verdict.betas.push_back(betas[row]);
        for (int64_t j = 0; j < tree.children(node) && chosen < 0; ++j) {
          if (flags[row * k_max + j] != 0) chosen = j;
        }
      }
      verdict.accepted_rank.push_back(chosen);
      if (chosen < 0) {
        verdict.host_token = static_cast<int64_t>(candidate[at]);
        verdict.token = candidates.narrow(0, at, 1);
        break;
      }
      node = tree.first_child(node) + chosen;
      verdict.path.push_back(node);
      verdict.path_tokens.push_back(static_cast<int64_t>(token[base[r] + node]));
    }
  }
  return out;
}

}  // namespace speculant
