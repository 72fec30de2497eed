"""Hierarchical drafts (cpp/drafting/hierarchy.h): a SpeculativeDecoder as the draft of another, to any depth.

Exactness is checked twice, as for the chain: the law of the algorithm enumerated on Markov tables
(markov.hierarchical_law, with the C++ verification kernel) equals the target's own continuation law to 1e-6;
and the engine's samples pass Pearson's chi-square test against that exact law at SIGNIFICANCE = 1e-3 per
window. 7 configurations x 2 windows make 14 tests a correct engine could fail by chance: a family-wise
false-rejection rate of at most 1.4% for a fresh draw of seeds (Bonferroni); the seeds are fixed, so the outcome
is deterministic. Power: the enumeration of a level that reports the wrong q (its drafter's instead of its
model's) differs from the target's law by far more than the chi-square tests resolve at N_SAMPLES
(test_a_wrong_q_is_detected).
"""

import concurrent.futures

import numpy as np
import pytest
import torch

from support import markov
import speculant
from support.laws import assert_law
from speculant import analysis, sampling

N_SAMPLES = 4000
BATCH = 100  # rows per generate call; row r of a call seeded s is what a batch of one seeded s + r gives
MAX_NEW_TOKENS = 6
VOCAB = 4
PROMPT = [2, 1, 3]


def tables(seed: int, levels: int = 3, scale: float = 0.8) -> list:
    """A target and `levels - 1` drafts, each perturbed from the one above (so each level drafts the next well)."""
    out = [markov.random_table(VOCAB, seed, mask_prob=0.1)]
    for i in range(1, levels):
        out.append(markov.perturb(out[-1], seed + 101 * i, scale))
    return out


def hierarchy(models: list, gammas: list, **sampling_options):
    """SpeculativeDecoder(models[0], SpeculativeDecoder(models[1], ..., gamma=gammas[1]), gamma=gammas[0])."""
    draft = models[-1]
    for model, gamma in zip(reversed(models[:-1]), reversed(gammas)):
        draft = speculant.SpeculativeDecoder(model, draft, gamma=gamma, **sampling_options)
    return draft


def loaded(table_list: list) -> list:
    return [speculant.load(markov.cached_model(t)) for t in table_list]


# ------------------------------------------------------------------------------------------------
# The enumerated law
# ------------------------------------------------------------------------------------------------

ENUMERATED = [
    # id, levels, gammas, temperature, top_k, top_p, lenience
    ("3-levels-g2-1-T1", 3, [2, 1], 1.0, 0, 1.0, 1.0),
    ("3-levels-g3-2-T0.7-topk3", 3, [3, 2], 0.7, 3, 1.0, 1.0),
    ("3-levels-g1-2-topp0.8", 3, [1, 2], 1.0, 0, 0.8, 1.0),
    ("4-levels-g2-2-1-T1", 4, [2, 2, 1], 1.0, 0, 1.0, 1.0),
    ("3-levels-g2-2-argmax", 3, [2, 2], 0.0, 0, 1.0, 1.0),
]


@pytest.mark.parametrize("config", ENUMERATED, ids=[c[0] for c in ENUMERATED])
@pytest.mark.parametrize("verify", ["reference", "speculant"])
def test_enumerated_law_is_the_targets(config, verify):
    name, levels, gammas, temperature, top_k, top_p, lenience = config
    table_list = tables(40 + levels, levels)
    fn = sampling.verify if verify == "speculant" else markov.reference.verify
    got = markov.hierarchical_law(table_list, PROMPT, 3, gammas, temperature, top_k, top_p, lenience, verify=fn)
    want = markov.continuation_law(table_list[0], PROMPT, 3, temperature, top_k, top_p)
    assert torch.allclose(got, want, atol=1e-6), name


def test_lenient_top_level_law_is_the_two_level_lenient_law():
    """Lenience at the top over a hierarchical draft: the drafts follow the draft model's own law, so the output
    law is the lenient law of (target, draft model) alone."""
    table_list = tables(47)
    got = markov.hierarchical_law(table_list, PROMPT, 3, [2, 2], lenience=0.5)
    want = markov.speculative_law(table_list[0], table_list[1], PROMPT, 3, 2, lenience=0.5)
    assert torch.allclose(got, want, atol=1e-9)
    assert not torch.allclose(got, markov.continuation_law(table_list[0], PROMPT, 3), atol=1e-3)


