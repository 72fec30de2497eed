"""The paper's analysis (Leviathan, Kalman & Matias 2023, §3 and A.5).

p is the target M_p's distribution, q the draft M_q's; beta: acceptance rate at one prefix (Definition 3.1);
alpha = E[beta] (Corollary 3.6); gamma: draft length; c: cost coefficient (draft call time / target call time,
Definition 3.7); c_hat: the same ratio for arithmetic operations (Definition 3.10); l: lenience (A.5).

The formulas of §3 take scalars or numpy arrays (broadcast together; an array in gives an array out, scalars
give a Python float) and raise ValueError naming the parameter for out-of-range input. ``estimate_alpha`` is the
one function here that runs models.

Token trees (several drafts per position, cpp/math/tree.h) come last: the expected tokens and walltime improvement of a
tree under positional acceptance (Sequoia, Chen et al. 2024), the best tree for a budget of drafts, and the
acceptance table from verification counts. They take one tree and one acceptance model, not arrays.

Exact verifiers from per-position laws (verifiers.py, re-exported here): the expected tokens per target call of
token, block, traversal and token-tree verification, and ``chain_optimum``.
"""

from __future__ import annotations

import collections
import math
import numbers
from fractions import Fraction
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..decoding.decoder import SpeculativeDecoder
from ..decoding.sampling import beta  # Theorem 3.5's beta, public here too (speculant.analysis.beta)
# The tree basics live in trees.py (the decoder takes trees too); they stay public here.
from ..decoding.trees import (MAX_TREE_NODES, Tree, TreeChoice, TreeLike, TreeSpeedup, tree_depth, tree_draft_calls,
                    tree_parents, tree_size)
# Each exact verifier's expected tokens from per-position laws live in verifiers.py; they stay public here.
from .verifiers import (block_expected_tokens, chain_optimum, token_expected_tokens, token_tree_expected_tokens,
                        traversal_expected_tokens)

ArrayLike = Union[float, Sequence[float], np.ndarray]


def _out(value: np.ndarray):
    """A 0-d result as a Python scalar, anything else as the array."""
    return value.item() if value.ndim == 0 else value


def _alpha(alpha: ArrayLike) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all((a >= 0.0) & (a <= 1.0)):  # also rejects NaN
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return a


def _gamma(gamma: ArrayLike, minimum: int = 0) -> np.ndarray:
    g = np.asarray(gamma)
    if g.dtype == bool or not np.issubdtype(g.dtype, np.number) or not np.all(np.isfinite(g)) \
            or not np.all(g == np.round(g)) or not np.all(g >= minimum):
        raise ValueError(f"gamma must be an integer >= {minimum}, got {gamma}")
    return g.astype(np.int64)


def _cost(c: ArrayLike, name: str = "c") -> np.ndarray:
    value = np.asarray(c, dtype=np.float64)
    if not np.all(value >= 0.0):  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {c}")
    return value


# --------------------------------------------------------------------------------------------------
# §3.2: the acceptance rate of one pair of distributions
# --------------------------------------------------------------------------------------------------


