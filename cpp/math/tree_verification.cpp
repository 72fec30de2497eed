// The tensor path of verification, trees and chains (tree.h: verify_drafts_as_tensors), which accelerators run: every
// internal node's residuals p_j and children's laws q_j step by step for all nodes at once, each child's coin and test,
// each node's candidate t, all as tensor work; the host reads back once per verification what the verdicts need (which
// children their tests kept, the candidates, the betas, the finiteness witnesses, the tokens) and walks each row's tree
// down the first child kept at each node. With VerificationGraphs (verification_graphs.h) the device's part runs from
// fixed-shape buffers, a CUDA graph per key; what it reads back, and where, is the key's Plan.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <tuple>
#include <utility>

#include "errors.h"
#include "device/graphs.h"
#include "device/join.h"
#include "device/read_back.h"
#include "math/speculative.h"
#include "math/tree.h"
#include "math/tree_layout.h"
#include "device/upload.h"
#include "device/verification_graphs.h"

namespace speculant {
namespace {

constexpr size_t kNone = SIZE_MAX;  // a part not read back
constexpr double kTiny = std::numeric_limits<double>::min();

// Walks row r down its tree from the root: at each node `choose(node)` gives the rank of the child accepted there
// (-1: none), and where none is, `stop(node)` the candidate t (its host value and its device view).
template <typename Choose, typename Stop>
void walk(const Nodes& nodes, int64_t r, const double* token, Verdict& verdict, const Choose& choose,
          const Stop& stop) {
  const Tree& tree = nodes.tree(r);
  for (int64_t node = 0;;) {
    const int64_t chosen = tree.children(node) > 0 ? choose(node) : -1;
    verdict.accepted_rank.push_back(chosen);
    if (chosen < 0) {
      stop(node);
      return;
    }
    node = tree.first_child(node) + chosen;
    verdict.path.push_back(node);
    verdict.path_tokens.push_back(static_cast<int64_t>(token[nodes.token(nodes.base[r] + node)]));
  }
}

bool all_finite(const double* values, int64_t n) {
  return std::all_of(values, values + n, [](double v) { return std::isfinite(v); });
}

// Whether a row's draft witnesses (read back as `part`, kNone: none given) are finite.
bool draft_finite(const TreeInput& row, const ReadBack& read, size_t part) {
  return row.draft_finite && (part == kNone || all_finite(read.at(part), row.draft_maxima.numel()));
}

// What the device reads back (ids in the read-back), by position (the layout's order): mass, each position's last
// row's total (sampled) or maximum (greedy), NaN where the target's logits were not finite; candidates, each
// position's t; beta, each internal position's; kept [M, K], whether each child's test kept it (past a node's count:
// not read); ratio, each internal position's first child's p(x) / q(x) (a chain's Verdict::ratios). Sampled, for
// expected_kept's chances (tree.h): weight [M, K], traversal's each child's r; tests [M, K, 4], the token rule's
// child_acceptance arguments of each child: p_j(x), q_j(x) and, where the coupled coin looks ahead, whether the next
// child lies in H_j (1 or 0) and w.
struct DeviceParts {
  size_t beta = kNone, kept = kNone, mass = kNone, candidates = kNone, ratio = kNone, weight = kNone, tests = kNone;
  at::Tensor candidates_tensor;  // [nodes] in the layout's order, int64 on the device
};

// Temperature 0: every node's argmax (the first index on ties) and row maximum (its finiteness witness) in one
// operation; a child's test keeps it where its token is its parent's argmax, or (A.5's argmax variant, chains only)
// where the target gives it at least l times its maximum; beta at a node is q's mass at the argmax (p is one-hot).
DeviceParts greedy_steps(const Nodes& nodes, const Layout& layout, const DeviceInputs& in, const SamplingConfig& config,
                         ReadBack& read) {
  DeviceParts out;
  const int64_t m = layout.internal;
  const auto [node_maxima, node_best] = at::max(in.logits, -1);  // [nodes], the nodes' order
  const at::Tensor best = take_rows(node_best, layout.order, in.taken[0]);
  if (m > 0) {
    const at::Tensor top = best.narrow(0, 0, m).unsqueeze(1);                                  // [M, 1]
    const at::Tensor x = take_rows(in.tokens, layout.children, in.taken[2]).view({m, nodes.widest});  // [M, K]
    out.beta = read.add(take_rows(in.q, layout.q_rows, in.taken[1]).gather(1, top));
    at::Tensor kept = x == top;
    if (config.lenience < 1.0) {
      const auto work = in.logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      const at::Tensor logits = take_rows(in.logits, layout.order, in.taken[0]).narrow(0, 0, m);
      kept.select(1, 0).logical_or_(lenient_argmax(logits, x.narrow(1, 0, 1), config.lenience, work));
    }
    out.kept = read.add(kept);
    out.ratio = read.add(at::where(kept.select(1, 0), std::numeric_limits<double>::infinity(), 0.0));
  }
  out.mass = read.add(take_rows(node_maxima, layout.order, in.taken[0]));
  out.candidates_tensor = best;
  out.candidates = read.add(best);
  return out;
}

// Each of the M internal nodes' first child's p(x) / q(x) [M], from their rows p, q [M, V] and children x [M, K]: 0
// where p(x) = 0, +inf where q(x) = 0 < p(x).
at::Tensor first_ratios(const at::Tensor& p, const at::Tensor& q, const at::Tensor& x) {
  const at::Tensor x_0 = x.narrow(1, 0, 1);
  const at::Tensor p_x = p.gather(1, x_0).to(at::kDouble), q_x = q.gather(1, x_0).to(at::kDouble);
  return at::where(p_x > 0, p_x / q_x, 0.0).view({-1});
}

void child_tests(const at::Tensor& p_x, const at::Tensor& q_x, const at::Tensor& u, bool first,
                 const at::Tensor& next_in_h, const at::Tensor& w, at::Tensor& kept) {
  const int64_t n = next_in_h.defined() ? next_in_h.size(0) : 0, rest = p_x.size(0) - n;
  if (rest > 0) {  // u < min(1, p / (l q))
    at::Tensor out = kept.narrow(0, n, rest);
    at::lt_out(out, u.narrow(0, n, rest) * q_x.narrow(0, n, rest), p_x.narrow(0, n, rest));
  }
  if (n > 0) {  // coupled_coin's two cases: u times (u w + 1 - w) in H_j, (1 - w) outside it
    const at::Tensor u_n = u.narrow(0, 0, n), outside = at::rsub(w, 1.0);
    const at::Tensor scale = at::where(next_in_h, u_n * w + outside, u_n * outside);  // float64: u is
    at::Tensor out = kept.narrow(0, 0, n);
    at::lt_out(out, scale * q_x.narrow(0, 0, n), p_x.narrow(0, 0, n));
  }
  if (!first) kept.logical_and_(q_x > 0);
}

// Every position's candidate t, drawn from its row of P (any nonnegative mass), with the mass read back as the
// finiteness witness: NaN where the target's logits were not finite.
void draw_candidates(const at::Tensor& P, const Layout& layout, const DeviceInputs& in, ReadBack& read,
                     DeviceParts& out) {
  at::Tensor mass;
  out.candidates_tensor = sample_inverse_cdf_scaled(
      P, take_rows(in.uniforms, layout.draw_of, in.taken[3]).view({-1, 1}), &mass);  // [nodes]
  out.mass = read.add(mass);
  out.candidates = read.add(out.candidates_tensor);
}

// The laws n nodes' children were drawn from, stage by stage (tree.h; the host's ChildLaws in tensor form): q [n, V],
// s the later children's law (a sibling draft's, or q), x [n, K] the children's tokens. Stage j's nodes are the
// leading rows_j, `next` of which have a child after j.
class StageLaws {
 public:
  StageLaws(const at::Tensor& q, const at::Tensor& s, const at::Tensor& x, Siblings siblings)
      : q_(q), s_(s), x_(x), siblings_(siblings), law_(q) {}

