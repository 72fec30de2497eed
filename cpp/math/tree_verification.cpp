// The tensor path of token-tree verification (tree.h: verify_trees_generic), which accelerators run. Each kernel
// launch costs the host microseconds whatever its size, so the work is split by what it needs: the device computes
// what sums over the vocabulary (every internal node's residuals p_j and children's laws q_j, step by step for all
// nodes at once, and every node's candidate t), the host everything per child from a few numbers read back once
// (tests the children, walks down each row's tree). With VerificationGraphs (verification_graphs.h) the device's
// part runs from fixed-shape buffers, a CUDA graph per key; what it reads back, and where, is the key's Plan.
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
#include "device/upload.h"
#include "device/verification_graphs.h"

namespace speculant {
namespace {

constexpr size_t kNone = SIZE_MAX;  // a part not read back
constexpr double kTiny = std::numeric_limits<double>::min();

// A batch of trees: every row's nodes one after the other (row r's node i is the batch's node base[r] + i).
struct Nodes {
  explicit Nodes(const std::vector<TreeInput>& rows) : rows(rows), base(rows.size() + 1, 0) {
    for (size_t r = 0; r < rows.size(); ++r) {
      base[r + 1] = base[r] + rows[r].tree->size();
      widest = std::max(widest, rows[r].tree->max_children());
      row_of.resize(base[r + 1], static_cast<int64_t>(r));
    }
    size = base.back();
    tokens = every_row(&TreeInput::tokens);
    siblings_law = rows.front().sibling_q.defined();
    for (const TreeInput& row : rows) {
      require(row.sibling_q.defined() == siblings_law, "a batch's rows all have a sibling law, or none");
    }
  }
  // of the batch's node, in the batch's numbering
  int64_t children(int64_t node) const { return tree(row_of[node]).children(node - base[row_of[node]]); }
  int64_t first_child(int64_t node) const {
    const int64_t r = row_of[node];
    return base[r] + tree(r).first_child(node - base[r]);
  }
  const Tree& tree(int64_t r) const { return *rows[r].tree; }
  at::Tensor every_row(at::Tensor TreeInput::*field) const {
    std::vector<at::Tensor> parts;
    for (const TreeInput& row : rows) parts.push_back(row.*field);
    return joined(parts);
  }

  const std::vector<TreeInput>& rows;
  std::vector<int64_t> base, row_of;
  int64_t size = 0, widest = 1;
  at::Tensor tokens;  // [nodes], int64
  bool siblings_law = false;  // the rows' later children drawn from a sibling law (TreeInput::sibling_q)
};

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
    verdict.path_tokens.push_back(static_cast<int64_t>(token[nodes.base[r] + node]));
  }
}

// rows[i] of `from` for i < n, given on the host (`rows`) and on the device (`index`): a view where they are
// consecutive (as a single tree's layout is, its nodes already in the layout's order), else one gather.
at::Tensor take_rows(const at::Tensor& from, const std::vector<int64_t>& rows, const at::Tensor& index, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    if (rows[i] != rows[0] + i) return from.index_select(0, index.narrow(0, 0, n));
  }
  return n > 0 ? from.narrow(0, rows[0], n) : from.index_select(0, index.narrow(0, 0, 0));
}

bool all_finite(const double* values, int64_t n) {
  return std::all_of(values, values + n, [](double v) { return std::isfinite(v); });
}

// Whether a row's draft witnesses (read back as `part`, kNone: none given) are finite.
bool draft_finite(const TreeInput& row, const ReadBack& read, size_t part) {
  return part == kNone || all_finite(read.at(part), row.draft_maxima.numel());
}