def lk_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Definition 3.2 / Lemma 3.3: D_LK(p, q) = sum_x |p(x) - M(x)| = 1 - sum_x min(p(x), q(x)), over the last
    dimension (M = (p + q) / 2). Symmetric, in [0, 1] (Corollary 3.4): 0 iff p = q, 1 iff disjoint supports."""
    return 1.0 - beta(p, q)


def multi_draft_bound(p: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """The most that any exact verification of k drafts drawn i.i.d. from q can accept at one node whose target
    law is p: the largest P(Y in C) over couplings of Y ~ p with the drafts C (the output law must stay p).
    Over the last dimension, any leading shape; k = 1 gives beta (Theorem 3.5).

    By the max-flow min-cut duality of such couplings (Strassen), the largest P(Y in C) is
    1 - max_S [p(S) - P(C meets S)], with P(C meets S) = 1 - (1 - q(S))^k for i.i.d. drafts. The maximum is
    reached at a set {x : p(x) / q(x) >= t}: for a fixed q(S) the largest p(S) is at most the fractional
    knapsack's, a concave piecewise-linear function of q(S) whose corners are those sets, and adding the convex
    (1 - q(S))^k leaves each piece's maximum at a corner. So the bound is exact and costs one sort.

    What it is for: the distance from a verifier to the best possible one. Recursive rejection sampling
    (cpp/math/tree.h) with siblings drawn with replacement is one such coupling, so it accepts at most this, and
    less where the draft is close to the target in law (tests/test_tree.py enumerates it); an optimal
    transport plan per node (SpecTr's formulation, solved exactly) reaches it. Children drawn without
    replacement are not i.i.d.: the bound does not cover them (they may accept more)."""
    k = _count(k, "k", 1)
    p, q = torch.broadcast_tensors(torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64))
    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), torch.where(p > 0, math.inf, 0.0))
    order = ratio.argsort(-1, descending=True)
    p_sets, q_sets = p.gather(-1, order).cumsum(-1), q.gather(-1, order).cumsum(-1)  # the sets {p / q >= t}
    uncovered = p_sets - 1.0 + (1.0 - q_sets).clamp(0.0, 1.0) ** k  # p(S) - P(C meets S)
    return 1.0 - uncovered.clamp_min(0.0).amax(-1)  # the empty set: 0


def second_child_bound(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The most that any exact verification of two drafts Y1, Y2 drawn i.i.d. from q can accept the second with
    (P(output = Y2 != Y1)) while the first keeps Algorithm 1's chance beta = sum min(p, q), the most it can have;
    attained (the linear program's optimum, tests/test_tree.py). Over the last dimension, any leading shape.

    Why: P(output = Y1) = beta forces P(output = Y1 | Y1 = a) = min(1, p(a) / q(a)) for every a, so whenever Y1
    is a token of p(a) >= q(a) the output is Y1, whatever Y2 is. The rejections are the rest: a token a of
    p(a) < q(a) drawn first is rejected with total probability s(a) = q(a) - p(a), spread over the second draws
    as the verifier likes, at most q(a) q(b) where Y2 = b; and the output can be Y2 = b only for b of
    p(b) > q(b), at most d(b) = p(b) - q(b) in all (the rest of b's mass went to Y1 = b). So the answer is the
    largest flow from the a's (supplies s) to the b's (demands d) through cells of capacity q(a) q(b), and the
    rejections it leaves unused fall on useless Y2 (each a has q(a) >= s(a) of cells in all). By max-flow
    min-cut it is the least over sets C of b's of
        sum_(a: p(a) < q(a)) q(a) min(1 - p(a) / q(a), q(C)) + sum_(b not in C) d(b)
    (a cut with C on the sink's side keeps a on the source's side, A, when s(a) exceeds q(a) q(C), and for a
    given A puts b in C when d(b) >= q(b) q(A)), so the best C is a set {b : p(b) / q(b) >= t}: one sort, then
    every such set at once.

    A tree wants its first child to keep beta (that child gets the deepest subtree), so this is the ceiling on
    what a second sibling can add there; siblings="coupled" (cpp/math/tree.h) is a rule under it (its coins depend
    on Y2 only through whether Y2 is a b), rejection sampling with independent coins another."""
    p, q = torch.broadcast_tensors(torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64))
    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), torch.where(p > 0, math.inf, 1.0))
    supply, order = torch.where(p < q, 1.0 - ratio, 0.0).sort(-1)  # s(a) / q(a), ascending
    q_supply = q.gather(-1, order) * (supply > 0)
    zero = torch.zeros_like(q[..., :1])
    mass_q = torch.cat([zero, q_supply.cumsum(-1)], -1)  # over the first i budgets
    mass_s = torch.cat([zero, (q_supply * supply).cumsum(-1)], -1)
    by_ratio = torch.where(p > q, ratio, -1.0).argsort(-1, descending=True)  # the b's, largest p / q first
    q_need = (q * (p > q)).gather(-1, by_ratio)
    need = (p - q).clamp_min(0.0).gather(-1, by_ratio)
    covered = torch.cat([zero, q_need.cumsum(-1)], -1)  # q(C) for C = each prefix, the empty one first
    outside = need.sum(-1, keepdim=True) - torch.cat([zero, need.cumsum(-1)], -1)  # sum of d outside C
    below = torch.searchsorted(supply.contiguous(), covered.contiguous(), right=True)  # budgets <= q(C)
    spent = mass_s.gather(-1, below) + covered * (mass_q[..., -1:] - mass_q.gather(-1, below))
    return (spent + outside).amin(-1)


# --------------------------------------------------------------------------------------------------
# §3.1, §3.3 - §3.5: tokens, walltime, operations, the choice of gamma
# --------------------------------------------------------------------------------------------------


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike):
    """Equation (1): E[# tokens per run of Algorithm 1] = (1 - alpha^(gamma+1)) / (1 - alpha), and gamma + 1 at
    alpha = 1 (a capped geometric variable, assuming i.i.d. betas)."""
    a, g = _alpha(alpha), _gamma(gamma)
    denominator = np.where(a == 1.0, 1.0, 1.0 - a)
    return _out(np.where(a == 1.0, g + 1.0, (1.0 - a ** (g + 1)) / denominator))


def walltime_improvement(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike):
    """Theorem 3.8: the expected walltime improvement factor (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)),
    assuming the gamma + 1 parallel target evaluations take the time of one and long enough generations."""
    g = _gamma(gamma)
    return _out(np.asarray(expected_tokens(alpha, g)) / (g * _cost(c) + 1.0))


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike):
    """Theorem 3.11: the expected factor of increase in arithmetic operations,
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))."""
    g = _gamma(gamma)
    return _out((g * _cost(c_hat, "c_hat") + g + 1.0) / np.asarray(expected_tokens(alpha, g)))


def optimal_gamma(alpha: ArrayLike, c: ArrayLike, max_gamma: int = 64):
    """§3.5 (Figure 3): the integer gamma in [1, max_gamma] that maximizes Theorem 3.8, the smallest on ties."""
    a, cost = np.broadcast_arrays(_alpha(alpha), _cost(c))
    gammas = np.arange(1, int(_gamma(max_gamma, minimum=1)) + 1)  # [G]
    improvement = np.asarray(walltime_improvement(a[..., None], gammas, cost[..., None]))  # [..., G]
    return _out(gammas[np.argmax(improvement, axis=-1)])


def oracle_improvement(alpha: ArrayLike, c: ArrayLike):
    """§3.5's oracle bound: with an oracle choosing gamma per iteration, Algorithm 1 yields 1 / (1 - alpha) tokens
    per target call for c * alpha / (1 - alpha) draft calls, an improvement of 1 / (1 - alpha + c alpha)
    (inf at alpha = 1, c = 0)."""
    a, cost = _alpha(alpha), _cost(c)
    denominator = 1.0 - a + cost * a
    return _out(np.where(denominator > 0, 1.0 / np.where(denominator > 0, denominator, 1.0), np.inf))


def improves(alpha: ArrayLike, c: ArrayLike):
    """Corollary 3.9: some gamma improves the walltime iff alpha > c."""
    return _out(_alpha(alpha) > _cost(c))


