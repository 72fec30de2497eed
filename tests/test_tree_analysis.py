"""The theory of token trees (speculant.analysis, after Sequoia's positional acceptance): expected tokens per target
call, the walltime improvement, the best tree for a budget of drafts, and the acceptance table from counts.

* Exact (fractions.Fraction, no rounding): the chain [1] * gamma gives Equation (1) for every alpha, gamma
  (alpha = 1 included); small trees against hand computations; a shape and its breadth-first parents agree;
  best_tree against brute force over every ordered tree of at most 7 drafts (random tables with denominators of
  20, so distinct trees differ by far more than float rounding); the chain is best when only rank 0 is accepted.
* Floats: tree_speedup of a chain is Theorem 3.8 (walltime_improvement) to 1e-12; optimal_tree against brute
  force over every tree of at most 6 drafts, with non-monotone per-width verification costs.
* Monte Carlo (fixed seeds): the mean tokens of simulated walks against tree_expected_tokens, a two-sided z-test
  at SIGNIFICANCE = 1e-3 each (standard error from the sample); 2 tests, at most 0.2% family-wise false failures
  for a fresh choice of seeds (Bonferroni).
"""

from fractions import Fraction

import numpy as np
import pytest
import scipy.stats

from speculant import _core, analysis
from support.chisquare import SIGNIFICANCE



# ------------------------------------------------------------------------------------------------
# Trees written out: ordered trees as nested children lists, evaluated without the library
# ------------------------------------------------------------------------------------------------


def forests(n: int):
    """Every ordered forest of n nodes: a list of trees, a tree being the list of its children's trees."""
    if n == 0:
        yield []
        return
    for first in range(1, n + 1):  # the first tree's size
        for children in forests(first - 1):
            for rest in forests(n - first):
                yield [children] + rest


def nested_value(children, table, depth: int = 0):
    """sum over the nodes below of prod_path table[depth][rank], by recursion; None if the table lacks a cell."""
    total = 0
    for rank, grandchildren in enumerate(children):
        if depth >= len(table) or rank >= len(table[depth]):
            return None
        below = nested_value(grandchildren, table, depth + 1)
        if below is None:
            return None
        total += table[depth][rank] * (1 + below)
    return total


def nested_depth(children) -> int:
    return 1 + max(nested_depth(c) for c in children) if children else 0


def breadth_first(children) -> list:
    parents, queue = [-1], [(0, children)]
    for node, kids in queue:  # the list grows as it is walked
        for kid in kids:
            parents.append(node)
            queue.append((len(parents) - 1, kid))
    return parents


def fraction_table(rng, depths: int, most_ranks: int = 4, denominator: int = 20) -> list:
    """Rows of random probabilities k / 20 (some 0), each row summing to at most 1 (the rest: all rejected)."""
    table = []
    for _ in range(depths):
        ranks = int(rng.integers(1, most_ranks + 1))
        counts = rng.multinomial(denominator, np.full(ranks + 1, 1.0 / (ranks + 1)))
        table.append([Fraction(int(k), denominator) for k in counts[:ranks]])
    return table


# ------------------------------------------------------------------------------------------------
# Exact: chains, hand computations, forms
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [Fraction(0), Fraction(1, 3), Fraction(7, 10), Fraction(99, 100), Fraction(1)])
@pytest.mark.parametrize("gamma", [1, 2, 5, 9])
def test_chain_is_equation_1_exactly(alpha, gamma):
    expected = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    for acceptance in (alpha, [alpha], [[alpha]] * gamma, [[alpha, Fraction(0)]] * (gamma + 2)):
        for tree in ([1] * gamma, analysis.tree_parents([1] * gamma)):
            value = analysis.tree_expected_tokens(tree, acceptance)
            assert isinstance(value, Fraction) and value == expected
    assert analysis.tree_expected_tokens([1] * gamma, float(alpha)) == pytest.approx(
        analysis.expected_tokens(float(alpha), gamma), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.5])
