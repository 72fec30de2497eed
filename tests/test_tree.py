"""Token trees, one iteration (cpp/math/tree.h): the shape, the children a node draws, and multi-draft verification.

The rule (tree.h): at a node, the children are tried in the order they were drawn, each by one step of
speculative sampling against what the earlier rejections left of p (the residual), with q itself (children drawn
with replacement), q without the earlier siblings (without replacement), or, for siblings="top", the point mass at
each of the first k - 1 children (q's most probable tokens) and q without them for the last; the first accepted
child becomes the next node, and when all are rejected t is drawn from the last residual (at a leaf: from p).

* Exact, by enumeration (float64, no sampling): on Markov tables (each token's next-token law depends on it alone),
  the law of what one iteration emits, drafting included, completed by the target to depth + 1 tokens, equals
  the target's own law of depth + 1 tokens, for several shapes, sampling modes (temperature, top-k, top-p) and
  the three ways of drawing children. ``iteration_law`` (tests/support/tree_laws.py) is the rule written out; the
  enumeration proves it exact, and the chi-square tests check that the C++ (draw_children + verify_tree) samples
  that same law.
* Statistical: Pearson chi-square of the emitted sequences (pooled to expected counts >= 5) against
  ``iteration_law`` at SIGNIFICANCE = 1e-3 per test with fixed seeds, for both implementations of draw_children
  and verify_tree (the CPU kernels, and the tensor path accelerators run, forced on CPU, also in float32): 29
  tests, 6 more with a sibling draft (children 1 .. k - 1 from a third table), and 6 of the children's own law,
  at most 4.1% family-wise false failures for a fresh choice of seeds (Bonferroni).
* Sibling drafts (tree.h): the enumerated law with a third table drawing the later children is the target's;
  the second child's share has distill's closed form; the draws come from the right rows.
* Greedy: top-k children, the longest path of argmax agreement, t the argmax: exactly the enumerated walk,
  for both implementations.
* Edges (draft equal to the target, every child impossible, a target sure of one token, masked rows): every
  rule on both implementations returns finite verdicts that emit only tokens the target can.
"""

import contextlib
import itertools
from collections import defaultdict

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch

from support.chisquare import SIGNIFICANCE, pooled
from speculant import _core
from speculant.testing import tensor_path
from support.tree_laws import (F64, VOCAB, completed, draw_tree, iteration_law, sibling_table, standardized, tables,
                               target_law, top_order)


# ------------------------------------------------------------------------------------------------
# The rule, written out (float64), and its exactness
# ------------------------------------------------------------------------------------------------


SHAPES = [[1], [3], [1, 1, 1], [2, 2], [3, 1], [1, 3], [2, 1, 2]]
CONFIGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 2, 1.0), (1.3, 0, 0.8)]  # temperature, top_k, top_p


