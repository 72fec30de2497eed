"""The exact law of one traversal-verification iteration (cpp/math/tree.h: verification="block" on a tree),
enumerated in float64 on tree_laws' Markov tables.

`iteration_law` follows the rule as the verifier runs it: the nodes in post-order, each child's subtree tried in
rank order (it stops somewhere with the chance its own enumeration gives), then the node's own coin against the
mass of its last stage measure. Nothing here assumes the lemma of tree.h (that a subtree stops with its weight's
chance): each subtree's stopping chance is summed from its enumeration. `plain_residual=True` plants the defect the
tests must catch: where a non-root node stops, t from norm(max(0, p - q)) instead of its last stage measure.
"""

from collections import defaultdict

import numpy as np

from .tree_laws import VOCAB, top_order


def child_weight(w_x: float, q_x: float, first: bool) -> float:
    """min(1, W_j(x) / q_j(x)); where q_j(x) = 0 the first child's 1 and a later one's 0."""
    if not w_x > 0:
        return 0.0
    if not q_x > 0:
        return 1.0 if first else 0.0
    return min(1.0, w_x / q_x)


def next_stage(w: np.ndarray, q_j: np.ndarray, p_v: np.ndarray) -> np.ndarray:
    """W_(j+1) = max(0, W_j - q_j) / (1 - m_j), p_v where 1 - m_j is 0."""
    rest = 1.0 - np.minimum(w, q_j).sum()
    return np.maximum(0.0, w - q_j) / rest if rest > 0 else p_v


def iteration_law(p_table, q_table, root: int, shape, siblings: str, s_table=None,
                  plain_residual: bool = False) -> dict:
    """{emitted tokens: probability} of one iteration after `root`: every node of depth i draws shape[i] children
    from q at its token (`siblings`: "with_replacement", "without_replacement" or "top"; `s_table`, with
    replacement: the law of children 1 .. k - 1), then the tree is verified by traversal."""
    p_of = [np.asarray(p_table[v], float) for v in range(VOCAB)]
    q_of = [np.asarray(q_table[v], float) for v in range(VOCAB)]
    s_of = q_of if s_table is None else [np.asarray(s_table[v], float) for v in range(VOCAB)]

    def node(token: int, depth: int, r: float) -> dict:
        """{sequence: P(this subtree stops, emitting it)} for a node of weight r."""
        if depth == len(shape):
            return {(t,): r * p_of[token][t] for t in range(VOCAB) if p_of[token][t] > 0}
        return stages(token, depth, 0, r * p_of[token], q_of[token].copy())

    def stop_here(token: int, depth: int, w: np.ndarray) -> dict:
        law = w
        if plain_residual and depth > 0:
            plain = np.maximum(0.0, p_of[token] - q_of[token])
            if plain.sum() > 0:
                law = plain / plain.sum() * w.sum()
        return {(t,): float(law[t]) for t in range(VOCAB) if law[t] > 0}

    def stages(token: int, depth: int, j: int, w: np.ndarray, left: np.ndarray) -> dict:
        """{sequence: P(children j .. k - 1's subtrees, then the node's coin, stop, emitting it)} at stage j."""
        k = shape[depth]
        if j == k:
            return stop_here(token, depth, w)
        if siblings == "top" and j < k - 1:  # a fixed child, q's j-th most probable
            x = top_order(q_of[token])[j]
            q_j = np.zeros(VOCAB)
            q_j[x] = 1.0
        else:
            base = s_of[token] if siblings == "with_replacement" and j > 0 else left
            if base.sum() == 0:  # q's support used up: an arbitrary child, never kept, leaves W as it is
                return stages(token, depth, j + 1, w, left)
            q_j = base / base.sum()
        out = defaultdict(float)
        rest = {}  # what the later stages see after child j's subtree did not stop, by the law left
        for x in range(VOCAB):
            if q_j[x] == 0:
                continue
            r_c = child_weight(float(w[x]), float(q_j[x]), j == 0)
            below = node(x, depth + 1, r_c) if r_c > 0 else {}
            for seq, prob in below.items():
                out[(x,) + seq] += q_j[x] * prob
            passed = q_j[x] * (1.0 - sum(below.values()))
            after = left.copy()
            if siblings != "with_replacement":
                after[x] = 0.0
            key = after.tobytes()
            rest[key] = (rest[key][0] + passed, after) if key in rest else (passed, after)
        w_next = next_stage(w, q_j, p_of[token])
        for passed, after in rest.values():
            if passed > 0:
                for seq, prob in stages(token, depth, j + 1, w_next, after).items():
                    out[seq] += passed * prob
        return out

    return dict(node(root, 0, 1.0))