  // q_j: top's point mass at x_j where a child follows, at the last child q without the top tokens; else as left.
  at::Tensor law(int64_t j, int64_t rows_j, int64_t next) {
    if (siblings_ == Siblings::top) {
      std::vector<at::Tensor> laws;
      if (next > 0) {
        const at::Tensor x_j = x_.narrow(0, 0, next).narrow(1, j, 1);
        laws.push_back(at::zeros({next, q_.size(1)}, q_.options()).scatter_(1, x_j, 1.0));
      }
      if (rows_j > next) {
        at::Tensor last = q_.narrow(0, next, rows_j - next);
        if (j > 0) {
          last = last.scatter(1, x_.narrow(0, next, rows_j - next).narrow(1, 0, j), 0.0);
          last = last / last.sum(-1, /*keepdim=*/true).clamp_min(kTiny);
        }
        laws.push_back(last);
      }
      law_ = joined(laws);
    }
    return law_.narrow(0, 0, rows_j);
  }
  // After stage j: without replacement, q_j without x_j, renormalized; with replacement, s from child 1 on.
  void advance(int64_t j, int64_t next) {
    if (next > 0 && siblings_ == Siblings::without_replacement) {
      const at::Tensor left = law_.narrow(0, 0, next).scatter(1, x_.narrow(0, 0, next).narrow(1, j, 1), 0.0);
      law_ = left / left.sum(-1, /*keepdim=*/true).clamp_min(kTiny);
    } else if (j == 0 && siblings_ != Siblings::top) {
      law_ = s_;
    }
  }
  void set(const at::Tensor& law) { law_ = law; }  // the coupled rule's reweighted law

