"""Grown token trees: ``tree=speculant.DynamicTree(budget, depth, children, width)`` (cpp/drafting/tree_growth.h).

Each iteration's tree is grown by the draft's confidence: level by level the ``width`` nodes of the newest depth
with the highest path log probability under the draft each get ``children`` children, until ``budget`` drafts
are placed or the tree is ``depth`` deep. The shape of a level depends on the tokens drawn before it, which is
what the exactness argument in the header allows and what these tests check:

* Exact, by enumeration (float64, no sampling): on test_tree's Markov tables, every way the whole tree can be
  drawn (level by level, the shape chosen from the values as the header says), each verified by tree.h's rule;
  the law of what one iteration emits, completed by the target, equals the target's own, for two growth rules
  that make the shape depend on the drawn tokens, four sampling modes and the three ways of drawing children. As a
  control, EAGLE-2's final reranking (drop the drafts of lowest value from a larger tree) is enumerated the same
  way and is *not* exact: the test would see the bias the header warns of.
* The engine's rule is this one: at temperature 0 (top-k children, deterministic) each iteration's tree in the
  trace (Iteration.tree) equals the Python rule's on the draft's own logits; every tree keeps the limits.
* Statistical: Pearson chi-square of the first LAW_NEW tokens against the target's exact law on native Markov
  tables (tests/support/engine_checks.py's MarkovRows) with the draft model and with a bigram drafter, at SIGNIFICANCE =
  1e-3 per window, 2 windows per case, fixed seeds: 4 cases, at most 0.8% family-wise false failures for a fresh
  choice of seeds (Bonferroni).
* Greedy: token for token the pure-torch greedy loop (tests/support/decoding_references.py), alone and in batches, and
  transformers' greedy generate on a live GPT-2.
* The prediction from the trees the iterations drafted (speculant.timing), and the refusals by name.
"""

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch

from support import markov
import speculant
from support.decoding_references import TARGET, TARGET_CONFIG, perturbed, tiny_gpt, torch_greedy
from support.drafter_sets import table_drafters
from support.engine_checks import table_model
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples
from speculant.tiny_gpt import script_cached
from support.tree_laws import completed, standardized, tables, target_law

# ------------------------------------------------------------------------------------------------
# The rule, written out (float64), and its exactness
# ------------------------------------------------------------------------------------------------


def choose(values: list, level: list, budget: int, children: int, width: int) -> list:
    """(node, children) to expand among `level` (the newest depth's nodes), as tree_growth.h says: the `width`
    of highest value (ties: the earlier node), each min(children, budget left) in value order, in node order."""
    ranked = sorted((v for v in level if np.isfinite(values[v])), key=lambda v: -values[v])[:width]
    out = []
    for v in ranked:
        if budget == 0:
            break
        k = min(children, budget)
        budget -= k
        out.append((v, k))
    return sorted(out)


def draws(q: np.ndarray, k: int, siblings: str):
    """Every way k children are drawn from q, with its probability: (tokens, probability). A child drawn once q's
    support is used up (without replacement, top) is -1: arbitrary, never accepted. Top: q's k - 1 most probable
    tokens (the first index on ties), then one draw from the rest."""
    if siblings == "top":
        fixed = sorted(range(len(q)), key=lambda v: (-q[v], v))[:k - 1]
        left = q.copy()
        left[fixed] = 0.0
        for last, prob in draws(left, 1, "without_replacement"):
            yield tuple(fixed) + last, prob
        return

    def go(left: np.ndarray, k: int):
        if k == 0:
            yield (), 1.0
            return
        mass = left.sum()
        if mass == 0:
            for rest, prob in go(left, k - 1):
                yield (-1,) + rest, prob
            return
        for x in np.flatnonzero(left):
            nxt = left if siblings == "with_replacement" else np.where(np.arange(len(left)) == x, 0.0, left)
            for rest, prob in go(nxt, k - 1):
                yield (int(x),) + rest, left[x] / mass * prob
    yield from go(q, k)


