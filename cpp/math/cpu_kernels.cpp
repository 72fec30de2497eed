#include "math/cpu_kernels.h"

#include <ATen/Dispatch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>

#include "errors.h"
#include "math/speculative.h"

namespace speculant::cpu {
namespace {

std::atomic<bool> host_kernels_on{true};

constexpr double kInf = std::numeric_limits<double>::infinity();

// The passes over a row are written so that the compiler vectorizes them: comparisons and OR-reductions, and
// reductions that `omp simd` lets it reorder (-fopenmp-simd; CMakeLists.txt). Sums of probabilities are taken
// in float64.

// Whether a row of raw logits is usable: no NaN, no +inf, and not entirely -inf (-inf alone masks a token).
template <typename acc_t, typename in_t>
bool row_finite(const in_t* x, int64_t vocab) {
  int bad = 0, real = 0;
#pragma omp simd reduction(| : bad, real)
  for (int64_t v = 0; v < vocab; ++v) {
    const auto value = static_cast<acc_t>(x[v]);
    bad |= !(value < std::numeric_limits<acc_t>::infinity());  // NaN or +inf
    real |= value > -std::numeric_limits<acc_t>::infinity();
  }
  return bad == 0 && real != 0;
}

// The maximum of a finite row.
template <typename acc_t, typename in_t>
acc_t row_max(const in_t* x, int64_t vocab) {
  auto top = -std::numeric_limits<acc_t>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t v = 0; v < vocab; ++v) top = std::max(top, static_cast<acc_t>(x[v]));
  return top;
}

// First index of the maximum (NaN never wins, as no value compares above it).
template <typename acc_t>
int64_t argmax(const acc_t* row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v) {
    if (row[v] > row[best]) best = v;
  }
  return best;
}

// Inverse CDF of an unnormalized row with positive mass, in float64: the first token whose cumulative mass
// exceeds u * total. A zero-probability token never is. The total is summed in another order than the scan,
// so when rounding leaves the target above the scan's last sum the last token with positive mass is returned.
// `value(v)` gives the row's mass at v.
template <typename F>
int64_t inverse_cdf(int64_t vocab, double u, const F& value) {
  double total = 0.0;
#pragma omp simd reduction(+ : total)
  for (int64_t v = 0; v < vocab; ++v) total += value(v);
  const double target = u * total * kBelowOne;
  double cumulative = 0.0;
  int64_t last = vocab - 1;  // only for a row without positive mass (NaN), which callers reject
  for (int64_t v = 0; v < vocab; ++v) {
    const double mass = value(v);
    if (mass > 0) last = v;
    cumulative += mass;
    if (cumulative > target && mass > 0) return v;
  }
  return last;
}

// Top-p on one finite probability row, in place: keeps the most probable tokens whose preceding mass (in
// descending order, ties in index order) is below top_p, and renormalizes.
template <typename acc_t>
void keep_top_p(acc_t* row, int64_t vocab, double top_p, std::vector<int64_t>& order) {
  order.resize(vocab);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [row](int64_t a, int64_t b) { return row[a] > row[b]; });
  double cumulative = 0.0, kept = 0.0;
  for (const int64_t v : order) {
    const acc_t before = static_cast<acc_t>(cumulative + row[v]) - row[v];  // as cumsum(sorted) - sorted
    cumulative += row[v];
    if (static_cast<double>(before) < top_p) {  // in float64: a tiny top_p must not round to 0
      kept += row[v];
    } else {
      row[v] = 0;
    }
  }
  for (int64_t v = 0; v < vocab; ++v) row[v] = static_cast<acc_t>(row[v] / kept);
}