 private:
  at::Tensor q_, s_, x_;
  Siblings siblings_;
  at::Tensor law_;
};

// tree.h's steps for every internal node at once; P holds p_j in place (row by row, the layout's order).
DeviceParts run_steps(const Nodes& nodes, const Layout& layout, const DeviceInputs& in, const SamplingConfig& config,
                      Siblings siblings, ReadBack& read) {
  DeviceParts out;
  const int64_t m = layout.internal, k = nodes.widest;
  // standardizing makes a new tensor (T > 0), which P may overwrite where the layout keeps the nodes' order
  const at::Tensor p = standardize_as_tensors(in.logits, config);                         // [nodes, V]
  at::Tensor P = take_rows(p, layout.order, in.taken[0]);                                  // [nodes, V]
  const at::Tensor x = take_rows(in.tokens, layout.children, in.taken[2]).view({m, k});    // [M, K]
  const at::Tensor q = take_rows(in.q.to(p.scalar_type()), layout.q_rows, in.taken[1]);     // [M, V]
  // the later children's law (tree.h): a sibling draft's, or q
  const at::Tensor s =
      in.sibling.defined() ? take_rows(in.sibling.to(p.scalar_type()), layout.q_rows, in.taken[1]) : q;
  if (siblings == Siblings::top) out.beta = read.add(beta(P.narrow(0, 0, m), q));
  if (m > 0) out.ratio = read.add(first_ratios(P.narrow(0, 0, m), q, x));
  // each child's coin u [M, K] (A.5's lenience l folded in: the test is u l q < p) and whether its test keeps it
  at::Tensor coins, kept, tests;
  if (m > 0) {
    coins = take_rows(in.uniforms, layout.coins, in.taken[4]).view({m, k}) * (config.lenience / kBelowOne);
    kept = at::zeros({m, k}, coins.options().dtype(at::kBool));
    tests = at::zeros({m, k, 4}, coins.options());  // DeviceParts::tests
  }
  StageLaws laws(q, s, x, siblings);  // the law child j was drawn from, given every rejection before it
  for (int64_t j = 0; j < k && layout.leading[j] > 0; ++j) {
    const int64_t rows_j = layout.leading[j], next = layout.leading[j + 1];
    at::Tensor p_j = P.narrow(0, 0, rows_j);
    const at::Tensor law = laws.law(j, rows_j, next);
    const at::Tensor x_j = x.narrow(0, 0, rows_j).narrow(1, j, 1);
    const at::Tensor p_x = p_j.gather(1, x_j), q_x = law.gather(1, x_j);  // [M_j, 1], before p_j turns residual
    at::Tensor next_in_h, w;  // coupled: whether each next child lies in H_j, and q(H_j) [M_{j+1}, 1]
    const ResidualParts residual = residual_parts(p_j, law);  // [M_j, V], its mass [M_j, 1]
    const at::Tensor &excess = residual.excess, &positive = residual.positive, &mass = residual.mass;
    if (j == 0 && siblings != Siblings::top) out.beta = read.add(at::rsub(mass, 1.0));  // Theorem 3.5's beta
    if (next > 0 && siblings == Siblings::coupled) {
      // tree.h's coupled rule, in closed form for every token a of ratio r = p_j(a) / q_j(a) < 1: rejected with
      // probability min(1, (1 - r) / w) when the next child is in H_j and max(0, 1 - r / (1 - w)) when it is not
      // (w = q(H_j), the next child a draw of q); q_{j+1} = q times the rejected mass of each case, over the
      // probability of a rejection, which the rule keeps at Algorithm 1's: the residual's mass. Child j's own coin
      // looks at whether the next child lies in H_j.
      const at::Tensor e = excess.narrow(0, 0, next), pj = p_j.narrow(0, 0, next), qj = law.narrow(0, 0, next);
      const at::Tensor q0 = s.narrow(0, 0, next);  // the next child's law
      const at::Tensor in_h = e > 0;                                // [M_{j+1}, V]
      w = (q0 * in_h).sum(-1, /*keepdim=*/true);                     // [M_{j+1}, 1]
      const at::Tensor below = positive.narrow(0, 0, next) - e;      // (q_j - p_j)^+
      const at::Tensor in = at::minimum(qj, below / w.clamp_min(kTiny)).sum(-1, /*keepdim=*/true);
      const at::Tensor off = (qj - pj / at::rsub(w, 1.0).clamp_min(kTiny)).clamp_min(0.0).sum(-1, /*keepdim=*/true);
      next_in_h = in_h.gather(1, x.narrow(0, 0, next).narrow(1, j + 1, 1));
      laws.set(q0 * at::where(in_h, in, off) / mass.narrow(0, 0, next).clamp_min(kTiny));
    } else {
      laws.advance(j, next);
    }
    at::Tensor kept_j = kept.narrow(0, 0, rows_j).narrow(1, j, 1);
    child_tests(p_x, q_x, coins.narrow(0, 0, rows_j).narrow(1, j, 1), j == 0, next_in_h, w, kept_j);
    const at::Tensor tests_j = tests.narrow(0, 0, rows_j).select(1, j);  // [M_j, 4]
    tests_j.narrow(1, 0, 1).copy_(p_x);
    tests_j.narrow(1, 1, 1).copy_(q_x);
    if (next_in_h.defined()) {
      tests_j.narrow(0, 0, next).narrow(1, 2, 1).copy_(next_in_h);
      tests_j.narrow(0, 0, next).narrow(1, 3, 1).copy_(w);
    }
    // rejected: p_{j+1} = norm(max(0, p_j - q_j)), p_j itself where that has no mass (speculative.h's residual)
    to_residual(p_j, residual);
  }
  if (m > 0) {
    out.kept = read.add(kept);
    out.tests = read.add(tests);
  }
  draw_candidates(P, layout, in, read, out);
  return out;
}

// A child's weight (tree.h's child_weight) for n children at once: w_x, q_x [n, 1] its token's W_j and q_j, float64.
at::Tensor child_weights(const at::Tensor& w_x, const at::Tensor& q_x, bool first) {
  const at::Tensor ratio = (w_x / q_x).clamp_max(1.0);  // inf where q_x = 0 < w_x, NaN where both are 0
  return at::where(w_x > 0, at::where(q_x > 0, ratio, first ? 1.0 : 0.0), 0.0);
}

// Traversal verification (tree.h; on chains the block rule), every row's tree at once, depth by depth: at each
// depth its internal nodes' stage measures W_j for their children in rank order, the children's weights, and each
// node's W_(k+1), whose mass is its stopping chance and which P's row then holds (t's law where a row stops there;
// p where it has no mass). Then each child's coin against its stopping chance (a leaf's: its weight), read back as
// kept [M, K] by edge; the host finds each row's stop in post-order.
DeviceParts traversal_steps(const Nodes& nodes, const Layout& layout, const DeviceInputs& in,
                            const SamplingConfig& config, Siblings siblings, ReadBack& read) {
  DeviceParts out;
  const int64_t m = layout.internal, k = nodes.widest;
  const at::Tensor p = standardize_as_tensors(in.logits, config);  // a new tensor (T > 0), which P may overwrite
  at::Tensor P = take_rows(p, layout.order, in.taken[0]);          // [nodes, V]
  if (m > 0) {
    const at::Tensor q = take_rows(in.q.to(p.scalar_type()), layout.q_rows, in.taken[1]);  // [M, V]
    const at::Tensor s =
        in.sibling.defined() ? take_rows(in.sibling.to(p.scalar_type()), layout.q_rows, in.taken[1]) : q;
    const at::Tensor x = take_rows(in.tokens, layout.children, in.taken[2]).view({m, k});
    out.beta = read.add(beta(P.narrow(0, 0, m), q));
    out.ratio = read.add(first_ratios(P.narrow(0, 0, m), q, x));
    const at::Tensor weights = at::zeros({m * k}, p.options().dtype(at::kDouble));  // each edge's child's r
    const at::Tensor chance = at::empty({m}, weights.options());                     // each internal node's h
    const at::Tensor edges = in.taken[5];
    for (size_t d = 0; d + 1 < layout.level_start.size(); ++d) {
      const int64_t begin = layout.level_start[d], n = layout.level_start[d + 1] - begin;
      const at::Tensor p_level = P.narrow(0, begin, n);
      at::Tensor r = at::ones({n, 1}, weights.options());
      if (d > 0) {
        const std::vector<int64_t> level(layout.edge_of.begin() + begin, layout.edge_of.begin() + begin + n);
        r = take_rows(weights, level, edges.defined() ? edges.narrow(0, begin, n) : edges).view({n, 1});
      }
      at::Tensor w = r.to(p.scalar_type()) * p_level;  // W_1 = r p, then each stage's
      StageLaws laws(q.narrow(0, begin, n), s.narrow(0, begin, n), x.narrow(0, begin, n), siblings);
      for (int64_t j = 0; j < k; ++j) {
        int64_t rows_j = 0, next = 0;
        for (int64_t i = begin; i < begin + n; ++i) {
          rows_j += nodes.children(layout.order[i]) > j;
          next += nodes.children(layout.order[i]) > j + 1;
        }
        if (rows_j == 0) break;
        const at::Tensor law = laws.law(j, rows_j, next), w_j = w.narrow(0, 0, rows_j);
        const at::Tensor x_j = x.narrow(0, begin, rows_j).narrow(1, j, 1);
        const at::Tensor r_c = child_weights(w_j.gather(1, x_j).to(at::kDouble), law.gather(1, x_j).to(at::kDouble),
                                             j == 0);
        weights.view({m, k}).narrow(0, begin, rows_j).narrow(1, j, 1).copy_(r_c);
        // W_(j+1) = max(0, W_j - q_j) / (1 - m_j), p where 1 - m_j is 0
        const at::Tensor rest = at::rsub(at::minimum(w_j, law).sum(-1, /*keepdim=*/true).to(at::kDouble), 1.0);
        const at::Tensor next_w = (w_j - law).clamp_min(0.0) / rest.clamp_min(kTiny).to(p.scalar_type());
        w_j.copy_(at::where(rest > 0, next_w, p_level.narrow(0, 0, rows_j)));
        laws.advance(j, next);
      }
      const at::Tensor mass = w.sum(-1).to(at::kDouble);  // [n]
      chance.narrow(0, begin, n).copy_(mass);
      p_level.copy_(at::where(mass.unsqueeze(1) > 0, w, p_level));
    }
    // every child's stopping chance, by edge: its weight, and for an internal child its W_(k+1)'s mass
    at::Tensor h = weights.clone();
    const int64_t first = layout.level_start.size() > 2 ? layout.level_start[1] : m;  // the non-root internal nodes
    if (first < m) {
      const std::vector<int64_t> below(layout.edge_of.begin() + first, layout.edge_of.begin() + m);
      const at::Tensor index = edges.defined() ? edges.narrow(0, first, m - first) : edges;
      put_rows(h, below, index, chance.narrow(0, first, m - first));
    }
    const at::Tensor coins = take_rows(in.uniforms, layout.coins, in.taken[4]).view({m, k}) * (1.0 / kBelowOne);
    out.kept = read.add(coins.lt(h.view({m, k})));
    out.weight = read.add(weights);
  }
  draw_candidates(P, layout, in, read, out);
  return out;
}

// Whether a row gave draft witnesses (they are read back with the rest).
bool has_witnesses(const TreeInput& row) { return row.draft_maxima.defined() && row.draft_maxima.numel() > 0; }

// What a verification reads back, and where (read_back.h): fixed by its key (the rows' trees, the settings, the
// shapes), so that a graph's replay, which runs none of the code that placed the parts, is read as the run that
// captured it.
struct Plan {
  DeviceParts parts;  // candidates_tensor: the run's own (none kept for a replay)
  size_t token_part = kNone;
  std::vector<size_t> draft_parts;  // each row's draft witnesses (kNone: none given)
  std::vector<int64_t> offsets;