def verified_law(p_table, q_table, tokens: list, parents: list, siblings: str) -> dict:
    """The law of what verification emits (accepted path + t) for one drawn tree (tree.h's rule)."""
    kids = defaultdict(list)
    for v in range(1, len(parents)):
        kids[parents[v]].append(v)

    def at(v: int) -> dict:
        p_j = p_table[tokens[v]].copy()
        out, reach = defaultdict(float), 1.0
        q_left = q_table[tokens[v]].copy()
        for j, child in enumerate(kids[v]):
            x, mass = tokens[child], q_left.sum()
            if x < 0 or mass == 0:
                continue
            q_j = q_left / mass
            if siblings == "top" and j < len(kids[v]) - 1:  # a fixed child: the point mass at x
                q_j = np.eye(len(q_j))[x]
            a = min(1.0, p_j[x] / q_j[x])
            for seq, prob in at(child).items():
                out[(x,) + seq] += reach * a * prob
            reach *= 1 - a
            rest = np.maximum(p_j - q_j, 0.0)
            p_j = rest / rest.sum() if rest.sum() > 0 else p_j
            if siblings != "with_replacement":
                q_left[x] = 0.0
        for t in np.flatnonzero(p_j):
            out[(int(t),)] += reach * p_j[t]
        return out

    return at(0)


def grown_law(p_table, q_table, root: int, growth, siblings: str, rerank: int = 0) -> dict:
    """Exact law of one grown-tree iteration after `root`: every drawing of the tree, each verified. rerank > 0:
    EAGLE-2's reranking, which keeps only the `rerank` drafts of highest value of the grown tree."""
    budget, depth, children, width = growth
    out = defaultdict(float)

    def grow(tokens, parents, values, level, left, weight):
        chosen = choose(values, level, left, children, width) if left > 0 and len(level) and \
            depth_of(parents, level[0]) < depth else []
        if not chosen:
            finish(tokens, parents, values, weight)
            return
        options = [list(draws(q_table[tokens[v]], k, siblings)) for v, k in chosen]
        for combo in itertools.product(*options):
            t, p, val, w = list(tokens), list(parents), list(values), weight
            for (v, _), (drawn, prob) in zip(chosen, combo):
                w *= prob
                for x in drawn:
                    t.append(x)
                    p.append(v)
                    val.append(values[v] + (np.log(q_table[tokens[v]][x]) if x >= 0 else -np.inf))
            grow(t, p, val, list(range(len(tokens), len(t))), left - sum(k for _, k in chosen), w)

    def finish(tokens, parents, values, weight):
        if rerank:
            keep = sorted(sorted(range(1, len(tokens)), key=lambda v: -values[v])[:rerank])
            index = {0: 0, **{v: i + 1 for i, v in enumerate(keep)}}
            tokens = [tokens[0]] + [tokens[v] for v in keep]
            parents = [-1] + [index[parents[v]] for v in keep]
        for seq, prob in verified_law(p_table, q_table, tokens, parents, siblings).items():
            out[seq] += weight * prob

    grow([root], [-1], [0.0], [0], budget, 1.0)
    return out


def depth_of(parents: list, v: int) -> int:
    d = 0
    while parents[v] >= 0:
        v, d = parents[v], d + 1
    return d


GROWTHS = [(5, 3, 2, 1), (5, 2, 2, 2)]  # budget, depth, children, width: the shape depends on the values
CONFIGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 2, 1.0), (1.3, 0, 0.8)]  # temperature, top_k, top_p


