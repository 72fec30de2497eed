"""Each exact verifier's expected tokens from per-position laws (speculant.analysis, research/verifiers.py).

* By hand: g = 1 (block = token = 1 + beta), a 2-token chain of g = 2 with E[r_2] written out, a node of two
  children with and without replacement.
* Exact comparisons on 20 seeded random chains: block >= token, strictly on some; equal where every row has
  p = q or at g = 1. A chain's traversal is block verification and its token tree is Algorithm 1 (1e-12).
* Trees: traversal >= recursive rejection sampling on seeded instances (V = 4), and the recursion against a
  brute force that runs the post-order stopping process over every draft assignment.
* Refusals name the parameter. Everything is exact and deterministic: nothing is sampled.
"""

import itertools

import numpy as np
import pytest
import torch

from speculant import analysis
from speculant.decoding.trees import Tree, tree_parents
from speculant.research import verifiers

SIBLINGS = ("with_replacement", "without_replacement")


def random_laws(rng, rows: int, vocab: int) -> np.ndarray:
    """Rows of a Dirichlet(1/2), some entries zeroed (every row keeps its first token)."""
    laws = rng.dirichlet(np.full(vocab, 0.5), size=rows)
    laws[rng.random(laws.shape) < 0.15] = 0.0
    laws[:, 0] += 1e-3
    return laws / laws.sum(axis=1, keepdims=True)


def random_chains(count: int = 20):
    rng = np.random.default_rng(0)
    for _ in range(count):
        vocab, g = int(rng.choice([3, 5])), int(rng.integers(1, 6))
        yield random_laws(rng, g + 1, vocab), random_laws(rng, g, vocab)


# ------------------------------------------------------------------------------------------------
# By hand
# ------------------------------------------------------------------------------------------------


def test_one_draft_is_one_plus_beta_for_both_rules():
    p, q = np.array([[0.5, 0.5], [1.0, 0.0]]), np.array([[0.8, 0.2]])
    assert analysis.token_expected_tokens(p, q) == pytest.approx(1.7, abs=1e-15)  # beta = 0.5 + 0.2
    assert analysis.block_expected_tokens(p, q) == pytest.approx(1.7, abs=1e-15)


def test_two_token_chain_by_hand():
    # Position 1: ratios p/q are 0.5 (x = 0, q = 0.8) and 3 (x = 1, q = 0.2), so r_1 is 0.5 or 1 and
    # E[r_1] = 0.8 * 0.5 + 0.2 * 1 = 0.6 = beta_1. Position 2: ratios 3 (q = 0.2) and 0.5 (q = 0.8):
    #   r_1 = 0.5 (0.8): r_2 = min(1, 1.5) = 1 (0.2) or 0.25 (0.8), mean 0.4;
    #   r_1 = 1 (0.2):   r_2 = 1 (0.2) or 0.5 (0.8), mean 0.6;
    # E[r_2] = 0.8 * 0.4 + 0.2 * 0.6 = 0.44, block = 1 + 0.6 + 0.44 = 2.04. Token: beta_2 = 0.2 + 0.4 = 0.6,
    # 1 + 0.6 + 0.6 * 0.6 = 1.96.
    p = np.array([[0.4, 0.6], [0.6, 0.4], [1.0, 0.0]])
    q = np.array([[0.8, 0.2], [0.2, 0.8]])
    expected, ratios = analysis.block_expected_tokens(p, q, return_ratios=True)
    assert expected == pytest.approx(2.04, abs=1e-14)
    assert ratios == pytest.approx([0.6, 0.44], abs=1e-14)
    assert analysis.token_expected_tokens(p, q) == pytest.approx(1.96, abs=1e-14)
    assert analysis.chain_optimum(p, q) == expected
    assert analysis.traversal_expected_tokens([1, 1], p, q) == pytest.approx(2.04, abs=1e-14)


def test_two_children_by_hand():
    # Root law p = (0.4, 0.6), q = (0.8, 0.2): child 1 is kept with m_1 = 0.6. With replacement W_2 =
    # max(p - q, 0) / 0.4 = (0, 1), m_2 = 0.2: 1 + 0.6 + 0.4 * 0.2 = 1.68. Without replacement child 2 is the
    # other token: after x_1 = 0 (0.8, kept with 0.5) it is token 1, kept with 1: 1 + 0.6 + 0.8 * 0.5 = 2.
    # At the root W_1 = p has mass 1, so traversal and rejection sampling agree there.
    p, q = np.array([[0.4, 0.6], [0.5, 0.5]]), np.array([[0.8, 0.2]])
    for rule in (analysis.traversal_expected_tokens, analysis.token_tree_expected_tokens):
        assert rule([2], p, q, "with_replacement") == pytest.approx(1.68, abs=1e-14)
        assert rule([2], p, q, "without_replacement") == pytest.approx(2.0, abs=1e-14)


