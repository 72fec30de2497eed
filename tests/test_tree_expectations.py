"""What a token tree keeps in expectation on its drafts (cpp/math/tree.h: expected_kept; Verdict::kept_in_expectation,
and Stats' token_expected_tokens or block_expected_tokens for the rule that ran on trees).

* Exact, by enumeration (float64, no sampling): on tree_laws' Markov tables every way the drafter can draw a tree
  is verified by the engine, and the engine's expectations, weighted by each tree's chance of being drawn, equal the
  drafts kept under the enumerated law of one iteration (support/tree_laws.py for the token rule,
  support/traversal_laws.py for traversal), for every sibling rule each verification takes, a sibling draft, top-k,
  top-p and T = 0.7, 1 and 1.3, on the host kernels and on the tensor path (and CUDA where a GPU is there). The
  other rule's exact value differs from each case's by more than 0.01 (the comparison tells the rules apart).
* Temperature 0: the expectation is the drafts kept.
* Whole generations: the drafts kept minus the expectation of the rule that ran has mean 0 (a z-test at
  SIGNIFICANCE = 1e-3 with fixed seeds, each rule on the host and the tensor path: 4 tests), and the other rule's
  column is NaN.
"""

import contextlib
import math
from collections import defaultdict

import numpy as np
import pytest
import scipy.stats
import torch

import speculant
from speculant import _core
from speculant.testing import tensor_path
from support import markov, traversal_laws, tree_laws
from support.engine_checks import table_model
from support.tree_laws import F64, VOCAB, sibling_table, standardized, tables, top_order

pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

SIGNIFICANCE = 1e-3


def drawn_trees(parents, q_table, root: int, siblings: str, s_table=None) -> list:
    """[(tokens, chance)]: every tree of node tokens the drafter can draw after `root` and its probability. Each
    node's children come from q at its token: independent draws (children 1 .. from s_table's row where given),
    without replacement, or top's k - 1 most probable tokens and one draw of q without them; once q's support is
    used up, a filler token 0."""
    children = defaultdict(list)
    for node, parent in enumerate(parents[1:], start=1):
        children[parent].append(node)

    def law(node: int, tokens: list) -> dict:
        kids = children[parents[node]]
        rank, q = kids.index(node), np.asarray(q_table[tokens[parents[node]]], float).copy()
        if siblings in ("with_replacement", "coupled"):
            if rank > 0 and s_table is not None:
                q = np.asarray(s_table[tokens[parents[node]]], float).copy()
        elif siblings == "without_replacement":
            q[[tokens[k] for k in kids[:rank]]] = 0.0
        else:  # top
            ranked = top_order(q)
            if rank < len(kids) - 1:
                return {ranked[rank]: 1.0}
            q[ranked[:rank]] = 0.0
        if q.sum() <= 0:
            return {0: 1.0}
        return {v: float(q[v] / q.sum()) for v in range(VOCAB) if q[v] > 0}

    out = []

    def fill(node: int, tokens: list, chance: float):
        if node == len(parents):
            out.append((torch.tensor(tokens), chance))
            return
        for token, p in law(node, tokens).items():
            fill(node + 1, tokens + [token], chance * p)

    fill(1, [root], 1.0)
    return out


def kept(law: dict) -> float:
    """The drafts kept in expectation under an iteration's law of emitted tokens (accepted path + t)."""
    return sum(p * (len(seq) - 1) for seq, p in law.items())


def engine_expectation(shape, config, siblings, verification, path, seed, root=1, sibling=False):
    """The engine's expectations over every drawable tree, weighted by their chances (path: "host", "tensors" or
    "cuda"); and the exact value of the rule that ran and of the other one (the token rule's with replacement
    where traversal is not defined)."""
    target, draft = tables(seed)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    s_table = standardized(sibling_table(seed), config) if sibling else None
    parents = _core._tree_parents(shape)
    trees = drawn_trees(parents, q_table, root, siblings, s_table)
    device = "cuda" if path == "cuda" else "cpu"
    rows = [(parents, target[tokens].to(device), q_table[tokens].to(device), tokens.to(device)) for tokens, _ in trees]
    sibling_qs = [s_table[tokens].to(device) for tokens, _ in trees] if sibling else []
    out = _core._verify_trees_seeded(rows, *config, 1.0, siblings, list(range(len(rows))), path != "host",
                                     sibling_qs, verification=verification)
    assert all(verdict[4] for verdict in out)
    value = sum(chance * verdict[5] for (_, chance), verdict in zip(trees, out))
    token = kept(tree_laws.iteration_law(p_table, q_table, root, shape, siblings, s_table))
    if siblings == "coupled":
        other = kept(tree_laws.iteration_law(p_table, q_table, root, shape, "with_replacement", s_table))
    else:
        other = kept(traversal_laws.iteration_law(p_table, q_table, root, shape, siblings, s_table))
    return (value, token, other) if verification == "token" else (value, other, token)


