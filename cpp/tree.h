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
// Greedy (temperature 0): children are the draft's top-k tokens, and the first child equal to the target's
// argmax is accepted (the longest path of argmax agreement); t is the argmax.
// Lenience (A.5) is not defined for trees here: its bound is proven for one draft per position.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "sampling.h"

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

 private:
  std::vector<int64_t> parent_, depth_, first_child_, children_;
};

// How the children of a node were drawn from the draft's q at that node.
enum class Siblings { with_replacement, without_replacement, top };

// k children of one node from q [V] (a standardized row): k independent draws, or k draws without replacement
// (each from q without the tokens drawn before it, renormalized; once q's support is used up, the remaining
// children are arbitrary tokens, which verify_tree never accepts), or (top) q's k - 1 most probable tokens, the
// first index on ties, then one draw from q without them; greedy: the k most probable tokens, the first index on
// ties. Returns int64 [k] on q's device. CPU rows are drawn by cpu::draw_children.
at::Tensor draw_children(const at::Tensor& q, int64_t k, Siblings siblings, bool greedy, at::Generator& generator);
// q's k most probable tokens, the first index on ties: int64 [k].
at::Tensor top_tokens(const at::Tensor& q, int64_t k);
// The tensor path of the sampled (not greedy) draws, which accelerators run.
at::Tensor draw_children_generic(const at::Tensor& q, int64_t k, Siblings siblings, at::Generator& generator);

struct TreeVerdict {
  std::vector<int64_t> path;  // the accepted nodes, root excluded, by depth
  std::vector<int64_t> path_tokens;
  at::Tensor token;           // int64 [1] on the device: t, after the last accepted node
  int64_t host_token = 0;
  // For each node on the path, the root included, the rank of the child accepted there (-1: none, or a leaf).
  std::vector<int64_t> accepted_rank;
  std::vector<double> betas;  // sum_x min(p, q) at each internal node on the path (Theorem 3.5's beta)
  bool finite = true;         // every target row (and draft row given) had finite logits
};

// One row's tree. target_logits [N + 1, V]: row i is the target after node i. q [N + 1, V]: row i is the
// draft's standardized distribution at node i, which node i's children were drawn from (rows of leaves are
// not read). tokens int64 [N + 1]: node i's token (the root's is not read). Lenience must be 1.
// draft_maxima (may be undefined): the draft's raw row maxima, checked for NaN / +inf.
// On accelerators (verify_tree_generic) every node's acceptance tests and every candidate t are computed as
// tensors, with one device -> host read, and the walk down the tree is done on the host from that read. CPU
// tensors go to cpu::verify_tree, which evaluates only the nodes on the walk (the same law, other draws).
TreeVerdict verify_tree(const Tree& tree, const at::Tensor& target_logits, const at::Tensor& q,
                        const at::Tensor& tokens, const SamplingConfig& config, Siblings siblings,
                        at::Generator& generator, const at::Tensor& draft_maxima = at::Tensor());
TreeVerdict verify_tree_generic(const Tree& tree, const at::Tensor& target_logits, const at::Tensor& q,
                                const at::Tensor& tokens, const SamplingConfig& config, Siblings siblings,
                                at::Generator& generator, const at::Tensor& draft_maxima = at::Tensor());

}  // namespace speculant