// Temperature 0: the longest path of argmax agreement. Every node's argmax (the first index on ties) and row maximum
// (its finiteness witness) in one operation; beta at a node is q's mass at the target's argmax (p is one-hot).
std::vector<Verdict> verify_greedy(const Nodes& nodes, ReadBack& read, size_t token_part,
                                       const std::vector<size_t>& draft_parts) {
  const auto [maxima, best] = at::max(nodes.every_row(&TreeInput::target_logits), -1);  // [nodes]
  const at::Tensor beta = nodes.every_row(&TreeInput::q).gather(1, best.unsqueeze(1));
  const size_t maxima_part = read.add(maxima), best_part = read.add(best), beta_part = read.add(beta);
  read.read();
  const double *token = read.at(token_part), *argmax = read.at(best_part), *betas = read.at(beta_part);
  std::vector<Verdict> out(nodes.rows.size());
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t base = nodes.base[r];
    Verdict& verdict = out[r];
    verdict.finite = all_finite(read.at(maxima_part) + base, nodes.tree(r).size()) &&
                     draft_finite(nodes.rows[r], read, draft_parts[r]);
    auto choose = [&](int64_t node) {
      verdict.betas.push_back(betas[base + node]);
      const int64_t first = nodes.first_child(base + node);
      for (int64_t j = 0; j < nodes.children(base + node); ++j) {
        if (token[first + j] == argmax[base + node]) return j;
      }
      return int64_t{-1};
    };
    auto stop = [&](int64_t node) {
      verdict.host_token = static_cast<int64_t>(argmax[base + node]);
      verdict.token = best.narrow(0, base + node, 1);
    };
    walk(nodes, static_cast<int64_t>(r), token, verdict, choose, stop);
  }
  return out;
}

// Sampled: where each node's rows and uniforms are. Internal nodes first, by child count descending, so that step
// j's nodes (those with more than j children) are the leading M_j rows; then the leaves. Each row's uniforms come
// from its own generator, as alone, in one operation: a coin per (internal node in tree order, child of the row's
// widest node), then one per node for its candidate t.
struct Layout {
  explicit Layout(const Nodes& nodes) : position(nodes.size), coin_at(nodes.size, 0) {
    for (int64_t node = 0; node < nodes.size; ++node) {
      if (nodes.children(node) > 0) order.push_back(node);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return nodes.children(a) > nodes.children(b); });
    internal = static_cast<int64_t>(order.size());
    for (int64_t node = 0; node < nodes.size; ++node) {
      if (nodes.children(node) == 0) order.push_back(node);
    }
    for (int64_t i = 0; i < nodes.size; ++i) position[order[i]] = i;
    leading.assign(nodes.widest + 1, 0);
    for (int64_t i = 0; i < internal; ++i) {
      for (int64_t j = 0; j < nodes.children(order[i]); ++j) ++leading[j];
    }
    std::vector<int64_t> draw_at(nodes.size);
    for (size_t r = 0, offset = 0; r < nodes.rows.size(); ++r) {
      const Tree& tree = nodes.tree(static_cast<int64_t>(r));
      const int64_t width = std::max<int64_t>(tree.max_children(), 1), base = nodes.base[r];
      int64_t coins = 0;
      for (int64_t node = 0; node < tree.size(); ++node) {
        if (tree.children(node) > 0) coin_at[base + node] = offset + width * coins++;
      }
      for (int64_t node = 0; node < tree.size(); ++node) draw_at[base + node] = offset + width * coins + node;
      uniform_sizes.push_back(width * coins + tree.size());
      offset += uniform_sizes.back();
    }
    // the order, each internal node's children (past its count: its first child again, never read), each
    // position's candidate uniform
    index = order;
    for (int64_t i = 0; i < internal; ++i) {
      const int64_t first = nodes.first_child(order[i]);
      for (int64_t j = 0; j < nodes.widest; ++j) index.push_back(first + (j < nodes.children(order[i]) ? j : 0));
    }
    for (int64_t i = 0; i < nodes.size; ++i) draw_of.push_back(draw_at[order[i]]);
    index.insert(index.end(), draw_of.begin(), draw_of.end());
  }

  // Every row's uniforms (its block from its own generator), float64, scaled (sampling.h).
  at::Tensor uniforms(const Nodes& nodes, const at::Device& device) const {
    std::vector<at::Tensor> blocks;
    for (size_t r = 0; r < nodes.rows.size(); ++r) {
      blocks.push_back(scaled_uniforms({uniform_sizes[r]}, *nodes.rows[r].generator, device));
    }
    return joined(blocks);
  }

  std::vector<int64_t> order, position;  // position -> node, node -> position
  int64_t internal = 0;                   // M
  std::vector<int64_t> leading;           // M_j: the internal nodes with more than j children (j = 0 .. K)
  std::vector<int64_t> coin_at;           // an internal node's first coin in the uniforms
  std::vector<int64_t> draw_of;           // each position's candidate uniform in the uniforms
  std::vector<int64_t> uniform_sizes;     // each row's block of uniforms
  std::vector<int64_t> index;             // order [nodes] | children [M, K] | draw_of [nodes], one upload
};