template <typename in_t, typename acc_t>
at::Tensor standardize_rows(const at::Tensor& logits, const SamplingConfig& config, std::vector<uint8_t>* finite) {
  const int64_t n = logits.size(0), vocab = logits.size(1);
  const in_t* x = logits.const_data_ptr<in_t>();
  const auto options = logits.options().dtype(c10::CppTypeToScalarType<acc_t>::value);
  std::vector<uint8_t> ok(n);
  for (int64_t i = 0; i < n; ++i) ok[i] = row_finite<acc_t>(x + i * vocab, vocab);
  if (finite) *finite = ok;
  if (config.greedy()) {  // one-hot at the argmax, first index on ties
    at::Tensor out = at::zeros({n, vocab}, options);
    acc_t* y = out.mutable_data_ptr<acc_t>();
    for (int64_t i = 0; i < n; ++i) {
      const in_t* row = x + i * vocab;
      int64_t best = 0;
      for (int64_t v = 1; v < vocab; ++v) {
        if (static_cast<acc_t>(row[v]) > static_cast<acc_t>(row[best])) best = v;
      }
      y[i * vocab + best] = 1;
    }
    return out;
  }
  const bool top_k = config.top_k > 0 && config.top_k < vocab;
  at::Tensor shifted;
  if (config.temperature == 1.0 && !top_k) {
    shifted = logits.to(options.dtype());  // softmax shifts by the maximum itself; no copy when already so
  } else {
    // (x - max) / T: the law is unchanged and the quotient stays finite for any T > 0 (sampling.cpp).
    shifted = at::empty({n, vocab}, options);
    acc_t* y = shifted.mutable_data_ptr<acc_t>();
    const auto temperature = static_cast<acc_t>(config.temperature);
    std::vector<acc_t> scratch;
    for (int64_t i = 0; i < n; ++i) {
      const in_t* row = x + i * vocab;
      acc_t* out = y + i * vocab;
      if (!ok[i]) {  // NaN throughout: the caller rejects the row
        std::fill(out, out + vocab, std::numeric_limits<acc_t>::quiet_NaN());
        continue;
      }
      const acc_t top = row_max<acc_t>(row, vocab);
      for (int64_t v = 0; v < vocab; ++v) out[v] = (static_cast<acc_t>(row[v]) - top) / temperature;
      if (top_k) {  // keep the k largest and every value tied with the k-th
        scratch.assign(out, out + vocab);
        std::nth_element(scratch.begin(), scratch.begin() + (config.top_k - 1), scratch.end(), std::greater<acc_t>());
        const acc_t kth = scratch[config.top_k - 1];
        for (int64_t v = 0; v < vocab; ++v) {
          if (out[v] < kth) out[v] = -std::numeric_limits<acc_t>::infinity();
        }
      }
    }
  }
  at::Tensor probs = at::_softmax(shifted, /*dim=*/1, /*half_to_float=*/false);  // vectorized, all rows at once
  if (config.top_p < 1.0) {
    acc_t* data = probs.mutable_data_ptr<acc_t>();
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) {
      if (ok[i]) keep_top_p(data + i * vocab, vocab, config.top_p, order);
    }
  }
  return probs;
}

// Rows of a [n, V] tensor as acc_t: the tensor's own memory where it is contiguous acc_t, else each row
// converted when it is read (a walk reads only the nodes it reaches). A row stays valid until the next is read.
template <typename acc_t>
class HostRows {
 public:
  explicit HostRows(const at::Tensor& rows) : rows_(rows) {
    if (rows.defined() && rows.scalar_type() == kType && rows.is_contiguous()) data_ = rows.const_data_ptr<acc_t>();
  }
  bool defined() const { return rows_.defined(); }
  bool stable() const { return data_ != nullptr; }  // whether a row stays valid after the next is read
  const acc_t* operator[](int64_t i) {
    if (data_) return data_ + i * rows_.size(1);
    held_ = rows_[i].to(kType).contiguous();
    return held_.const_data_ptr<acc_t>();
  }

 private:
  static constexpr at::ScalarType kType = c10::CppTypeToScalarType<acc_t>::value;
  at::Tensor rows_, held_;
  const acc_t* data_ = nullptr;
};