def test_chain_speedup_is_theorem_3_8(alpha, gamma, c):
    assert analysis.tree_speedup([1] * gamma, alpha, c) == pytest.approx(
        analysis.walltime_improvement(alpha, gamma, c), rel=1e-12)
    assert analysis.tree_expected_tokens([1] * gamma, 1.0) == gamma + 1.0  # the alpha = 1 limit, exactly


def test_small_trees_by_hand():
    third, sixth = Fraction(1, 3), Fraction(1, 6)
    # [2, 1]: two children (0.6, 0.2), each with one child (0.5): 1 + 0.8 + (0.6 + 0.2) 0.5
    table = [[Fraction(3, 5), Fraction(1, 5)], [Fraction(1, 2)]]
    assert analysis.tree_expected_tokens([2, 1], table) == Fraction(11, 5)
    assert analysis.tree_expected_tokens([-1, 0, 0, 1, 2], table) == Fraction(11, 5)
    # root: ranks 1/2, 1/4; node 1: ranks 1/3, 1/6; node 2: rank 1/3
    table = [[Fraction(1, 2), Fraction(1, 4)], [third, sixth]]
    assert analysis.tree_expected_tokens([-1, 0, 0, 1, 1, 2], table) == \
        1 + Fraction(1, 2) + Fraction(1, 4) + Fraction(1, 2) * third + Fraction(1, 2) * sixth + Fraction(1, 4) * third
    # independent siblings: rank j with alpha (1 - alpha)^j
    alpha = Fraction(3, 5)
    assert analysis.tree_expected_tokens([2], alpha) == 1 + alpha + alpha * (1 - alpha)
    assert analysis.tree_expected_tokens([3, 1], alpha) == 1 + (1 - (1 - alpha) ** 3) * (1 + alpha)
    # one sequence by rank, the same at every depth
    assert analysis.tree_expected_tokens([2, 2], [Fraction(1, 2), Fraction(1, 4)]) == 1 + Fraction(3, 4) + \
        Fraction(9, 16)
    assert analysis.tree_expected_tokens([-1], 0.5) == 1.0 and analysis.tree_size([-1]) == 0
    assert isinstance(analysis.tree_expected_tokens([2, 1], [[0.6, 0.2], [0.5]]), float)
    assert analysis.tree_expected_tokens([2, 1], np.array([[0.6, 0.2], [0.5, 0.0]])) == pytest.approx(2.2)


@pytest.mark.parametrize("shape", [[1], [3], [1, 1, 1, 1], [2, 1], [3, 2, 1], [1, 4, 2], [2, 2, 2, 2]])
def test_shapes_and_their_parents(shape):
    parents = analysis.tree_parents(shape)
    assert parents == list(_core._tree_parents(shape))  # cpp/math/tree.h's Tree::from_shape
    assert analysis.tree_parents(parents) == parents
    assert analysis.tree_size(shape) == analysis.tree_size(parents) == len(parents) - 1
    assert analysis.tree_depth(shape) == analysis.tree_depth(parents) == len(shape)
    table = fraction_table(np.random.default_rng(sum(shape)), len(shape), most_ranks=4)
    table = [row + [Fraction(0)] * (4 - len(row)) for row in table]
    assert analysis.tree_expected_tokens(shape, table) == analysis.tree_expected_tokens(parents, table)


def test_speedup_costs():
    table = [[0.6, 0.2], [0.5]]  # [2, 1]: E = 2.2, depth 2, width 5
    linear = lambda width: 1.0 + 0.1 * (width - 1)  # noqa: E731
    assert analysis.tree_speedup([2, 1], table, 0.1, linear) == pytest.approx(2.2 / (0.2 + 1.4))
    assert analysis.tree_speedup([2, 1], table, 0.1, {5: 1.4}) == pytest.approx(2.2 / 1.6)
    assert analysis.tree_speedup([2, 1], table, 0.1, [1.0, 1.1, 1.2, 1.3, 1.4]) == pytest.approx(2.2 / 1.6)
    assert analysis.tree_speedup([2, 1], table, 0.1, np.array([1.0, 1.1, 1.2, 1.3, 1.4])) == pytest.approx(2.2 / 1.6)
    assert analysis.tree_speedup([2, 1], table, 0.1) == pytest.approx(2.2 / 1.2)
    assert analysis.tree_speedup([2, 1], table, 0.1, draft_calls=4) == pytest.approx(2.2 / 1.4)
    assert analysis.tree_speedup([-1], 0.7, 0.1) == 1.0  # no drafts: the target alone