def test_a_wrong_q_is_detected():
    """Negative control: a draft level reporting its drafter's q (not its own model's) changes the output law by
    more than 0.01 in total variation, which the chi-square tests below resolve (about 0.003 at N_SAMPLES)."""
    target, middle, small = tables(48)

    def below(context, n):
        return markov.speculative_law(middle, small, context, n, 2)

    wrong = markov.speculative_law(target, small, PROMPT, 3, 2, draft_block=below)
    right = markov.hierarchical_law([target, middle, small], PROMPT, 3, [2, 2])
    assert (wrong - right).abs().sum() / 2 > 0.01


# ------------------------------------------------------------------------------------------------
# The engine's samples
# ------------------------------------------------------------------------------------------------


def samples(decoder, seed_base: int, **options) -> np.ndarray:
    out = []
    for start in range(0, N_SAMPLES, BATCH):
        results = decoder.generate([PROMPT] * BATCH, max_new_tokens=MAX_NEW_TOKENS, seed=seed_base + start, **options)
        out += [r.tokens for r in results]
    return np.asarray(out, dtype=np.int64)


ENGINE = [
    # id, levels, gammas, temperature, top_k, top_p, inner gamma policy, seed
    ("3-levels-g3-2-T1", 3, [3, 2], 1.0, 0, 1.0, "fixed", 61),
    ("3-levels-g4-1-T0.7-topk3", 3, [4, 1], 0.7, 3, 1.0, "fixed", 62),
    ("3-levels-g2-2-topp0.8-heuristic", 3, [2, 2], 1.0, 0, 0.8, "heuristic", 63),
    ("4-levels-g3-2-1-T1", 4, [3, 2, 1], 1.0, 0, 1.0, "fixed", 64),
]


@pytest.mark.parametrize("config", ENGINE, ids=[c[0] for c in ENGINE])
def test_engine_law_is_the_targets(config):
    name, levels, gammas, temperature, top_k, top_p, policy, seed = config
    table_list = tables(seed, levels)
    models = loaded(table_list)
    options = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    draft = models[-1]
    for model, gamma in zip(reversed(models[1:-1]), reversed(gammas[1:])):
        draft = speculant.SpeculativeDecoder(model, draft, gamma=gamma, gamma_policy=policy, max_gamma=3, **options)
    decoder = speculant.SpeculativeDecoder(models[0], draft, gamma=gammas[0], **options)
    law = markov.continuation_law(table_list[0], PROMPT, MAX_NEW_TOKENS, temperature, top_k, top_p)
    assert_law(samples(decoder, 1000 * seed), law, name)


def test_engine_law_with_a_bigram_table_at_the_bottom():
    """The natural three-level stack: target, draft model, and an n-gram table under the draft model."""
    target, middle = tables(65, 2)
    corpus = np.random.default_rng(5).choice(VOCAB, size=400, p=[0.4, 0.3, 0.2, 0.1])
    table = speculant.drafters.Bigram.fit(corpus, VOCAB)
    models = loaded([target, middle])
    decoder = speculant.SpeculativeDecoder(models[0], speculant.SpeculativeDecoder(models[1], table, gamma=2), gamma=3)
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS)
    assert_law(samples(decoder, 65000), law, "bigram-at-the-bottom")


def test_engine_law_with_prompt_lookup_at_the_bottom():
    """A drafter that keeps the sequence on the host (prompt lookup; Python drafters share its rewind)."""
    target, middle = tables(67, 2)
    models = loaded([target, middle])
    lookup = speculant.drafters.PromptLookup(VOCAB, min_ngram=1, max_ngram=2)
    decoder = speculant.SpeculativeDecoder(models[0], speculant.SpeculativeDecoder(models[1], lookup, gamma=3),
                                           gamma=2)
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS)
    assert_law(samples(decoder, 67000), law, "prompt-lookup-at-the-bottom")


def test_python_drafter_at_the_bottom_sees_the_rewound_sequence():
    """After the target rejects a draft, the level's drafter continues from the cut sequence: a PythonDrafter
    records every context it is asked to continue, and each is a prefix of prompt + output or of a draft the
    level emitted after it."""
    target, middle = loaded(tables(68, 2))
    contexts = []

    def propose(context, gamma):
        contexts.append(list(context))
        return [context[-1]] * gamma, torch.nn.functional.one_hot(torch.tensor([context[-1]] * gamma), VOCAB).double()

    drafter = speculant.drafters.PythonDrafter(propose, VOCAB)
    decoder = speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, drafter, gamma=2), gamma=3)
    result = decoder.generate(PROMPT, max_new_tokens=30, seed=4)
    sequence, position, seen = PROMPT + result.tokens, len(PROMPT), 0
    for it in result.trace:
        emitted = []  # what the draft level emitted in this iteration before each of its own iterations
        for inner in it.inner:  # each draft-level iteration that drafted asked with its exact context
            if len(inner.drafted):
                assert contexts[seen] == sequence[:position] + emitted
                seen += 1
            emitted += list(inner.drafted[:inner.accepted]) + [inner.token]
        position += it.accepted + 1
    assert seen == len(contexts) > 0