// One verification's walk down a token tree (tree.h's rule; a chain is the tree [1] * gamma): p [N + 1, V]
// standardized, q and the sibling law by node, the nodes' tokens, and for greedy chains with lenience below 1
// A.5's argmax variant per node (else null).
template <typename acc_t>
struct Walk {
  const Tree& tree;
  const acc_t* p;
  int64_t vocab;
  HostRows<acc_t>& q;
  HostRows<acc_t>& sibling;
  const int64_t* tokens;
  const SamplingConfig& config;
  Siblings siblings;
  const Uniform& uniform;  // the coins
  const Uniform& draw;     // t's
  const uint8_t* lenient;
};

// Greedy: the rank of the first child that is p's argmax (or that A.5's argmax variant keeps), else -1 with t
// that argmax.
template <typename acc_t>
int64_t greedy_child(const Walk<acc_t>& in, int64_t node, const acc_t* p_node, int64_t& t) {
  const int64_t best = argmax(p_node, in.vocab), first = in.tree.first_child(node);
  for (int64_t j = 0; j < in.tree.children(node); ++j) {
    if (in.tokens[first + j] == best || (in.lenient && in.lenient[first + j])) return j;
  }
  t = best;
  return -1;
}

// The laws a node's children were drawn from, in rank order (tree.h): q_j for child j given the rejections before
// it. With replacement q (the sibling law from child 1 on); without replacement q without the earlier siblings'
// tokens, renormalized; top the point mass at each of the first k - 1, then q without them. The coupled rule
// reweights what is left itself (left()). Copies are made only where a later child reads them.
template <typename acc_t>
class ChildLaws {
 public:
  ChildLaws(const acc_t* q, const acc_t* s, int64_t vocab, int64_t children, Siblings siblings)
      : q_(q), s_(s), vocab_(vocab), children_(children), siblings_(siblings) {}

  // q_j for child j of token x, valid until the next call.
  const acc_t* law(int64_t j, int64_t x) {
    const acc_t* out = q_;
    if (j > 0) {  // what is left, renormalized
      double mass = 0.0;
#pragma omp simd reduction(+ : mass)
      for (int64_t v = 0; v < vocab_; ++v) mass += left_[v];
      const double scale = 1.0 / std::max(mass, std::numeric_limits<double>::min());
      rest_.resize(vocab_);
      for (int64_t v = 0; v < vocab_; ++v) rest_[v] = static_cast<acc_t>(left_[v] * scale);
      out = rest_.data();
    }
    if (siblings_ == Siblings::top && j < children_ - 1) {  // the first k - 1: the point mass at x
      rest_.assign(vocab_, acc_t(0));
      rest_[x] = 1;
      out = rest_.data();
    }
    return out;
  }
  // After child j of token x is rejected: what is left for the next child, unnormalized.
  std::vector<acc_t>& rejected(int64_t j, int64_t x) {
    if (left_.empty()) left_.assign(q_, q_ + vocab_);
    if (j == 0 && siblings_ == Siblings::with_replacement) std::copy(s_, s_ + vocab_, left_.begin());
    if (!independent_draws(siblings_)) left_[x] = 0;
    return left_;
  }

 private:
  const acc_t* q_;
  const acc_t* s_;
  int64_t vocab_, children_;
  Siblings siblings_;
  std::vector<acc_t> left_, rest_;
};

