// Token trees: several drafts per position, verified in one target call (SpecInfer, Miao et al. 2024;
// recursive rejection sampling, Jeon et al. 2024). A chain of gamma drafts is the tree [1] * gamma.
//
// Notation as in speculative.h: p = target M_p, q = draft M_q, both standardized by one SamplingConfig.
//
// Exactness (multi-draft speculative sampling). At a node with target distribution p and children x_1 .. x_k
// (in the order they were drawn), the verifier runs k speculative sampling steps in turn:
//     p_1 = p;  step j: accept x_j with probability min(1, p_j(x_j) / q_j(x_j)),
//                       otherwise p_{j+1} = norm(max(0, p_j - q_j));
//     if every child is rejected, t ~ p_{k+1}.
// where q_j is the law x_j was drawn from given x_1 .. x_{j-1}: q itself when the children are drawn with
// replacement (independently), q without the earlier siblings' tokens, renormalized, when drawn without
// replacement; for `top` children (below) the point mass at x_j for each of the first k - 1, which are q's most
// probable tokens, and q without them, renormalized, for the last.
// Claim: the token this emits at the node is distributed as p. Proof by induction on the
// children left: with none left, t ~ p_{k+1} = p_j. With children j .. k left, fix x_1 .. x_{j-1}; x_j ~ q_j,
// and step j is one step of Algorithm 1 for the pair (p_j, q_j): P(emit x_j) = min(q_j(x), p_j(x)), and on a
// rejection (probability 1 - sum min(p_j, q_j)) the rest emits a sample of p_{j+1} by the induction
// hypothesis, whatever x_j was (p_{j+1} depends on q_j, not on the drawn x_j, and the later children are
// drawn from laws the later steps use). So P(emit x) = min(p_j, q_j)(x) + (1 - sum min(p_j, q_j)) p_{j+1}(x)
// = p_j(x) (Theorem 3.5's identity, A.1). An accepted child becomes the next node: its own children were
// drawn from q at its context, so the same argument applies there, and the emitted sequence is distributed as
// the target's own continuation, token by token. Without replacement p_{j+1}(x_i) = 0 for every rejected x_i
// (a rejection needs p_j(x_i) < q_j(x_i)), so removing the rejected tokens from q_{j+1} loses nothing; with
// replacement a repeated token, once rejected, has p_{j+1}(x) = 0 and is rejected again.
// Top children (how the drafts are drawn bounds what any verifier can accept: Hu et al., ICLR 2025, "Towards
// optimal multi-draft speculative decoding"). A point mass is a law like any other, so the proof above covers
// x_j fixed in advance: step j accepts x_j with probability min(1, p_j(x_j) / 1) = p_j(x_j) and on a rejection
// leaves p_{j+1} = norm(max(0, p_j - delta_{x_j})), which is p_j with x_j removed, renormalized. The first k - 1
// children are a function of q alone (its k - 1 most probable tokens, the first index on ties), so the claim
// needs nothing of the draft's calibration there; the last child, drawn from q without them, is an ordinary
// speculative step against what is left. With k = 1 this is the chain's Algorithm 1. Together the first k - 1
// steps accept with probability p(T) (T: the top k - 1 tokens), the last with the sum over x outside T of
// min(p(x), q(x) (1 - p(T)) / (1 - q(T))): more than sampled siblings where the draft's argmax is the
// target's but its mass is spread, less where the draft is close to the target in law (tests/test_tree.py
// enumerates both; on the trained GPT-2 pair sampled siblings keep more, benchmarks/trees.py).
// Coupled children (siblings = coupled: drawn independently from q, as with replacement). Rejection sampling tries
// child j with a coin of probability min(1, r(x_j)), r = p_j / q_j, that ignores the later children, so a child
// of r < 1 is sometimes accepted when the child after it would have been accepted too, and sometimes rejected when
// the child after it is useless. The coupled rule lets child j's coin look at child j + 1's token, and only at
// whether it lies in H_j = {v : p_j(v) > q_j(v)}, the support of the residual p_{j+1}. With w = q(H_j), the chance
// that child j + 1 lands in H_j, a child of r = r(x_j) is accepted with probability
//     u(r, in H_j) = clamp((r - (1 - w)) / w, 0, 1),     u(r, not in H_j) = min(1, r / (1 - w))
// (1 when the denominator is 0; u = 1 for r >= 1 either way): a child of r < 1 spends its acceptance on the
// draws of j + 1 that are useless, as far as they reach. The last child, with no child after it, keeps min(1, r).
// Claim: the token emitted at the node is distributed as p. (1) For every x_j = a, the coin averaged over
// x_{j+1} ~ q is (1 - w) u(r, out) + w u(r, in) = min(1, r(a)) (check the cases r <= 1 - w and r > 1 - w), so
// P(emit x_j = a) = q_j(a) min(1, r(a)) = min(p_j, q_j)(a), as in Algorithm 1, and a rejection has probability
// 1 - sum min(p_j, q_j) and must be followed by a sample of p_{j+1} = norm(max(0, p_j - q_j)), as above.
// (2) Given the rejection, x_{j+1} is no longer distributed as q: its law is
//     q_{j+1}(b) = q(b) (1 - sum_a q_j(a) u(r(a), b in H_j)) / (1 - sum min(p_j, q_j)),
// which the verifier computes (it depends on b only through b in H_j), while x_{j+2} .. x_k, not looked at yet,
// are still independent draws of q, independent of x_{j+1}. Step j + 1 is then the same rule for the pair
// (p_{j+1}, q_{j+1}) with its own look-ahead at x_{j+2}, and by induction on the children left (the base case
// the last child's plain step, then t ~ p_{k+1}) it emits a sample of p_{j+1}; with (1), of p_j. The verifier
// never reads x_j's token after step j, so the rest may depend on x_{j+1} in any way its law q_{j+1} accounts
// for. Accepted children go on as above: their subtrees were drawn from q at their own tokens.
// Why it keeps more: a rejection of child j now happens mostly when child j + 1 is in H_j, so the residual's
// support meets child j + 1 more often than with independent coins, while child j keeps its chance
// sum min(p_j, q_j). On the trained GPT-2 pair at T = 1 the second child's share rises from 0.105 to 0.148, with
// the first child's 0.61 unchanged (benchmarks/node_bounds.py): rank 0 keeps its lead, and a tree of this rule
// puts its deepest subtree there as Sequoia's trees do.
// Sibling drafts (a second draft model for the later children: TreeInput::sibling_q). With independent draws (with
// replacement, coupled) a node's first child is drawn from the draft's q and children 1 .. k - 1 independently from
// another law s at the same node, a second model's: the arguments above hold for any law a child was drawn from, as
// long as each step uses the law its child was drawn from given the earlier rejections. With replacement, child
// j >= 1 is tried against s itself; coupled, child j's coin looks at whether child j + 1 lies in H_j and w = s(H_j)
// (child j + 1 is a draw of s), and q_{j+1} is s reweighted on and off H_j (in (2) above q becomes s). Child 0 keeps
// Algorithm 1's beta. What it is for: the next child is accepted with sum min(p_{j+1}, q_{j+1}), largest when its
// law is close to the residual p_{j+1} = norm(max(0, p - q)), which a draft's own q is not (it is where q falls
// short of p); a model trained toward that residual (speculant.distill, loss="residual") draws siblings
// that are accepted more often. Without replacement and top are not defined with a sibling law here. A node with one
// child never reads s (its child is the draft's), so s's rows there may be any law: the drafter does not run the
// sibling below the deepest level that branches, and gives those nodes q's rows.
// Greedy (temperature 0): children are the draft's top-k tokens (with a sibling draft: the draft's argmax, then the
// sibling's k - 1 most probable tokens), and the first child equal to the target's argmax is accepted (the longest
// path of argmax agreement); t is the argmax.
// Lenience (A.5) is not defined for trees here: its bound is proven for one draft per position.
//
// Block verification of a chain (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro and Suresh, ICLR 2025, Algorithm 2;
// SamplingConfig::Verification::block). Drafts x_1 .. x_g, x_i drawn from q_i (the draft's law after x_1 .. x_(i-1)),
// p_i the target's law there, p_(g+1) the target's after the whole chain. The running ratio
//     r_0 = 1,  r_i = min(1, r_(i-1) p_i(x_i) / q_i(x_i)),
// and for i < g the residual weight Z_i = sum_y max(0, r_i p_(i+1)(y) - q_(i+1)(y)) and the stopping chance
// h_i = Z_i / (Z_i + 1 - r_i) (1 where that is 0 / 0; h_0 = 1), h_g = r_g. With independent uniforms eta_1 .. eta_g,
// tau = the largest i with eta_i < h_i (0 if none, since h_0 = 1); the verifier keeps x_1 .. x_tau and emits
// t ~ p_(g+1) when tau = g, else t ~ norm(max(0, r_tau p_(tau+1) - q_(tau+1))) (p_(tau+1) itself where that has no
// mass). At r_tau = 1 that residual is Algorithm 1's; a rejection at position i no longer ends the block, because a
// later position whose joint ratio recovers can still be kept.
// Claim: the emitted tokens are distributed as the target's own continuation. Write q(x_1..i) and p(x_1..i) for the
// products of the q_j(x_j) and p_j(x_j), j <= i.
// (1) P(x_1..i drafted, tau >= i) = q(x_1..i) r_i, by induction from i = g down: at g, P(tau = g | x) = h_g = r_g.
// Below, tau >= i + 1 given x_1..i has probability m_i = sum_y q_(i+1)(y) r_(i+1)(x_1..i, y) = sum_y min(r_i
// p_(i+1)(y), q_(i+1)(y)) by the hypothesis, and tau = i adds h_i (1 - m_i), since eta_i is independent of the rest;
// 1 - m_i = 1 - r_i + Z_i, so h_i (1 - m_i) = Z_i and m_i + Z_i = r_i (where 1 - m_i = 0 the value of h_i is never
// used). (2) So P(tau = i, x_1..i, t = y) = q(x_1..i) Z_i norm(...)(y) = q(x_1..i) max(0, r_i p_(i+1)(y) -
// q_(i+1)(y)) for i < g, and q(x_1..g) r_g p_(g+1)(y) at g. (3) The emitted sequence has length tau + 1; its first
// i + 1 tokens are (x_1..i, y) either because tau >= i + 1 with x_(i+1) = y, of probability q(x_1..i) min(r_i
// p_(i+1)(y), q_(i+1)(y)) by (1), or because tau = i and t = y, by (2); their sum is q(x_1..i) r_i p_(i+1)(y),
// while reaching length i + 1 after x_1..i at all (tau >= i) has probability q(x_1..i) r_i by (1). So given that
// the output reaches position i + 1 after x_1..i, its token there is distributed as p_(i+1): every emitted token
// follows the target's law given the ones before it, and the next iteration, which starts from the target's
// context, continues it (Theorem 3.5's argument, position by position). The three draws (the draft's, the etas, t's)
// must be independent: a defect that reuses one stream's values across them breaks (1).
// Temperature 0: every r_i is 0 or 1 (p is one-hot and the greedy draft's q too), h_i = r_i, so tau is the longest
// prefix the target's argmax agrees with and t its argmax there: the token rule's verdict, which the engine runs.
// What it keeps: E[tau] = sum_i E[r_i] over the draft's chains, at least the token rule's sum_i E[prod_j min(1,
// p_j / q_j)], since r_i >= that product (Sun et al.: block verification is optimal among valid verifiers of one
// draft chain).
//
// Traversal verification of a tree (Weng et al., NeurIPS 2025, "Traversal Verification for Speculative Tree
// Decoding": leaf to root, sequence-level; verification = block on a tree). The rule as this library states and
// proves it; on a chain it is the block rule above, verdict for verdict and uniform for uniform. Every node v gets a
// weight r_v (the root's 1) and, as its children are reached, stage measures W_1, W_2, .. over the next token
// (nonnegative, of mass at most 1): W_1 = r_v p_v, where p_v is the target's law after v; child c_j (rank j, drawn
// from q_j, the law the sibling rule above gives: q, q without the earlier siblings renormalized, top's point masses,
// a sibling draft's s) gets the weight
//     r_(c_j) = min(1, W_j(x_j) / q_j(x_j))   (1 for the first child where q_j(x_j) = 0 < W_j(x_j); 0 for a later one)
// and W_(j+1) = max(0, W_j - q_j) / (1 - m_j), m_j = sum_y min(W_j(y), q_j(y)) (p_v itself where 1 - m_j = 0, a stage
// never reached). A node with k children stops with chance h_v = the mass of W_(k+1); a leaf's is r_v, the root's 1.
// The verifier visits the nodes in post-order (each child's subtree in rank order, then the node), draws one
// independent uniform eta_v for each node of r_v > 0, and keeps the path to the first node with eta_v < h_v; t is
// drawn from norm(W_(k+1)) there (a leaf's: p_v; p_v where that has no mass). Nodes of r = 0 (and their subtrees,
// all of r = 0) are passed over. Temperature 0 runs the token rule, whose verdict this is (one child of weight 1
// at each node of the argmax path, the others 0).
// Claim: the emitted tokens are distributed as the target's own continuation. Lemma, by induction on the height of
// v's subtree: given v and any weight r_v, v's subtree stops somewhere with probability r_v (over its drafts and
// its uniforms), and the first token it emits after v (x_(c_j) if it stops in c_j's subtree, else t) is distributed
// as p_v given that it stops; more precisely, P(stops, first token y) = r_v p_v(y). For stage j (reached when the
// subtrees of c_1 .. c_(j-1) did not stop) write A_j(y) for the chance that the rest (the subtrees of c_j .. c_k,
// then v's own coin) stops with first token y. Claim: A_j = W_j. At stage k + 1 only v's coin is left: it stops
// with chance h_v = |W_(k+1)| and emits t ~ norm(W_(k+1)): A = W_(k+1). At stage j, x_j = x has probability q_j(x);
// by the lemma for c_j (a smaller subtree, of weight r_(c_j) = min(1, W_j(x) / q_j(x))), c_j's subtree stops with
// first token x with probability q_j(x) r_(c_j) = min(W_j(x), q_j(x)), in all m_j; otherwise (1 - m_j) the later
// stages run, and A_(j+1) = W_(j+1) by induction: those stages' drafts were drawn from the laws they use, whatever
// x_j was (the law W_(j+1) does not depend on x_j, and where a sibling rule removes x_j, W_(j+1)(x_j) = 0 whenever x_j
// could be rejected: a rejection needs W_j(x_j) < q_j(x_j)). So A_j(y) = min(W_j, q_j)(y) + (1 - m_j) W_(j+1)(y) =
// min(W_j, q_j)(y) + max(0, W_j(y) - q_j(y)) = W_j(y). At j = 1: P(v's subtree stops, first token y) = W_1(y) = r_v
// p_v(y), the lemma. Given a stop in c_j's subtree after x_(c_j) = y, the tokens after y follow the target by the
// lemma for c_j (applied to its own subtree), so the emitted sequence follows the target token by token. The root
// (r = 1) stops with probability 1, and the next iteration continues from the target's context (Theorem 3.5's
// argument). On a chain, W_2 of node i - 1 is max(0, r_(i-1) p_i - q_i) / (1 - m), 1 - m = Z + 1 - r (m + Z = r): its
// mass is the block rule's h and its normalization block's residual, and r_i the running ratio: the same rule. The
// draft's draws, the etas and t's uniform must be independent, as for the block rule.
// Coupled siblings look at the next child's token before a child's test, which the lemma's stage argument does not
// cover (W_(j+1) would depend on x_(j+1)): a tree with siblings "coupled" takes verification "token", refused by name.
// What it keeps: on a chain at least the token rule's (the block rule's argument above); on trees Weng et al. report
// 2.2-5.7% longer acceptance than the token rule's tree verification, and speculant.analysis computes both exactly
// on small trees (traversal_expected_tokens, token_tree_expected_tokens).
//
// What a tree keeps in expectation on its drafts (expected_kept below; Verdict::kept_in_expectation). Given the
// drafted tokens, with the coins integrated out, the kept path passes through node v with a chance each rule gives
// in closed form from one number per node, its `chance`. Token rule: c_v = child v's test chance given its earlier
// siblings' rejections (child_acceptance, with the law p_j and q_j the walk uses there); the coins are independent,
// so P(v kept) = P(parent kept) c_v prod_(s: earlier siblings of v) (1 - c_s). Traversal: c_v = v's weight r_v; by
// the lemma, v's subtree stops with chance r_v over its own drafts and coins, and it is visited when the subtrees
// before it in post-order, those of the earlier siblings of v and of each of its ancestors, did not stop, each with
// chance 1 - r_s over draws of its own: P(v kept) = r_v prod_(s before v) (1 - r_s). On a chain these are
// expected_kept's products and running ratios. Their sum over the nodes is an unbiased estimate of E[n] whose
// average over the drafter's draws is analysis' enumeration (tests/test_tree_expectations.py checks both rules on
// every sibling rule by exact enumeration of the drafts). At T = 0 each verdict is fixed by the drafts: its n.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "math/sampling.h"
#include "math/verdict.h"
#include "math/speculative.h"