def minimum_improvement(alpha: ArrayLike, c: ArrayLike):
    """Corollary 3.9: when alpha > c, gamma = 1 already gives (1 + alpha) / (1 + c)."""
    a, cost = _alpha(alpha), _cost(c)
    if not np.all(a > cost):
        raise ValueError(f"Corollary 3.9 needs alpha > c, got alpha={alpha}, c={c}")
    return _out((1.0 + a) / (1.0 + cost))


# --------------------------------------------------------------------------------------------------
# Corollary 3.6: alpha of a model pair, measured through the engine
# --------------------------------------------------------------------------------------------------


def generation_kwargs(prompts, generate_kwargs: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """The keyword arguments of one ``generate`` call per prompt.

    ``prompts`` is one prompt (token ids, or a 1-D tensor) or a sequence of prompts (a 2-D tensor is one per
    row). A prompt may also be a mapping of ``generate`` keyword arguments, for arguments that change with the
    prompt (an encoder-decoder's ``encoder_input_ids``, its ``prompt_ids`` defaulting to the decoder start).
    ``generate_kwargs`` are added to every call.
    """
    common = dict(generate_kwargs or {})
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2):
            raise ValueError(f"prompts as a tensor must be 1-D (one prompt) or 2-D (one per row), got shape "
                             f"{list(prompts.shape)}")
        prompts = [prompts] if prompts.dim() == 1 else list(prompts)
    elif isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be token ids or a sequence of prompts, got {type(prompts).__name__}")
    elif len(prompts) > 0 and isinstance(prompts[0], numbers.Integral):
        prompts = [prompts]
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt")
    calls = []
    for prompt in prompts:
        if isinstance(prompt, Mapping):
            calls.append({**common, **prompt})
        else:
            calls.append({**common, "prompt_ids": prompt})
    return calls


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # tensors and arrays of several values have no single truth
        return False


def batch_kwargs(calls: Sequence[Mapping[str, Any]]) -> Tuple[Dict[str, Any], bool]:
    """One ``generate`` call for consecutive prompts' calls (``generation_kwargs``) and whether it is a batch:
    their prompt_ids (and encoder_input_ids) as lists, every other argument the same in all of them."""
    if len(calls) == 1:
        return dict(calls[0]), False
    rowwise = ("prompt_ids", "encoder_input_ids")
    merged = {key: [call[key] for call in calls] for key in rowwise if key in calls[0]}
    for i, call in enumerate(calls):
        if set(call).intersection(rowwise) != set(merged):
            raise ValueError(f"prompts in one batch must all give {sorted(merged)}; prompt {i} of the batch gives "
                             f"{sorted(set(call).intersection(rowwise))}")
        shared = {k: v for k, v in call.items() if k not in rowwise}
        common = {k: v for k, v in calls[0].items() if k not in rowwise}
        if shared.keys() != common.keys() or not all(_same(shared[k], common[k]) for k in common):
            raise ValueError("prompts in one batch must share every generate argument besides prompt_ids and "
                             f"encoder_input_ids; prompt {i} of the batch differs: use batch_size=1")
    merged.update({k: v for k, v in calls[0].items() if k not in rowwise})
    return merged, True


def verified_positions(trace) -> int:
    """The draft positions Algorithm 1 decided on in a generation's trace: up to and including the first
    rejection of each iteration (the positions over which the engine averages beta, Corollary 3.6)."""
    return sum(min(it.accepted + 1, len(it.drafted)) for it in trace)


def estimate_alpha(target, draft, prompts, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   gamma: int = 4, max_new_tokens: int = 128, seed: int = 0,
                   generate_kwargs: Optional[Mapping[str, Any]] = None) -> float:
    """Corollary 3.6: alpha = E[beta] = E[sum_x min(p, q)] for a target / draft pair (speculant.Model) under
    one sampling configuration, estimated as the paper's §4.2 does, over sequences generated by the target.

    Runs exact speculative decoding (lenience 1) from each prompt (see ``generation_kwargs``; prompt i uses
    seed + i) and pools the engine's per-position beta = sum_x min(p, q) over every verified position (each
    generated token whose position had a draft: all but the bonus tokens). Because the engine's output follows
    the target's law, those prefixes are the target's own samples. The exact per-position beta (not the 0/1
    accept outcomes) is averaged, so the estimate has the variance of the prefixes only. gamma changes how
    many positions are verified, not what is averaged.
    """
    decoder = SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p)
    total, count = 0.0, 0
    for i, kwargs in enumerate(generation_kwargs(prompts, generate_kwargs)):
        result = decoder.generate(**kwargs, max_new_tokens=max_new_tokens, seed=seed + i)
        n = verified_positions(result.trace)
        if n:
            total += result.stats.alpha * n
            count += n
    if count == 0:
        raise ValueError("no position was verified: max_new_tokens must be >= 2 (or the prompts hit EOS at once)")
    return total / count


