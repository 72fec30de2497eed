"""The exact law of one block-verification iteration (cpp/math/tree.h: Sun et al.'s rule), enumerated in float64
on tree_laws' Markov tables.

`chain_verdict_law` is the rule's law of (tau, t) given one chain of drafts; `iteration_law` the law of what one
iteration emits, drafting included (every chain of gamma drafts enumerated); `expected_kept` the drafts one
iteration keeps in expectation, by the block rule or the token rule (Algorithm 1); `draft_chains` chains drawn from
the draft as the engine's tests give them. `plain_residual=True` plants
the defect the tests must catch: t drawn from Algorithm 1's residual norm(max(0, p - q)) where the block stops
past its first position.
"""

import itertools
from collections import defaultdict

import numpy as np
import torch

from .tree_laws import VOCAB


def ratios(p_rows, q_rows, drafts) -> list:
    """r_0 .. r_g: r_i = min(1, r_(i-1) p_i(x_i) / q_i(x_i))."""
    r = [1.0]
    for i, x in enumerate(drafts):
        q_x, p_x = float(q_rows[i][x]), float(p_rows[i][x])
        r.append(min(1.0, r[-1] * p_x / q_x) if q_x > 0 else (1.0 if p_x > 0 and r[-1] > 0 else 0.0))
    return r


def chain_verdict_law(p_rows, q_rows, drafts, plain_residual: bool = False) -> dict:
    """{(tau, t): probability} for one chain: p_rows [g + 1] the target's laws after the root and each draft, q_rows
    [g] the draft's laws the drafts were drawn from."""
    g = len(drafts)
    r = ratios(p_rows, q_rows, drafts)

    def weights(i: int, scale: float) -> np.ndarray:
        return np.maximum(0.0, scale * np.asarray(p_rows[i], float) - np.asarray(q_rows[i], float))

    h = [1.0]
    for i in range(1, g):
        z = weights(i, r[i]).sum()
        h.append(z / (z + 1.0 - r[i]) if z + 1.0 - r[i] > 0 else 1.0)
    h.append(r[g])
    out = defaultdict(float)
    for tau in range(g + 1):
        stop = h[tau] * np.prod([1.0 - h[j] for j in range(tau + 1, g + 1)])
        if stop == 0:
            continue
        if tau == g:
            law = np.asarray(p_rows[g], float)
        else:
            law = weights(tau, 1.0 if plain_residual else r[tau])
            if law.sum() <= 0:
                law = np.asarray(p_rows[tau], float)
        law = law / law.sum()
        for t in range(VOCAB):
            if law[t] > 0:
                out[(tau, t)] += stop * law[t]
    return out


def iteration_law(p_table, q_table, root: int, gamma: int, plain_residual: bool = False) -> dict:
    """{emitted tokens: probability} of one iteration after `root`: gamma drafts drawn from the draft (each from
    its table's row at the token before it), then verified as a block."""
    out = defaultdict(float)
    for drafts in itertools.product(range(VOCAB), repeat=gamma):
        context = (root,) + drafts
        q_rows = [q_table[c] for c in context[:-1]]
        chance = float(np.prod([float(q_rows[i][x]) for i, x in enumerate(drafts)]))
        if chance == 0:
            continue
        p_rows = [p_table[c] for c in context]
        for (tau, t), prob in chain_verdict_law(p_rows, q_rows, drafts, plain_residual).items():
            out[drafts[:tau] + (t,)] += chance * prob
    return dict(out)


def expected_kept(p_table, q_table, root: int, gamma: int, rule: str) -> float:
    """E[drafts kept] in one iteration after `root`: sum_i E[r_i] for "block", sum_i E[prod_(j <= i) min(1, p_j / q_j)]
    for "token" (Algorithm 1)."""
    total = 0.0
    for drafts in itertools.product(range(VOCAB), repeat=gamma):
        context = (root,) + drafts
        q_rows, p_rows = [q_table[c] for c in context[:-1]], [p_table[c] for c in context]
        chance = float(np.prod([float(q_rows[i][x]) for i, x in enumerate(drafts)]))
        if chance == 0:
            continue
        if rule == "block":
            kept = sum(ratios(p_rows, q_rows, drafts)[1:])
        else:
            kept, running = 0.0, 1.0
            for i, x in enumerate(drafts):
                running *= min(1.0, float(p_rows[i][x]) / float(q_rows[i][x]))
                kept += running
        total += chance * kept
    return total


def draft_chains(q_table, gamma: int, draws: int, seed: int) -> list:
    """`draws` chains of gamma drafts from the root 1, each draft drawn from q at the token before it."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(draws):
        context = [1]
        for _ in range(gamma):
            context.append(int(torch.multinomial(q_table[context[-1]], 1, generator=gen)))
        out.append(context)
    return out