def test_engine_lenient_top_level_law():
    table_list = tables(66)
    models = loaded(table_list)
    decoder = speculant.SpeculativeDecoder(models[0], speculant.SpeculativeDecoder(models[1], models[2], gamma=2),
                                           gamma=2, lenience=0.5)
    law = markov.speculative_law(table_list[0], table_list[1], PROMPT, MAX_NEW_TOKENS, 2, lenience=0.5)
    assert_law(samples(decoder, 66000), law, "lenient-top")


# ------------------------------------------------------------------------------------------------
# Greedy, bookkeeping, statistics, trace
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gammas", [[1, 1], [3, 2], [5, 1], [2, 3, 1]])
def test_greedy_equals_the_targets_greedy_decoding(gammas):
    table_list = tables(70, len(gammas) + 1, scale=1.5)
    models = loaded(table_list)
    decoder = hierarchy(models, gammas, temperature=0.0)
    prompts = [PROMPT, [0], [3, 3, 1, 2, 0]]
    got = decoder.generate(prompts, max_new_tokens=25)
    for prompt, result in zip(prompts, got):
        want = speculant.generate(models[0], prompt, max_new_tokens=25, temperature=0.0)
        assert result.tokens == want.tokens


def test_levels_record_what_each_level_did():
    table_list = tables(71)
    models = loaded(table_list)
    decoder = hierarchy(models, [4, 2])
    for result in decoder.generate([PROMPT, [1], [0, 2]], max_new_tokens=30, seed=3):
        stats, (level,) = result.stats, result.levels
        assert stats.draft_calls == 0  # the top's drafter makes no model calls of its own: its level does
        drafted = sum(len(it.drafted) for it in result.trace)
        assert stats.drafted_tokens == drafted
        # each iteration's drafts are exactly what its draft level emitted, in order
        for it in result.trace:
            emitted = [t for inner in it.inner for t in (list(inner.drafted[:inner.accepted]) + [inner.token])]
            assert emitted == list(it.drafted)
        assert level.new_tokens == drafted
        assert level.iterations == level.target_calls == sum(len(it.inner) for it in result.trace)
        assert level.draft_calls == level.drafted_tokens  # the small model drafts one token per call
        assert 0 < level.alpha < 1 and 0 < stats.alpha < 1
        assert level.total_seconds <= stats.draft_seconds + 1e-3


def test_draft_levels_never_overshoot_the_tokens_asked():
    """Each draft-level iteration drafts at most the tokens still due - 1, so none is wasted past the request."""
    models = loaded(tables(72))
    result = hierarchy(models, [3, 5]).generate(PROMPT, max_new_tokens=40, seed=1)
    for it in result.trace:
        due = len(it.drafted)
        for inner in it.inner:
            assert len(inner.drafted) <= due - 1
            due -= inner.accepted + 1
        assert due == 0


def test_same_seed_same_tokens_and_batch_rows_match_batch_of_one():
    models = loaded(tables(73))
    decoder = hierarchy(models, [3, 2])
    prompts = [PROMPT, [0, 1], [3]]
    batch = decoder.generate(prompts, max_new_tokens=20, seed=11)
    for r, prompt in enumerate(prompts):
        alone = decoder.generate(prompt, max_new_tokens=20, seed=11 + r)
        assert alone.tokens == batch[r].tokens
        assert [list(it.drafted) for it in alone.trace] == [list(it.drafted) for it in batch[r].trace]


def test_trace_shows_both_levels():
    models = loaded(tables(74))
    result = hierarchy(models, [3, 1]).generate(PROMPT, max_new_tokens=10, seed=2)
    text = result.trace.render(color=False)
    assert "    1.1 | " in text and "  2 | " in text
    assert "1.1" not in result.trace.render(color=False, levels=False)
    assert "1.1 | " in result.trace._repr_html_()