@pytest.mark.parametrize("siblings", ["with_replacement", "without_replacement", "top"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("growth", GROWTHS, ids=str)
def test_one_grown_iteration_is_exact(growth, config, siblings):
    target, draft = tables(seed=sum(growth) + int(10 * config[0]))
    p_table, q_table = standardized(target, config).numpy(), standardized(draft, config).numpy()
    law = grown_law(p_table, q_table, root=1, growth=growth, siblings=siblings)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert max(len(seq) for seq in law) == growth[1] + 1  # some iteration reaches the full depth
    length = growth[1] + 1
    np.testing.assert_allclose(completed(law, torch.from_numpy(p_table), length),
                               target_law(torch.from_numpy(p_table), 1, length), rtol=0, atol=1e-12)


def test_reranking_by_value_is_not_exact():
    """The control: grow 4 drafts, keep the 3 of highest value (EAGLE-2's reranking). Dropping children because
    of their own tokens biases the law, visibly, so the enumeration above would catch a rule that did."""
    target, draft = tables(seed=11)
    config = (1.0, 0, 1.0)
    p_table, q_table = standardized(target, config).numpy(), standardized(draft, config).numpy()
    law = grown_law(p_table, q_table, root=1, growth=(4, 2, 2, 2), siblings="without_replacement", rerank=3)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    got = completed(law, torch.from_numpy(p_table), 3)
    assert np.abs(got - target_law(torch.from_numpy(p_table), 1, 3)).max() > 1e-3


# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------


def test_engine_grows_the_rules_tree():
    """At temperature 0 the children are the draft's top k and the values log_softmax of its raw logits, so
    each iteration's tree is determined: the trace's trees equal the rule's on the draft's own table."""
    target, draft = markov.target_and_draft(LAW_VOCAB, 81, draft_scale=1.5)
    growth = (7, 3, 2, 2)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft),
                                           tree=speculant.DynamicTree(*growth), temperature=0.0)
    assert decoder.gamma == 3
    prompt = list(LAW_PROMPT)
    result = decoder.generate(prompt, max_new_tokens=20)
    sequence = list(prompt)
    wide = 0
    for it in result.trace:
        budget = min(growth[0], 20 - (len(sequence) - len(prompt)) - 1)  # nothing limits it but depth here
        depth = min(growth[1], 20 - (len(sequence) - len(prompt)) - 1)
        tokens, parents, values = [sequence[-1]], [-1], [0.0]
        paths = [[]]
        level, left = [0], growth[0]
        while left > 0 and depth_of(parents, level[0]) < depth:
            chosen = choose(values, level, left, growth[2], growth[3])
            if not chosen:
                break
            start = len(tokens)
            for v, k in chosen:
                raw = markov.row_logits(draft, sequence + paths[v])
                logq = torch.log_softmax(raw, -1)
                for x in torch.sort(raw, descending=True, stable=True).indices[:k].tolist():
                    tokens.append(x)
                    parents.append(v)
                    values.append(values[v] + float(logq[x]))
                    paths.append(paths[v] + [x])
            level, left = list(range(start, len(tokens))), left - sum(k for _, k in chosen)
        assert budget >= 0
        assert it.tree == parents, f"iteration at {len(sequence)}"
        wide += len(set(parents[1:])) < len(parents) - 1  # some node had several children
        sequence += it.drafted[:it.accepted] + [it.token]
    assert wide > 0
    assert result.tokens == sequence[len(prompt):]


LAW_CASES = [  # id, drafter, growth, siblings, sampling, table seed
    ("model-without-T1", "model", (6, 3, 2, 2), "without_replacement", dict(temperature=1.0), 91),
    ("model-with-T0.8-topp0.9", "model", (5, 4, 3, 1), "with_replacement", dict(temperature=0.8, top_p=0.9), 92),
    ("bigram-without-topk3", "bigram", (6, 3, 2, 2), "without_replacement", dict(temperature=1.0, top_k=3), 93),
    ("model-top-T1", "model", (6, 3, 3, 2), "top", dict(temperature=1.0), 94),
]


@pytest.mark.parametrize("case", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_grown_tree_law_equals_target_law(case):
    _, drafter, growth, siblings, sampling, seed = case
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    draft = table_model(draft) if drafter == "model" else table_drafters(LAW_VOCAB, seed)[drafter]
    decoder = speculant.SpeculativeDecoder(table_model(target), draft, tree=speculant.DynamicTree(*growth),
                                           siblings=siblings, **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=seed * 1000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling.get("temperature", 1.0),
                                  sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    assert_law(samples, law, f"grown tree {growth}")


PROMPTS = [[7], [1, 2, 3, 4, 5], [40, 3, 3, 9, 0, 11, 47, 2, 30, 5, 8]]
NEW = 30


@pytest.fixture(scope="module")
def greedy_models():
    drafts = {"near": perturbed(TARGET, seed=3, scale=0.05), "unrelated": tiny_gpt(TARGET_CONFIG, seed=9)}
    target = speculant.load(script_cached(TARGET))
    return target, {name: speculant.load(script_cached(m)) for name, m in drafts.items()}


@pytest.mark.parametrize("growth", [(16, 6, 2, 4), (4, 4, 1, 1), (9, 3, 3, 3), (12, 8, 4, 1)], ids=str)
def test_greedy_grown_trees_are_plain_greedy(greedy_models, growth):
    target, drafts = greedy_models
    expected = [torch_greedy(TARGET, prompt, NEW) for prompt in PROMPTS]
    for name, draft in drafts.items():
        decoder = speculant.SpeculativeDecoder(target, draft, tree=speculant.DynamicTree(*growth), temperature=0.0)
        results = decoder.generate(PROMPTS, max_new_tokens=NEW)
        assert [r.tokens for r in results] == expected, name
        assert [decoder.generate(p, max_new_tokens=NEW).tokens for p in PROMPTS] == expected, name
        for r in results:
            for it in r.trace:
                parents = it.tree
                assert len(parents) - 1 <= growth[0]
                assert max((depth_of(parents, v) for v in range(len(parents))), default=0) <= growth[1]
                counts = np.bincount(parents[1:], minlength=len(parents)) if len(parents) > 1 else np.zeros(1)
                assert counts.max() <= growth[2]
                assert it.accepted <= len(it.drafted)
    bigram = table_drafters(TARGET_CONFIG.vocab_size, 5)["bigram"]
    decoder = speculant.SpeculativeDecoder(target, bigram, tree=speculant.DynamicTree(*growth), temperature=0.0)
    assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=NEW)] == expected