// The device's inputs of a sampled verification: every row's logits [nodes, V], q [nodes, V] and tokens [nodes]
// joined, the layout's index (on the device: order, children [M, K], candidate uniforms [nodes]), the uniforms, and
// where the rows have a sibling law (tree.h) their sibling_q [nodes, V] joined.
struct DeviceInputs {
  DeviceInputs(const std::vector<at::Tensor>& in, const Nodes& nodes, const Layout& layout)
      : logits(in[0]), q(in[1]), tokens(in[2]), rows(in[3].narrow(0, 0, nodes.size)),
        children(in[3].narrow(0, nodes.size, layout.internal * nodes.widest)),
        draws(in[3].narrow(0, nodes.size + layout.internal * nodes.widest, nodes.size)), uniforms(in[4]),
        sibling(nodes.siblings_law ? in[5] : at::Tensor()) {}
  at::Tensor logits, q, tokens, rows, children, draws, uniforms, sibling;
};

// What the device reads back for step j (ids in the read-back; kNone: not read): the residual's mass [M_j]
// (1 - sum min(p_j, q_j), the probability that child j is rejected); q_{j+1}'s normalizer (without replacement,
// [M_{j+1}]) or q_j's for the nodes at their last child (top, [M_j - M_{j+1}]); coupled: w = q(H_j) and q_{j+1}'s
// weights on H_j and off it [M_{j+1}] (its normalizer is the residual's mass), and the sign of p_j - q_j at each
// child's token [M_{j+1}, K] (whether it lies in H_j).
struct Step {
  size_t mass = kNone, norm = kNone, w = kNone, in = kNone, off = kNone, sign = kNone;
};

struct DeviceParts {
  std::vector<Step> steps;
  size_t p = kNone, q = kNone, sibling = kNone, beta = kNone, uniforms = kNone, mass = kNone, candidates = kNone;
  at::Tensor candidates_tensor;  // [nodes] in the layout's order, int64 on the device
};