CASES = [  # shape, config, siblings, verification, sibling draft, table seed: the two rules differ by 0.02-0.08
    ([2, 1], (0.7, 0, 1.0), "with_replacement", "token", False, 24),
    ([1, 3], (1.0, 0, 1.0), "without_replacement", "token", False, 20),
    ([2, 2], (1.3, 0, 0.8), "top", "token", False, 23),
    ([3, 1], (1.0, 3, 1.0), "coupled", "token", False, 20),
    ([2, 1], (1.3, 0, 0.8), "coupled", "token", True, 24),
    ([2, 1], (0.7, 0, 1.0), "with_replacement", "block", False, 24),
    ([1, 3], (1.0, 4, 1.0), "without_replacement", "block", False, 20),
    ([2, 2], (1.3, 0, 0.8), "top", "block", False, 23),
    ([2, 1], (1.0, 0, 1.0), "with_replacement", "block", True, 20),
]

@pytest.mark.parametrize("path", ["host", "tensors", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}-{c[0]}-{c[2]}{'-sibling' if c[4] else ''}")
def test_the_expectation_averages_to_the_enumerated_law(case, path):
    shape, config, siblings, verification, sibling, seed = case
    value, exact, other = engine_expectation(shape, config, siblings, verification, path, seed, sibling=sibling)
    assert value == pytest.approx(exact, abs=1e-9)
    assert abs(other - exact) > 0.01, "the case must tell the rules apart"


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_at_temperature_zero_the_expectation_is_what_was_kept(verification, as_tensors):
    target, draft = tables(30, masked=False)
    parents = _core._tree_parents([2, 2])
    rows = []
    for seed in range(12):
        tokens = tree_laws.draw_tree(parents, None, draft, seed % VOCAB, "top", True, seed)
        rows.append((parents, target[tokens], standardized(draft, (0.0, 0, 1.0))[tokens], tokens))
    out = _core._verify_trees_seeded(rows, 0.0, 0, 1.0, 1.0, "top", list(range(len(rows))), as_tensors,
                                     verification=verification)
    assert any(path for path, *_ in out)
    assert all(verdict[5] == len(verdict[0]) for verdict in out)


def generations(verification: str, path: str, count: int = 200):
    target, draft = markov.target_and_draft(6, 83, mask_prob=0.1, independent_draft=True)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), tree=[2, 1, 1],
                                           siblings="without_replacement", temperature=1.0,
                                           verification=verification)
    with tensor_path() if path == "tensors" else contextlib.nullcontext():
        return [decoder.generate([0], max_new_tokens=24, seed=9500 + i).stats for i in range(count)]


@pytest.mark.parametrize("path", ["host", "tensors"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_the_expectation_of_the_rule_that_ran_is_unbiased(verification, path):
    stats = generations(verification, path)
    assert all(s.predicted_iterations == s.iterations for s in stats)
    other = "token" if verification == "block" else "block"
    assert all(math.isnan(getattr(s, f"{other}_expected_tokens")) for s in stats)
    gaps = np.array([s.accepted_tokens - getattr(s, f"{verification}_kept_sum") for s in stats])
    z = gaps.mean() / (gaps.std(ddof=1) / math.sqrt(len(gaps)))
    assert abs(z) < scipy.stats.norm.ppf(1 - SIGNIFICANCE / 2), (verification, z)
    assert 0 < sum(s.accepted_tokens for s in stats) < sum(s.drafted_tokens for s in stats)