# ------------------------------------------------------------------------------------------------
# Chains
# ------------------------------------------------------------------------------------------------


def test_block_keeps_at_least_the_token_rule():
    gains = []
    for p, q in random_chains():
        block, token = analysis.block_expected_tokens(p, q), analysis.token_expected_tokens(p, q)
        assert isinstance(block, float)
        assert block >= token - 1e-12
        gains.append(block - token)
    assert max(gains) > 1e-3


def test_block_equals_token_where_p_is_q_or_at_one_draft():
    for p, q in random_chains():
        equal = p[:-1].copy()
        g = q.shape[0]
        assert analysis.block_expected_tokens(p, equal) == pytest.approx(g + 1.0, abs=1e-12)
        assert analysis.token_expected_tokens(p, equal) == pytest.approx(g + 1.0, abs=1e-12)
        one_p, one_q = p[:2], q[:1]
        assert analysis.block_expected_tokens(one_p, one_q) == pytest.approx(
            analysis.token_expected_tokens(one_p, one_q), abs=1e-14)


def test_chain_traversal_is_block_and_chain_token_tree_is_algorithm_1():
    for p, q in random_chains():
        shape = [1] * q.shape[0]
        for siblings in SIBLINGS:
            assert analysis.traversal_expected_tokens(shape, p, q, siblings) == pytest.approx(
                analysis.block_expected_tokens(p, q), abs=1e-12)
            assert analysis.token_tree_expected_tokens(shape, p, q, siblings) == pytest.approx(
                analysis.token_expected_tokens(p, q), abs=1e-12)
        assert analysis.traversal_expected_tokens(shape, p, p[:-1]) == pytest.approx(len(shape) + 1.0, abs=1e-12)


def test_torch_input_gives_the_same_value():
    p, q = next(random_chains(1))
    assert analysis.block_expected_tokens(torch.tensor(p), torch.tensor(q)) == analysis.block_expected_tokens(p, q)


# ------------------------------------------------------------------------------------------------
# Trees
# ------------------------------------------------------------------------------------------------


def test_traversal_keeps_at_least_rejection_sampling():
    rng = np.random.default_rng(0)
    for shape in ([2, 1], [2, 2], [3], [1, 2]):
        for _ in range(5):
            p, q = random_laws(rng, len(shape) + 1, 4), random_laws(rng, len(shape), 4)
            for siblings in SIBLINGS:
                traversal = analysis.traversal_expected_tokens(shape, p, q, siblings)
                token_tree = analysis.token_tree_expected_tokens(shape, p, q, siblings)
                assert traversal >= token_tree - 1e-12, (shape, siblings, p, q, traversal, token_tree)


def child_law(q_row: np.ndarray, used: list, replace: bool) -> np.ndarray:
    law = q_row.copy()
    if not replace:
        law[used] = 0.0
        law = law / law.sum() if law.sum() > 0 else np.zeros_like(law)
    return law


def post_order_tokens(parents, kids, depth, tokens, p, q, replace) -> float:
    """E[tokens] for fixed drafts: the weights r and stopping chances h, then the first stop in post-order."""
    r, h, order = [1.0] + [0.0] * (len(parents) - 1), [1.0] * len(parents), []

    def visit(v):
        measure, used = r[v] * p[depth[v]], []
        for c in kids[v]:
            law = child_law(q[depth[v]], used, replace)
            r[c] = min(1.0, measure[tokens[c]] / law[tokens[c]]) if law.any() and measure[tokens[c]] > 0 else 0.0
            m = np.minimum(measure, law).sum()
            measure = np.maximum(measure - law, 0.0) / (1.0 - m) if m < 1.0 else p[depth[v]]
            used.append(tokens[c])
            visit(c)
        h[v] = measure.sum() if kids[v] else r[v]
        order.append(v)

    visit(0)
    h[0], alive, kept = 1.0, 1.0, 0.0
    for v in order:
        kept, alive = kept + alive * h[v] * depth[v], alive * (1.0 - h[v])
    return 1.0 + kept