// tree.h's steps for every internal node at once; P holds p_j in place (row by row, the layout's order).
DeviceParts run_steps(const Nodes& nodes, const Layout& layout, const DeviceInputs& in, const SamplingConfig& config,
                      Siblings siblings, ReadBack& read) {
  DeviceParts out;
  out.steps.resize(nodes.widest);
  const int64_t m = layout.internal, k = nodes.widest;
  // standardizing makes a new tensor (T > 0), which P may overwrite where the layout keeps the nodes' order
  const at::Tensor p = standardize_generic(in.logits, config);                         // [nodes, V]
  at::Tensor P = take_rows(p, layout.order, in.rows, nodes.size);                      // [nodes, V]
  const at::Tensor x = in.tokens.index_select(0, in.children).view({m, k});           // [M, K]
  const at::Tensor q = take_rows(in.q.to(p.scalar_type()), layout.order, in.rows, m);  // [M, V]
  out.p = read.add(P.narrow(0, 0, m).gather(1, x));
  out.q = read.add(q.gather(1, x));
  // the later children's law (tree.h): a sibling draft's, or q
  const at::Tensor s = in.sibling.defined() ? take_rows(in.sibling.to(p.scalar_type()), layout.order, in.rows, m) : q;
  if (in.sibling.defined()) out.sibling = read.add(s.gather(1, x));
  if (siblings == Siblings::top) out.beta = read.add(beta(P.narrow(0, 0, m), q));
  at::Tensor q_j = q;  // the law child j was drawn from, given every rejection before it (with replacement: q)
  for (int64_t j = 0; j < k && layout.leading[j] > 0; ++j) {
    const int64_t rows_j = layout.leading[j], next = layout.leading[j + 1];
    Step& step = out.steps[j];
    at::Tensor p_j = P.narrow(0, 0, rows_j);
    if (siblings == Siblings::top) {  // the point mass at x_j where a child follows; at the last, q without the top
      std::vector<at::Tensor> laws;
      if (next > 0) {
        const at::Tensor x_j = x.narrow(0, 0, next).narrow(1, j, 1);
        laws.push_back(at::zeros({next, p.size(1)}, p.options()).scatter_(1, x_j, 1.0));
      }
      if (rows_j > next) {
        at::Tensor last = q.narrow(0, next, rows_j - next);
        if (j > 0) {
          last = last.scatter(1, x.narrow(0, next, rows_j - next).narrow(1, 0, j), 0.0);
          const at::Tensor norm = last.sum(-1, /*keepdim=*/true);
          step.norm = read.add(norm);
          last = last / norm.clamp_min(kTiny);
        }
        laws.push_back(last);
      }
      q_j = joined(laws);
    }
    const at::Tensor law = q_j.narrow(0, 0, rows_j);
    const ResidualParts residual = residual_parts(p_j, law);  // [M_j, V], its mass [M_j, 1]
    const at::Tensor &excess = residual.excess, &positive = residual.positive, &mass = residual.mass;
    step.mass = read.add(mass);
    if (next > 0 && siblings == Siblings::coupled) {
      // tree.h's coupled rule, in closed form for every token a of ratio r = p_j(a) / q_j(a) < 1: rejected with
      // probability min(1, (1 - r) / w) when the next child is in H_j and max(0, 1 - r / (1 - w)) when it is not
      // (w = q(H_j), the next child a draw of q); q_{j+1} = q times the rejected mass of each case, over the
      // probability of a rejection, which the rule keeps at Algorithm 1's: the residual's mass.
      const at::Tensor e = excess.narrow(0, 0, next), pj = p_j.narrow(0, 0, next), qj = law.narrow(0, 0, next);
      const at::Tensor q0 = s.narrow(0, 0, next);  // the next child's law
      const at::Tensor in_h = e > 0;                                // [M_{j+1}, V]
      const at::Tensor w = (q0 * in_h).sum(-1, /*keepdim=*/true);   // [M_{j+1}, 1]
      const at::Tensor below = positive.narrow(0, 0, next) - e;      // (q_j - p_j)^+
      const at::Tensor in = at::minimum(qj, below / w.clamp_min(kTiny)).sum(-1, /*keepdim=*/true);
      const at::Tensor off = (qj - pj / at::rsub(w, 1.0).clamp_min(kTiny)).clamp_min(0.0).sum(-1, /*keepdim=*/true);
      step.w = read.add(w);
      step.in = read.add(in);
      step.off = read.add(off);
      step.sign = read.add(e.gather(1, x.narrow(0, 0, next)));
      q_j = q0 * at::where(in_h, in, off) / mass.narrow(0, 0, next).clamp_min(kTiny);
    } else if (next > 0 && siblings == Siblings::without_replacement) {
      const at::Tensor left = law.narrow(0, 0, next).scatter(1, x.narrow(0, 0, next).narrow(1, j, 1), 0.0);
      const at::Tensor norm = left.sum(-1, /*keepdim=*/true);
      step.norm = read.add(norm);
      q_j = left / norm.clamp_min(kTiny);
    } else if (j == 0 && in.sibling.defined()) {  // with replacement: the later children drawn from s
      q_j = s;
    }
    // rejected: p_{j+1} = norm(max(0, p_j - q_j)), p_j itself where that has no mass (speculative.h's residual)
    to_residual(p_j, residual);
  }
  at::Tensor mass;  // each node's final row's total: NaN where the target's logits were not finite
  out.candidates_tensor = sample_inverse_cdf_scaled(
      P, take_rows(in.uniforms, layout.draw_of, in.draws, nodes.size).view({-1, 1}), &mass);  // [nodes]
  out.uniforms = read.add(in.uniforms);
  out.mass = read.add(mass);
  out.candidates = read.add(out.candidates_tensor);
  return out;
}