// Sampled: the node's children tested in rank order (tree.h), one uniform each until one is kept; its rank, or
// -1 with t drawn from the last residual. Child 0 reads p and q themselves; what is left of them is copied only
// where a later child reads it, so a chain's test costs what Algorithm 1's does. With `chances` (by node), no coin
// and no t: every child's test chance given the rejections before it is written there, and none is kept.
template <typename acc_t>
int64_t sampled_child(const Walk<acc_t>& in, int64_t node, const acc_t* p_node, const acc_t* q_node,
                      const acc_t* s_node, int64_t& t, double* chances = nullptr) {
  const int64_t children = in.tree.children(node), first = in.tree.first_child(node), vocab = in.vocab;
  const acc_t* p_j = p_node;
  std::vector<acc_t> p_rest;  // p_j, once a later child reads it
  ChildLaws<acc_t> laws(q_node, s_node, vocab, children, in.siblings);
  for (int64_t j = 0; j < children; ++j) {
    const int64_t x = in.tokens[first + j];
    const acc_t* q_j = laws.law(j, x);
    // Coupled: the coin looks at whether the next child is in H_j = {p_j > q_j}, of q mass w (tree.h).
    const bool look_ahead = in.siblings == Siblings::coupled && j + 1 < children;
    double w = 0.0;
    if (look_ahead) {
#pragma omp simd reduction(+ : w)
      for (int64_t v = 0; v < vocab; ++v) w += p_j[v] > q_j[v] ? s_node[v] : acc_t(0);
    }
    const int64_t next = look_ahead ? in.tokens[first + j + 1] : 0;
    const bool next_in_h = p_j[next] > q_j[next];
    const double chance = child_acceptance(p_j[x], q_j[x], in.config.lenience, j == 0, look_ahead, next_in_h, w);
    if (chances != nullptr) {
      chances[first + j] = chance;
      if (j == children - 1) return -1;
    } else if (in.uniform() < chance) {
      return j;
    }
    const double rejected = residual_mass(p_j, q_j, vocab);
    if (j == children - 1) {  // every child rejected: t from residual(p_j, q_j), p_j itself when that has no mass
      t = rejected > 0 ? inverse_cdf(vocab, in.draw(), [p_j, q_j](int64_t v) { return excess(p_j[v], q_j[v]); })
                       : inverse_cdf(vocab, in.draw(), [p_j](int64_t v) { return static_cast<double>(p_j[v]); });
      return -1;
    }
    std::vector<acc_t>& left = laws.rejected(j, x);
    if (look_ahead) {  // the next child's law given this rejection: q reweighted on H_j and off it (tree.h)
      double keep_in = 0.0, keep_out = 0.0;
      for (int64_t v = 0; v < vocab; ++v) {
        if (q_j[v] <= 0 || p_j[v] >= q_j[v]) continue;  // r >= 1: always accepted
        const double r = static_cast<double>(p_j[v]) / q_j[v];
        keep_in += q_j[v] * (1.0 - coupled_coin(r, true, w));
        keep_out += q_j[v] * (1.0 - coupled_coin(r, false, w));
      }
      for (int64_t v = 0; v < vocab; ++v) {
        left[v] = static_cast<acc_t>(s_node[v] * (p_j[v] > q_j[v] ? keep_in : keep_out));
      }
    }
    // rejected: p_{j+1} = norm(max(0, p_j - q_j)), p_j itself when that has no mass
    if (rejected > 0) {
      p_rest.resize(vocab);
      for (int64_t v = 0; v < vocab; ++v) p_rest[v] = static_cast<acc_t>(residual_at(p_j[v], q_j[v], rejected));
      p_j = p_rest.data();
    }
  }
  return -1;  // no children: not reached (walk() treats leaves)
}

// The walk from the root: at each internal node its beta and its children's tests, down the accepted child, until
// a node keeps none (t from its residual, or its argmax when greedy) or a leaf (t from p there).
template <typename acc_t>
Verdict walk(const Walk<acc_t>& in) {
  Verdict out;
  for (int64_t node = 0;;) {
    const acc_t* p_node = in.p + node * in.vocab;
    if (in.tree.children(node) == 0) {
      out.accepted_rank.push_back(-1);
      const auto mass = [p_node](int64_t v) { return static_cast<double>(p_node[v]); };
      out.host_token = in.config.greedy() ? argmax(p_node, in.vocab) : inverse_cdf(in.vocab, in.draw(), mass);
      return out;
    }
    const acc_t* q_node = in.q[node];
    const acc_t* s_node = in.sibling.defined() ? in.sibling[node] : q_node;
    out.betas.push_back(beta(p_node, q_node, in.vocab));
    int64_t t = 0;
    const int64_t chosen = in.config.greedy() ? greedy_child(in, node, p_node, t)
                                              : sampled_child(in, node, p_node, q_node, s_node, t);
    out.accepted_rank.push_back(chosen);
    if (chosen < 0) {
      out.host_token = t;
      return out;
    }
    node = in.tree.first_child(node) + chosen;
    out.path.push_back(node);
    out.path_tokens.push_back(in.tokens[node]);
  }
}

