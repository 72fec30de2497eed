"""Traversal verification of a token tree (cpp/math/tree.h: Weng et al., NeurIPS 2025; verification="block" on a
tree, the block rule on a chain).

* Exact, by enumeration (float64, no sampling): on tree_laws' Markov tables the law of what one iteration emits,
  drafting included, completed by the target, equals the target's own law, for every shape of the tree tests, at
  T = 0.7, 1 and 1.3, with top-k and with top-p, siblings with and without replacement and "top", and a sibling
  draft (support/traversal_laws.py writes the rule out). The planted defect (t from the plain residual
  norm(max(0, p - q)) where a non-root node stops) is caught by the same comparison. On chains the enumerated law
  is block verification's (support/block_laws.py), and the engine's verdicts are the block rule's, uniform for
  uniform, chain form against tree form, on the host and on the tensor path.
* Statistical: the engine's verdicts for trees drawn as the drafter draws them, on the CPU kernels and the tensor
  path (CUDA when a GPU is there), against the enumerated law by Pearson's chi-square at SIGNIFICANCE = 1e-3 with
  fixed seeds (8 tests on the CPU); the same samples reject the defect's law where it shows (power). Whole
  generations of SpeculativeDecoder(tree=..., verification="block") against the target's exact law of 6 tokens
  (2 tests). 10 tests: at most 1% family-wise false failures for a fresh choice of seeds (Bonferroni).
* Temperature 0: the token rule's verdicts. The expected drafts kept equal speculant.analysis'
  traversal_expected_tokens, an independent implementation, and are at least the token rule's on these tables.
* Refusals name what is wrong: siblings "coupled", grown trees.
"""

import contextlib
from collections import defaultdict

import numpy as np
import pytest
import scipy.stats
import torch

import speculant
from speculant import _core
from speculant.testing import tensor_path
from support import block_laws, markov, traversal_laws, tree_laws
from support.chisquare import SIGNIFICANCE, pooled
from support.engine_checks import table_model
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples
from support.tree_laws import F64, VOCAB, completed, draw_tree, sibling_table, standardized, tables, target_law

pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

SHAPES = [[1], [3], [1, 1, 1], [2, 2], [3, 1], [1, 3], [2, 1, 2]]
CONFIGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 0, 1.0), (1.0, 2, 1.0), (1.0, 0, 0.8)]  # temperature, top_k, top_p
SIBLINGS = ["with_replacement", "without_replacement", "top"]
DEFECT_SHOWS = [[1, 1, 1], [2, 2], [1, 3], [2, 1, 2]]  # a non-root node that branches or stops at 0 < r < 1


def gap(law: dict, p_table, shape) -> float:
    length = len(shape) + 1
    return float(np.abs(completed(law, p_table, length) - target_law(p_table, 1, length)).max())


@pytest.mark.parametrize("siblings", SIBLINGS)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_traversal_law_is_the_targets(shape, config, siblings):
    target, draft = tables(20 + len(shape))
    p_table, q_table = standardized(target, config), standardized(draft, config)
    law = traversal_laws.iteration_law(p_table, q_table, 1, shape, siblings)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert gap(law, p_table, shape) < 1e-12
    if shape in DEFECT_SHOWS and config == CONFIGS[0]:
        defect = traversal_laws.iteration_law(p_table, q_table, 1, shape, siblings, plain_residual=True)
        assert gap(defect, p_table, shape) > 1e-4, "the enumeration must catch the plain residual"