# --------------------------------------------------------------------------------------------------
# Token trees: several drafts per position, verified in one target call (cpp/math/tree.h)
# --------------------------------------------------------------------------------------------------
#
# The forms a tree is given in, and its size, depth and draft calls, are in trees.py.
#
# Acceptance (Sequoia's positional acceptance, Chen et al. 2024, arXiv:2402.12374, made depth-dependent here):
# acceptance[i][j] is the probability that verifying the children of a node of depth i ends by accepting its
# rank-j child. Verification tries the children in rank order (multi-draft speculative sampling, cpp/math/tree.h), so
# whether rank j is accepted does not depend on the siblings after it: a node with k children accepts rank j < k
# with probability acceptance[i][j] and rejects them all (then t is drawn from the residual) with probability
# 1 - sum_{j<k} acceptance[i][j]. The model assumes these laws depend on the depth and rank alone, not on the
# tokens of the path (as Equation (1) assumes i.i.d. betas). Three forms:
#   * a table, one row per depth (ragged rows allowed): acceptance[i][j];
#   * one sequence per rank, the same at every depth: acceptance[j];
#   * a scalar alpha, the independent-siblings model: every child's test accepts with probability alpha whatever
#     happened to its earlier siblings, so rank j is accepted with probability alpha (1 - alpha)^j at every depth.
#     For a chain this is Equation (1)'s alpha exactly; for wider trees it is an idealization (the residual after
#     a rejection is not the pair Algorithm 1 saw: at T = 0 with top-k children, rank j is accepted iff the
#     target's argmax is the draft's (j+1)-th token), so choose trees with a measured table
#     (``acceptance_from_counts``).
# Values may be floats or fractions.Fraction; with Fractions throughout, tree_expected_tokens computes exactly.

AcceptanceLike = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]