def test_per_call_overrides_apply_to_every_level():
    table_list = tables(75, scale=1.5)
    models = loaded(table_list)
    decoder = hierarchy(models, [3, 2])
    greedy = decoder.generate(PROMPT, max_new_tokens=15, do_sample=False)
    assert greedy.tokens == speculant.generate(models[0], PROMPT, max_new_tokens=15, do_sample=False).tokens
    emitted = []
    for it in greedy.trace:  # the draft level ran greedily too: its drafts are the draft model's argmax chain
        chain = speculant.generate(models[1], PROMPT + emitted, max_new_tokens=len(it.drafted), do_sample=False)
        assert list(it.drafted) == chain.tokens
        emitted += list(it.drafted[:it.accepted]) + [it.token]


# ------------------------------------------------------------------------------------------------
# Refusals
# ------------------------------------------------------------------------------------------------


def test_refusals_name_the_problem():
    target, middle, small = loaded(tables(76))
    with pytest.raises(ValueError, match="lenience"):
        speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small, lenience=0.5))
    with pytest.raises(ValueError, match="temperature"):
        speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small, temperature=0.5))
    with pytest.raises(ValueError, match="tree"):
        speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small, tree=[2, 1]))
    with pytest.raises(ValueError, match="chains only"):
        speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small), tree=[2, 2])
    with pytest.raises(ValueError, match="different model handles"):
        speculant.SpeculativeDecoder(middle, speculant.SpeculativeDecoder(small, middle))
    with pytest.raises(ValueError, match="different model handles"):  # a model two levels down
        speculant.SpeculativeDecoder(small, speculant.SpeculativeDecoder(middle, speculant.SpeculativeDecoder(
            target, small)))
    with pytest.raises(ValueError, match="draft_tokenizer"):
        speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small), draft_tokenizer=object(),
                                     target_tokenizer=object())
    with pytest.raises(ValueError, match="gamma_policy"):
        speculant.SpeculativeDecoder(middle, small, gamma_policy="sometimes")


# ------------------------------------------------------------------------------------------------
# Theorem 3.8 composed
# ------------------------------------------------------------------------------------------------


def test_composed_improvement_reduces_to_theorem_3_8():
    assert analysis.hierarchical_improvement([0.8], [4], [0.2]) == pytest.approx(analysis.walltime_improvement(0.8, 4, 0.2))
    # a useless, free lowest drafter: the draft level emits one token per draft-model call, as a chain's draft does
    assert analysis.hierarchical_improvement([0.8, 0.0], [4, 3], [0.2, 0.0]) == pytest.approx(
        analysis.walltime_improvement(0.8, 4, 0.2))
    # a perfect, free lowest drafter: the draft level makes ceil(gamma / (g + 1)) calls for gamma tokens
    assert analysis.hierarchical_draft_cost([0.8, 1.0], [5, 2], [0.2, 0.0]) == pytest.approx(0.2 * 2)
    assert analysis.hierarchical_improvement([0.8, 0.7], [4, 2], [0.2, 0.05]) > analysis.walltime_improvement(0.8, 4, 0.2)
    # the cost of wide calls: one level is tree_speedup of the chain; a draft level's own verification counts too
    wide = [1.0 + 0.1 * w for w in range(12)]
    assert analysis.hierarchical_improvement([0.8], [4], [0.2], verify_costs=[wide]) == pytest.approx(
        analysis.tree_speedup([1] * 4, [[0.8]] * 4, 0.2, verify_cost=wide))
    assert analysis.hierarchical_draft_cost([0.8, 1.0], [5, 2], [0.2, 0.0], verify_costs=[None, wide]) == \
        pytest.approx(0.2 * (wide[2] + wide[1]))  # widths 3 (3 tokens kept), then 2 (the last 2)
    with pytest.raises(ValueError, match="one entry per level"):
        analysis.hierarchical_improvement([0.8, 0.7], [4, 2], [0.2, 0.1], verify_costs=[None])
    # the engine's own time: per top iteration and per plain token, in target calls
    assert analysis.hierarchical_improvement([0.8], [4], [0.2], overheads=[0.3], plain_overhead=0.1) == \
        pytest.approx(analysis.expected_tokens(0.8, 4) * 1.1 / (1 + 0.3 + 4 * 0.2))
    # a draft level's overhead is paid once per draft-level iteration: a perfect, free drafter gives 2 of them
    assert analysis.hierarchical_draft_cost([0.8, 1.0], [5, 2], [0.2, 0.0], overheads=[9.0, 0.25]) == \
        pytest.approx(0.2 * 2 * 1.25)
    with pytest.raises(ValueError, match="overheads needs one entry per level"):
        analysis.hierarchical_improvement([0.8, 0.7], [4, 2], [0.2, 0.1], overheads=[0.1])
    with pytest.raises(ValueError, match="overheads\\[1\\] must be a finite number >= 0"):
        analysis.hierarchical_improvement([0.8, 0.7], [4, 2], [0.2, 0.1], overheads=[0.1, -1])
    with pytest.raises(ValueError, match="plain_overhead must be a finite number >= 0"):
        analysis.hierarchical_improvement([0.8], [4], [0.2], plain_overhead=float("nan"))
    with pytest.raises(ValueError, match="one entry per level"):
        analysis.hierarchical_improvement([0.8, 0.7], [4], [0.2, 0.1])
    with pytest.raises(ValueError, match="alpha"):
        analysis.hierarchical_improvement([1.8, 0.7], [4, 2], [0.2, 0.1])