@pytest.mark.parametrize("siblings", ["with_replacement", "without_replacement", "top", "coupled"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_iteration_is_exact(shape, config, siblings):
    target, draft = tables(seed=len(shape) * 10 + shape[0])
    p_table, q_table = standardized(target, config), standardized(draft, config)
    law = iteration_law(p_table, q_table, root=1, shape=shape, siblings=siblings)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    length = len(shape) + 1
    np.testing.assert_allclose(completed(law, p_table, length), target_law(p_table, 1, length), rtol=0, atol=1e-12)


def test_more_children_keep_more_tokens():
    """What trees are for: with the same depth, siblings raise the expected tokens per iteration."""
    target, draft = tables(seed=3)
    config = (1.0, 0, 1.0)
    p_table, q_table = standardized(target, config), standardized(draft, config)

    def mean_length(shape, siblings):
        law = iteration_law(p_table, q_table, 2, shape, siblings)
        return sum(len(seq) * prob for seq, prob in law.items())

    chain = mean_length([1, 1], "with_replacement")
    assert chain == pytest.approx(mean_length([1, 1], "top"), abs=1e-12)  # one child: the same chain
    assert chain < mean_length([2, 2], "with_replacement") < mean_length([3, 3], "without_replacement")
    assert chain < mean_length([2, 2], "top")


def test_top_siblings_win_where_the_draft_ranks_well_but_spreads_its_mass():
    """Which rule keeps more is a property of the pair (tree.h): a draft whose argmax is the target's but whose
    mass is spread keeps 0.97 of one [2] node with top children against 0.54 with sampled ones; a draft close to
    the target in law (test_tree's perturbed tables, the trained GPT-2 pair's case in BENCHMARKS.md) keeps more
    with sampled siblings at node 1. Exact enumeration."""
    def accepted(p_table, q_table, root, siblings):
        return sum(prob for seq, prob in iteration_law(p_table, q_table, root, [2], siblings).items() if len(seq) == 2)

    peaked = torch.tensor([[0.9, 0.05, 0.03, 0.01, 0.01]] * VOCAB, dtype=F64)
    spread = torch.tensor([[0.24, 0.2, 0.2, 0.18, 0.18]] * VOCAB, dtype=F64)
    assert accepted(peaked, spread, 0, "top") == pytest.approx(0.9726, abs=1e-4)
    assert accepted(peaked, spread, 0, "without_replacement") == pytest.approx(0.5355, abs=1e-4)
    target, draft = tables(seed=5, masked=False)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    assert accepted(p_table, q_table, 1, "without_replacement") > accepted(p_table, q_table, 1, "top") + 0.01


def test_coupled_siblings_accept_more_than_independent_coins_within_the_bound():
    """siblings="coupled" (tree.h): one node keeps at least what independent coins keep (with replacement), never
    more than the best coupling of i.i.d. children (analysis.multi_draft_bound), and clearly more than both
    other sampled rules at node 1. Exact enumeration of one node of k children. (That the first child keeps sum
    min(p, q): tests/test_bench_trees.py, node_bounds.coupled against this enumeration.)"""
    from speculant import analysis

    target, draft = tables(seed=5, masked=False)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    for root in range(VOCAB):
        p, q = p_table[root], q_table[root]
        for k in (2, 3, 4):
            kept = {name: sum(prob for seq, prob in iteration_law(p_table, q_table, root, [k], name).items()
                              if len(seq) == 2) for name in ("coupled", "with_replacement")}
            assert kept["coupled"] >= kept["with_replacement"] - 1e-12
            assert kept["coupled"] <= float(analysis.multi_draft_bound(p, q, k)) + 1e-12
    two = {name: sum(prob for seq, prob in iteration_law(p_table, q_table, 1, [2], name).items() if len(seq) == 2)
           for name in ("coupled", "with_replacement", "without_replacement")}
    assert two["coupled"] > max(two["with_replacement"], two["without_replacement"]) + 0.01


def second_child_optimum(p, q) -> float:
    """The largest P(Y = C2 != C1) over joint laws of Y ~ p and two i.i.d. draws C1, C2 of q with P(Y = C1) at its
    most, sum min(p, q): a linear program over P(C1 = a, C2 = b, Y = y)."""
    n = VOCAB
    index = {(a, b, y): i for i, (a, b, y) in enumerate(itertools.product(range(n), repeat=3))}
    rows, rhs = [], []
    for a, b in itertools.product(range(n), repeat=2):  # the draws' law
        row = np.zeros(len(index))
        row[[index[a, b, y] for y in range(n)]] = 1.0
        rows.append(row), rhs.append(float(q[a] * q[b]))
    for y in range(n):  # the output's law
        row = np.zeros(len(index))
        row[[index[a, b, y] for a, b in itertools.product(range(n), repeat=2)]] = 1.0
        rows.append(row), rhs.append(float(p[y]))
    first = np.zeros(len(index))
    first[[index[a, b, a] for a, b in itertools.product(range(n), repeat=2)]] = 1.0
    rows.append(first), rhs.append(float(torch.minimum(p, q).sum()))
    gain = np.zeros(len(index))
    gain[[index[a, b, b] for a, b in itertools.product(range(n), repeat=2) if a != b]] = 1.0
    return lp_maximum(gain, rows, rhs)


@pytest.mark.parametrize("seed, masked", [(5, False), (6, False), (7, False), (8, True)])
def test_coupled_second_child_is_under_the_bound_that_keeps_the_first(seed, masked):
    """analysis.second_child_bound (the most a second i.i.d. child can be accepted while the first keeps
    sum min(p, q), in closed form by max-flow min-cut) is the linear program's optimum, which is at least what
    siblings="coupled" gives the second child (its node of two keeps sum min(p, q) + that, enumerated), which
    is at least what independent coins give it. Masked tables have a token of p = 0 < q; a token of q = 0 < p
    (no draft reaches it) is checked apart."""
    from speculant import analysis

    target, draft = tables(seed=seed, masked=masked)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    for root in range(VOCAB):
        p, q = p_table[root], q_table[root]
        beta = float(torch.minimum(p, q).sum())
        second = {name: sum(prob for seq, prob in iteration_law(p_table, q_table, root, [2], name).items()
                            if len(seq) == 2) - beta for name in ("coupled", "with_replacement")}
        optimum = second_child_optimum(p, q)
        assert float(analysis.second_child_bound(p, q)) == pytest.approx(optimum, abs=1e-9)
        assert optimum >= second["coupled"] - 1e-9 >= second["with_replacement"] - 2e-9
    p, q = torch.tensor([0.3, 0.1, 0.2, 0.25, 0.15], dtype=F64), torch.tensor([0.0, 0.4, 0.1, 0.2, 0.3], dtype=F64)
    assert float(analysis.second_child_bound(p, q)) == pytest.approx(second_child_optimum(p, q), abs=1e-9)


def test_top_siblings_accept_what_the_closed_form_says():
    """One node with k top children: the first k - 1 steps accept p(T) together (T: q's top k - 1), the last
    sum over the rest of min(p(x), q(x) (1 - p(T)) / (1 - q(T))) (tree.h): enumerated against that formula."""
    target, draft = tables(seed=5, masked=False)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    p, q = p_table[2], q_table[2]
    for k in (1, 2, 3, 4):
        law = iteration_law(p_table, q_table, 2, [k], "top")
        accepted = sum(prob for seq, prob in law.items() if len(seq) == 2)
        top = top_order(q)[:k - 1]
        p_top, q_top = float(p[top].sum()), float(q[top].sum())
        rest = [v for v in range(VOCAB) if v not in top]
        closed = p_top + sum(min(float(p[v]), float(q[v]) * (1 - p_top) / (1 - q_top)) for v in rest)
        assert accepted == pytest.approx(closed, abs=1e-12)


def coupling_optimum(p, q, k: int) -> float:
    """The largest P(Y in C) over joint laws of Y ~ p and k i.i.d. draws C from q, by linear programming over
    P(C = c, Y = y) for every ordered draw c: what analysis.multi_draft_bound computes by its closed form."""
    draws = list(itertools.product(range(VOCAB), repeat=k))
    n = len(draws) * VOCAB  # variable (c, y) at index c * VOCAB + y
    gain = np.zeros(n)
    rows, totals = [], []
    for c, draw in enumerate(draws):
        gain[[c * VOCAB + y for y in set(draw)]] = 1.0
        row = np.zeros(n)
        row[c * VOCAB:(c + 1) * VOCAB] = 1.0
        rows.append(row)
        totals.append(float(np.prod([float(q[x]) for x in draw])))
    for y in range(VOCAB - 1):  # the last column's total follows from the others (and would only add rounding)
        row = np.zeros(n)
        row[y::VOCAB] = 1.0
        rows.append(row)
        totals.append(float(p[y]))
    return lp_maximum(gain, rows, totals)


def lp_maximum(gain, rows, rhs) -> float:
    """max gain . x over x >= 0 with rows x = rhs (HiGHS)."""
    result = scipy.optimize.linprog(-np.asarray(gain), A_eq=np.array(rows), b_eq=np.array(rhs), bounds=(0, None),
                                    method="highs")
    assert result.status == 0
    return -result.fun


@pytest.mark.parametrize("seed", [2, 5, 8])
def test_multi_draft_bound_is_the_best_coupling(seed):
    """analysis.multi_draft_bound against the linear program it solves in closed form (k = 1, 2, 3; a target
    with a zero, and drafts near and far), and against what recursive rejection sampling with replacement
    accepts at a node of k children (enumerated, iteration_law): never more, and less somewhere."""
    from speculant import analysis
    target, draft = tables(seed=seed, masked=seed != 8)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    gaps = []
    for root in (0, 3):
        p, q = p_table[root], q_table[root]
        assert float(analysis.multi_draft_bound(p, q, 1)) == pytest.approx(float(analysis.beta(p, q)), abs=1e-12)
        for k in (1, 2, 3):
            bound = float(analysis.multi_draft_bound(p, q, k))
            assert bound == pytest.approx(coupling_optimum(p, q, k), abs=1e-7)
            law = iteration_law(p_table, q_table, root, [k], "with_replacement")
            rejection = sum(prob for seq, prob in law.items() if len(seq) == 2)
            assert rejection <= bound + 1e-12
            gaps.append(bound - rejection)
    assert max(gaps) > 1e-3
    batch = analysis.multi_draft_bound(p_table, q_table, 2)  # rows at once
    assert batch.shape == (VOCAB,) and float(batch[3]) == pytest.approx(coupling_optimum(p_table[3], q_table[3], 2),
                                                                         abs=1e-7)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        analysis.multi_draft_bound(p_table[0], q_table[0], 0)


# ------------------------------------------------------------------------------------------------
# The C++: shapes, children, verification
# ------------------------------------------------------------------------------------------------


def test_shapes():
    assert _core._tree_parents([1, 1, 1]) == [-1, 0, 1, 2]
    assert _core._tree_parents([2, 2]) == [-1, 0, 0, 1, 1, 2, 2]
    assert _core._tree_parents([3, 1]) == [-1, 0, 0, 0, 1, 2, 3]
    assert _core._tree_parents([]) == [-1]
    for bad, message in (([0], r"tree\[0\] = 0"), ([64, 64, 64], "more than 4096 nodes")):
        with pytest.raises(ValueError, match=message):
            _core._tree_parents(bad)
    q = torch.full((4, VOCAB), 1.0 / VOCAB, dtype=F64)
    tokens = torch.zeros(4, dtype=torch.long)
    for parents, message in (([0, 0], "root, with parent -1"), ([-1, 1], "comes before it"),
                             ([-1, 0, 1, 0], "parents nondecreasing")):
        with pytest.raises(ValueError, match=message):
            _core._verify_tree_seeded(parents, q, q, tokens, 1.0, 0, 1.0, 1.0, "with_replacement", [0])
    with pytest.raises(ValueError,
                       match="siblings must be 'without_replacement', 'with_replacement', 'top' or 'coupled'"):
        _core._verify_tree_seeded([-1, 0], q[:2], q[:2], tokens[:2], 1.0, 0, 1.0, 1.0, "sorted", [0])


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
def test_children_without_replacement_are_distinct_and_within_the_support(as_tensors):
    """Also the second child's law: q without the first, renormalized (chi-square at SIGNIFICANCE: 2 more tests
    per path, 4 in all, beside the 16 of test_cpp_samples_the_exact_law: at most 2% family-wise)."""
    q = torch.tensor([0.0, 0.5, 0.3, 0.2, 0.0], dtype=F64)
    for seed in range(200):
        children = _core._draw_children(q, 3, "without_replacement", greedy=False, seed=seed,
                                        as_tensors=as_tensors).tolist()
        assert sorted(children) == [1, 2, 3]
    pairs = [tuple(_core._draw_children(q, 2, "without_replacement", False, seed=s, as_tensors=as_tensors).tolist())
             for s in range(4000)]
    counts = np.bincount([first for first, _ in pairs], minlength=VOCAB)
    assert counts[0] == counts[4] == 0
    expected = q.numpy()[1:4] * 4000
    assert scipy.stats.chisquare(counts[1:4], expected).pvalue > SIGNIFICANCE
    second = np.bincount([b for a, b in pairs if a == 1], minlength=VOCAB)[2:4]  # after 1: q(2), q(3) renormalized
    assert scipy.stats.chisquare(second, second.sum() * np.array([0.6, 0.4])).pvalue > SIGNIFICANCE
    assert _core._draw_children(q, 4, "without_replacement", False, seed=0, as_tensors=as_tensors).tolist()[:3] != [0, 0, 0]
    assert _core._draw_children(torch.tensor([0.1, 0.3, 0.3, 0.2, 0.1]), 3, "with_replacement", greedy=True,
                                seed=0).tolist() == [1, 2, 3]  # the top 3, the first index on ties


@pytest.mark.parametrize("path", ["host", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_children_are_the_top_scores_first_index_on_ties(path, dtype):
    """Greedy children (top_tokens: a partial sort on the host, argmax or a stable sort as tensors) are each row's k
    highest scores, the first index on ties, NaN above all: what a stable descending sort gives."""
    rows = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.3, -1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
                         [0.0, float("nan"), 5.0, float("-inf"), 5.0, float("nan")],
                         [float("-inf"), 1.0, float("-inf"), 0.5, 1.0, float("-inf")]], dtype=dtype)
    with tensor_path() if path == "tensor" else contextlib.nullcontext():
        for row in rows:
            for k in (1, 2, 3, 6):
                want = torch.sort(row, stable=True, descending=True).indices[:k].tolist()
                got = _core._draw_children(row, k, "with_replacement", greedy=True, seed=0).tolist()
                assert got == want, (row.tolist(), k)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
def test_top_children_are_the_top_then_one_draw(as_tensors):
    """siblings="top": q's k - 1 most probable tokens (the first index on ties), then one draw from q without them
    (chi-square at SIGNIFICANCE: one more test per path, counted in the module's family)."""
    q = torch.tensor([0.1, 0.3, 0.3, 0.2, 0.1], dtype=F64)
    last = []
    for seed in range(3000):
        children = _core._draw_children(q, 3, "top", greedy=False, seed=seed, as_tensors=as_tensors).tolist()
        assert children[:2] == [1, 2]
        last.append(children[2])
    counts = np.bincount(last, minlength=VOCAB)
    assert counts[1] == counts[2] == 0
    assert scipy.stats.chisquare(counts[[0, 3, 4]], 3000 * np.array([0.25, 0.5, 0.25])).pvalue > SIGNIFICANCE
    with pytest.raises(ValueError, match="top children are the draft's top 5 and one draw, but V = 5"):
        _core._draw_children(q, 6, "top", False, seed=0, as_tensors=as_tensors)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("siblings", ["with_replacement", "coupled", "without_replacement", "top"])
def test_a_level_of_nodes_draws_each_nodes_children_from_its_own_row(siblings, as_tensors):
    """The drafter draws a whole depth at once: rows of disjoint supports and counts 2, 1, 3 (a grown tree's level)
    and 2, 2, 2 (a fixed shape's). Each node's children come from its own row, in node order, distinct without
    replacement, the row's top tokens first for top; greedy: each row's top tokens. The rows of a batch's rows
    (groups, each with its generator) get the children they get alone."""
    q = torch.zeros(3, 9, dtype=F64)
    q[0, 0:3] = torch.tensor([0.5, 0.3, 0.2])
    q[1, 3:6] = torch.tensor([0.2, 0.7, 0.1])
    q[2, 6:9] = torch.tensor([0.3, 0.3, 0.4])
    for counts in ([2, 1, 3], [2, 2, 2]):
        for seed in range(50):
            drawn = _core._draw_children(q, counts, siblings, False, seed, as_tensors).tolist()
            assert len(drawn) == sum(counts)
            start = 0
            for row, k in enumerate(counts):
                children = drawn[start:start + k]
                start += k
                assert all(q[row, c] > 0 for c in children), (counts, row, children)
                if siblings in ("without_replacement", "top"):
                    assert len(set(children)) == k
                if siblings == "top":
                    assert children[:k - 1] == q[row].argsort(descending=True, stable=True)[:k - 1].tolist()
        top = {(2, 1, 3): [0, 1, 4, 8, 6, 7], (2, 2, 2): [0, 1, 4, 3, 8, 6]}[tuple(counts)]  # first index on ties
        assert _core._draw_children(q, counts, siblings, True, 0, as_tensors).tolist() == top
        for seed in range(20):  # a batch's rows: group g of the rows draws from its own generator, as alone
            together = _core._draw_children(q, counts, siblings, False, seed, as_tensors, groups=[1, 2]).tolist()
            first = _core._draw_children(q[:1], counts[:1], siblings, False, seed, as_tensors).tolist()
            rest = _core._draw_children(q[1:], counts[1:], siblings, False, seed + 1, as_tensors).tolist()
            assert together == first + rest, (counts, seed)
    with pytest.raises(ValueError, match="one row per count, got 3 rows for 2 counts"):
        _core._draw_children(q, [1, 1], siblings, False, 0, as_tensors)
    with pytest.raises(ValueError, match="every node's count must be >= 1, got 0"):
        _core._draw_children(q, [1, 0, 1], siblings, False, 0, as_tensors)
    with pytest.raises(ValueError, match="the groups hold 2 rows of q's 3"):
        _core._draw_children(q, [1, 1, 1], siblings, False, 0, as_tensors, groups=[1, 1])


def run_tree(shape, target, draft, config, siblings, draws, as_tensors, greedy=False, root=1, dtype=F64, sibling=None):
    """Emitted sequences of `draws` iterations, each with a freshly drawn tree (seed i); the verifier is given
    the target's logits and q in `dtype`. `sibling`: a sibling draft's logits table (tree.h's sibling drafts)."""
    parents = _core._tree_parents(shape)
    temperature, top_k, top_p = config
    q_table = standardized(draft, config)
    s_table = None if sibling is None else standardized(sibling, config)
    out = []
    for seed in range(draws):
        tokens = draw_tree(parents, q_table, draft, root, siblings, greedy, seed, as_tensors,
                           None if sibling is None else sibling if greedy else s_table)
        path, path_tokens, t, ranks, finite, _ = _core._verify_tree_seeded(
            parents, target[tokens].to(dtype), q_table[tokens].to(dtype), tokens, temperature, top_k, top_p, 1.0,
            siblings, [seed], as_tensors, sibling_q=None if sibling is None else s_table[tokens].to(dtype))[0]
        assert finite and len(ranks) == len(path) + 1
        assert path_tokens == tokens[path].tolist()
        assert [parents[node] for node in path] == ([0] + path)[:len(path)], "the path goes down the tree"
        out.append(tuple(path_tokens) + (t,))
    return out


STAT_CASES = [  # shape, config, siblings, table seed
    ([2, 2], (1.0, 0, 1.0), "with_replacement", 31),
    ([2, 2], (1.0, 0, 1.0), "without_replacement", 32),
    ([3, 1], (0.7, 2, 1.0), "with_replacement", 33),
    ([3, 1], (0.7, 2, 1.0), "without_replacement", 34),
    ([1, 3], (1.3, 0, 0.8), "without_replacement", 35),
    ([4], (1.0, 3, 1.0), "without_replacement", 36),  # more children than top-k leaves: the support runs out
    ([2, 1, 2], (1.0, 0, 1.0), "with_replacement", 37),
    ([1, 1, 1], (1.0, 0, 1.0), "with_replacement", 38),
    ([2, 2], (1.0, 0, 1.0), "top", 39),
    ([3, 1], (0.7, 2, 1.0), "top", 40),
    ([4], (1.0, 3, 1.0), "top", 41),  # the top 3 are q's whole support: the drawn child is arbitrary
    # coupled: tables where the second and third children's law given a rejection (tree.h's q_{j+1}) matters: with
    # q in its place the emitted law moves by 0.076 and 0.067 in total variation
    ([2, 2], (1.0, 0, 1.0), "coupled", 60),
    ([3], (1.0, 0, 1.0), "coupled", 46),
    ([3, 1], (0.7, 2, 1.0), "coupled", 43),
]


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("case", STAT_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_cpp_samples_the_exact_law(case, as_tensors):
    check_law(case, as_tensors, F64)


def test_tensor_path_in_float32_samples_the_exact_law():
    """What an accelerator gives the verifier: float32 logits and q (the coupled rule, whose coins divide by w and
    1 - w)."""
    check_law(([3], (1.0, 0, 1.0), "coupled", 46), True, torch.float32)


def check_law(case, as_tensors, dtype, sibling=False):
    shape, config, siblings, seed = case
    draws = 3000
    target, draft = tables(seed)
    s_logits = sibling_table(seed) if sibling else None
    law = iteration_law(standardized(target, config), standardized(draft, config), 1, shape, siblings,
                        None if s_logits is None else standardized(s_logits, config))
    counts = defaultdict(int)
    for seq in run_tree(shape, target, draft, config, siblings, draws, as_tensors, dtype=dtype, sibling=s_logits):
        counts[seq] += 1
    impossible = [seq for seq in counts if law.get(seq, 0.0) == 0.0]
    assert not impossible, f"sequences of probability zero were emitted: {impossible}"
    cells = sorted(law)
    expected, observed = pooled(np.array([law[c] for c in cells]) * draws, np.array([counts[c] for c in cells], float))
    expected *= observed.sum() / expected.sum()
    assert scipy.stats.chisquare(observed, expected).pvalue > SIGNIFICANCE


# ------------------------------------------------------------------------------------------------
# Sibling drafts (tree.h): children 1 .. k - 1 drawn from another law s, verified against it
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("siblings", ["with_replacement", "coupled"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [[2], [3], [2, 2], [3, 1], [2, 1, 2]], ids=str)
def test_sibling_draft_is_exact(shape, config, siblings):
    """Enumerated: with children 1 .. k - 1 from a third table (a sibling draft, with mass where the target has
    none), one iteration completed by the target is the target's own law."""
    seed = len(shape) * 10 + shape[0]
    target, draft = tables(seed)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    law = iteration_law(p_table, q_table, 1, shape, siblings, standardized(sibling_table(seed), config))
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    length = len(shape) + 1
    np.testing.assert_allclose(completed(law, p_table, length), target_law(p_table, 1, length), rtol=0, atol=1e-12)


def test_a_sibling_close_to_the_residual_is_accepted_more_and_its_share_has_a_closed_form():
    """One node of two children, with replacement: the second child is accepted with sum min(max(0, p - q),
    (1 - beta) s) (speculant.distillation.sibling_share, what distill's residual loss reports), enumerated; a
    sibling whose law is the residual norm(max(0, p - q)) takes every rejection of the first child (the node keeps
    everything), where q itself as the sibling takes less; the first child keeps beta whatever the sibling."""
    from speculant import distillation

    target, draft = tables(seed=5, masked=False)
    config = (1.0, 0, 1.0)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    residual = (p_table - q_table).clamp_min(0.0)
    s_logits = sibling_table(5)
    oracle = residual / residual.sum(-1, keepdim=True)
    for root in range(VOCAB):
        p, q = p_table[root], q_table[root]
        beta = float(torch.minimum(p, q).sum())
        shares = {}
        for name, s in (("sibling", standardized(s_logits, config)), ("oracle", oracle), ("q", q_table)):
            law = iteration_law(p_table, q_table, root, [2], "with_replacement", s)
            shares[name] = sum(prob for seq, prob in law.items() if len(seq) == 2) - beta
        closed = distillation.sibling_share(target[root:root + 1], draft[root:root + 1], s_logits[root:root + 1],
                                            *config)
        assert shares["sibling"] == pytest.approx(float(closed), abs=1e-6)  # float32 standardization there
        assert shares["oracle"] == pytest.approx(1.0 - beta, abs=1e-12)
        assert shares["oracle"] > shares["q"] + 1e-3


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
def test_sibling_children_come_from_the_sibling_row(as_tensors):
    """Disjoint supports: child 0 from q's row, children 1 .. from the sibling's (independent draws; the tensor path
    and the host kernel alike); at temperature 0 the draft's argmax then the sibling's top tokens; rules that do
    not draw independently are refused by name."""
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]], dtype=F64)
    s = torch.tensor([[0.0, 0.0, 0.3, 0.3, 0.4], [0.2, 0.0, 0.8, 0.0, 0.0]], dtype=F64)
    for siblings in ("with_replacement", "coupled"):
        for seed in range(40):
            drawn = _core._draw_children(q, [3, 2], siblings, False, seed, as_tensors, sibling_q=s).tolist()
            assert drawn[0] in (0, 1) and all(x in (2, 3, 4) for x in drawn[1:3])
            assert drawn[3] == 3 and drawn[4] in (0, 2)
        assert _core._draw_children(q, [3, 2], siblings, True, 0, as_tensors, sibling_q=s).tolist() == [0, 4, 2, 3, 2]
    for siblings in ("without_replacement", "top"):
        with pytest.raises(ValueError, match="a sibling draft's children are independent draws"):
            _core._draw_children(q, [2, 2], siblings, False, 0, as_tensors, sibling_q=s)
        with pytest.raises(ValueError, match="a sibling draft's children are independent draws"):
            _core._verify_tree_seeded([-1, 0, 0], q[[0, 0, 1]], q[[0, 0, 1]], torch.tensor([0, 1, 3]), 1.0, 0, 1.0,
                                      1.0, siblings, [0], as_tensors, sibling_q=s[[0, 0, 1]])
    with pytest.raises(ValueError, match="the siblings' law must be shaped as q"):
        _core._draw_children(q, [2, 2], "coupled", False, 0, as_tensors, sibling_q=s[:1])
    with pytest.raises(ValueError, match="sibling_q must be shaped as q"):
        _core._verify_tree_seeded([-1, 0, 0], q[[0, 0, 1]], q[[0, 0, 1]], torch.tensor([0, 1, 3]), 1.0, 0, 1.0, 1.0,
                                  "coupled", [0], as_tensors, sibling_q=s)


SIBLING_CASES = [  # shape, config, siblings, table seed
    ([2, 2], (1.0, 0, 1.0), "coupled", 60),
    ([3, 1], (0.7, 2, 1.0), "coupled", 43),
    ([3], (1.0, 0, 1.0), "with_replacement", 46),
]


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("case", SIBLING_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_cpp_samples_the_exact_law_with_a_sibling_draft(case, as_tensors):
    check_law(case, as_tensors, F64, sibling=True)


def degenerate_tables() -> dict:
    """Pairs (target, draft logits [V, V]) at the edges of the rules: a draft equal to the target (nothing is ever
    rejected: H_j is empty, w = 0), a draft sure of a token the target never emits (every child rejected), a target
    sure of one token under a uniform draft (w = q of that token), and both masked at random."""
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64)
    masked = target.clone()
    masked[:, 0] = -float("inf")
    sure_of_zero = torch.full((VOCAB, VOCAB), -float("inf"), dtype=F64)
    sure_of_zero[:, 0] = 0.0
    peaked = torch.full((VOCAB, VOCAB), -float("inf"), dtype=F64)
    peaked[:, 3] = 0.0
    holes = torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64)
    holes[torch.rand(VOCAB, VOCAB, generator=gen) < 0.4] = -float("inf")
    holes[:, 2] = 0.0  # every row keeps one token
    draft_holes = torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64)
    draft_holes[torch.rand(VOCAB, VOCAB, generator=gen) < 0.4] = -float("inf")
    draft_holes[:, 4] = 0.0
    return {"equal": (target, target), "draft-sure-of-a-masked-token": (masked, sure_of_zero),
            "target-sure": (peaked, torch.zeros(VOCAB, VOCAB, dtype=F64)), "holes": (holes, draft_holes)}


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("siblings", ["with_replacement", "without_replacement", "top", "coupled"])
@pytest.mark.parametrize("name", list(degenerate_tables()))
def test_degenerate_laws_emit_only_what_the_target_can(name, siblings, as_tensors):
    """At the edges every rule returns a finite verdict whose emitted tokens all have target probability > 0
    given their prefix; with the draft equal to the target every sampled first child is accepted (a fixed "top"
    child only with its probability), and under a target sure of one token only that token is emitted."""
    target, draft = degenerate_tables()[name]
    p_table = standardized(target, (1.0, 0, 1.0))
    for shape in ([2, 2], [3, 1], [4]):
        for seed in range(40):
            root = seed % VOCAB
            (path, path_tokens, t, ranks, finite, _), = run_one(shape, target, draft, siblings, root, seed, as_tensors)
            assert finite
            emitted, previous = path_tokens + [t], root
            for token in emitted:
                assert p_table[previous][token] > 0, (shape, seed, emitted)
                previous = token
            if name == "equal" and siblings != "top":  # a sampled first child of q = p: always accepted
                assert ranks[:len(path)] == [0] * len(path) and len(path) == len(shape)
            if name == "target-sure":
                assert set(emitted) == {3}