def _probability(value, name: str):
    """A probability as Fraction (kept exact) or float, else ValueError naming it."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")  # also rejects NaN
    return value if isinstance(value, Fraction) else float(value)


def _row(values, name: str) -> list:
    row = [_probability(v, f"{name}[{j}]") for j, v in enumerate(values)]
    if not row:
        raise ValueError(f"{name} is empty: give the probability of at least rank 0")
    if float(sum(row)) > 1.0 + 1e-9:
        raise ValueError(f"{name} sums to {float(sum(row))!r} > 1: its ranks are exclusive outcomes (verification "
                         f"accepts at most one child of a node)")
    return row


class _Acceptance:
    """A validated acceptance model: a table by depth, one row for every depth, or the independent-siblings alpha."""

    def __init__(self, acceptance: AcceptanceLike):
        value = acceptance.tolist() if isinstance(acceptance, np.ndarray) else acceptance
        self.rows: Optional[List[list]] = None  # by depth
        self.row: Optional[list] = None  # at every depth
        self.alpha = None  # independent siblings
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            self.alpha = _probability(value, "acceptance (a scalar alpha)")
            self.exact = isinstance(self.alpha, Fraction)
            return
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
            raise ValueError(f"acceptance must be a scalar alpha, a sequence by rank, or a table by depth and rank, "
                             f"got {acceptance!r}")
        nested = [isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, (str, bytes)) for v in value]
        if all(nested):
            self.rows = [_row(list(r), f"acceptance[{i}]") for i, r in enumerate(value)]
            self.exact = all(isinstance(v, Fraction) for r in self.rows for v in r)
        elif not any(nested):
            self.row = _row(value, "acceptance")
            self.exact = all(isinstance(v, Fraction) for v in self.row)
        else:
            raise ValueError("acceptance must be one sequence by rank or a table of rows by depth, not a mixture")

    def depths(self) -> Optional[int]:
        """How many depths the model covers (a tree of depth d needs d), None for all."""
        return None if self.rows is None else len(self.rows)

    def ranks(self, depth: int) -> Optional[int]:
        """How many ranks it gives at this depth, None for all."""
        if self.alpha is not None:
            return None
        return len(self.rows[depth] if self.rows is not None else self.row)

    def value(self, depth: int, rank: int):
        if self.alpha is not None:
            return self.alpha * (1 - self.alpha) ** rank
        return (self.rows[depth] if self.rows is not None else self.row)[rank]

    def floats(self, depth: int, most: int) -> np.ndarray:
        """The probabilities of ranks 0 .. min(ranks, most) - 1 at this depth, float64 [k]."""
        ranks = self.ranks(depth)
        k = most if ranks is None else min(ranks, most)
        return np.array([float(self.value(depth, j)) for j in range(k)], dtype=np.float64)

    def fits(self, tree: Tree) -> None:
        """ValueError unless the model gives every depth and rank the tree has."""
        depths = self.depths()
        if depths is not None and tree.depth > depths:
            raise ValueError(f"acceptance has rows for depths 0 .. {depths - 1}, but the tree has depth {tree.depth} "
                             f"(its nodes of depth {tree.depth - 1} have children): give a row per depth up to "
                             f"{tree.depth - 1}")
        for depth, k in enumerate(tree.max_children):
            ranks = self.ranks(depth)
            if ranks is not None and k > ranks:
                where = f"acceptance[{depth}]" if self.rows is not None else "acceptance"
                raise ValueError(f"a node of depth {depth} has {k} children, but {where} gives only {ranks} ranks")

    def result(self, value):
        return Fraction(value) if self.exact else float(value)


def _count(value, name: str, minimum: int = 0) -> int:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _nonnegative(value, name: str) -> float:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def verify_cost_function(verify_cost) -> Callable[[int], float]:
    """verify_cost as a function of the width, each value checked when asked for."""
    if verify_cost is None:
        return lambda width: 1.0
    if callable(verify_cost):
        lookup, what = verify_cost, "verify_cost({})"
    elif isinstance(verify_cost, Mapping):
        def lookup(width):
            if width not in verify_cost:
                raise ValueError(f"verify_cost has no entry for width {width} (a mapping width -> cost must cover "
                                 f"every width asked for)")
            return verify_cost[width]
        what = "verify_cost[{}]"
    elif isinstance(verify_cost, (Sequence, np.ndarray)) and not isinstance(verify_cost, (str, bytes)):
        table = list(verify_cost)

        def lookup(width):
            if width > len(table):
                raise ValueError(f"verify_cost gives widths 1 .. {len(table)} (verify_cost[w - 1] is width w's), "
                                 f"but width {width} is needed")
            return table[width - 1]
        what = "verify_cost[{} - 1]"
    else:
        raise ValueError(f"verify_cost must be None, a function of the width, a mapping width -> cost or a sequence "
                         f"(verify_cost[w - 1] for width w), got {verify_cost!r}")

    def cost(width: int) -> float:
        value = lookup(width)
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < float(value) < math.inf:
            raise ValueError(f"{what.format(width)} must be a finite time > 0 (in units of one 1-token target call), "
                             f"got {value!r}")
        return float(value)
    return cost



def tree_expected_tokens(tree: TreeLike, acceptance: AcceptanceLike):
    """Expected tokens per target call (accepted drafts plus the target's own token t) under positional acceptance:

        E = 1 + sum over draft nodes v of prod over the path root -> v of acceptance[depth(parent(u))][rank(u)],

    since a node v is on the accepted path with the product's probability (the nodes of one depth are disjoint
    events) and E = 1 + sum_t P(at least t drafts accepted). For a shape this is 1 + sum_{t=1..d} prod_{i<t}
    sum_{j<k_(i+1)} acceptance[i][j]. The chain [1] * gamma with acceptance alpha at every depth gives
    1 + alpha + ... + alpha^gamma, Equation (1)'s (1 - alpha^(gamma+1)) / (1 - alpha) (gamma + 1 at alpha = 1);
    rank-wise sums of Sequoia's f(T) = sum_v prod_path p_rank (Chen et al. 2024).

    Returns a float, or a fractions.Fraction when every acceptance value is a Fraction (exact arithmetic).
    ValueError for a tree the acceptance model does not cover (a depth beyond its rows, a rank beyond a row).
    """
    t, acc = Tree(tree), _Acceptance(acceptance)
    acc.fits(t)
    total = 1
    if t.shape is not None:
        reach = 1  # sum over the nodes of depth i of the probability that the accepted path reaches them
        for i, k in enumerate(t.shape):
            reach = reach * sum(acc.value(i, j) for j in range(k))
            total = total + reach
    else:
        reach = [1] * len(t.parents)  # the probability that the accepted path reaches each node
        for v in range(1, len(t.parents)):
            up = t.parents[v]
            reach[v] = reach[up] * acc.value(t.node_depth[up], t.rank[v])
            total = total + reach[v]
    return acc.result(total)


def tree_speedup(tree: TreeLike, acceptance: AcceptanceLike, c: float, verify_cost=None,
                 draft_calls: Optional[float] = None) -> float:
    """Theorem 3.8 for a tree: the expected walltime improvement over decoding with the target alone,

        E[tokens per target call] / (draft_calls * c + verify_cost(N + 1)),

    in units of one 1-token target call (the baseline's cost per token). E is ``tree_expected_tokens``; N + 1 the
    verification width (``tree_size`` + 1). Assumptions, as the paper's: long enough generations, and
    * draft_calls defaults to the tree's depth d: the draft scores all nodes of one depth in one call, which
      costs c (Definition 3.7) whatever their number; give draft_calls (any number >= 0, in units of one draft
      call) to model otherwise, e.g. one call per drafted node, tree_size(tree);
    * verify_cost(width) is the target call's time relative to a 1-token call: None is 1.0 at every width (the
      paper's assumption that gamma + 1 parallel evaluations take the time of one); otherwise a function of the
      width, a mapping width -> cost, or a sequence with verify_cost[w - 1] for width w (measured per-width
      costs on hardware where wide calls cost more, such as a CPU).
    For the chain [1] * gamma with acceptance alpha and verify_cost None this is Theorem 3.8's
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) (``walltime_improvement``). Returns a float.
    """
    t = Tree(tree)
    tokens = tree_expected_tokens(tree, acceptance)
    calls = t.depth if draft_calls is None else _nonnegative(draft_calls, "draft_calls")
    return float(tokens) / (calls * _nonnegative(c, "c") + verify_cost_function(verify_cost)(t.size + 1))


def _budget_and_depth(budget, acc: _Acceptance, max_depth, minimum: int = 0) -> Tuple[int, int]:
    budget = _count(budget, "budget", minimum)
    depths = acc.depths()
    if max_depth is None:
        depth = depths if depths is not None else budget
    else:
        depth = _count(max_depth, "max_depth")
        if depths is not None and depth > depths:
            raise ValueError(f"max_depth = {depth}, but acceptance has rows for depths 0 .. {depths - 1} only (a tree "
                             f"of depth d needs d rows)")
    return budget, min(depth, budget)


def _tree_dp(rows: List[np.ndarray], budget: int) -> Tuple[List[np.ndarray], List[List[np.ndarray]]]:
    """Sequoia's dynamic program, with acceptance by depth: rows[i] [k_i] are the rank probabilities of depth i.

    best[i][n] (float64 [budget + 1]): the most sum_v prod_path acceptance over the subtrees of exactly n
    descendants of a node of depth i (-inf where no tree of n nodes fits; best[len(rows)] is a leaf). Over a
    node's ranks j = k - 1 .. 0, with exactly m nodes left for ranks >= j,
        G_j[m] = max(0 if m = 0, max_{s < m} rows[i][j] (1 + best[i+1][s]) + G_{j+1}[m - 1 - s]),
    and best[i] = G_0. choice[i][j][m]: the descendants s of the rank-j child, -1 for none (the node's children
    stop at rank j). O(sum_i k_i budget^2).
    """
    m = np.arange(budget + 1)
    rest = m[:, None] - 1 - m[None, :]  # [budget + 1, budget + 1]: nodes left for ranks > j when child j has s
    valid, rest = rest >= 0, np.maximum(rest, 0)
    leaf = np.full(budget + 1, -np.inf)
    leaf[0] = 0.0
    best: List[np.ndarray] = [leaf] * (len(rows) + 1)
    choice: List[List[np.ndarray]] = [[] for _ in rows]
    for i in reversed(range(len(rows))):
        fits = best[i + 1] > -np.inf
        below = np.where(fits, 1.0 + best[i + 1], 0.0)  # a child and its subtree of s descendants, s that fit
        later = leaf  # G_k: no ranks left
        for a in reversed(rows[i]):
            child = np.where(fits, a * below, -np.inf)  # [s]  (no 0 * -inf)
            candidates = np.where(valid, child[None, :] + later[rest], -np.inf)  # [m, s]
            s = np.argmax(candidates, axis=1)
            value = candidates[m, s]
            take = value > -np.inf  # a child of rank j, whenever the m nodes fit (m = 0 stops)
            choice[i].append(np.where(take, s, -1))
            later = np.where(take, value, leaf)
        choice[i].reverse()
        best[i] = later
    return best, choice


def _dp_tree(choice: List[List[np.ndarray]], depth: int, nodes: int) -> List[int]:
    """The breadth-first parents of the tree the dynamic program chose for a node of this depth with this many
    descendants."""
    parents, queue = [-1], collections.deque([(0, depth, nodes)])
    while queue:
        node, i, left = queue.popleft()
        j = 0
        while i < len(choice) and j < len(choice[i]) and choice[i][j][left] >= 0:
            s = int(choice[i][j][left])
            parents.append(node)
            queue.append((len(parents) - 1, i + 1, s))
            left -= 1 + s
            j += 1
        assert left == 0, "the dynamic program's choices must use exactly the nodes they were given"
    return parents


def best_tree(budget: int, acceptance: AcceptanceLike, max_depth: Optional[int] = None) -> TreeChoice:
    """The tree of at most ``budget`` drafts (and depth at most ``max_depth``) with the most expected tokens per
    target call under positional acceptance, by Sequoia's dynamic program (Chen et al. 2024; the optimal subtree
    recursion, over (depth, nodes) since acceptance depends on depth here): the best subtree of n descendants of
    a depth-i node splits its nodes over its children of ranks 0, 1, ..., each child's subtree being the best of
    its size at depth i + 1 (see _tree_dp).

    max_depth defaults to the acceptance table's depth (a table by depth) or to the budget; it may not exceed the
    table's. Of several best trees (equal within a relative 1e-12, for float rounding), the one with the fewest
    drafts is returned (more nodes of zero acceptance add nothing). Time O(max_depth * ranks * budget^2) with
    numpy (ranks: the longest row considered, at most budget).
    Returns TreeChoice(tree=breadth-first parents, expected_tokens=tree_expected_tokens(tree, acceptance)).
    """
    acc = _Acceptance(acceptance)
    budget, depth = _budget_and_depth(budget, acc, max_depth)
    parents = [-1]
    if budget > 0 and depth > 0:
        best, choice = _tree_dp([acc.floats(i, budget) for i in range(depth)], budget)
        top = best[0].max()  # >= best[0][0] = 0
        parents = _dp_tree(choice, 0, int(np.argmax(best[0] >= top - 1e-12 * top)))  # the fewest drafts
    return TreeChoice(parents, tree_expected_tokens(parents, acceptance))


def optimal_tree(budget: int, acceptance: AcceptanceLike, c: float, verify_cost=None,
                 max_depth: Optional[int] = None) -> TreeSpeedup:
    """The tree of at most ``budget`` drafts (and depth at most ``max_depth``) that maximizes ``tree_speedup``
    (draft calls = depth), the root alone ([-1], no drafts) included: §3.5's choice of gamma for trees, as in
    Sequoia's hardware-aware optimizer. For every depth d and every exact draft count n, the dynamic program of
    best_tree gives the best tree of n drafts and depth <= d; the improvement (1 + best) / (d c + verify_cost(n +
    1)) is maximized over (d, n), and the maximizing tree has exactly that improvement, so the result is optimal
    for any verify_cost (which must cover widths 1 .. budget + 1). Ties go to the smaller depth, then the fewer
    drafts. Returns TreeSpeedup(tree=breadth-first parents, expected_tokens, speedup).
    """
    acc = _Acceptance(acceptance)
    budget, depth = _budget_and_depth(budget, acc, max_depth)
    c = _nonnegative(c, "c")
    cost = verify_cost_function(verify_cost)
    widths = np.array([cost(w) for w in range(1, budget + 2)])  # [budget + 1]: width n + 1 for n drafts
    best_speedup, best_at = 1.0 / widths[0], None
    shared = acc.depths() is None  # the same row at every depth: one program gives every depth limit
    if shared and depth > 0:
        plan = _tree_dp([acc.floats(0, budget)] * depth, budget)
    for d in range(1, depth + 1):
        best, choice = plan if shared else _tree_dp([acc.floats(i, budget) for i in range(d)], budget)
        top = depth - d if shared else 0  # the level of the root of depth-limit d
        speedup = (1.0 + best[top][1:]) / (d * c + widths[1:])  # [budget]: n = 1 .. budget drafts
        n = int(np.argmax(speedup))
        if speedup[n] > best_speedup:
            best_speedup, best_at = speedup[n], (choice, top, n + 1)
    parents = [-1] if best_at is None else _dp_tree(*best_at)
    return TreeSpeedup(parents, tree_expected_tokens(parents, acceptance),
                       tree_speedup(parents, acceptance, c, verify_cost))


def best_tree_shape(budget: int, acceptance: AcceptanceLike, max_depth: Optional[int] = None) -> TreeChoice:
    """The shape [k1, ..., kd] of at most ``budget`` drafts (k1 + k1 k2 + ... <= budget, d <= max_depth) with the
    most expected tokens per target call, by enumerating every such shape (tree_expected_tokens's product form:
    E = 1 + sum_t prod_{i<t} sum_{j<k_(i+1)} acceptance[i][j]). budget >= 1 (a shape drafts at least one node).
    Of several best shapes, the one with the fewest drafts, then the first in lexicographic order.
    Returns TreeChoice(tree=the shape, expected_tokens, exact with Fraction acceptance).
    """
    acc = _Acceptance(acceptance)
    budget, depth = _budget_and_depth(budget, acc, max_depth, minimum=1)
    top = (None, None, None)  # (value, drafts, shape)

    def visit(shape: List[int], level: int, size: int, reach, value) -> None:
        nonlocal top
        if shape and (top[0] is None or value > top[0] or (value == top[0] and size < top[1])):
            top = (value, size, list(shape))
        if len(shape) == depth:
            return
        i = len(shape)
        ranks = acc.ranks(i)
        prefix = 0
        for k in range(1, (budget - size) // level + 1):
            if ranks is not None and k > ranks:
                break
            prefix = prefix + acc.value(i, k - 1)
            shape.append(k)
            visit(shape, level * k, size + level * k, reach * prefix, value + reach * prefix)
            shape.pop()

    visit([], 1, 0, 1, 1)
    return TreeChoice(top[2], tree_expected_tokens(top[2], acceptance))


def acceptance_from_counts(accepted, visits, offered=None) -> List[List[float]]:
    """Estimates the acceptance table from verification counts: acceptance[i][j] = accepted[i][j] / visits[i],
    the maximum-likelihood estimate of the positional model (each verified node's outcome is one draw of a
    categorical over its ranks and "all rejected"; its binomial standard error is sqrt(a (1 - a) / visits[i])).

    accepted[i][j]: how many verified nodes of depth i accepted their rank-j child; visits[i]: how many nodes of
    depth i had their children verified (nodes on accepted paths with children; a leaf is not a visit). Every
    counted node of depth i must have had children of all the ranks in accepted[i] (counts from one tree shape,
    or rows cut to the smallest number of children at that depth), else the later ranks are underestimated.
    Counts are whole numbers >= 0 with sum_j accepted[i][j] <= visits[i] and visits[i] >= 1 (drop depths never
    visited). Returns a table by depth (lists of floats), a valid ``acceptance`` argument.

    offered (optional, ``stats.tree_offered``): offered[i][j], how many of those nodes had a rank-j child at all.
    With it acceptance[i][j] = accepted[i][j] / offered[i][j], which lifts the restriction above (trees whose
    nodes of one depth have different numbers of children: given parents, grown trees); a row ends before its
    first rank never offered.
    """
    def whole(value, name: str) -> int:
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or value != int(value) or value < 0:
            raise ValueError(f"{name} must be a count (a whole number >= 0), got {value!r}")
        return int(value)

    rows = accepted.tolist() if isinstance(accepted, np.ndarray) else accepted
    counts = visits.tolist() if isinstance(visits, np.ndarray) else visits
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows \
            or not all(isinstance(r, Sequence) and not isinstance(r, (str, bytes)) for r in rows):
        raise ValueError(f"accepted must be a non-empty table of counts by depth and rank, got {accepted!r}")
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) != len(rows):
        raise ValueError(f"visits must hold one count per depth of accepted ({len(rows)}), got {visits!r}")
    offers = offered.tolist() if isinstance(offered, np.ndarray) else offered
    if offers is not None and (isinstance(offers, (str, bytes)) or not isinstance(offers, Sequence)
                               or len(offers) != len(rows)
                               or not all(isinstance(r, Sequence) and len(r) == len(rows[i])
                                          for i, r in enumerate(offers))):
        raise ValueError(f"offered must be a table of counts shaped like accepted (one count per depth and rank), "
                         f"got {offered!r}")
    table = []
    for i, row in enumerate(rows):
        n = whole(counts[i], f"visits[{i}]")
        hits = [whole(v, f"accepted[{i}][{j}]") for j, v in enumerate(row)]
        if not hits:
            raise ValueError(f"accepted[{i}] is empty: give the count of at least rank 0")
        if n == 0:
            raise ValueError(f"visits[{i}] = 0: no node of depth {i} was verified, so its row has no estimate "
                             f"(drop it and the deeper rows)")
        if sum(hits) > n:
            raise ValueError(f"accepted[{i}] sums to {sum(hits)} > visits[{i}] = {n}: a verified node accepts at "
                             f"most one child")
        if offers is None:
            table.append([h / n for h in hits])
            continue
        row_out = []
        for j, h in enumerate(hits):
            m = whole(offers[i][j], f"offered[{i}][{j}]")
            if m > n or h > m:
                raise ValueError(f"offered[{i}][{j}] = {m} must lie between accepted[{i}][{j}] = {h} and visits[{i}] "
                                 f"= {n}: a rank is accepted only where it was offered, offered only where visited")
            if m == 0:
                break
            row_out.append(h / m)
        table.append(row_out)
    return table


# --------------------------------------------------------------------------------------------------
# Hierarchical drafts (cpp/drafting/hierarchy.h): Theorem 3.8 composed over levels
# --------------------------------------------------------------------------------------------------


def _levels(alphas, gammas, costs) -> List[Tuple[float, int, float]]:
    alphas, gammas, costs = list(alphas), list(gammas), list(costs)
    if not alphas or not len(alphas) == len(gammas) == len(costs):
        raise ValueError(f"alphas, gammas and costs need one entry per level (at least one), got {len(alphas)}, "
                         f"{len(gammas)} and {len(costs)}")
    return [(float(_alpha(a)), int(_gamma(g, minimum=1)), float(_cost(c, f"costs[{i}]")))
            for i, (a, g, c) in enumerate(zip(alphas, gammas, costs))]


def _production_costs(levels: List[Tuple[float, int, float]], tokens: int,
                      widths: List[Callable[[int], float]], overheads: List[float]) -> List[float]:
    """F(n) for n = 0 .. tokens: the expected cost, in one-token calls of levels[0]'s target, of that level
    emitting exactly n tokens, each iteration drafting min(gamma, n - 1) tokens (what a level below the top does),
    verifying them in one call of width g + 1 (widths[0](g + 1) one-token calls) and spending overheads[0] on
    its own work."""
    alpha, gamma, c = levels[0]
    drafts = [0.0] * tokens  # the cost of drafting g tokens, g = 0 .. tokens - 1
    if len(levels) > 1 and tokens > 1:
        below = _production_costs(levels[1:], tokens - 1, widths[1:], overheads[1:])
        drafts = [c * below[g] for g in range(tokens)]
    elif tokens > 1:
        drafts = [c * g for g in range(tokens)]
    out = [0.0]
    for n in range(1, tokens + 1):
        g = min(gamma, n - 1)
        cost = drafts[g] + widths[0](g + 1) + overheads[0]
        for k in range(1, g + 2):  # k tokens emitted: k - 1 accepted, then the correction or the bonus
            p = alpha ** (k - 1) * (1.0 - alpha) if k <= g else alpha ** g
            cost += p * out[n - k]
        out.append(cost)
    return out


def _widths(verify_costs, levels: int) -> List[Callable[[int], float]]:
    if verify_costs is None:
        return [verify_cost_function(None)] * levels
    verify_costs = list(verify_costs)
    if len(verify_costs) != levels:
        raise ValueError(f"verify_costs needs one entry per level ({levels}), got {len(verify_costs)}")
    return [verify_cost_function(v) for v in verify_costs]


def _overheads(overheads, levels: int) -> List[float]:
    if overheads is None:
        return [0.0] * levels
    overheads = list(overheads)
    if len(overheads) != levels:
        raise ValueError(f"overheads needs one entry per level ({levels}), got {len(overheads)}")
    return [_nonnegative(o, f"overheads[{i}]") for i, o in enumerate(overheads)]


def hierarchical_draft_cost(alphas: Sequence[float], gammas: Sequence[int], costs: Sequence[float],
                            verify_costs=None, overheads=None) -> float:
    """The expected cost, in one-token target calls, of drafting gamma_0 tokens per iteration with a hierarchical
    draft.

    Level i (0 = the top) verifies with model M_i the drafts of M_{i+1}: alphas[i] is their acceptance, gammas[i]
    the draft length, costs[i] = T(M_{i+1}) / T(M_i) (Definition 3.7 between neighbouring levels, one-token
    calls). The last level's drafter runs alone: g tokens cost g * costs[-1]. Every level below the top emits
    exactly the tokens asked of it, drafting min(gamma_i, tokens still due - 1) per iteration; its expected cost
    F(n) of n tokens follows from F(n) = D(g) + v(g + 1) + sum_k P(k tokens emitted) F(n - k), with Equation
    (1)'s capped geometric law of k (i.i.d. acceptances, as in Theorem 3.8). verify_costs: None (the paper's
    assumption that a call of w tokens costs one call), or one entry per level, level i's target call of width w
    over its one-token call (as tree_speedup's verify_cost: a function, a mapping or a sequence; entry 0, the
    top's target, does not enter the draft cost). overheads: None (the paper's assumption that only model calls
    cost time), or one entry per level, the engine's own time per iteration of level i (sampling, verification,
    bookkeeping, rollback) in one-token calls of level i's target; entry 0, the top's, does not enter the draft
    cost. One level gives gamma * c, Theorem 3.8's draft cost."""
    levels = _levels(alphas, gammas, costs)
    widths = _widths(verify_costs, len(levels))
    spent = _overheads(overheads, len(levels))
    alpha, gamma, c = levels[0]
    if len(levels) == 1:
        return gamma * c
    return c * _production_costs(levels[1:], gamma, widths[1:], spent[1:])[gamma]


