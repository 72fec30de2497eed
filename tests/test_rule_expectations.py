"""Each chain rule's expected tokens per target call on the drafts a run verified (Stats.token_expected_tokens and
Stats.block_expected_tokens; cpp/math/speculative.h: expected_kept).

* The ratios a verdict carries are p_i(x_i) / q_i(x_i) at every draft position, on the host kernels and on the tensor
  path (at T = 0: +inf where the test keeps the draft, else 0), and the expectation is the rule's formula over them.
* Unbiased: over generations of the engine on Markov tables, the drafts kept minus the expectation of the rule that
  ran has mean 0 (a z-test at SIGNIFICANCE = 1e-3, fixed seeds, for each rule on the host and the tensor path: 4
  tests). The planted defect, the other rule's expectation put in the place of the rule that ran, is rejected by
  the same samples (power).
* On context-free tables the pooled expectation agrees with speculant.analysis' exact values; sweeps carry both
  columns.
"""

import contextlib
import math

import numpy as np
import pytest
import scipy.stats
import torch

import speculant
from speculant import _core
from speculant.testing import tensor_path
from support import markov
from support.tree_laws import F64, VOCAB, standardized, tables

pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

SIGNIFICANCE = 1e-3
CONFIGS = [(0.7, 0, 1.0), (1.0, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8)]


def expected_kept(ratios, lenience: float, block: bool) -> float:
    """The reference: sum_i P(n >= i | x_1..i), Algorithm 1's product of min(1, ratio / l) or block's running r_i."""
    kept, r = 0.0, 1.0
    for ratio in ratios:
        r = 0.0 if r == 0 else min(1.0, r * ratio) if block else r * min(1.0, ratio / lenience)
        kept += r
    return kept


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_a_verdict_carries_each_positions_ratio(config, as_tensors):
    target, draft = tables(71)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    gen = torch.Generator().manual_seed(3)
    for case in range(20):
        gamma = 1 + case % 4
        chain = [1]
        for _ in range(gamma):
            chain.append(int(torch.multinomial(q_table[chain[-1]], 1, generator=gen)))
        row = (target[chain], q_table[chain[:-1]], torch.tensor(chain[1:]))
        for verification in ("token", "block"):
            *_, ratios = _core._verify_rows_seeded([row], *config, 1.0, seeds=[case], as_tensors=as_tensors,
                                                    verification=verification)[0]
            want = [float(p_table[a, b] / q_table[a, b]) for a, b in zip(chain, chain[1:])]
            np.testing.assert_allclose(ratios, want, rtol=1e-5)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
def test_at_temperature_zero_a_ratio_says_whether_the_test_keeps(as_tensors):
    target, draft = tables(72)
    for chain in ([1, 2, 3, 4], [1, 4, 4, 2], [2, 0, 1, 3]):
        q = torch.nn.functional.one_hot(torch.tensor(chain[1:]), VOCAB).to(F64)
        row = (target[chain[:-1] + [chain[-1]]], q, torch.tensor(chain[1:]))
        *_, ratios = _core._verify_rows_seeded([row], 0.0, 0, 1.0, 1.0, seeds=[0], as_tensors=as_tensors)[0]
        kept = [int(target[a].argmax()) == b for a, b in zip(chain, chain[1:])]
        assert ratios == [math.inf if k else 0.0 for k in kept]


def generations(verification: str, path: str, count: int = 300, temperature: float = 1.0):
    target, draft = markov.target_and_draft(6, 81, mask_prob=0.1, independent_draft=True)
    decoder = speculant.SpeculativeDecoder(speculant.load(markov.script(target, "cached")),
                                           speculant.load(markov.script(draft, "cached")), gamma=5,
                                           temperature=temperature, verification=verification)
    with tensor_path() if path == "tensors" else contextlib.nullcontext():
        return [decoder.generate([0], max_new_tokens=24, seed=9000 + i).stats for i in range(count)]


def z_score(stats, rule: str) -> float:
    """The mean over generations of (drafts kept - the rule's expectation), over its standard error."""
    gaps = np.array([s.accepted_tokens - getattr(s, f"{rule}_kept_sum") for s in stats])
    return gaps.mean() / (gaps.std(ddof=1) / math.sqrt(len(gaps)))


@pytest.mark.parametrize("path", ["host", "tensors"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_the_expectation_of_the_rule_that_ran_is_unbiased(verification, path):
    stats = generations(verification, path)
    assert all(s.predicted_iterations == s.iterations for s in stats)
    bound = scipy.stats.norm.ppf(1 - SIGNIFICANCE / 2)
    assert abs(z_score(stats, verification)) < bound, verification
    other = "token" if verification == "block" else "block"
    assert abs(z_score(stats, other)) > bound, f"the {other} rule's expectation must be rejected for {verification}"


@pytest.mark.parametrize("path", ["host", "tensors"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_at_temperature_zero_the_expectations_are_the_drafts_kept(verification, path):
    """Greedy verification has no coins: each rule's expectation is what it keeps, the two rules agree, and a
    rejected position is not revived by a later draft that matches the argmax (0 * inf)."""
    stats = generations(verification, path, count=20, temperature=0.0)
    assert any(s.accepted_tokens < s.drafted_tokens for s in stats)
    for s in stats:
        assert s.token_kept_sum == s.block_kept_sum == s.accepted_tokens


def test_context_free_tables_meet_analysis():
    """Every row the same law: the pooled expectations converge to speculant.analysis' exact values (the iterations'
    draft laws do not depend on the context), here within 2% (long runs: the last iterations draft fewer)."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)
    q = p.flip(0)
    target = speculant.load(markov.script(markov.constant_table(p), "cached"))
    draft = speculant.load(markov.script(markov.constant_table(q), "cached"))
    gamma = 4
    out = {}
    for verification in ("token", "block"):
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=1.0, verification=verification)
        results = [decoder.generate([0], max_new_tokens=600, seed=i) for i in range(8)]
        out[verification] = speculant.timing.rule_expectations(results)
    laws = (p.expand(gamma + 1, 4).numpy(), q.expand(gamma, 4).numpy())
    exact = {f"{rule}_expected_tokens": getattr(speculant.analysis, f"{rule}_expected_tokens")(*laws)
             for rule in ("token", "block")}
    for ran in out.values():
        for rule, value in ran.items():
            assert value == pytest.approx(exact[rule], rel=0.02), (rule, value, exact[rule])
    assert len(exact) == 2 and all(len(ran) == 2 for ran in out.values())
    assert exact["block_expected_tokens"] > exact["token_expected_tokens"] * 1.1


def test_a_sweep_has_both_columns():
    target, draft = markov.target_and_draft(6, 82)
    rows = speculant.sweep(speculant.load(markov.script(target, "cached")),
                           speculant.load(markov.script(draft, "cached")), [[0]], gammas=[3],
                           verifications=["token", "block"], max_new_tokens=16, repeats=1, progress=False)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    assert len(rows) == 2
    for row in rows:
        assert 1.0 <= row["token_expected_tokens"] <= 4.0
        assert row["token_expected_tokens"] <= row["block_expected_tokens"] + 1e-9
