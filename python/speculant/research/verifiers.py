"""Each exact verifier's expected tokens per target call, computed exactly, and the optimum for one chain.

The laws are per-position and context-free: p[d] is the target's law of the token after a node of depth d, the
same whatever was drafted, and q[d] is the draft's law there (d = 0 is the last decided token). With equal rows
this is the i.i.d. setting of Equation (1). Each function takes numpy or torch arrays of probabilities and works
in float64. Each row must be nonnegative and sum to 1 within 1e-5 (a float32 softmax's rounding), and is
renormalized in float64. A bad input raises ValueError naming the parameter.

* ``token_expected_tokens``: Algorithm 1 on a chain, in closed form.
* ``block_expected_tokens``: block verification of a chain (Sun et al., ICLR 2025), by a dynamic program over
  the values of its running ratio. ``chain_optimum`` is its value.
* ``traversal_expected_tokens``: traversal verification of a token tree (Weng et al., NeurIPS 2025), by exact
  enumeration.
* ``token_tree_expected_tokens``: recursive rejection sampling of the same tree (cpp/math/tree.h), by the same
  enumeration.

Nothing is sampled, so the results are exact up to float rounding. The enumerations are for small vocabularies
and trees: V <= 6 and at most 7 nodes take well under a second.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Tuple, Union

import numpy as np
import torch

from ..decoding.trees import Tree, TreeLike, tree_parents

LawsLike = Union[np.ndarray, torch.Tensor]

SIBLINGS = ("with_replacement", "without_replacement")


def _laws(value: LawsLike, name: str, rows=None, vocab=None) -> np.ndarray:
    """One law per row as float64 [rows, vocab], else ValueError naming the parameter."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu", torch.float64).numpy()
    try:
        laws = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of probabilities, got {type(value).__name__}") from None
    if laws.ndim != 2 or laws.shape[1] == 0:
        raise ValueError(f"{name} must be 2-D [positions, vocab] with vocab >= 1, got shape {list(laws.shape)}")
    if rows is not None and laws.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {list(laws.shape)}")
    if vocab is not None and laws.shape[1] != vocab:
        raise ValueError(f"{name} must have p's vocab of {vocab} columns, got shape {list(laws.shape)}")
    if not np.all(np.isfinite(laws)) or np.any(laws < 0.0):
        raise ValueError(f"{name} must hold finite probabilities >= 0")
    sums = laws.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-5)
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}] sums to {float(sums[bad[0]])!r}, not 1: each row must be a law")
    return laws / sums[:, None]


def _chain(p: LawsLike, q: LawsLike) -> Tuple[np.ndarray, np.ndarray]:
    """The validated laws of a chain: p [g + 1, V], q [g, V]."""
    p = _laws(p, "p")
    return p, _laws(q, "q", rows=p.shape[0] - 1, vocab=p.shape[1])


def token_expected_tokens(p: LawsLike, q: LawsLike) -> float:
    """Algorithm 1 on a chain of g drafts: E[tokens per target call] = 1 + sum_(i=1..g) prod_(j<=i) beta_j.

    beta_j = sum_x min(p_j(x), q_j(x)) is the acceptance rate at position j (Definition 3.1). p is [g + 1, V],
    the target's law at positions 1 .. g + 1. q is [g, V], the draft's at positions 1 .. g. p's last row is
    only validated. With equal rows this is Equation (1)."""
    p, q = _chain(p, q)
    betas = np.minimum(p[:-1], q).sum(axis=1)
    return float(1.0 + np.cumprod(betas).sum())