def hierarchical_improvement(alphas: Sequence[float], gammas: Sequence[int], costs: Sequence[float],
                             verify_costs=None, overheads=None, plain_overhead: float = 0.0) -> float:
    """Theorem 3.8 composed over the levels of a hierarchical draft: E[tokens per target call] (Equation (1) at
    the top's alpha and gamma) over the top's verification call (verify_costs[0](gamma_0 + 1), 1 without
    verify_costs) plus overheads[0] plus hierarchical_draft_cost, times the cost of a plain decoding step (1 +
    plain_overhead: its engine time per token in target calls). With one level and no verify_costs or overheads
    this is walltime_improvement. The lower levels' speedup lowers the top's c: its effective c is
    hierarchical_draft_cost / gamma_0 (a drafted token's cost in target calls).

    With every cost measured (verify_costs, costs, overheads and plain_overhead, each in one-token calls), this
    is a cost model of the whole loop: what is predicted is only how many iterations each level runs per token
    (Equation (1) and the recurrence of hierarchical_draft_cost, from alpha and gamma)."""
    levels = _levels(alphas, gammas, costs)
    alpha, gamma, _ = levels[0]
    verify = _widths(verify_costs, len(levels))[0](gamma + 1) + _overheads(overheads, len(levels))[0]
    step = 1.0 + _nonnegative(plain_overhead, "plain_overhead")
    return float(expected_tokens(alpha, gamma)) * step / (
        verify + hierarchical_draft_cost(alphas, gammas, costs, verify_costs, overheads))