# ------------------------------------------------------------------------------------------------
# The best tree: brute force
# ------------------------------------------------------------------------------------------------


def test_best_tree_against_brute_force():
    rng = np.random.default_rng(2024)
    trees = {n: list(forests(n)) for n in range(8)}  # 1 + 1 + 2 + 5 + 14 + 42 + 132 + 429 ordered trees
    for trial in range(12):
        table = fraction_table(rng, depths=int(rng.integers(1, 5)))
        for budget in range(8):
            best = max(v for n in range(budget + 1) for t in trees[n]
                       if (v := nested_value(t, table)) is not None)
            choice = analysis.best_tree(budget, table)
            assert choice.expected_tokens == 1 + best, (trial, budget, table)
            assert analysis.tree_size(choice.tree) <= budget
            # every tree's value, through the library, as written out
            for t in trees[min(budget, 4)]:
                value = nested_value(t, table)
                if value is not None:
                    assert analysis.tree_expected_tokens(breadth_first(t), table) == 1 + value
        # a depth limit below the table's
        limited = max(v for n in range(7) for t in trees[n]
                      if nested_depth(t) <= 1 and (v := nested_value(t, table)) is not None)
        assert analysis.best_tree(6, table, max_depth=1).expected_tokens == 1 + limited
    # one row for every depth (depth up to the budget), and the independent-siblings alpha
    for acceptance in ([Fraction(1, 2), Fraction(1, 5), Fraction(1, 10)], Fraction(3, 5)):
        for budget in range(7):
            deep = [[Fraction(acceptance) * (1 - Fraction(acceptance)) ** j for j in range(budget)]
                    if isinstance(acceptance, Fraction) else acceptance] * budget
            best = max(v for n in range(budget + 1) for t in trees[n] if (v := nested_value(t, deep)) is not None)
            assert analysis.best_tree(budget, acceptance).expected_tokens == 1 + best


def test_best_tree_returns_the_fewest_drafts_and_the_chain_when_only_rank_0_is_accepted():
    rng = np.random.default_rng(7)
    for depths in (1, 3, 6):
        rows = [[float(a), 0.0, 0.0] for a in rng.uniform(0.05, 1.0, depths)]
        for budget in range(9):
            n = min(budget, depths)
            choice = analysis.best_tree(budget, rows)
            assert choice.tree == [-1] + list(range(n))  # the chain of n drafts, nothing of zero value
            assert choice.expected_tokens == pytest.approx(1 + sum(np.prod([r[0] for r in rows[:t]])
                                                                   for t in range(1, n + 1)))
    assert analysis.best_tree(5, [0.8, 0.0]).tree == [-1, 0, 1, 2, 3, 4]
    assert analysis.best_tree(5, [[0.8], [0.0], [0.9]]).tree == [-1, 0]  # nothing reaches past a dead depth
    assert analysis.best_tree(0, 0.9) == ([-1], 1.0)