def brute_traversal(tree, p, q, replace: bool) -> float:
    """traversal_expected_tokens over every assignment of tokens to the drafts, without the recursion."""
    parents = tree_parents(tree)
    depth, kids = Tree(parents).node_depth, [[] for _ in parents]
    for v in range(1, len(parents)):
        kids[parents[v]].append(v)
    total = 0.0
    for drafts in itertools.product(range(p.shape[1]), repeat=len(parents) - 1):
        tokens, chance = (None,) + drafts, 1.0
        for v in range(len(parents)):
            for j, c in enumerate(kids[v]):
                law = child_law(q[depth[v]], [tokens[u] for u in kids[v][:j]], replace)
                chance *= law[tokens[c]] if law.any() else float(tokens[c] == 0)  # a filler: token 0
        if chance > 0.0:
            total += chance * post_order_tokens(parents, kids, depth, tokens, p, q, replace)
    return total


def test_a_filler_adds_nothing():
    # q's support is 2 tokens, so the third child drawn without replacement is a filler (never accepted).
    p, q = np.array([[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]]), np.array([[0.5, 0.5, 0.0]])
    for rule in (analysis.traversal_expected_tokens, analysis.token_tree_expected_tokens):
        assert rule([3], p, q, "without_replacement") == pytest.approx(1.5, abs=1e-14)  # 1 + 0.2 + 0.3
        assert rule([3], p, q, "without_replacement") == rule([2], p, q, "without_replacement")
    assert brute_traversal([3, 1], np.vstack([p, p[1:]]), np.vstack([q, p[1:]]), False) == pytest.approx(
        analysis.traversal_expected_tokens([3, 1], np.vstack([p, p[1:]]), np.vstack([q, p[1:]]),
                                           "without_replacement"), abs=1e-12)


@pytest.mark.parametrize("tree", [[2, 1], [1, 2], [3], [-1, 0, 0, 1, 1, 2]])
def test_traversal_recursion_matches_the_post_order_process(tree):
    rng = np.random.default_rng(1)
    d = Tree(tree).depth
    p, q = random_laws(rng, d + 1, 3), random_laws(rng, d, 3)
    for siblings in SIBLINGS:
        assert analysis.traversal_expected_tokens(tree, p, q, siblings) == pytest.approx(
            brute_traversal(tree, p, q, siblings == "with_replacement"), abs=1e-12)


# ------------------------------------------------------------------------------------------------
# Refusals and re-exports
# ------------------------------------------------------------------------------------------------


def test_bad_input_names_the_parameter():
    p, q = np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[0.8, 0.2]])
    for rule in (analysis.token_expected_tokens, analysis.block_expected_tokens, analysis.chain_optimum):
        with pytest.raises(ValueError, match="^p must be 2-D"):
            rule(p[0], q)
        with pytest.raises(ValueError, match="^q must have 1 rows"):
            rule(p, np.vstack([q, q]))
        with pytest.raises(ValueError, match="^q must have p's vocab"):
            rule(p, np.array([[0.5, 0.25, 0.25]]))
        with pytest.raises(ValueError, match="^q must hold finite probabilities >= 0"):
            rule(p, np.array([[1.2, -0.2]]))
        with pytest.raises(ValueError, match=r"^p\[1\] sums to"):
            rule(np.array([[0.5, 0.5], [0.5, 0.4]]), q)
    with pytest.raises(ValueError, match="^p must have 3 rows"):
        analysis.traversal_expected_tokens([2, 1], p, np.vstack([q, q]))
    with pytest.raises(ValueError, match="^tree"):
        analysis.traversal_expected_tokens([0], p, q)


@pytest.mark.parametrize("siblings", ["coupled", "top", "bogus", None])
def test_unknown_siblings_are_refused(siblings):
    p, q = np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[0.8, 0.2]])
    with pytest.raises(ValueError, match="^traversal verification takes siblings 'with_replacement' or "
                                         "'without_replacement'"):
        analysis.traversal_expected_tokens([2], p, q, siblings)
    with pytest.raises(ValueError, match="siblings"):
        analysis.token_tree_expected_tokens([2], p, q, siblings)


def test_analysis_re_exports_the_verifiers():
    for name in ("token_expected_tokens", "block_expected_tokens", "traversal_expected_tokens",
                 "token_tree_expected_tokens", "chain_optimum"):
        assert getattr(analysis, name) is getattr(verifiers, name)


def test_float32_laws_are_taken_and_renormalized():
    """A float32 softmax's rows sum to 1 only within its rounding: taken, renormalized in float64."""
    gen = torch.Generator().manual_seed(4)
    p64, q64 = (torch.softmax(torch.randn(n, 7, generator=gen, dtype=torch.float64), -1) for n in (5, 4))
    for rule in (analysis.block_expected_tokens, analysis.token_expected_tokens):
        assert rule(p64.float(), q64.float()) == pytest.approx(rule(p64, q64), abs=1e-6)