// Every child's test chance by node (tree.h: expected_kept's c_v for the token rule), from sampled_child without
// coins, at each internal node the kept path can reach: a node of chance 0 is passed over, and so its children
// keep chance 0 and are passed over too.
template <typename acc_t>
std::vector<double> token_chances(const Walk<acc_t>& in) {
  std::vector<double> out(in.tree.size(), 0.0);
  for (int64_t node = 0; node < in.tree.size(); ++node) {
    if ((node > 0 && !(out[node] > 0)) || in.tree.children(node) == 0) continue;
    const acc_t* q_node = in.q[node];
    int64_t t = 0;
    sampled_child(in, node, in.p + node * in.vocab, q_node, in.sibling.defined() ? in.sibling[node] : q_node, t,
                  out.data());
  }
  return out;
}

// Traversal verification (tree.h; on a chain, Sun et al.'s block verification): the nodes in post-order, each of
// weight r > 0 against one uniform (the root draws none: it stops when nothing below it does), until one falls below
// the node's stopping chance h; then one uniform for t. A node's stage measures W_j are computed as its children are
// reached (a pass over V for each child whose subtree was passed over), so a chain's walk costs what Algorithm 1's
// does at each position it visits; a subtree of r = 0 is passed over unread.
template <typename acc_t>
class Traversal {
 public:
  explicit Traversal(const Walk<acc_t>& in) : in_(in) {}

  Verdict run() {
    visit(0, 1.0);
    Verdict out;
    for (int64_t node = stop_; node > 0; node = in_.tree.parent(node)) out.path.push_back(node);
    std::reverse(out.path.begin(), out.path.end());
    int64_t node = 0;
    for (const int64_t next : out.path) {
      out.betas.push_back(beta(in_.p + node * in_.vocab, in_.q[node], in_.vocab));
      out.accepted_rank.push_back(in_.tree.rank(next));
      out.path_tokens.push_back(in_.tokens[next]);
      node = next;
    }
    if (in_.tree.children(stop_) > 0) out.betas.push_back(beta(in_.p + stop_ * in_.vocab, in_.q[stop_], in_.vocab));
    out.accepted_rank.push_back(-1);
    const acc_t* p_stop = in_.p + stop_ * in_.vocab;
    double mass = 0.0;
    for (const double w : stop_law_) mass += w;
    out.host_token = mass > 0 ? inverse_cdf(in_.vocab, in_.draw(), [this](int64_t v) { return stop_law_[v]; })
                              : inverse_cdf(in_.vocab, in_.draw(),
                                            [p_stop](int64_t v) { return static_cast<double>(p_stop[v]); });
    return out;
  }

  // Every node's weight r_v (tree.h: expected_kept's c_v for traversal), by a visit of the whole tree without coins
  // (a subtree of r = 0 is passed over: its weights are 0).
  std::vector<double> weights() {
    std::vector<double> out(in_.tree.size(), 0.0);
    weights_ = &out;
    visit(0, 1.0);
    weights_ = nullptr;
    return out;
  }