@pytest.mark.parametrize("shape", [[2], [3, 1], [2, 1, 2]], ids=str)
def test_traversal_with_a_sibling_draft_is_exact(shape):
    target, draft = tables(30 + len(shape))
    config = CONFIGS[0]
    p_table, q_table = standardized(target, config), standardized(draft, config)
    s_table = standardized(sibling_table(30 + len(shape)), config)
    law = traversal_laws.iteration_law(p_table, q_table, 1, shape, "with_replacement", s_table)
    assert gap(law, p_table, shape) < 1e-12


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_a_chain_traversed_is_the_block_rule(gamma):
    target, draft = tables(40 + gamma)
    config = (1.0, 0, 1.0)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    traversal = traversal_laws.iteration_law(p_table, q_table, 1, [1] * gamma, "with_replacement")
    block = block_laws.iteration_law(p_table, q_table, 1, gamma)
    assert set(traversal) == set(block)
    assert max(abs(traversal[s] - block[s]) for s in block) < 1e-12


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
def test_a_chain_as_a_tree_gets_the_block_verdicts_uniform_for_uniform(as_tensors):
    """The chain [1] * gamma in its own form (the block rule's entry) and as a tree (traversal's): the same verdicts
    for the same seeds, at every draw."""
    target, draft = tables(45)
    config = (1.0, 0, 1.0)
    q_table = standardized(draft, config)
    gamma = 4
    contexts = block_laws.draft_chains(q_table, gamma, 300, 45)
    seeds = list(range(len(contexts)))
    rows = [(target[c], q_table[c[:-1]], torch.tensor(c[1:])) for c in contexts]
    chains = _core._verify_rows_seeded(rows, *config, 1.0, seeds=seeds, as_tensors=as_tensors, verification="block")
    parents = _core._tree_parents([1] * gamma)
    trees = [(parents, target[c], q_table[c], torch.tensor(c)) for c in contexts]
    as_trees = _core._verify_trees_seeded(trees, *config, 1.0, "with_replacement", seeds, as_tensors,
                                          verification="block")
    assert [(n, t) for n, t, *_ in chains] == [(len(path), t) for path, _, t, *_ in as_trees]
    assert len({n for n, *_ in chains}) == gamma + 1, "every stopping place occurs"


def engine_counts(shape, config, siblings, seed, draws, as_tensors, verification="block", device="cpu") -> dict:
    """{emitted: count} of `draws` iterations, each tree drawn as the drafter draws it (seed i), all verified in
    one call."""
    target, draft = tables(seed)
    q_table = standardized(draft, config)
    parents = _core._tree_parents(shape)
    trees = []
    for i in range(draws):
        tokens = draw_tree(parents, q_table, draft, 1, siblings, False, i)
        trees.append((parents, target[tokens].to(device), q_table[tokens].to(device), tokens.to(device)))
    out = _core._verify_trees_seeded(trees, *config, 1.0, siblings, list(range(draws)), as_tensors,
                                     verification=verification)
    counts = defaultdict(int)
    for (path, path_tokens, t, ranks, finite, _) in out:
        assert finite and len(ranks) == len(path) + 1
        assert [parents[node] for node in path] == ([0] + path)[:len(path)], "the path goes down the tree"
        counts[tuple(path_tokens) + (t,)] += 1
    return counts


def chi_square(law: dict, counts: dict) -> float:
    assert all(law.get(c, 0.0) > 0 for c in counts), "sequences of probability zero were emitted"
    cells = sorted(set(law) | set(counts))
    expected, observed = pooled(np.array([law.get(c, 0.0) for c in cells]) * sum(counts.values()),
                                np.array([counts.get(c, 0) for c in cells], float))
    expected *= observed.sum() / expected.sum()
    return scipy.stats.chisquare(observed, expected).pvalue


STAT_CASES = [  # shape, config, siblings, table seed, whether the defect's law must be rejected (its TV: 0.06-0.21)
    ([2, 2], (0.7, 2, 1.0), "without_replacement", 20, True),
    ([1, 3], (0.7, 2, 1.0), "top", 20, True),
    ([2, 1, 2], (0.7, 2, 1.0), "with_replacement", 42, True),
    ([3, 1], (1.3, 0, 0.8), "without_replacement", 22, False),
]