def _ratio_law(p_row: np.ndarray, q_row: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The law of p(x) / q(x) for x ~ q: its distinct values and their probabilities."""
    drawn = q_row > 0.0
    values, where = np.unique(p_row[drawn] / q_row[drawn], return_inverse=True)
    return values, np.bincount(where, weights=q_row[drawn], minlength=values.size)


def block_expected_tokens(p: LawsLike, q: LawsLike, return_ratios: bool = False):
    """Block verification of a chain of g drafts (Sun et al., ICLR 2025): E[tokens per target call].

    The running ratio is r_0 = 1 and r_i = min(1, r_(i-1) p_i(x_i) / q_i(x_i)), with x_i ~ q_i drawn
    independently. The block proof gives P(tau >= i) = E[r_i], so E = 1 + sum_(i=1..g) E[r_i]. E[r_i] is
    computed exactly by a dynamic program over the distinct values of r, merging equal values (r = 1 and r = 0
    merge most). The cost is the number of distinct values, at most the product of the rows' distinct ratios.
    p and q are shaped as in ``token_expected_tokens``. Returns a float, or (E, [E[r_1], ..., E[r_g]]) with
    return_ratios=True."""
    p, q = _chain(p, q)
    values, chances = np.ones(1), np.ones(1)  # the law of r_0
    means: List[float] = []
    for i in range(q.shape[0]):
        ratios, weights = _ratio_law(p[i], q[i])
        step = np.minimum(1.0, values[:, None] * ratios[None, :]).ravel()
        values, where = np.unique(step, return_inverse=True)
        chances = np.bincount(where, weights=(chances[:, None] * weights[None, :]).ravel(), minlength=values.size)
        means.append(float(values @ chances))
    expected = 1.0 + sum(means)
    return (expected, means) if return_ratios else expected


def chain_optimum(p: LawsLike, q: LawsLike) -> float:
    """The most expected tokens per target call that any valid verifier of one draft chain reaches.

    Sun et al. (ICLR 2025) prove block verification optimal among valid verifiers of one chain, so this is
    ``block_expected_tokens(p, q)``."""
    return block_expected_tokens(p, q)


def _siblings(siblings, rule: str) -> bool:
    """Whether siblings are drawn with replacement, else ValueError naming siblings."""
    if not isinstance(siblings, str) or siblings not in SIBLINGS:
        raise ValueError(f"{rule} takes siblings 'with_replacement' or 'without_replacement', got {siblings!r}")
    return siblings == "with_replacement"


def _without(q_row: np.ndarray, used: FrozenSet[int]) -> np.ndarray:
    """q without the earlier siblings' tokens, renormalized; all zero once q's support is used up."""
    law = q_row.copy()
    law[list(used)] = 0.0
    total = law.sum()
    return law / total if total > 0.0 else np.zeros_like(law)


def _kept_chance(measure: float, law: float, first: bool) -> float:
    """A child's weight min(1, W(x) / q(x)), with the rule's values where q(x) = 0 or W(x) = 0."""
    if measure <= 0.0:
        return 0.0
    if law <= 0.0:
        return 1.0 if first else 0.0
    return min(1.0, measure / law)


class _TreeWalk:
    """The exact enumeration behind ``traversal_expected_tokens`` and ``token_tree_expected_tokens``.

    fresh=False is traversal: a node of weight r starts from the measure r p. fresh=True is recursive rejection
    sampling: an accepted child starts again from p, so its value is r times its value at r = 1."""

    def __init__(self, tree: TreeLike, p: LawsLike, q: LawsLike, siblings, fresh: bool, rule: str):
        self.replace = _siblings(siblings, rule)
        t = Tree(tree_parents(tree))
        self.children: List[List[int]] = [[] for _ in t.parents]
        for node in range(1, len(t.parents)):
            self.children[t.parents[node]].append(node)
        self.depth = t.node_depth
        self.p = _laws(p, "p", rows=t.depth + 1)
        self.q = _laws(q, "q", rows=t.depth, vocab=self.p.shape[1])
        self.fresh = fresh
        self.memo: Dict[Tuple[int, float], float] = {}

    def expected_tokens(self) -> float:
        """1 + G(root): the root has weight 1, and the target's own token is always kept."""
        return float(1.0 + self.value(0, 1.0))

    def value(self, node: int, r: float) -> float:
        """G(node) for a node of weight r: the expected drafts kept below it, averaged over its subtree's tokens."""
        if r <= 0.0 or not self.children[node]:
            return 0.0
        if self.fresh and r != 1.0:
            return r * self.value(node, 1.0)
        key = (node, r)
        if key not in self.memo:
            depth = self.depth[node]
            self.memo[key] = self.stages(self.children[node], depth, r * self.p[depth], frozenset(), True)
        return self.memo[key]

    def stages(self, kids: List[int], depth: int, measure: np.ndarray, used: FrozenSet[int], first: bool) -> float:
        """sum_(j >= this stage) prod_(i<j) (1 - r_(c_i)) (r_(c_j) + G(c_j)), given W_j and the earlier tokens."""
        law = self.q[depth] if self.replace else _without(self.q[depth], used)
        later = self.next_measure(measure, law, depth)
        child, rest = kids[0], kids[1:]
        if not law.any():  # a filler: its law is all zero, and it is never accepted
            return self.stages(rest, depth, later, used, False) if rest else 0.0
        total, passed = 0.0, 0.0
        for x in np.flatnonzero(law):
            r = _kept_chance(measure[x], law[x], first)
            total += law[x] * (r + self.value(child, r))
            if not rest or r >= 1.0:
                continue
            if self.replace:  # W_(j+1) and q_(j+1) do not depend on x_j: the later stages once
                passed += law[x] * (1.0 - r)
            else:
                total += law[x] * (1.0 - r) * self.stages(rest, depth, later, used | {int(x)}, False)
        if passed > 0.0:
            total += passed * self.stages(rest, depth, later, used, False)
        return total

    def next_measure(self, measure: np.ndarray, law: np.ndarray, depth: int) -> np.ndarray:
        """W_(j+1) = max(W_j - q_j, 0) / (1 - m_j) (traversal) or norm(max(p_j - q_j, 0)) (rejection sampling)."""
        left = np.maximum(measure - law, 0.0)
        if self.fresh:
            total = left.sum()
            return left / total if total > 0.0 else measure
        rest = 1.0 - np.minimum(measure, law).sum()
        return left / rest if rest > 0.0 else self.p[depth]


def traversal_expected_tokens(tree: TreeLike, p: LawsLike, q: LawsLike, siblings: str = "with_replacement") -> float:
    """Traversal verification of a token tree (Weng et al., NeurIPS 2025): E[tokens per target call], exactly.

    tree is a shape [k1, ..., kd] or breadth-first parents (``tree_parents``). p is [d + 1, V]: row i is the
    target's law of a depth-i node's children's tokens. q is [d, V], the draft's. siblings is "with_replacement"
    (a node's children are i.i.d. draws of q_i) or "without_replacement" (each later sibling is drawn from q_i
    without the earlier siblings' tokens, renormalized; once q's support is used up the rest are fillers).

    The rule. Node v has a weight r_v and a measure W over its children's tokens: the root has r = 1, and
    W_1 = r_v p. At stage j, child c_j's token x_j was drawn from q_j. Its weight is r = min(1, W_j(x_j) /
    q_j(x_j)), with m_j = sum_x min(W_j(x), q_j(x)) and W_(j+1) = max(W_j - q_j, 0) / (1 - m_j). A child's own
    measure starts at r_c p. The stopping chance of v is the mass of W_(k+1), and r_v at a leaf. The verifier
    visits nodes in post-order and keeps the path to the first node whose coin falls under its stopping chance.
    Given the drafts, the output passes through a reached child c with probability r_c, and subtrees' coins are
    independent. So G(v) = sum_j prod_(i<j) (1 - r_(c_i)) (r_(c_j) + G(c_j)), averaged over the children's tokens,
    and E = 1 + E[G(root)].

    A chain [1] * g gives ``block_expected_tokens``. For a node-level ceiling, ``multi_draft_bound`` gives the
    most that any exact verification of k i.i.d. drafts can accept at one node."""
    return _TreeWalk(tree, p, q, siblings, False, "traversal verification").expected_tokens()


def token_tree_expected_tokens(tree: TreeLike, p: LawsLike, q: LawsLike,
                               siblings: str = "with_replacement") -> float:
    """Recursive rejection sampling of a token tree (cpp/math/tree.h): E[tokens per target call], by enumeration.

    The tree, laws and siblings are as in ``traversal_expected_tokens``. At a node with target law p_1 = p,
    child j is accepted with a_j = min(1, p_j(x_j) / q_j(x_j)). On a rejection p_(j+1) = norm(max(p_j - q_j, 0)).
    An accepted child starts again from its depth's p. So K(v) = sum_j prod_(i<j) (1 - a_i) a_j (1 + K(c_j)),
    averaged over the children's tokens, and E = 1 + E[K(root)]. A chain gives ``token_expected_tokens``."""
    return _TreeWalk(tree, p, q, siblings, True, "token tree verification").expected_tokens()