 private:
  // Node v's subtree in post-order, v of weight r > 0: its children's subtrees in rank order, then v itself. True
  // once a node stops (stop_, and stop_law_ its W_(k+1): empty for a leaf, whose t follows p). Recording weights_,
  // no node stops.
  bool visit(int64_t v, double r) {
    const int64_t vocab = in_.vocab, children = in_.tree.children(v), first = in_.tree.first_child(v);
    const acc_t* p_v = in_.p + v * vocab;
    std::vector<double> w;  // W_j for j >= 1; W_0 = r p_v is read from p
    if (children > 0) {
      // converted rows are copied: deeper nodes read other rows into the same buffer
      std::vector<acc_t> q_held, s_held;
      const acc_t* q = held(in_.q, v, q_held);
      const acc_t* s = in_.sibling.defined() ? held(in_.sibling, v, s_held) : q;
      ChildLaws<acc_t> laws(q, s, vocab, children, in_.siblings);
      const auto at = [&](int64_t j, int64_t u) { return j == 0 ? r * static_cast<double>(p_v[u]) : w[u]; };
      for (int64_t j = 0; j < children; ++j) {
        const int64_t x = in_.tokens[first + j];
        const acc_t* q_j = laws.law(j, x);
        const double r_child = child_weight(at(j, x), q_j[x], j == 0);
        if (weights_ != nullptr) (*weights_)[first + j] = r_child;
        if (r_child > 0 && visit(first + j, r_child)) return true;
        if (weights_ != nullptr && j == children - 1) return false;  // W_(k+1), v's chance, is not needed
        double kept = 0.0;  // m_j = sum min(W_j, q_j)
        for (int64_t u = 0; u < vocab; ++u) kept += std::min(at(j, u), static_cast<double>(q_j[u]));
        std::vector<double> next(vocab);
        for (int64_t u = 0; u < vocab; ++u) {
          next[u] = 1.0 - kept > 0 ? std::max(0.0, at(j, u) - q_j[u]) / (1.0 - kept) : static_cast<double>(p_v[u]);
        }
        w.swap(next);
        laws.rejected(j, x);
      }
    }
    double h = r;  // a leaf's; an internal node's is W_(k+1)'s mass
    if (children > 0) h = std::accumulate(w.begin(), w.end(), 0.0);
    if (weights_ != nullptr || (v != 0 && !(in_.uniform() < h))) return false;
    stop_ = v;
    stop_law_.swap(w);
    return true;
  }

  // Row v of `rows`, valid through the deeper visits: the tensor's own memory, else a copy in `copy`.
  const acc_t* held(HostRows<acc_t>& rows, int64_t v, std::vector<acc_t>& copy) const {
    const acc_t* row = rows[v];
    if (rows.stable()) return row;
    copy.assign(row, row + in_.vocab);
    return copy.data();
  }

  const Walk<acc_t>& in_;
  int64_t stop_ = 0;
  std::vector<double> stop_law_;
  std::vector<double>* weights_ = nullptr;
};

}  // namespace

bool runs_on_host(const at::Device& device) {
  return device.is_cpu() && host_kernels_on.load(std::memory_order_relaxed);
}
bool runs_on_host(const at::Tensor& t) { return runs_on_host(t.device()); }

bool set_host_kernels(bool on) { return host_kernels_on.exchange(on); }

bool all_finite(const at::Tensor& maxima) {
  if (!maxima.defined()) return true;
  const at::Tensor values = maxima.to(at::kDouble).contiguous();
  const double* data = values.const_data_ptr<double>();
  return std::all_of(data, data + values.numel(), [](double m) { return std::isfinite(m); });
}

at::Tensor standardize(const at::Tensor& logits, const SamplingConfig& config, std::vector<uint8_t>* finite) {
  const at::Tensor x = logits.contiguous();
  if (x.scalar_type() == at::kDouble) return standardize_rows<double, double>(x, config, finite);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "speculant_standardize", [&] {
    out = standardize_rows<scalar_t, float>(x, config, finite);
  });
  return out;
}

int64_t draw(const at::Tensor& probs, int64_t row, bool greedy, const Uniform& uniform) {
  const int64_t vocab = probs.size(1);
  int64_t token = 0;
  AT_DISPATCH_FLOATING_TYPES(probs.scalar_type(), "speculant_draw", [&] {
    const scalar_t* data = probs.const_data_ptr<scalar_t>() + row * vocab;
    token = greedy ? argmax(data, vocab)
                   : inverse_cdf(vocab, uniform(), [data](int64_t v) { return static_cast<double>(data[v]); });
  });
  return token;
}