  bool same_places(const Plan& other) const { return offsets == other.offsets && ids() == other.ids(); }
  std::vector<size_t> ids() const {
    std::vector<size_t> out{parts.beta, parts.kept, parts.mass, parts.candidates, parts.ratio, parts.weight,
                            parts.tests, token_part};
    out.insert(out.end(), draft_parts.begin(), draft_parts.end());
    return out;
  }
};

// The device's part of a verification, from its inputs (`in`: DeviceInputs'): everything the host reads, packed
// into one float64 tensor; `plan` says where.
at::Tensor device_work(const Nodes& nodes, const Layout& layout, const SamplingConfig& config, Siblings siblings,
                       const std::vector<at::Tensor>& in, Plan& plan) {
  ReadBack read;
  const DeviceInputs inputs(in, nodes, layout);
  plan.token_part = read.add(inputs.tokens);
  plan.draft_parts.assign(nodes.rows.size(), kNone);
  for (size_t r = 0, next = inputs.witnesses; r < nodes.rows.size(); ++r) {
    if (has_witnesses(nodes.rows[r])) plan.draft_parts[r] = read.add(in[next++]);
  }
  plan.parts = layout.greedy ? greedy_steps(nodes, layout, inputs, config, read)
               : layout.block ? traversal_steps(nodes, layout, inputs, config, siblings, read)
                              : run_steps(nodes, layout, inputs, config, siblings, read);
  at::Tensor packed = read.pack();
  plan.offsets = read.offsets();
  return packed;
}

// A verification's key in the graphs: everything its operations' shapes and order depend on.
std::string key_of(const Nodes& nodes, const SamplingConfig& config, Siblings siblings) {
  const TreeInput& first = nodes.rows.front();
  std::string what = fmt::format("the verification of trees (T {}, top-k {}, top-p {}, lenience {}, {}, siblings {}, "
                                 "logits {}, q {}, V {}, sibling law {}):", config.temperature, config.top_k,
                                 config.top_p, config.lenience, config.block() ? "block" : "token",
                                 static_cast<int>(siblings),
                                 c10::toString(first.target_logits.scalar_type()),
                                 c10::toString(first.q.scalar_type()), first.target_logits.size(1),
                                 nodes.siblings_law ? c10::toString(first.sibling_q.scalar_type()) : "none");
  for (size_t r = 0; r < nodes.rows.size(); ++r) {
    const Tree& tree = nodes.tree(static_cast<int64_t>(r));
    std::vector<int64_t> parents;
    for (int64_t v = 0; v < tree.size(); ++v) parents.push_back(tree.parent(v));
    what += fmt::format(" [{}]{} witnesses {}", fmt::join(parents, ", "), nodes.chain_form[r] ? " as a chain" : "",
                        has_witnesses(nodes.rows[r]) ? nodes.rows[r].draft_maxima.numel() : 0);
  }
  return what;
}

// The device's part run, through the graphs' buffers where given (sampled only): what it packed, where (plan), and
// every position's candidate t on the device (int64 [nodes], in the layout's order).
struct DeviceRun {
  at::Tensor packed, candidates;
  Plan ran;                  // without graphs: this run's
  const Plan* plan = &ran;   // with graphs: the key's, from its first run
};

void run_device(const Nodes& nodes, const Layout& layout, const SamplingConfig& config, Siblings siblings,
                VerificationGraphs* graphs, DeviceRun& run) {
  // greedy: a few operations, fewer than copying the inputs into a graph's buffers takes
  if (layout.greedy) graphs = nullptr;
  const at::Device device = nodes.rows.front().target_logits.device();
  std::vector<at::Tensor> in{nodes.every_row(&TreeInput::target_logits), nodes.every_row(&TreeInput::q),
                             nodes.tokens};
  if (!layout.greedy) in.push_back(layout.uniforms(nodes, device));
  if (nodes.siblings_law) in.push_back(nodes.every_row(&TreeInput::sibling_q));
  const size_t index_at = in.size();  // the layout's index, where it has one
  const bool indexed = !layout.index.empty();
  if (indexed) in.emplace_back();
  for (const TreeInput& row : nodes.rows) {
    if (has_witnesses(row)) in.push_back(row.draft_maxima);
  }
  std::optional<std::pair<at::Tensor, const Plan*>> graphed;
  if (graphs != nullptr) {
    if (indexed) {  // the host's index straight into its buffer (graphs.h)
      in[index_at] = host_buffer({static_cast<int64_t>(layout.index.size())}, at::kLong, device);
      std::copy(layout.index.begin(), layout.index.end(), in[index_at].mutable_data_ptr<int64_t>());
    }
    graphed = graphs->run<Plan>(key_of(nodes, config, siblings), in,
                                [&](const std::vector<at::Tensor>& buffers, Plan& plan) {
                                  at::Tensor out = device_work(nodes, layout, config, siblings, buffers, plan);
                                  plan.parts.candidates_tensor = at::Tensor();
                                  return out;
                                });
  }
  if (graphed) {
    std::tie(run.packed, run.plan) = *graphed;
    run.candidates =
        run.packed.narrow(0, run.plan->offsets[run.plan->parts.candidates], nodes.size).to(at::kLong);
  } else {  // without graphs, or a key past their limit: the same work without the buffers
    if (indexed) in[index_at] = graphs != nullptr ? upload(in[index_at], device) : upload(layout.index, device);
    run.packed = device_work(nodes, layout, config, siblings, in, run.ran);
    run.candidates = run.ran.parts.candidates_tensor;
  }
}

// Traversal verification: where row r stops, the first node in post-order whose coin fell below its chance (kept,
// by edge: its parent's position times K plus its rank), the root if none.
int64_t traversal_stop(const Nodes& nodes, const Layout& layout, const ReadBack& read, const DeviceParts& parts,
                       size_t r) {
  const double* kept = read.at(parts.kept);
  const Tree& tree = nodes.tree(static_cast<int64_t>(r));
  for (const int64_t node : tree.post_order()) {
    if (node > 0 && kept[layout.edge_of[layout.position[nodes.base[r] + node]]] != 0) return node;
  }
  return 0;
}

// The rank of node's child on the path from the root to `stop` (-1 at stop itself).
int64_t on_path(const Tree& tree, int64_t node, int64_t stop) {
  int64_t child = stop;
  while (child > 0 && tree.parent(child) != node) child = tree.parent(child);
  return child > 0 ? tree.rank(child) : -1;
}

// Row r's drafts kept in expectation by its rule (tree.h: expected_kept), from each child's chance: traversal's
// weights as read back, the token rule's by child_acceptance from its tests' values (at T = 0: its n).
double kept_in_expectation(const Nodes& nodes, const Layout& layout, const ReadBack& read, const DeviceParts& parts,
                           size_t r, const Verdict& verdict, double lenience, Siblings siblings) {
  if (layout.greedy) return static_cast<double>(verdict.accepted());
  const Tree& tree = nodes.tree(static_cast<int64_t>(r));
  std::vector<double> chances(tree.size(), 0.0);
  for (int64_t node = 1; node < tree.size(); ++node) {
    const int64_t parent = tree.parent(node), rank = tree.rank(node);
    const int64_t edge = layout.position[nodes.base[r] + parent] * nodes.widest + rank;
    if (layout.block) {
      chances[node] = read.at(parts.weight)[edge];
      continue;
    }
    const double* test = read.at(parts.tests) + 4 * edge;
    const bool look_ahead = siblings == Siblings::coupled && rank + 1 < tree.children(parent);
    chances[node] = child_acceptance(test[0], test[1], lenience, rank == 0, look_ahead, test[2] != 0, test[3]);
  }
  return expected_kept(tree, chances, layout.block);
}

// Each row's walk down its tree on the host, from the read-back.
std::vector<Verdict> walk_rows(const Nodes& nodes, const Layout& layout, const DeviceRun& run, double lenience,
                               Siblings siblings) {
  ReadBack read(run.plan->offsets);
  read.load(run.packed);
  const DeviceParts& parts = run.plan->parts;
  const double* token = read.at(run.plan->token_part);
  std::vector<Verdict> out(nodes.rows.size());
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t base = nodes.base[r];
    const int64_t stop_node = layout.block ? traversal_stop(nodes, layout, read, parts, r) : 0;
    Verdict& verdict = out[r];
    verdict.finite = draft_finite(nodes.rows[r], read, run.plan->draft_parts[r]);
    for (int64_t node = 0; node < nodes.tree(r).size(); ++node) {
      verdict.finite = verdict.finite && std::isfinite(read.at(parts.mass)[layout.position[base + node]]);
    }
    auto choose = [&](int64_t node) {
      const int64_t i = layout.position[base + node];
      verdict.betas.push_back(read.at(parts.beta)[i]);
      if (layout.block) return on_path(nodes.tree(static_cast<int64_t>(r)), node, stop_node);
      const double* kept = read.at(parts.kept) + i * nodes.widest;  // the first child kept, in rank order
      for (int64_t j = 0; j < nodes.children(base + node); ++j) {
        if (kept[j] != 0) return j;
      }
      return int64_t{-1};
    };
    auto stop = [&](int64_t node) {
      const int64_t i = layout.position[base + node];
      verdict.host_token = static_cast<int64_t>(read.at(parts.candidates)[i]);
      verdict.token = run.candidates.narrow(0, i, 1);
    };
    walk(nodes, static_cast<int64_t>(r), token, verdict, choose, stop);
    verdict.kept_in_expectation = kept_in_expectation(nodes, layout, read, parts, r, verdict, lenience, siblings);
    if (nodes.chain_form[r]) {
      verdict.drafted = nodes.drafts(static_cast<int64_t>(r), token);
      for (int64_t node = 0; node + 1 < nodes.tree(r).size(); ++node) {
        verdict.ratios.push_back(read.at(parts.ratio)[layout.position[base + node]]);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Verdict> verify_drafts_as_tensors(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                          Siblings siblings, VerificationGraphs* graphs) {
  if (rows.empty()) return {};
  for (const TreeInput& row : rows) check_tree_input(row, config, siblings);
  const Nodes nodes(rows);
  const Layout layout(nodes, config);
  DeviceRun run;
  run_device(nodes, layout, config, siblings, graphs, run);
  return walk_rows(nodes, layout, run, config.lenience, siblings);
}

}  // namespace speculant