@pytest.mark.parametrize("path", ["host", "tensors", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", STAT_CASES, ids=lambda c: f"{c[0]}-{c[2]}")
def test_engine_samples_the_traversal_law(case, path):
    shape, config, siblings, seed, power = case
    draws = 6000
    target, draft = tables(seed)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    counts = engine_counts(shape, config, siblings, seed, draws, path != "host",
                           device="cuda" if path == "cuda" else "cpu")
    law = traversal_laws.iteration_law(p_table, q_table, 1, shape, siblings)
    assert chi_square(law, counts) > SIGNIFICANCE
    if power:
        defect = traversal_laws.iteration_law(p_table, q_table, 1, shape, siblings, plain_residual=True)
        pvalue = chi_square(defect, counts)
        assert pvalue < SIGNIFICANCE, f"the plain residual must be rejected, p = {pvalue:.3g}"


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
@pytest.mark.parametrize("siblings", SIBLINGS)
def test_temperature_zero_gives_the_token_rules_verdicts(siblings, as_tensors):
    config = (0.0, 0, 1.0)
    block = engine_counts([2, 2], config, siblings, 50, 200, as_tensors)
    token = engine_counts([2, 2], config, siblings, 50, 200, as_tensors, verification="token")
    assert block == token


@pytest.mark.parametrize("siblings", ["with_replacement", "without_replacement"])
@pytest.mark.parametrize("shape", [[1, 1, 1], [2, 2], [3, 1], [2, 1, 2]], ids=str)
def test_what_it_keeps_is_what_analysis_predicts_and_at_least_the_token_rules(shape, siblings):
    """Context-free tables (every row the same law), where speculant.analysis' per-depth laws apply: the drafts one
    iteration keeps in expectation, from this module's enumeration and from analysis.traversal_expected_tokens
    (written apart), agree; and traversal keeps at least what the token rule's tree verification keeps here."""
    gen = torch.Generator().manual_seed(len(shape) * 7 + len(siblings))
    p_row = torch.softmax(torch.randn(VOCAB, generator=gen, dtype=F64) * 1.5, -1)
    q_row = torch.softmax(torch.randn(VOCAB, generator=gen, dtype=F64) * 1.5, -1)
    p_table, q_table = p_row.expand(VOCAB, VOCAB), q_row.expand(VOCAB, VOCAB)
    traversal = traversal_laws.iteration_law(p_table, q_table, 1, shape, siblings)
    token = tree_laws.iteration_law(p_table, q_table, 1, shape, siblings)
    kept = sum(prob * (len(seq) - 1) for seq, prob in traversal.items())
    depth = len(shape)
    predicted = speculant.analysis.traversal_expected_tokens(shape, p_row.expand(depth + 1, VOCAB),
                                                             q_row.expand(depth, VOCAB), siblings=siblings)
    assert kept + 1 == pytest.approx(predicted, abs=1e-12)
    assert kept >= sum(prob * (len(seq) - 1) for seq, prob in token.items()) - 1e-12


@pytest.mark.parametrize("path", ["host", "tensors"])
def test_generations_follow_the_target_law(path):
    target, draft = markov.target_and_draft(LAW_VOCAB, 71, mask_prob=0.1, independent_draft=False)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), tree=[2, 1],
                                           siblings="without_replacement", temperature=1.0, verification="block")
    with tensor_path() if path == "tensors" else contextlib.nullcontext():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=7100)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, 1.0, 0, 1.0)
    assert_law(samples, law, f"traversal, {path}")


def test_refusals_name_what_is_wrong():
    target, draft = markov.target_and_draft(LAW_VOCAB, 72)
    t, d = table_model(target), table_model(draft)
    with pytest.raises(ValueError, match="siblings='coupled' \\(the default\\) takes verification='token'"):
        speculant.SpeculativeDecoder(t, d, tree=[2, 1], verification="block")
    with pytest.raises(ValueError, match="on a grown tree \\(budget=\\)"):
        speculant.SpeculativeDecoder(t, d, tree=speculant.DynamicTree(budget=4), siblings="with_replacement",
                                     verification="block")
    tokens = torch.tensor([1, 2, 3])
    q = torch.full((3, VOCAB), 1.0 / VOCAB, dtype=F64)
    with pytest.raises(ValueError, match="siblings 'coupled' take verification='token'"):
        _core._verify_tree_seeded([-1, 0, 0], q, q, tokens, 1.0, 0, 1.0, 1.0, "coupled", [0], verification="block")
    decoder = speculant.SpeculativeDecoder(t, d, tree=[2, 1], siblings="top", verification="block")
    assert decoder.verification == "block"


def test_sweep_runs_traversal_beside_the_token_rule():
    target, draft = markov.target_and_draft(6, 3, draft_scale=1.0)
    pair = table_model(target), table_model(draft)
    frame = speculant.sweep(*pair, [[1, 2]], trees=[[2, 1]], siblings=["top", "coupled"],
                            verifications=["token", "block"], max_new_tokens=12, seed=5, repeats=1, progress=False)
    assert sorted(zip(frame.siblings, frame.verification)) == [("coupled", "token"), ("top", "block"),
                                                               ("top", "token")]
    for row in frame.itertuples():  # the expectation of the rule that ran, on its drafts (test_tree_expectations.py)
        ran, other = ((row.block_expected_tokens, row.token_expected_tokens) if row.verification == "block"
                      else (row.token_expected_tokens, row.block_expected_tokens))
        assert 1.0 < ran <= 3.0 and np.isnan(other)