at::Tensor sample(const at::Tensor& probs, at::Generator& generator) {
  const at::Tensor rows = probs.scalar_type() == at::kDouble || probs.scalar_type() == at::kFloat
                              ? probs.contiguous()
                              : probs.to(at::kFloat).contiguous();
  const int64_t n = rows.size(0);
  at::Tensor out = at::empty({n}, rows.options().dtype(at::kLong));
  int64_t* token = out.mutable_data_ptr<int64_t>();
  GeneratorUniform uniform(generator);
  for (int64_t i = 0; i < n; ++i) token[i] = draw(rows, i, /*greedy=*/false, [&uniform] { return uniform(); });
  return out;
}

at::Tensor draw_children(const at::Tensor& q, int64_t k, Siblings siblings, const Uniform& uniform,
                         const at::Tensor& sibling) {
  const at::Tensor row = q.to(at::kDouble).contiguous();
  const int64_t vocab = row.numel();
  std::vector<double> left(row.const_data_ptr<double>(), row.const_data_ptr<double>() + vocab);
  const at::Tensor sibling_row = sibling.defined() ? sibling.to(at::kDouble).contiguous() : at::Tensor();
  at::Tensor out = at::empty({k}, row.options().dtype(at::kLong));
  int64_t* token = out.mutable_data_ptr<int64_t>();
  int64_t j = 0;
  if (siblings == Siblings::top) {  // q's k - 1 most probable tokens, the first index on ties: one scan each
    for (; j < k - 1; ++j) {
      token[j] = argmax(left.data(), vocab);
      left[token[j]] = -1.0;  // below every probability until the draw
    }
    for (int64_t i = 0; i < j; ++i) left[token[i]] = 0.0;
  }
  for (; j < k; ++j) {
    if (j == 1 && sibling_row.defined()) {  // children 1 .. k - 1 from the sibling law (independent draws)
      std::copy(sibling_row.const_data_ptr<double>(), sibling_row.const_data_ptr<double>() + vocab, left.begin());
    }
    double mass = 0.0;
#pragma omp simd reduction(+ : mass)
    for (int64_t v = 0; v < vocab; ++v) mass += left[v];
    token[j] = mass > 0 ? inverse_cdf(vocab, uniform(), [&left](int64_t v) { return left[v]; }) : 0;
    if (!independent_draws(siblings)) left[token[j]] = 0.0;
  }
  return out;
}

at::Tensor top_tokens(const at::Tensor& q, int64_t k) {
  const int64_t vocab = q.size(-1);
  require(k >= 0 && k <= vocab, "top_tokens: k = {} must be in [0, {}]", k, vocab);
  const at::Tensor rows = q.contiguous().view({-1, vocab});
  at::Tensor out = at::empty({rows.size(0), k}, at::TensorOptions().dtype(at::kLong));
  int64_t* top = out.mutable_data_ptr<int64_t>();
  std::vector<int64_t> order(vocab);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rows.scalar_type(), "speculant_top_tokens", [&] {
    for (int64_t r = 0; r < rows.size(0); ++r) {
      const scalar_t* row = rows.const_data_ptr<scalar_t>() + r * vocab;
      const auto above = [row](int64_t a, int64_t b) {  // a strict weak order: NaN first, then descending, by index
        const double x = static_cast<double>(row[a]), y = static_cast<double>(row[b]);
        if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && (!std::isnan(y) || a < b);
        return x > y || (x == y && a < b);
      };
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(order.begin(), order.begin() + k, order.end(), above);
      std::copy(order.begin(), order.begin() + k, top + r * k);
    }
  });
  std::vector<int64_t> sizes = q.sizes().vec();
  sizes.back() = k;
  return out.view(sizes);
}

at::Tensor token_tensor(int64_t token) {
  at::Tensor out = at::empty({1}, at::TensorOptions().dtype(at::kLong));
  *out.mutable_data_ptr<int64_t>() = token;
  return out;
}