namespace speculant {

// A tree of draft nodes. Node 0 is the root: the sequence's last token, already decided. Nodes 1 .. N are
// drafts in breadth-first order: parent[i] < i, parents nondecreasing, so the children of a node are
// contiguous, in the order they were drawn (their rank).
class Tree {
 public:
  // parent[0] = -1; the rest as above (ValueError otherwise).
  explicit Tree(std::vector<int64_t> parent);
  Tree() : Tree(std::vector<int64_t>{-1}) {}  // the root alone
  // Every node of depth i < d has shape[i] children (each >= 1): 1 + k1 + k1 k2 + ... nodes; [1] * gamma is
  // the chain of gamma drafts.
  static Tree from_shape(const std::vector<int64_t>& shape);

  int64_t size() const { return static_cast<int64_t>(parent_.size()); }  // N + 1, the root included
  int64_t parent(int64_t node) const { return parent_[node]; }
  int64_t depth(int64_t node) const { return depth_[node]; }
  int64_t depth() const { return depth_.back(); }  // the deepest node's
  int64_t first_child(int64_t node) const { return first_child_[node]; }
  int64_t children(int64_t node) const { return children_[node]; }
  int64_t rank(int64_t node) const { return node - first_child_[parent_[node]]; }
  int64_t max_children() const;
  bool chain() const { return max_children() <= 1; }
  const std::vector<int64_t>& parents() const { return parent_; }
  // The nodes in post-order: each child's subtree in rank order, then the node (the root last).
  std::vector<int64_t> post_order() const;