def test_composed_cost_matches_a_simulation_of_the_draft_level():
    """hierarchical_draft_cost's recurrence against a Monte Carlo run of the capped draft-level schedule."""
    rng = np.random.default_rng(0)
    alpha, gamma_in, c_in, gamma, slope, overhead = 0.6, 2, 0.1, 5, 0.2, 0.15
    total = 0.0
    runs = 20000
    for _ in range(runs):
        due, cost = gamma, 0.0
        while due > 0:
            g = min(gamma_in, due - 1)
            cost += 1.0 + slope * g + overhead + g * c_in  # a call of g + 1 tokens, the engine's work, the drafts
            accepted = 0
            while accepted < g and rng.random() < alpha:
                accepted += 1
            due -= accepted + 1
        total += cost
    simulated = total / runs
    assert analysis.hierarchical_draft_cost([0.9, alpha], [gamma, gamma_in], [1.0, c_in], overheads=[0.0, overhead],
                                            verify_costs=[None, lambda w: 1.0 + slope * (w - 1)]) == pytest.approx(
        simulated, rel=0.01)


def test_sweep_takes_a_hierarchical_draft():
    target, middle, small = loaded(tables(77))
    level = speculant.SpeculativeDecoder(middle, small, gamma=2)
    frame = speculant.sweep(target, level, [PROMPT, [0]], gammas=[2, 3], temperatures=[0.0, 1.0],
                            max_new_tokens=12, repeats=1, progress=False)
    assert len(frame) == 4
    for row in frame.itertuples():
        (upper, bottom) = row.levels
        assert upper["gamma"] == 2 and 0 <= upper["alpha"] <= 1 and upper["c"] > 0 and bottom["c"] > 0
        want = analysis.hierarchical_improvement([row.acceptance, upper["alpha"]], [row.gamma, 2],
                                                 [upper["c"], bottom["c"]])
        assert row.predicted_speedup == pytest.approx(want)
    greedy = frame[frame.temperature == 0.0]
    assert (greedy.alpha > 0).all()  # the level was rebuilt at temperature 0 (a temperature-1 level is refused)
    with pytest.raises(ValueError, match="executor"):
        speculant.sweep(target, level, [PROMPT], gammas=[2], executor=concurrent.futures.ThreadPoolExecutor(1),
                        progress=False)


def test_with_sampling_rebuilds_every_level():
    target, middle, small = loaded(tables(78))
    decoder = speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(middle, small, gamma=3), gamma=2,
                                           lenience=0.5)
    cold = decoder.with_sampling(0.5, top_k=2)
    assert cold.draft.sampling.temperature == 0.5 and cold.draft.sampling.top_k == 2
    assert cold.draft.gamma == 3 and cold.sampling.lenience == 0.5 and cold.gamma == 2


def test_short_and_empty_generations():
    """max_new_tokens 0 and 1 (nothing to draft: the level is asked for no token), and a level whose gamma exceeds
    what the top ever asks of it."""
    models = loaded(tables(79))
    decoder = hierarchy(models, [2, 5])
    assert decoder.generate(PROMPT, max_new_tokens=0, seed=1).tokens == []
    one = decoder.generate([PROMPT, [1]], max_new_tokens=1, seed=1)
    assert [len(r.tokens) for r in one] == [1, 1] and all(r.levels[0].target_calls == 0 for r in one)
    plain = speculant.generate(models[0], PROMPT, max_new_tokens=9, temperature=0)
    assert hierarchy(models, [2, 5], temperature=0).generate(PROMPT, max_new_tokens=9).tokens == plain.tokens