Verdict verify_tree(const Tree& tree, const at::Tensor& target_logits, const at::Tensor& q, const int64_t* tokens,
                    const SamplingConfig& config, Siblings siblings, const Uniform& coins, const Uniform& draw,
                    const at::Tensor& sibling_q) {
  std::vector<uint8_t> finite;
  // in float64: a node's later children subtract residuals from residuals
  const at::Tensor p = standardize(target_logits, config, &finite).to(at::kDouble).contiguous();  // [N + 1, V]
  HostRows<double> q_rows(q), sibling_rows(sibling_q);
  const Walk<double> in{tree, p.const_data_ptr<double>(), p.size(1), q_rows, sibling_rows, tokens, config, siblings,
                        coins, draw, nullptr};
  Verdict out = config.block() ? Traversal<double>(in).run() : walk(in);
  out.kept_in_expectation =
      config.greedy() ? static_cast<double>(out.accepted())
                      : expected_kept(tree, config.block() ? Traversal<double>(in).weights() : token_chances(in),
                                      config.block());
  out.finite = std::all_of(finite.begin(), finite.end(), [](uint8_t ok) { return ok != 0; });
  return out;
}

// A chain's ratios p_i(x_i) / q_i(x_i) (Verdict::ratios) from its rows p [gamma + 1, V] and q [gamma, V]; at T = 0
// +inf where the test keeps x_i (the argmax, or A.5's lenient argmax: `lenient` by node), else 0.
template <typename acc_t>
std::vector<double> chain_ratios(const acc_t* p, const acc_t* q, int64_t vocab, const int64_t* drafted, int64_t gamma,
                                 bool greedy, const std::vector<uint8_t>& lenient) {
  std::vector<double> out(gamma);
  for (int64_t i = 0; i < gamma; ++i) {
    const double p_x = p[i * vocab + drafted[i]], q_x = q[i * vocab + drafted[i]];
    out[i] = !greedy ? acceptance_ratio(p_x, q_x, 1.0) : p_x > 0 || (!lenient.empty() && lenient[i + 1]) ? kInf : 0.0;
  }
  return out;
}

Verdict verify(const at::Tensor& target_logits, const at::Tensor& q, const int64_t* drafted,
               const SamplingConfig& config, const Uniform& coins, const Uniform& draw) {
  const int64_t gamma = q.size(0);
  std::vector<uint8_t> finite;
  const at::Tensor p = standardize(target_logits, config, &finite);  // [gamma + 1, V], in its working dtype
  const at::Tensor q_rows = gamma > 0 ? q.to(p.scalar_type()).contiguous() : q;  // no copy when already so
  std::vector<int64_t> tokens{0};  // the chain as the tree [1] * gamma: node i + 1 holds draft i
  tokens.insert(tokens.end(), drafted, drafted + gamma);
  std::vector<uint8_t> lenient;  // A.5's argmax variant, by node (a rare mode: tensor operations suffice)
  if (config.greedy() && config.lenience < 1.0 && gamma > 0) {
    const at::Tensor index = at::tensor(std::vector<int64_t>(drafted, drafted + gamma)).view({gamma, 1});
    const at::Tensor keep = lenient_argmax(target_logits, index, config.lenience, at::kDouble).contiguous();
    lenient.assign(1, 0);
    lenient.insert(lenient.end(), keep.const_data_ptr<bool>(), keep.const_data_ptr<bool>() + gamma);
  }
  const Tree chain = Tree::from_shape(std::vector<int64_t>(gamma, 1));
  Verdict out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "speculant_verify", [&] {
    HostRows<scalar_t> q_by_node(q_rows), none{at::Tensor()};
    const Walk<scalar_t> in{chain, p.const_data_ptr<scalar_t>(), p.size(1), q_by_node, none, tokens.data(), config,
                            Siblings::with_replacement, coins, draw, lenient.empty() ? nullptr : lenient.data()};
    out = config.block() ? Traversal<scalar_t>(in).run() : walk(in);
    if (gamma > 0) {
      out.ratios = chain_ratios(p.const_data_ptr<scalar_t>(), q_rows.const_data_ptr<scalar_t>(), p.size(1), drafted,
                                gamma, config.greedy(), lenient);
    }
  });
  out.drafted.assign(drafted, drafted + gamma);
  out.finite = std::all_of(finite.begin(), finite.end(), [](uint8_t ok) { return ok != 0; });
  return out;
}

}  // namespace speculant::cpu