// One internal node's children followed through its steps on the host, from the read-back: p_j and q_j at the token
// of child c >= j, as the device computed their rows.
class Children {
 public:
  Children(const ReadBack& read, const DeviceParts& parts, const Layout& layout, Siblings siblings, int64_t widest,
           int64_t position, int64_t count, const double* tokens)
      : read_(read), parts_(parts), layout_(layout), siblings_(siblings), widest_(widest), i_(position), count_(count),
        tokens_(tokens) {}

  // Child j's test (tree.h's child_acceptance) at p_j(x_j) and q_j(x_j); 0 also for a NaN p_j(x_j) (the verdict's
  // finiteness says so).
  double acceptance(int64_t j) const {
    if (siblings_ == Siblings::coupled && j + 1 < count_) {
      const Step& step = parts_.steps[j];
      return child_acceptance(p_at(j, j), q_at(j, j), 1.0, j == 0, true, read_.at(step.sign)[i_ * widest_ + j + 1] > 0,
                              value(step.w));
    }
    return child_acceptance(p_at(j, j), q_at(j, j), 1.0, j == 0, false, false, 0.0);
  }

 private:
  double value(size_t part, int64_t shift = 0) const { return read_.at(part)[i_ - shift]; }

  // p_j(x_c): p's, then each earlier rejection's residual
  double p_at(int64_t j, int64_t c) const {
    double p = read_.at(parts_.p)[i_ * widest_ + c];
    for (int64_t l = 0; l < j; ++l) {
      const double mass = value(parts_.steps[l].mass);
      p = residual_at(p, q_at(l, c), mass);
    }
    return p;
  }

  double q_at(int64_t j, int64_t c) const {
    const double q = read_.at(parts_.q)[i_ * widest_ + c];
    auto earlier = [&](int64_t n) {  // x_c among x_0 .. x_{n-1}
      for (int64_t l = 0; l < n; ++l) {
        if (tokens_[l] == tokens_[c]) return true;
      }
      return false;
    };
    // the later children's law (tree.h): a sibling draft's, or q
    const double s = parts_.sibling != kNone ? read_.at(parts_.sibling)[i_ * widest_ + c] : q;
    switch (siblings_) {
      case Siblings::with_replacement:
        return j == 0 ? q : s;
      case Siblings::without_replacement: {  // q without the earlier children, renormalized step by step
        double left = q;
        for (int64_t l = 0; l < j; ++l) {
          const double norm = value(parts_.steps[l].norm);
          if (tokens_[l] == tokens_[c] || norm <= 0) return 0.0;
          left /= norm;
        }
        return left;
      }
      case Siblings::top: {  // the point masses, then q without them
        if (j < count_ - 1) return tokens_[c] == tokens_[j] ? 1.0 : 0.0;
        if (earlier(j)) return 0.0;
        if (j == 0) return q;
        const double norm = value(parts_.steps[j].norm, layout_.leading[j + 1]);
        return norm > 0 ? q / norm : 0.0;
      }
      case Siblings::coupled: {  // q weighted on H_{j-1} and off it, over the residual's mass
        if (j == 0) return q;
        const Step& before = parts_.steps[j - 1];
        const double mass = value(before.mass);
        const bool in_h = read_.at(before.sign)[i_ * widest_ + c] > 0;
        return mass > 0 ? s * value(in_h ? before.in : before.off) / mass : 0.0;
      }
    }
    return 0.0;
  }

  const ReadBack& read_;
  const DeviceParts& parts_;
  const Layout& layout_;
  Siblings siblings_;
  int64_t widest_, i_, count_;
  const double* tokens_;  // the children's
};