def run_one(shape, target, draft, siblings, root, seed, as_tensors):
    parents = _core._tree_parents(shape)
    q_table = standardized(draft, (1.0, 0, 1.0))
    tokens = draw_tree(parents, q_table, draft, root, siblings, False, seed, as_tensors)
    return _core._verify_tree_seeded(parents, target[tokens], q_table[tokens], tokens, 1.0, 0, 1.0, 1.0, siblings,
                                     [seed], as_tensors)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("siblings", ["with_replacement", "without_replacement", "top", "coupled"])
def test_a_batch_of_trees_gives_each_its_verdict_alone(siblings, temperature, as_tensors):
    """verify_drafts: trees of other shapes (widest 3, 2, 1, the root alone) in one batch, on the tensor path one
    pass and one read for all of them; each row's verdict is the one it gets alone with its seed, and a row whose
    target logits hold a NaN is the only one flagged."""
    target, draft = tables(seed=43)
    q_table = standardized(draft, (max(temperature, 1.0), 0, 1.0))
    trees, seeds = [], []
    for i, shape in enumerate([[3, 1], [2, 2], [1, 1, 1], [], [1, 3]]):
        parents = _core._tree_parents(shape)
        tokens = draw_tree(parents, q_table, draft, 1 + i % 3, siblings, temperature == 0, seed=i)
        trees.append((parents, target[tokens], q_table[tokens], tokens))
        seeds.append(100 + i)
    for rounds in range(20):
        seeds = [seed + 1000 for seed in seeds]
        together = _core._verify_trees_seeded(trees, temperature, 0, 1.0, 1.0, siblings, seeds, as_tensors)
        alone = [_core._verify_trees_seeded([tree], temperature, 0, 1.0, 1.0, siblings, [seed], as_tensors)[0]
                 for tree, seed in zip(trees, seeds)]
        assert together == alone
    parents, logits, q, tokens = trees[1]
    logits = logits.clone()
    logits[2, 3] = float("nan")
    flagged = _core._verify_trees_seeded([trees[0], (parents, logits, q, tokens), trees[2]], temperature, 0, 1.0,
                                         1.0, siblings, [1, 2, 3], as_tensors)
    assert [verdict[4] for verdict in flagged] == [True, False, True]


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
@pytest.mark.parametrize("shape", [[2, 2], [3, 1], [1, 1, 1], [4, 2]], ids=str)
def test_greedy_is_the_longest_argmax_agreement(shape, as_tensors):
    target, draft = tables(seed=41, masked=False)
    for root in range(VOCAB):
        parents = _core._tree_parents(shape)
        tokens = draw_tree(parents, None, draft, root, "top", True, seed=0)
        (path, path_tokens, t, ranks, _, _), = _core._verify_tree_seeded(
            parents, target[tokens], standardized(draft, (0.0, 0, 1.0))[tokens], tokens, 0.0, 0, 1.0, 1.0, "top",
            [0], as_tensors)
        want, node = [], 0
        children = defaultdict(list)
        for n, parent in enumerate(parents[1:], start=1):
            children[parent].append(n)
        while True:
            best = int(target[tokens[node]].argmax())
            match = [c for c in children[node] if tokens[c] == best]
            if not match:
                break
            node = match[0]
            want.append(best)
        assert path_tokens == want and t == int(target[tokens[node]].argmax())


@pytest.mark.parametrize("as_tensors", [False, True], ids=["cpu-kernel", "tensor-path"])
def test_lenience_is_refused_and_non_finite_logits_are_flagged(as_tensors):
    parents = _core._tree_parents([2])
    target, draft = tables(seed=5)
    tokens = torch.tensor([1, 2, 3])
    q = standardized(draft, (1.0, 0, 1.0))[tokens]
    with pytest.raises(ValueError, match="lenience must be 1 with a tree"):
        _core._verify_tree_seeded(parents, target[tokens], q, tokens, 1.0, 0, 1.0, 0.5, "with_replacement", [0],
                                  as_tensors)
    logits = target[tokens].clone()
    logits[2, 1] = float("nan")  # a leaf's row: never read unless reached, still checked
    assert _core._verify_tree_seeded(parents, logits, q, tokens, 1.0, 0, 1.0, 1.0, "top", [0],
                                     as_tensors)[0][4] is False