def test_best_tree_shape_against_brute_force():
    def shapes(budget, size=0, level=1, prefix=()):
        if prefix:
            yield list(prefix)
        for k in range(1, (budget - size) // level + 1):
            yield from shapes(budget, size + level * k, level * k, prefix + (k,))

    rng = np.random.default_rng(5)
    for _ in range(6):
        table = fraction_table(rng, depths=4)
        table = [row + [Fraction(0)] * (8 - len(row)) for row in table]  # every k <= budget fits
        for budget in range(1, 9):
            values = [analysis.tree_expected_tokens(s, table) for s in shapes(budget) if len(s) <= 4]
            choice = analysis.best_tree_shape(budget, table)
            assert choice.expected_tokens == max(values) and analysis.tree_size(choice.tree) <= budget
            assert choice.expected_tokens <= analysis.best_tree(budget, table).expected_tokens  # shapes are trees


def test_optimal_tree_against_brute_force():
    rng = np.random.default_rng(11)
    trees = [t for n in range(7) for t in forests(n)]
    for trial in range(8):
        table = [[float(v) for v in row] for row in fraction_table(rng, depths=3)]
        c = float(rng.uniform(0.0, 0.3))
        costs = list(rng.uniform(0.8, 2.0, 7))  # widths 1 .. 7, not monotone
        best = max(analysis.tree_speedup(breadth_first(t), table, c, costs) for t in trees
                   if nested_value(t, table) is not None)
        result = analysis.optimal_tree(6, table, c, costs)
        assert result.speedup == pytest.approx(best, rel=1e-12), (trial, table, c, costs)
        assert result.speedup == analysis.tree_speedup(result.tree, table, c, costs)
        assert analysis.tree_size(result.tree) <= 6


@pytest.mark.parametrize("alpha,c", [(0.6, 0.02), (0.8, 0.05), (0.9, 0.1), (0.95, 0.01)])
def test_optimal_tree_of_chains_is_section_3_5(alpha, c):
    """With one rank (only chains fit) and verify_cost 1, optimal_tree is §3.5's optimal gamma."""
    result = analysis.optimal_tree(64, [alpha], c)
    gamma = analysis.optimal_gamma(alpha, c, max_gamma=64)
    assert result.tree == [-1] + list(range(gamma))
    assert result.speedup == pytest.approx(analysis.walltime_improvement(alpha, gamma, c), rel=1e-12)
    assert analysis.optimal_tree(8, 0.5, 2.0).tree == [-1]  # alpha < c: no drafts (Corollary 3.9)


# ------------------------------------------------------------------------------------------------
# Monte Carlo
# ------------------------------------------------------------------------------------------------


def walk(parents, accept, n: int, rng) -> np.ndarray:
    """Tokens of n simulated verifications: from the root, accept(node, depth, k, uniforms) gives the rank accepted
    among the node's k children (k: none), until a node accepts none; tokens = accepted drafts + 1."""
    children = [[] for _ in parents]
    depth = [0] * len(parents)
    for v in range(1, len(parents)):
        children[parents[v]].append(v)
        depth[v] = depth[parents[v]] + 1
    node, alive, tokens = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool), np.ones(n)
    for _ in range(max(depth)):
        nxt = node.copy()
        moved = np.zeros(n, dtype=bool)
        for v, kids in enumerate(children):
            at = np.flatnonzero(alive & (node == v))
            if len(kids) == 0 or len(at) == 0:
                continue
            rank = accept(depth[v], len(kids), rng.random((len(at), len(kids))))
            ok = rank < len(kids)
            nxt[at[ok]] = np.asarray(kids)[rank[ok]]
            moved[at[ok]] = True
        tokens += moved
        alive &= moved
        node = nxt
    return tokens


def z_test(tokens: np.ndarray, expected: float) -> None:
    z = (tokens.mean() - expected) / (tokens.std(ddof=1) / np.sqrt(len(tokens)))
    assert abs(z) < scipy.stats.norm.isf(SIGNIFICANCE / 2), (tokens.mean(), expected, z)


def test_monte_carlo_of_positional_acceptance():
    """The categorical of each verified node (rank j with acceptance[depth][j], the rest: all rejected)."""
    table = [[0.5, 0.2, 0.1], [0.6, 0.15], [0.7]]
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 5, 6]  # ranks 0..2 at the root, two under rank 0, one under rank 1

    def categorical(depth, k, uniforms):
        edges = np.cumsum(table[depth][:k])
        return np.searchsorted(edges, uniforms[:, 0], side="right")  # k when every child is rejected

    tokens = walk(parents, categorical, 200_000, np.random.default_rng(0))
    z_test(tokens, analysis.tree_expected_tokens(parents, table))