 private:
  std::vector<int64_t> parent_, depth_, first_child_, children_;
};

// How the children of a node were drawn from the draft's q at that node (and, for coupled, how they are verified).
enum class Siblings { with_replacement, without_replacement, top, coupled };
// Whether a node's children are independent draws of q (with replacement, coupled).
inline bool independent_draws(Siblings siblings) {
  return siblings == Siblings::with_replacement || siblings == Siblings::coupled;
}

// The coupled rule's coin (above) for a child of ratio r = p_j(x) / q_j(x), given whether the next child lies in
// H_j, whose q mass is w.
inline double coupled_coin(double r, bool next_in_h, double w) {
  if (next_in_h) return w > 0 ? std::clamp((r - (1.0 - w)) / w, 0.0, 1.0) : 1.0;
  return w < 1 ? std::min(1.0, r / (1.0 - w)) : 1.0;
}

// A child's weight in traversal verification (above): min(1, W_j(x) / q_j(x)), where q_j(x) = 0 the first child's 1
// and a later one's 0 (a filler its law could not have drawn), 0 where W_j(x) is 0 (or NaN).
inline double child_weight(double w_x, double q_x, bool first) {
  if (!(w_x > 0)) return 0.0;
  if (!(q_x > 0)) return first ? 1.0 : 0.0;
  return std::min(1.0, w_x / q_x);
}

// Child j's test at a node (above), in its two forms: the host's (cpu_kernels.cpp) and the tensors' (the tensor path,
// tree_verification.cpp). min(1, p_j(x) / (l q_j(x))) with A.5's lenience l (1 but for chains), or the coupled coin
// where it looks ahead (coupled, a child after it: whether that child lies in H_j, whose mass under its law is w).
// The first child's test is Algorithm 1's (acceptance(): 1 where q(x) = 0 < p(x)); a later child q_j could not have
// drawn (a filler of draw_children) is never kept.
inline double child_acceptance(double p_x, double q_x, double lenience, bool first, bool look_ahead, bool next_in_h,
                               double w) {
  if (!first && !(q_x > 0)) return 0.0;
  const double ratio = acceptance_ratio(p_x, q_x, lenience);
  return look_ahead ? coupled_coin(ratio, next_in_h, w) : std::min(1.0, ratio);
}
// Child j's test at n nodes at once, the tensors' form (tree_verification.cpp), as the event that its coin u falls
// below child_acceptance: p_x, q_x [n, 1] its token's probabilities, u [n, 1] its coin (uniform in [0, 1), times l
// where lenience applies), written into kept (bool [n, 1]). u < min(1, p / (l q)) is u l q < p, which is 0 < p where
// q = 0 (the first child's 1) and false where p is 0 or NaN; a later child also needs q > 0. The coupled coin's two
// cases, for the first n' rows where next_in_h and w ([n', 1]) are given: (u w + 1 - w) q < p with the next child in
// H_j, u (1 - w) q < p without (the coin's clamps hold: u < 1; and w > 0 where the next child lies in H_j, w < 1 where
// it does not, since it was drawn with positive mass; where rounding makes w exactly 1 outside H_j this keeps only
// a child of p > 0, where the host's coin of 1 keeps any).
void child_tests(const at::Tensor& p_x, const at::Tensor& q_x, const at::Tensor& u, bool first,
                 const at::Tensor& next_in_h, const at::Tensor& w, at::Tensor& kept);

// The children of n nodes at once, counts[i] of them for node i, from q [n, V] (row i: node i's standardized
// row; greedy: its raw scores): for each node, counts[i] independent draws (with replacement, coupled), or draws
// without replacement (each from q without the tokens drawn before it, renormalized; once q's support is used up,
// the remaining children are arbitrary tokens, which verify_tree never accepts), or (top) q's counts[i] - 1 most
// probable tokens, the first index on ties, then one draw from q without them; greedy: the counts[i] most probable
// tokens, the first index on ties. Returns int64 [sum counts] on q's device, node 0's children first. The rows come
// in consecutive groups (a batch's rows' nodes), each drawing from its own generator the uniforms it would draw
// alone, so that a group's children do not depend on the others. CPU rows are drawn by cpu::draw_children, row
// after row.
struct DrawGroup {
  at::Generator* generator = nullptr;
  int64_t rows = 0;  // its rows of q, after the previous groups'
};
// `mass` (the tensor path of sampled draws only; left undefined elsewhere): each row's total mass [n, 1], float64,
// which is finite exactly when q's row is (a finiteness witness of the draft's logits, as sample_inverse_cdf_scaled's).
// `sibling_q` (may be undefined; independent draws or greedy only): [n, V], each node's children 1 .. k - 1 drawn from
// its row instead of q's (greedy: its raw scores, whose top k - 1 they are); the uniforms are the same either way.
at::Tensor draw_children(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings, bool greedy,
                         const std::vector<DrawGroup>& groups, at::Tensor* mass = nullptr,
                         const at::Tensor& sibling_q = at::Tensor());
// The tensor path of the sampled (not greedy) draws, which accelerators run: the draws of every row of every group
// in a few operations, not per node.
at::Tensor draw_children_as_tensors(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings,
                                 const std::vector<DrawGroup>& groups, at::Tensor* mass = nullptr,
                                 const at::Tensor& sibling_q = at::Tensor());
// draw_children_as_tensors in two parts, so that the draws can run inside a model call's CUDA graph (fused_draws.h):
// the uniforms the draws take from the groups' generators, in the order they take them, as one float64 table [n, width]
// on `device` (width: the widest count, or 1 for top), then the draws from them (top: every count the same).
at::Tensor children_uniforms(const std::vector<int64_t>& counts, Siblings siblings,
                             const std::vector<DrawGroup>& groups, const at::Device& device);
at::Tensor draw_children_with(const at::Tensor& q, const std::vector<int64_t>& counts, Siblings siblings,
                              const at::Tensor& uniforms, at::Tensor* mass = nullptr,
                              const at::Tensor& sibling_q = at::Tensor());
// Each row's k most probable tokens, the first index on ties: int64 [..., k].
at::Tensor top_tokens(const at::Tensor& q, int64_t k);


// One row's tree and what its verification needs. target_logits [N + 1, V]: row i is the target after node i.
// q [N + 1, V]: row i is the draft's standardized distribution at node i, which node i's children were drawn from
// (rows of leaves are not read). tokens int64 [N + 1]: node i's token (the root's is not read). draft_maxima (may
// be undefined): the draft's raw row maxima, checked for NaN / +inf; draft_finite: those already checked on the
// host. The row's coins come from *coins and its correction t from *correction, two streams (streams.h). sibling_q
// (may be undefined) [N + 1, V]: row i the law node i's children 1 .. k - 1 were drawn from (a sibling draft's, above).
//
// A chain (the tree [1] * N) may come in its own form, as Algorithm 1 has it: q [N, V] and tokens [N], the drafts
// x_1 .. x_N (node i's q row is q's row i, node i's token tokens[i - 1]); its verdict then lists them in `drafted`.
// Only chains in that form take A.5's lenience (its bound is proven for one draft per position).
struct TreeInput {
  const Tree* tree = nullptr;
  at::Tensor target_logits, q, tokens, draft_maxima;
  at::Generator* coins = nullptr;       // the coins' stream (streams.h)
  at::Generator* correction = nullptr;  // t's, another generator
  at::Tensor sibling_q;
  bool draft_finite = true;

