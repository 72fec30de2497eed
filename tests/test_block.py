"""Block verification of a chain (cpp/math/tree.h: Sun et al., ICLR 2025, Algorithm 2; verification="block").

* Exact, by enumeration (float64, no sampling): on tree_laws' Markov tables the law of what one iteration emits,
  drafting included, completed by the target to gamma + 1 tokens, equals the target's own law, for gamma = 1 .. 5
  at T = 0.7, 1 and 1.3, with top-k and with top-p (support/block_laws.py writes the rule out). The planted defect
  (t from Algorithm 1's residual norm(max(0, p - q)) where the block stops past its first position) is caught by
  the same comparison wherever it can show (gamma >= 2, no top-p). The block keeps at least the token rule's drafts in expectation, and more on these tables.
* Statistical: the engine's verdicts, for chains drawn from the draft, on the CPU kernels and on the tensor path
  (what accelerators run, forced on CPU; rows of two lengths in one call), against the enumerated law by Pearson's
  chi-square at SIGNIFICANCE = 1e-3 with fixed seeds (6 tests); the same samples must reject the defective law
  (power). Whole generations of the engine against the target's exact law of 6 tokens (support/laws.py: 2 windows
  each): host and tensor path, a prompt-lookup draft (a point-mass q) and a hierarchy's bottom level (8 tests
  more): 14 tests, at most 1.4% family-wise false failures for a fresh choice of seeds (Bonferroni).
* Temperature 0: the same tokens as the token rule. Refusals name what is wrong. The rule reaches every entry
  point: speculant.sweep's verifications axis, testing.check_distribution, the demo.
"""

import contextlib
import io
import itertools
from collections import defaultdict

import numpy as np
import pytest
import scipy.stats
import torch

import speculant
from speculant import _core
from speculant.testing import tensor_path
from support import block_laws, markov
from support.chisquare import SIGNIFICANCE, pooled
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples
from support.tree_laws import F64, VOCAB, completed, standardized, tables, target_law

pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

CONFIGS = [(0.7, 0, 1.0), (1.0, 0, 1.0), (1.3, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8)]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("config", CONFIGS, ids=[f"T{c[0]}-k{c[1]}-p{c[2]}" for c in CONFIGS])
def test_block_law_is_the_targets(config, gamma):
    target, draft = tables(10 + gamma)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    law = block_laws.iteration_law(p_table, q_table, 1, gamma)
    np.testing.assert_allclose(completed(law, p_table, gamma + 1), target_law(p_table, 1, gamma + 1), rtol=0,
                               atol=1e-12)
    # the planted defect, which needs a stop past the first position at 0 < r < 1 (top-p 0.8 on 5 tokens truncates
    # some of these tables to where r is 0 or 1)
    if gamma >= 2 and config[2] == 1.0:
        defect = block_laws.iteration_law(p_table, q_table, 1, gamma, plain_residual=True)
        gap = np.abs(completed(defect, p_table, gamma + 1) - target_law(p_table, 1, gamma + 1)).max()
        assert gap > 1e-4, "the enumeration must catch the plain residual"


@pytest.mark.parametrize("config", CONFIGS[:3], ids=["T0.7", "T1", "T1.3"])
def test_block_keeps_at_least_the_token_rules_drafts(config):
    target, draft = tables(12)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    for gamma in (1, 2, 3, 4):
        block = block_laws.expected_kept(p_table, q_table, 1, gamma, "block")
        token = block_laws.expected_kept(p_table, q_table, 1, gamma, "token")
        assert block >= token - 1e-12
        if gamma == 1:
            assert block == pytest.approx(token, abs=1e-12)  # one draft: the rules are one
        else:
            assert block > token * 1.01, (gamma, block, token)