def test_monte_carlo_of_independent_siblings():
    """A scalar alpha: each child's test accepts with probability alpha whatever its earlier siblings did."""
    alpha, parents = 0.55, analysis.tree_parents([3, 2, 1])

    def first_success(depth, k, uniforms):
        success = uniforms < alpha
        return np.where(success.any(axis=1), success.argmax(axis=1), k)

    tokens = walk(parents, first_success, 200_000, np.random.default_rng(1))
    z_test(tokens, analysis.tree_expected_tokens(parents, alpha))


# ------------------------------------------------------------------------------------------------
# Counts and validation
# ------------------------------------------------------------------------------------------------


def test_acceptance_from_counts():
    table = analysis.acceptance_from_counts([[50, 20, 10], [30, 6]], [100, np.int64(60)])
    assert table == [[0.5, 0.2, 0.1], [0.5, 0.1]]
    assert analysis.acceptance_from_counts(np.array([[3.0, 1.0]]), np.array([8])) == [[0.375, 0.125]]
    assert analysis.tree_expected_tokens([3, 2], table) == pytest.approx(1 + 0.8 + 0.8 * 0.6)
    # offered: each rank over the visits that had it (a given tree: nodes of one depth with 3, 2 or 1 children)
    offered = analysis.acceptance_from_counts([[50, 20, 10], [30, 0]], [100, 60], [[100, 80, 40], [60, 0]])
    assert offered == [[0.5, 0.25, 0.25], [0.5]]  # depth 1's rank 1 was never offered: no estimate, row ends
    assert analysis.acceptance_from_counts([[50, 20]], [100], np.array([[100, 100]])) == [[0.5, 0.2]]


@pytest.mark.parametrize("accepted,visits,match", [
    ([[5, 6]], [10], r"accepted\[0\] sums to 11 > visits\[0\] = 10"),
    ([[1]], [0], r"visits\[0\] = 0"),
    ([[-1]], [3], r"accepted\[0\]\[0\] must be a count"),
    ([[1.5]], [3], r"accepted\[0\]\[0\] must be a count"),
    ([[1]], [float("nan")], r"visits\[0\] must be a count"),
    ([[1], [1]], [3], "visits must hold one count per depth"),
    ([[]], [3], r"accepted\[0\] is empty"),
    ([], [], "accepted must be a non-empty table"),
])
def test_acceptance_from_counts_validates(accepted, visits, match):
    with pytest.raises(ValueError, match=match):
        analysis.acceptance_from_counts(accepted, visits)


@pytest.mark.parametrize("offered,match", [
    ([[10, 11]], r"offered\[0\]\[1\] = 11 must lie between accepted\[0\]\[1\] = 2 and visits\[0\] = 10"),
    ([[10, 1]], r"offered\[0\]\[1\] = 1 must lie between accepted\[0\]\[1\] = 2"),
    ([[10]], "offered must be a table of counts shaped like accepted"),
    ([[10, -1]], r"offered\[0\]\[1\] must be a count"),
    ("10", "offered must be a table"),
])
def test_acceptance_from_counts_validates_offered(offered, match):
    with pytest.raises(ValueError, match=match):
        analysis.acceptance_from_counts([[5, 2]], [10], offered)


NAN = float("nan")


