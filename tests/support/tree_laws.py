"""The exact law of one token-tree iteration (cpp/math/tree.h), enumerated in float64 on Markov tables of VOCAB tokens.

`tables` (a target and a draft logits table [V, V]: row x is the next-token logits after token x), `sibling_table`
(a sibling draft's table), `standardized` (a table under a (temperature, top_k, top_p) config), `draw_tree` (a tree's
node tokens drawn as the drafter draws them), `iteration_law` (the
law of what one iteration emits, drafting included, for each way of drawing siblings), `completed` (that law
continued by the target to a fixed length) and `target_law` (the target's own law of that length). Shared by
test_tree.py, test_tree_growth.py and test_bench_trees.py.
"""

import itertools
from collections import defaultdict

import numpy as np
import torch

from speculant import _core

from . import reference

VOCAB = 5
F64 = torch.float64


def tables(seed: int, masked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits [V, V]: row x is the next-token logits after token x (the draft a perturbation)."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64) * 1.5
    draft = target + torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64) * 1.0
    if masked:
        target[:, 0] = -float("inf")  # a token the target never emits: the draft's mass there is always rejected
    return target, draft


def standardized(table: torch.Tensor, config) -> torch.Tensor:
    temperature, top_k, top_p = config
    return reference.standardize(table, temperature, top_k, top_p)


def top_order(q) -> list:
    """q's tokens by probability, the first index on ties."""
    return sorted(range(len(q)), key=lambda v: (-float(q[v]), v))


def iteration_law(p_table, q_table, root: int, shape, siblings: str, s_table=None) -> dict:
    """Exact law of the tokens one iteration emits (accepted path + t) after `root`, drafting included: every
    node of depth i draws shape[i] children from q at its token (`siblings`: "with_replacement",
    "without_replacement" or "top"), then the tree is verified (tree.h). `s_table` (with_replacement and coupled):
    a sibling draft's table, whose row at the node's token draws children 1 .. k - 1 (tree.h's sibling drafts)."""

    def node(token: int, depth: int) -> dict:
        p = p_table[token]
        if depth == len(shape):
            return {(t,): float(p[t]) for t in range(VOCAB) if p[t] > 0}
        if siblings == "coupled":
            return coupled_law(depth, p, q_table[token], q_table[token] if s_table is None else s_table[token])
        return siblings_law(token, depth, 0, p, q_table[token].clone())

    def coupled_law(depth: int, p, first, q) -> dict:
        """Child 0 drawn from `first`, the others i.i.d. from q; child j's coin looks at whether child j + 1 is in
        H_j = {p_j > q_j}."""
        out = defaultdict(float)
        k = shape[depth]

        def accept(x: int, weight: float):
            for seq, prob in node(x, depth + 1).items():
                out[(x,) + seq] += weight * prob

        def step(j: int, p_j, q_j, x: int, weight: float):  # child j is x, drawn from q_j; weight: P(so far)
            r = float(p_j[x] / q_j[x])
            if j == k - 1:
                accept(x, weight * min(1.0, r))
                for t in range(VOCAB):
                    out[(t,)] += weight * (1 - min(1.0, r)) * float(reference.residual(p_j, q_j)[t])
                return
            in_h = p_j > q_j
            w = float(q[in_h].sum())
            keep = {h: sum(float(q_j[a]) * (1 - coupled_coin(float(p_j[a] / q_j[a]), h, w))
                           for a in range(VOCAB) if q_j[a] > 0) for h in (True, False)}
            q_next = q * torch.tensor([keep[bool(h)] for h in in_h], dtype=F64)
            for b in range(VOCAB):
                if q[b] == 0:
                    continue
                u = coupled_coin(r, bool(in_h[b]), w)
                accept(x, weight * float(q[b]) * u)
                if u < 1:
                    step(j + 1, reference.residual(p_j, q_j), q_next / q_next.sum(), b, weight * float(q[b]) * (1 - u))

        for x in range(VOCAB):
            if first[x] > 0:
                step(0, p, first, x, float(first[x]))
        return out

    def siblings_law(token: int, depth: int, j: int, p_j, q_left) -> dict:
        if j == shape[depth]:
            return {(t,): float(p_j[t]) for t in range(VOCAB) if p_j[t] > 0}
        if siblings == "top" and j < shape[depth] - 1:  # a fixed child, q's j-th most probable: q_j = delta_x
            x = top_order(q_table[token])[j]
            out = defaultdict(float)
            for seq, prob in node(x, depth + 1).items():
                out[(x,) + seq] += float(p_j[x]) * prob
            rest = p_j.clone()
            rest[x] = 0.0
            if float(rest.sum()) > 0:
                for seq, prob in siblings_law(token, depth, j + 1, rest / rest.sum(),
                                              q_left.clone().index_fill_(0, torch.tensor([x]), 0.0)).items():
                    out[seq] += (1 - float(p_j[x])) * prob
            return out
        mass = float(q_left.sum())
        if mass == 0:  # q's support used up: the child is arbitrary, never accepted, and leaves p_j as it is
            return siblings_law(token, depth, j + 1, p_j, q_left)
        q_j = q_left / mass
        out = defaultdict(float)
        for x in range(VOCAB):
            if q_j[x] == 0:
                continue
            a = float(reference.acceptance_probability(p_j[x], q_j[x]))
            if a > 0:
                for seq, prob in node(x, depth + 1).items():
                    out[(x,) + seq] += float(q_j[x]) * a * prob
            if a < 1:
                if siblings == "with_replacement":
                    left = q_left if s_table is None else s_table[token]
                else:
                    left = q_left.clone().index_fill_(0, torch.tensor([x]), 0.0)
                for seq, prob in siblings_law(token, depth, j + 1, reference.residual(p_j, q_j), left).items():
                    out[seq] += float(q_j[x]) * (1 - a) * prob
        return out

    return node(root, 0)