def test_live_greedy_grown_trees_equal_transformers_generate():
    from support import hf_models
    from support.hf_models import PROMPTS as HF_PROMPTS, hf_greedy
    model = hf_models.make("gpt2", seed=10)
    target, draft = speculant.load(model), speculant.load(hf_models.drafted(model, noise=0.01, seed=11))
    expected = [hf_greedy(model, "gpt2", i, eos=None) for i in range(len(HF_PROMPTS))]
    decoder = speculant.SpeculativeDecoder(target, draft, tree=speculant.DynamicTree(budget=8, depth=4),
                                           temperature=0)
    assert [r.tokens for r in decoder.generate(HF_PROMPTS, max_new_tokens=20)] == expected


def test_grown_trees_near_max_length_shrink_to_fit():
    """A model that holds 24 positions: the trees shrink to the room left and the output is still greedy's."""
    target, draft = markov.target_and_draft(LAW_VOCAB, 5)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft),
                                           tree=speculant.DynamicTree(budget=12, depth=4), temperature=0.0)
    plain = speculant.generate(table_model(target), list(LAW_PROMPT), max_new_tokens=64 - len(LAW_PROMPT),
                               temperature=0.0)
    result = decoder.generate(list(LAW_PROMPT), max_new_tokens=64 - len(LAW_PROMPT))
    assert result.tokens == plain.tokens
    room = [64 - (len(LAW_PROMPT) + sum(it.emitted for it in result.trace[:i])) + 1
            for i in range(len(result.trace))]
    assert all(len(it.tree) <= r for it, r in zip(result.trace, room))
    assert any(1 < len(it.tree) < 13 for it in result.trace[-3:])


def test_grown_tree_prediction_and_sweep(greedy_models):
    """The sweep's tree theory for a grown tree: the mean expected tokens of the trees the iterations drafted,
    at the acceptance table they measured, within 10% of the measured tokens per call here."""
    target, drafts = greedy_models
    grown = speculant.DynamicTree(budget=10, depth=4, children=2, width=2)
    frame = speculant.sweep(target, drafts["near"], PROMPTS * 4, trees=[grown, [2, 2]], temperatures=[1.0],
                            max_new_tokens=NEW, repeats=1, progress=False)
    row = frame[frame.gamma == 4].iloc[0]
    assert row.tree == grown and np.isfinite(row.predicted_speedup)
    assert row.expected_tokens == pytest.approx(row.tokens_per_target_call, rel=0.1)
    assert len(frame) == 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(tree=speculant.DynamicTree(budget=4, depth=2), gamma=3), "gamma must be the tree's depth 2"),
    (dict(tree=speculant.DynamicTree(), lenience=0.5), "lenience must be 1 with tree="),
])
def test_refusals(greedy_models, kwargs, message):
    target, drafts = greedy_models
    with pytest.raises(ValueError, match=message):
        speculant.SpeculativeDecoder(target, drafts["near"], **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(budget=0), "DynamicTree budget must be an integer >= 1"),
    (dict(budget=5000), "DynamicTree budget must be an integer <= 4096"),
    (dict(depth=0), "DynamicTree depth must be an integer >= 1"),
    (dict(children=1.5), "DynamicTree children must be an integer >= 1"),
    (dict(width=True), "DynamicTree width must be an integer >= 1"),
])
def test_dynamic_tree_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        speculant.DynamicTree(**kwargs)