@pytest.mark.parametrize("call,match", [
    (lambda: analysis.tree_expected_tokens([1], -0.1), r"acceptance \(a scalar alpha\) must be a probability"),
    (lambda: analysis.tree_expected_tokens([1], NAN), r"acceptance \(a scalar alpha\) must be a probability"),
    (lambda: analysis.tree_expected_tokens([1], True), "acceptance"),
    (lambda: analysis.tree_expected_tokens([1], [[1.2]]), r"acceptance\[0\]\[0\] must be a probability in \[0, 1\]"),
    (lambda: analysis.tree_expected_tokens([1], [0.5, NAN]), r"acceptance\[1\] must be a probability"),
    (lambda: analysis.tree_expected_tokens([2], [[0.6, 0.5]]), r"acceptance\[0\] sums to 1.1 > 1"),
    (lambda: analysis.tree_expected_tokens([2], [0.6, 0.4 + 2e-9]), r"acceptance sums to .* > 1"),
    (lambda: analysis.tree_expected_tokens([1], []), "acceptance must be a scalar alpha"),
    (lambda: analysis.tree_expected_tokens([1], [[]]), r"acceptance\[0\] is empty"),
    (lambda: analysis.tree_expected_tokens([1], [0.5, [0.5]]), "not a mixture"),
    (lambda: analysis.tree_expected_tokens([], 0.5), r"tree is empty.*\[-1\] is the root alone"),
    (lambda: analysis.tree_expected_tokens([2, 0], 0.5), r"tree\[1\] = 0"),
    (lambda: analysis.tree_expected_tokens([1.0], 0.5), "tree must be a shape"),
    (lambda: analysis.tree_expected_tokens([-1, 1], 0.5), "tree node 1 has parent 1"),
    (lambda: analysis.tree_expected_tokens([-1, 0, 1, 0], 0.5), "parents are nondecreasing"),
    (lambda: analysis.tree_expected_tokens([1, 1, 1], [[0.5], [0.5]]), r"rows for depths 0 \.\. 1, but the tree has "
                                                                       "depth 3"),
    (lambda: analysis.tree_expected_tokens([3], [[0.5, 0.2]]), r"depth 0 has 3 children, but acceptance\[0\] gives "
                                                               "only 2 ranks"),
    (lambda: analysis.tree_expected_tokens([-1, 0, 1, 1], [0.5]), "depth 1 has 2 children, but acceptance gives"),
    (lambda: analysis.tree_parents([64] * 4), "more than"),
    (lambda: analysis.tree_speedup([1], 0.5, -0.1), "c must be a finite number >= 0"),
    (lambda: analysis.tree_speedup([1], 0.5, NAN), "c must be a finite number >= 0"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, draft_calls=-1), "draft_calls must be"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, lambda w: 0.0), r"verify_cost\(2\) must be a finite time > 0"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, {1: 1.0}), "verify_cost has no entry for width 2"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, [1.0]), "verify_cost gives widths 1 .. 1"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, [1.0, NAN]), r"verify_cost\[2 - 1\] must be a finite time"),
    (lambda: analysis.tree_speedup([1], 0.5, 0.1, "fast"), "verify_cost must be None"),
    (lambda: analysis.best_tree(-1, 0.5), "budget must be an integer >= 0"),
    (lambda: analysis.best_tree(2.5, 0.5), "budget must be an integer >= 0"),
    (lambda: analysis.best_tree(True, 0.5), "budget must be an integer >= 0"),
    (lambda: analysis.best_tree(3, [[0.5]], max_depth=2),
     r"max_depth = 2, but acceptance has rows for depths 0 \.\. 0"),
    (lambda: analysis.best_tree(3, 0.5, max_depth=-1), "max_depth must be an integer >= 0"),
    (lambda: analysis.best_tree(3, [[0.5, 0.6]]), r"acceptance\[0\] sums to"),
    (lambda: analysis.best_tree_shape(0, 0.5), "budget must be an integer >= 1"),
    (lambda: analysis.optimal_tree(3, 0.5, NAN), "c must be"),
    (lambda: analysis.optimal_tree(3, 0.5, 0.1, [1.0, 1.0]),
     r"verify_cost gives widths 1 \.\. 2 .*but width 3 is needed"),
])
def test_validation_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_budget_of_64_beats_the_best_shape_and_chain():
    """A budget of 64 with the scalar model (every depth and rank open): well under a second each."""
    choice = analysis.best_tree(64, 0.7)
    assert analysis.tree_size(choice.tree) == 64
    assert choice.expected_tokens > analysis.best_tree_shape(64, 0.7).expected_tokens > analysis.expected_tokens(0.7, 8)
    result = analysis.optimal_tree(64, [[0.7, 0.15, 0.05]] * 8, 0.05, lambda w: 1.0 + 0.01 * w)
    assert result.speedup >= analysis.tree_speedup([1] * 8, 0.7, 0.05, lambda w: 1.0 + 0.01 * w)