def coupled_coin(r: float, next_in_h: bool, w: float) -> float:
    """siblings="coupled" (tree.h): the acceptance of a child of ratio r = p_j(x) / q_j(x) given whether the next
    child lies in H_j, of q mass w. Averaged over the next child, min(1, r)."""
    if next_in_h:
        return min(1.0, max(0.0, (r - (1 - w)) / w)) if w > 0 else 1.0
    return min(1.0, r / (1 - w)) if w < 1 else 1.0


def completed(law: dict, p_table, length: int) -> np.ndarray:
    """The law of `length` tokens: each emitted sequence continued by the target (Markov) to `length` tokens."""
    out = np.zeros((VOCAB,) * length)
    for seq, prob in law.items():
        for rest in itertools.product(range(VOCAB), repeat=length - len(seq)):
            full, weight = seq + rest, prob
            for previous, token in zip(full[len(seq) - 1:], rest):
                weight *= float(p_table[previous][token])
            out[full] += weight
    return out


def target_law(p_table, root: int, length: int) -> np.ndarray:
    return completed({(t,): float(p_table[root][t]) for t in range(VOCAB)}, p_table, length)


def sibling_table(seed: int) -> torch.Tensor:
    """A sibling draft's logits [V, V]: another perturbation of the target than the draft's, far from it."""
    target, _ = tables(seed)
    gen = torch.Generator().manual_seed(seed + 500)
    return target.masked_fill(torch.isinf(target), 0.0) + torch.randn(VOCAB, VOCAB, generator=gen, dtype=F64) * 2.0


def draw_tree(parents, q_table, draft_scores, root, siblings, greedy, seed, as_tensors=False, s_table=None):
    """Node tokens drawn as the decoder's drafter draws them: each internal node's children from q at its token
    (with a sibling table s_table, of the same kind as q_table / draft_scores: children 1 .. from its row)."""
    tokens = [root] * len(parents)
    children = defaultdict(list)
    for node, parent in enumerate(parents[1:], start=1):
        children[parent].append(node)
    for node in range(len(parents)):  # breadth-first: a node's token is set before its children are drawn
        if children[node]:
            scores = draft_scores[tokens[node]] if greedy else q_table[tokens[node]]
            drawn = _core._draw_children(scores, len(children[node]), siblings, greedy, seed * 1000 + node,
                                         as_tensors, sibling_q=None if s_table is None else s_table[tokens[node]])
            for child, token in zip(children[node], drawn.tolist()):
                tokens[child] = token
    return torch.tensor(tokens)