def verdicts(target, q_table, contexts, config, as_tensors, verification="block", seed=0, device="cpu") -> list:
    """The engine's verdicts (n, t) for each chain (root first), one call, row i seeded seed + i."""
    rows = [(target[c].to(device), q_table[c[:-1]].to(device), torch.tensor(c[1:], device=device)) for c in contexts]
    out = _core._verify_rows_seeded(rows, *config, 1.0, seeds=[seed + i for i in range(len(rows))],
                                    as_tensors=as_tensors, verification=verification)
    assert all(finite for *_, finite in out)
    return [(n, t) for n, t, *_ in out]


def chi_square(law: dict, counts: dict) -> float:
    cells = sorted(set(law) | set(counts))
    assert all(law.get(c, 0.0) > 0 for c in counts), "sequences of probability zero were emitted"
    expected, observed = pooled(np.array([law.get(c, 0.0) for c in cells]) * sum(counts.values()),
                                np.array([counts.get(c, 0) for c in cells], float))
    expected *= observed.sum() / expected.sum()
    return scipy.stats.chisquare(observed, expected).pvalue


STAT_CASES = [(3, (1.0, 0, 1.0), 40), (4, (0.7, 2, 1.0), 47), (5, (1.3, 0, 0.9), 40)]  # the defect's TV 0.03-0.05


@pytest.mark.parametrize("path", ["host", "tensors", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", STAT_CASES, ids=[f"g{c[0]}" for c in STAT_CASES])
def test_engine_samples_the_block_law(case, path):
    """Rows of gamma and gamma - 1 drafts alternate in one call (the tensor path's grid of positions, padded); on
    CUDA the device path accelerators run."""
    gamma, config, seed = case
    target, draft = tables(seed)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    draws = 4000
    contexts = block_laws.draft_chains(q_table, gamma, draws, seed)
    contexts = [c if i % 2 == 0 else c[:-1] for i, c in enumerate(contexts)]
    counts = {gamma: defaultdict(int), gamma - 1: defaultdict(int)}
    found = verdicts(target, q_table, contexts, config, path != "host", device="cuda" if path == "cuda" else "cpu")
    for context, (n, t) in zip(contexts, found):
        counts[len(context) - 1][tuple(context[1:n + 1]) + (t,)] += 1
    for g, seen in counts.items():
        law = block_laws.iteration_law(p_table, q_table, 1, g)
        assert chi_square(law, seen) > SIGNIFICANCE, f"gamma {g}"
        if g == gamma:  # power: the same samples reject the planted defect's law
            defect = block_laws.iteration_law(p_table, q_table, 1, g, plain_residual=True)
            pvalue = chi_square(defect, seen)
            assert pvalue < SIGNIFICANCE, f"the plain residual must be rejected, p = {pvalue:.3g}"


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensors"])
def test_temperature_zero_gives_the_token_rules_verdicts(as_tensors):
    target, draft = tables(51)
    config = (0.0, 0, 1.0)
    q_table = standardized(draft, config)
    contexts = [[1] + list(chain) for chain in itertools.product(range(VOCAB), repeat=3)]
    assert verdicts(target, q_table, contexts, config, as_tensors) == \
        verdicts(target, q_table, contexts, config, as_tensors, verification="token")


@pytest.mark.parametrize("path", ["host", "tensors", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_generations_follow_the_target_law(path):
    target, draft = markov.target_and_draft(LAW_VOCAB, 61, mask_prob=0.1, independent_draft=False)
    device = "cuda" if path == "cuda" else "cpu"
    decoder = speculant.SpeculativeDecoder(speculant.load(markov.script(target, "cached"), device=device),
                                           speculant.load(markov.script(draft, "cached"), device=device), gamma=4,
                                           temperature=1.0, verification="block")
    assert decoder.verification == "block"
    with tensor_path() if path == "tensors" else contextlib.nullcontext():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=7000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, 1.0, 0, 1.0)
    assert_law(samples, law, f"block, {path}")


@pytest.mark.parametrize("drafter", ["prompt_lookup", "hierarchy"])
def test_other_drafters_keep_the_target_law(drafter):
    """A point-mass q (prompt lookup: q of 0 / 1 is a valid law) and the bottom level of a hierarchy (q its model's
    law at each token, whatever the level did inside)."""
    target, draft = markov.target_and_draft(LAW_VOCAB, 63, mask_prob=0.1, independent_draft=False)
    t, d = speculant.load(markov.script(target, "cached")), speculant.load(markov.script(draft, "cached"))
    if drafter == "prompt_lookup":
        chain = speculant.drafters.PromptLookup(LAW_VOCAB, max_ngram=2)
    else:
        smaller = speculant.load(markov.script(markov.target_and_draft(LAW_VOCAB, 64)[1], "cached"))
        chain = speculant.SpeculativeDecoder(d, smaller, gamma=2)
    decoder = speculant.SpeculativeDecoder(t, chain, gamma=3, verification="block")
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=9000)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW, 1.0, 0, 1.0), f"block, {drafter}")