  bool chain_form() const { return tree->chain() && tokens.defined() && tokens.size(0) == tree->size() - 1; }
};

// The drafts a tree's rule keeps in expectation given each node's chance (above; chances[0], the root's, is not
// read): the token rule's or, with `block`, traversal's.
double expected_kept(const Tree& tree, const std::vector<double>& chances, bool block);

// ValueError unless the row's tensors are shaped as above for its tree, lenience is 1 (but for chain-form rows), a
// sibling law comes with independent draws, and the coins and the correction have two generators.
void check_tree_input(const TreeInput& row, const SamplingConfig& config, Siblings siblings);

// Every row's tree, chains included. CPU tensors go to the host walk row by row (cpu::verify_tree, cpu::verify for
// chain-form rows), which evaluates only the nodes on the walk. On accelerators (verify_drafts_as_tensors,
// tree_verification.cpp) every internal node of every row runs its steps as tensors at once (the residuals p_j and the
// children's laws q_j over the vocabulary, each child's coin and test, every node's candidate t drawn from its last
// row), with one device -> host read for the batch: which children the tests kept, the candidates, the betas and the
// finiteness witnesses. The host walks down each tree by the first child kept at each node (the same law, other draws
// than the host kernel's). A row gets the verdict it gets alone: its generator gives the same draws in the same order.
//
// With `graphs` the accelerators' path runs its device work (everything between the inputs, joined, and the one
// packed read-back) through fixed-shape buffers keyed by the rows' trees and the settings (verification_graphs.h):
// captured as a CUDA graph (one launch where a batch of [2, 1, 1] trees launches some fifty operations), or only run
// through the buffers. The uniforms are drawn outside, from each row's generator as without graphs: the same
// verdicts.
class VerificationGraphs;  // verification_graphs.h

std::vector<Verdict> verify_drafts(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                      Siblings siblings, VerificationGraphs* graphs = nullptr);
std::vector<Verdict> verify_drafts_as_tensors(const std::vector<TreeInput>& rows, const SamplingConfig& config,
                                              Siblings siblings, VerificationGraphs* graphs = nullptr);

}  // namespace speculant