// Whether a row gave draft witnesses (they are read back with the rest).
bool has_witnesses(const TreeInput& row) { return row.draft_maxima.defined() && row.draft_maxima.numel() > 0; }

// What a sampled verification reads back, and where (read_back.h): fixed by its key (the rows' trees, the settings,
// the shapes), so that a graph's replay, which runs none of the code that placed the parts, is read as the run that
// captured it.
struct Plan {
  DeviceParts parts;  // candidates_tensor: the run's own (none kept for a replay)
  size_t token_part = kNone;
  std::vector<size_t> draft_parts;  // each row's draft witnesses (kNone: none given)
  std::vector<int64_t> offsets;

  bool same_places(const Plan& other) const { return offsets == other.offsets && ids() == other.ids(); }
  std::vector<size_t> ids() const {
    std::vector<size_t> out{parts.p,       parts.q,    parts.sibling,    parts.beta,
                            parts.uniforms, parts.mass, parts.candidates, token_part};
    for (const Step& step : parts.steps) {
      out.insert(out.end(), {step.mass, step.norm, step.w, step.in, step.off, step.sign});
    }
    out.insert(out.end(), draft_parts.begin(), draft_parts.end());
    return out;
  }
};

// The device's part of a sampled verification, from its inputs (`in`: DeviceInputs' five or six, then each row's
// draft witnesses where given): everything the host reads, packed into one float64 tensor; `plan` says where.
at::Tensor device_work(const Nodes& nodes, const Layout& layout, const SamplingConfig& config, Siblings siblings,
                       const std::vector<at::Tensor>& in, Plan& plan) {
  ReadBack read;
  plan.token_part = read.add(in[2]);
  plan.draft_parts.assign(nodes.rows.size(), kNone);
  for (size_t r = 0, next = nodes.siblings_law ? 6 : 5; r < nodes.rows.size(); ++r) {
    if (has_witnesses(nodes.rows[r])) plan.draft_parts[r] = read.add(in[next++]);
  }
  plan.parts = run_steps(nodes, layout, DeviceInputs(in, nodes, layout), config, siblings, read);
  at::Tensor packed = read.pack();
  plan.offsets = read.offsets();
  return packed;
}

// A verification's key in the graphs: everything its operations' shapes and order depend on.
std::string key_of(const Nodes& nodes, const SamplingConfig& config, Siblings siblings) {
  const TreeInput& first = nodes.rows.front();
  std::string what = fmt::format("the verification of trees (T {}, top-k {}, top-p {}, siblings {}, logits {}, q {}, "
                                 "V {}, sibling law {}):", config.temperature, config.top_k, config.top_p,
                                 static_cast<int>(siblings), c10::toString(first.target_logits.scalar_type()),
                                 c10::toString(first.q.scalar_type()), first.target_logits.size(1),
                                 nodes.siblings_law ? c10::toString(first.sibling_q.scalar_type()) : "none");
  for (size_t r = 0; r < nodes.rows.size(); ++r) {
    const Tree& tree = nodes.tree(static_cast<int64_t>(r));
    std::vector<int64_t> parents;
    for (int64_t v = 0; v < tree.size(); ++v) parents.push_back(tree.parent(v));
    what += fmt::format(" [{}] witnesses {}", fmt::join(parents, ", "),
                        has_witnesses(nodes.rows[r]) ? nodes.rows[r].draft_maxima.numel() : 0);
  }
  return what;
}