def test_refusals_name_what_is_wrong():
    target, draft = markov.target_and_draft(LAW_VOCAB, 62)
    t, d = speculant.load(markov.script(target, "cached")), speculant.load(markov.script(draft, "cached"))
    with pytest.raises(ValueError, match="verification must be one of"):
        speculant.SpeculativeDecoder(t, d, verification="joint")
    with pytest.raises(ValueError, match="lenience must be 1 with verification='block'"):
        speculant.SpeculativeDecoder(t, d, verification="block", lenience=0.5)
    with pytest.raises(ValueError, match="siblings='coupled' \\(the default\\) takes verification='token'"):
        speculant.SpeculativeDecoder(t, d, verification="block", tree=[2, 1])  # trees: test_traversal.py
    decoder = speculant.SpeculativeDecoder(t, d, verification="block")
    with pytest.raises(ValueError, match="lenience must be 1 with verification='block'"):
        decoder.generate(LAW_PROMPT, max_new_tokens=2, sampling=speculant.SamplingSettings(lenience=0.5))
    with pytest.raises(ValueError, match="lenience must be 1 with verification='block'"):
        speculant.demo.run(lenience=0.5, verification="block", out=io.StringIO())   # before the pair is loaded
    row = (torch.zeros(3, VOCAB, dtype=F64), torch.full((2, VOCAB), 1.0 / VOCAB, dtype=F64), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="verification must be 'token' or 'block'"):
        _core._verify_rows_seeded([row], 1.0, 0, 1.0, 1.0, seeds=[0], as_tensors=False, verification="joint")


def test_sweep_runs_each_verification_side_by_side():
    target, draft = markov.target_and_draft(6, 3, draft_scale=1.0)
    pair = speculant.load(markov.cached_model(target)), speculant.load(markov.cached_model(draft))
    frame = speculant.sweep(*pair, [[1, 2], [3]], gammas=[3], lenience=[1.0, 0.5], verifications=["token", "block"],
                            max_new_tokens=20, seed=5, repeats=1, progress=False)
    assert sorted(zip(frame.verification, frame.lenience)) == [("block", 1.0), ("token", 0.5), ("token", 1.0)]
    block = frame[frame.verification == "block"].iloc[0]
    decoder = speculant.SpeculativeDecoder(*pair, gamma=3, verification="block")
    again = [decoder.generate(p, max_new_tokens=20, seed=5 + i) for i, p in enumerate([[1, 2], [3]])]
    assert block.target_calls == sum(r.stats.target_calls for r in again)  # the row ran the block rule
    with pytest.raises(ValueError, match="verifications must be one of"):
        speculant.sweep(*pair, [[1]], gammas=[2], verifications=["tokens"], progress=False)


def test_check_distribution_takes_the_rule():
    target, draft = markov.target_and_draft(4, 4, mask_prob=0.1)
    check = speculant.testing.check_distribution(markov.cached_model(target), markov.cached_model(draft), LAW_PROMPT,
                                                 k=2, gamma=3, samples=2000, seed=1, verification="block",
                                                 progress=False)
    assert check.passed and check.impossible == 0


def test_demo_prints_the_rule():
    out = io.StringIO()
    speculant.demo.run(max_new_tokens=20, repeats=1, color=False, out=out, verification="block")
    assert "verification=block" in out.getvalue()
