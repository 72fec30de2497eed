"""Each random role has its own stream (cpp/math/streams.h): the draft's draws, the verification's coins and the
correction's draw t, each from a generator keyed by (the row's seed, the role, the iteration).

* The keys differ by role and by step, and a row's verification draws its coins from the coins' key and its t from
  the correction's key: the engine's verdict equals the host kernel's run on uniforms drawn from those two keys.
* The defect a peer shipped (one stream for the draft's draws and the acceptance coins: the uniform that drew a
  draft token reused as its coin) is caught: with each chain drawn by inverse CDF from uniforms u_i and the coins
  being the same u_i, the verdicts' law is rejected by Pearson's chi-square, for the token rule and the block rule,
  while independent coins pass. SIGNIFICANCE = 1e-3, fixed seeds: 2 tests that must pass (0.2% family-wise false
  failures), 2 that must reject.
"""

from collections import defaultdict

import numpy as np
import pytest
import scipy.stats
import torch

from speculant import _core
from support import block_laws, tree_laws
from support.chisquare import SIGNIFICANCE, pooled
from support.tree_laws import F64, VOCAB, standardized, tables

ROLES = ("draft", "coins", "correction")


def test_keys_differ_by_role_and_step_and_are_reproducible():
    keys = {(role, step): _core._stream_key(7, role, step) for role in ROLES for step in range(50)}
    assert len(set(keys.values())) == len(keys)
    assert _core._stream_key(7, "coins", 3) == keys[("coins", 3)]
    assert _core._stream_key(8, "coins", 3) != keys[("coins", 3)]
    with pytest.raises(ValueError, match="role must be 'draft', 'coins' or 'correction'"):
        _core._stream_key(7, "acceptance", 0)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_a_verification_draws_its_coins_and_its_correction_from_their_own_keys(verification):
    target, draft = tables(3)
    config = (1.0, 0, 1.0)
    q_table = standardized(draft, config)
    for seed, context in enumerate(block_laws.draft_chains(q_table, 4, 40, 3)):
        logits, q, drafts = target[context], q_table[context[:-1]], torch.tensor(context[1:])
        n, t, *_ = _core._verify_rows_seeded([(logits, q, drafts)], *config, 1.0, seeds=[seed], as_tensors=False,
                                               verification=verification)[0]
        streams = {role: torch.Generator().manual_seed(_core._stream_key(seed, role, 0)) for role in ROLES}
        coins = torch.rand(8, generator=streams["coins"], dtype=F64).tolist()
        draws = torch.rand(1, generator=streams["correction"], dtype=F64).tolist()
        expected = _core._verify_step(logits, q, drafts, *config, 1.0, coins, draws, verification=verification)
        assert (n, t) == tuple(expected[:2])


def chains_and_their_uniforms(q_table, gamma: int, draws: int, seed: int):
    """Chains of gamma drafts from the root 1, each draft drawn by inverse CDF from a uniform: (chain, uniforms)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(draws):
        context, used = [1], []
        for _ in range(gamma):
            u = float(torch.rand(1, generator=gen, dtype=F64))
            cdf = torch.cumsum(q_table[context[-1]], 0)
            drawn = torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=F64))
            context.append(int(drawn.clamp_max(VOCAB - 1)))
            used.append(u)
        out.append((context, used))
    return out


def chi_square(law: dict, counts: dict) -> float:
    cells = sorted(set(law) | set(counts))
    expected, observed = pooled(np.array([law.get(c, 0.0) for c in cells]) * sum(counts.values()),
                                np.array([counts.get(c, 0) for c in cells], float))
    expected *= observed.sum() / expected.sum()
    return scipy.stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("verification", ["token", "block"])
def test_coins_that_reuse_the_drafts_uniforms_are_caught(verification):
    gamma, config, draws = 3, (1.0, 0, 1.0), 4000
    target, draft = tables(11)
    p_table, q_table = standardized(target, config), standardized(draft, config)
    law = block_laws.iteration_law(p_table, q_table, 1, gamma) if verification == "block" else \
        tree_laws.iteration_law(p_table, q_table, 1, [1] * gamma, "with_replacement")
    fresh = torch.Generator().manual_seed(12)
    counts = {"own streams": defaultdict(int), "one stream": defaultdict(int)}
    for context, used in chains_and_their_uniforms(q_table, gamma, draws, 11):
        logits, q, drafts = target[context], q_table[context[:-1]], torch.tensor(context[1:])
        t_draw = [float(torch.rand(1, generator=fresh, dtype=F64))]
        # the block rule reads its coins from the last position down: reversed, draft i's coin is its own u_i
        shared = used if verification == "token" else used[::-1]
        for name, coins in (("own streams", torch.rand(gamma, generator=fresh, dtype=F64).tolist()),
                            ("one stream", shared)):
            n, t, _, _ = _core._verify_step(logits, q, drafts, *config, 1.0, coins, t_draw, verification=verification)
            counts[name][tuple(context[1:n + 1]) + (t,)] += 1
    assert chi_square(law, counts["own streams"]) > SIGNIFICANCE
    pvalue = chi_square(law, counts["one stream"])
    assert pvalue < SIGNIFICANCE, f"coins sharing the draft's stream must be caught, p = {pvalue:.3g}"