std::vector<Verdict> verify_sampled(const Nodes& nodes, const SamplingConfig& config, Siblings siblings,
                                        VerificationGraphs* graphs) {
  const Layout layout(nodes);
  const at::Device device = nodes.rows.front().target_logits.device();
  std::vector<at::Tensor> in{nodes.every_row(&TreeInput::target_logits), nodes.every_row(&TreeInput::q),
                             nodes.tokens, at::Tensor(), layout.uniforms(nodes, device)};
  if (nodes.siblings_law) in.push_back(nodes.every_row(&TreeInput::sibling_q));
  for (const TreeInput& row : nodes.rows) {
    if (has_witnesses(row)) in.push_back(row.draft_maxima);
  }
  Plan ran;                // without graphs: this run's
  const Plan* plan = &ran;  // with graphs: the key's, from its first run
  at::Tensor packed, candidates;  // candidates: int64 [nodes] on the device, in the layout's order
  std::optional<std::pair<at::Tensor, const Plan*>> graphed;
  if (graphs != nullptr) {  // the host's index straight into its buffer (graphs.h)
    in[3] = host_buffer({static_cast<int64_t>(layout.index.size())}, at::kLong, device);
    std::copy(layout.index.begin(), layout.index.end(), in[3].mutable_data_ptr<int64_t>());
    graphed = graphs->run<Plan>(key_of(nodes, config, siblings), in,
                                [&](const std::vector<at::Tensor>& buffers, Plan& run) {
                                  at::Tensor out = device_work(nodes, layout, config, siblings, buffers, run);
                                  run.parts.candidates_tensor = at::Tensor();
                                  return out;
                                });
  }
  if (graphed) {
    std::tie(packed, plan) = *graphed;
    candidates = packed.narrow(0, plan->offsets[plan->parts.candidates], nodes.size).to(at::kLong);
  } else {  // without graphs, or a key past their limit: the same work without the buffers
    in[3] = graphs != nullptr ? upload(in[3], device) : upload(layout.index, device);
    packed = device_work(nodes, layout, config, siblings, in, ran);
    candidates = ran.parts.candidates_tensor;
  }
  ReadBack read(plan->offsets);
  read.load(packed);
  const DeviceParts& parts = plan->parts;
  const double *token = read.at(plan->token_part), *coin = read.at(parts.uniforms);
  std::vector<Verdict> out(nodes.rows.size());
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t base = nodes.base[r];
    Verdict& verdict = out[r];
    verdict.finite = draft_finite(nodes.rows[r], read, plan->draft_parts[r]);
    for (int64_t node = 0; node < nodes.tree(r).size(); ++node) {
      verdict.finite = verdict.finite && std::isfinite(read.at(parts.mass)[layout.position[base + node]]);
    }
    auto choose = [&](int64_t node) {
      const int64_t i = layout.position[base + node], count = nodes.children(base + node);
      verdict.betas.push_back(parts.beta != kNone ? read.at(parts.beta)[i] : 1.0 - read.at(parts.steps[0].mass)[i]);
      const Children children(read, parts, layout, siblings, nodes.widest, i, count,
                              token + nodes.first_child(base + node));
      for (int64_t j = 0; j < count; ++j) {
        if (coin[layout.coin_at[base + node] + j] / kBelowOne < children.acceptance(j)) return j;
      }
      return int64_t{-1};
    };
    auto stop = [&](int64_t node) {
      const int64_t i = layout.position[base + node];
      verdict.host_token = static_cast<int64_t>(read.at(parts.candidates)[i]);
      verdict.token = candidates.narrow(0, i, 1);
    };
    walk(nodes, static_cast<int64_t>(r), token, verdict, choose, stop);
  }
  return out;
}

}  // namespace

std::vector<Verdict> verify_trees_generic(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                              Siblings siblings, VerificationGraphs* graphs) {
  if (rows.empty()) return {};
  for (const TreeInput& row : rows) check_tree_input(row, config, siblings);
  const Nodes nodes(rows);
  if (!config.greedy()) return verify_sampled(nodes, config, siblings, graphs);
  ReadBack read;  // temperature 0: one operation, nothing to capture
  const size_t token_part = read.add(nodes.tokens);
  std::vector<size_t> draft_parts;  // each row's draft witnesses, where given
  for (const TreeInput& row : rows) draft_parts.push_back(has_witnesses(row) ? read.add(row.draft_maxima) : kNone);
  return verify_greedy(nodes, read, token_part, draft_parts);
}

}  // namespace speculant
