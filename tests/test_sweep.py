"""speculant.sweep on table models (tests/support/markov.py): the grid, the columns' definitions, reproducibility with a
seed, interruption, and the pass-through of generate arguments."""

import importlib
import math
import time

import numpy as np
import pytest
import torch

from support import markov
import speculant
from speculant import analysis
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached

sweep_module = importlib.import_module("speculant.sweep")  # the module; speculant.sweep is the function
PROMPTS = [[1, 2], [3], [0, 1, 2]]
TIMES = ["seconds", "plain_seconds", "c", "speedup", "speedup_min", "speedup_max", "spread", "predicted_speedup",
         "cost_model_speedup", "flag", "speedup_bound", "cpu_share"]


@pytest.fixture(scope="module")
def pair():
    target, draft = markov.target_and_draft(6, 3, draft_scale=1.0)
    return speculant.load(markov.cached_model(target)), speculant.load(markov.cached_model(draft))


def test_one_row_per_setting_with_consistent_columns(pair, capsys):
    frame = speculant.sweep(*pair, PROMPTS, gammas=[1, 3], temperatures=[0.0, 1.0], lenience=[1.0, 0.5],
                            max_new_tokens=20, seed=5)
    assert "speculant sweep" in capsys.readouterr().err  # the progress bar
    assert list(frame.columns) == sweep_module.COLUMNS and len(frame) == 8
    assert set(zip(frame.gamma, frame.temperature, frame.lenience)) == \
        {(g, t, l) for g in (1, 3) for t in (0.0, 1.0) for l in (1.0, 0.5)}
    assert (frame.top_k == 0).all() and (frame.top_p == 1.0).all() and not frame.attrs["interrupted"]
    assert (frame.new_tokens == len(PROMPTS) * 20).all()
    assert np.allclose(frame.tokens_per_target_call, frame.new_tokens / frame.target_calls)
    assert ((frame.alpha > 0) & (frame.alpha < 1)).all()
    exact = frame[frame.lenience == 1.0]
    assert (exact.acceptance == exact.alpha).all()
    assert np.allclose(frame.expected_tokens, analysis.expected_tokens(frame.acceptance.to_numpy(),
                                                                       frame.gamma.to_numpy()))
    assert np.allclose(frame.predicted_speedup, analysis.walltime_improvement(
        frame.acceptance.to_numpy(), frame.gamma.to_numpy(), frame.c.to_numpy()))
    assert (frame[[t for t in TIMES if t not in ('flag', 'spread')]] > 0).all().all()
    # medians over 3 interleaved rounds, with their range
    assert frame.attrs["repeats"] == 3
    assert ((frame.speedup_min <= frame.speedup) & (frame.speedup <= frame.speedup_max)).all()
    assert np.allclose(frame.spread, (frame.speedup_max - frame.speedup_min) / frame.speedup)


def test_alpha_and_acceptance_on_iid_models():
    """Same p and q after every prefix: alpha is sum min(p, q) exactly; at lenience 0.5 each verified draft is
    kept with probability sum min(p / 0.5, q) (A.5), so the observed fraction lies within 5 binomial standard
    deviations of it (a false failure has probability < 1e-6; the seed is fixed)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    target = speculant.load(markov.cached_model(markov.constant_table(p)))
    draft = speculant.load(markov.cached_model(markov.constant_table(q)))
    frame = speculant.sweep(target, draft, [[0]] * 10, gammas=4, lenience=[1.0, 0.5], max_new_tokens=100,
                            progress=False)
    exact, lenient = frame.iloc[0], frame.iloc[1]
    assert exact.alpha == pytest.approx(analysis.beta(p, q).item(), abs=1e-6)
    assert lenient.alpha == pytest.approx(exact.alpha)  # the engine's alpha ignores lenience
    rate = analysis.beta(p, q, 0.5).item()
    decisions = lenient.target_calls  # a lower bound on the verified drafts (>= 1 per call): a wider band
    assert abs(lenient.acceptance - rate) < 5 * math.sqrt(rate * (1 - rate) / decisions)
    # lenience raises acceptance from alpha = 0.5 to 0.7: well beyond the band's width at these counts
    assert lenient.acceptance > exact.alpha + 0.1


def test_same_seed_same_numbers(pair):
    kwargs = dict(gammas=[2, 4], temperatures=0.8, top_k=[0, 3], top_p=0.9, max_new_tokens=16, progress=False)
    first = speculant.sweep(*pair, PROMPTS, **kwargs, seed=11)
    again = speculant.sweep(*pair, PROMPTS, **kwargs, seed=11)
    other = speculant.sweep(*pair, PROMPTS, **kwargs, seed=12)
    counts = [c for c in sweep_module.COLUMNS if c not in TIMES]
    assert first[counts].equals(again[counts])
    assert not first[counts].equals(other[counts])


def test_interrupted_sweep_keeps_finished_rows(pair, monkeypatch):
    class Interrupting(speculant.SpeculativeDecoder):
        calls = 0

        def generate(self, *args, **kwargs):
            Interrupting.calls += 1
            # per setting: an untimed round and 3 timed ones over the prompts; stop in the third setting
            if Interrupting.calls > 2 * 4 * len(PROMPTS) + 1:
                raise KeyboardInterrupt
            return super().generate(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "SpeculativeDecoder", Interrupting)
    with pytest.warns(RuntimeWarning, match="2 of 3 settings"):
        frame = speculant.sweep(*pair, PROMPTS, gammas=[1, 1, 2], max_new_tokens=8, progress=False)
    assert frame.attrs["interrupted"] and len(frame) == 2 and frame.gamma.tolist() == [1, 1]
    assert (frame.new_tokens == len(PROMPTS) * 8).all()


def test_generate_arguments_pass_through(pair):
    eos = 2
    common = speculant.sweep(*pair, PROMPTS, gammas=2, max_new_tokens=30, progress=False,
                             generate_kwargs={"eos_token_id": eos})
    per_prompt = speculant.sweep(*pair, [{"prompt_ids": p, "eos_token_id": eos} for p in PROMPTS], gammas=2,
                                 max_new_tokens=30, progress=False)
    assert common.new_tokens.item() < len(PROMPTS) * 30
    assert common.new_tokens.item() == per_prompt.new_tokens.item()
    single = speculant.sweep(*pair, torch.tensor([1, 2]), gammas=np.array([1]), max_new_tokens=5, progress=False)
    assert single.new_tokens.item() == 5 and single.attrs["prompts"] == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(gammas=[2, 0]), "gamma"),
    (dict(gammas=2, lenience=[1.0, 1.5]), "lenience"),
    (dict(gammas=[]), "gammas must hold"),
    (dict(gammas=["2"]), "gammas must be numbers"),
    (dict(gammas=2, generate_kwargs={"seed": 1}), "seed"),
    (dict(trees="22"), "trees must be a list of tree shapes"),
    (dict(trees=[2, 2]), "trees must be a list of tree shapes"),
    (dict(), "give gammas"),
])
def test_bad_grids_raise_before_running(pair, kwargs, match, monkeypatch):
    monkeypatch.setattr(sweep_module, "generate", None)  # nothing may run
    with pytest.raises(ValueError, match=match):
        speculant.sweep(*pair, PROMPTS, progress=False, **kwargs)


def test_sweep_takes_a_drafter_and_measures_its_cost():
    from speculant import drafters

    torch.manual_seed(0)
    target = speculant.load(script_cached(TinyGPT(TinyGPTConfig(16, 1, 2, 16, 64))))
    lookup = drafters.PromptLookup(16, max_ngram=2)
    frame = speculant.sweep(target, lookup, [[1, 2, 3, 1, 2, 3, 1, 2]], gammas=[2], temperatures=[0.0],
                            max_new_tokens=12, progress=False)
    assert (frame.draft_calls == 0).all()
    assert (frame.c >= 0).all() and frame.c.notna().all() and frame.predicted_speedup.notna().all()


def slow_drafter(vocab: int, delays: dict, sleep=time.sleep):
    """A Python drafter that proposes nothing and sleeps delays[call] seconds at the given calls (0-based), by
    ``sleep`` (a FakeClock's advances the clock instead)."""
    from speculant import drafters

    calls = [0]

    def propose(context, gamma):
        sleep(delays.get(calls[0], 0.0))
        calls[0] += 1
        return [], None

    return drafters.PythonDrafter(propose, vocab), calls


class FakeClock:
    """speculant.timing's clock, set by the test: perf_counter and process_time read ``now``, which only
    ``sleep`` advances. Installed as timing's ``time`` module, it makes a timed round last exactly the fake
    seconds of the calls made inside it."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    process_time = perf_counter  # a full core: no round is flagged "contended"

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_slow_first_call_is_not_timed(monkeypatch):
    """The untimed round absorbs a first call that costs 3 s (as TorchScript's first calls of a shape do): no
    timed round contains it, so the reported speedup does not move. The seconds are a FakeClock's: each drafter
    call costs 0.01 s, the first 3 s more, and each plain generate 0.1 s; so every timed round lasts exactly
    its drafter calls' 0.01 s, which a loaded machine cannot change, and a timed round that held the first call
    (no untimed round, or one that skipped the speculative decoder) would last over 3 s, which speedup_min
    shows even where the median round does not."""
    timing = importlib.import_module("speculant.research.timing")
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    plain = sweep_module.generate

    def timed_plain(*args, **kwargs):
        clock.sleep(0.1)
        return plain(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "generate", timed_plain)
    torch.manual_seed(0)
    target = speculant.load(script_cached(TinyGPT(TinyGPTConfig(16, 1, 2, 16, 64))))
    drafter, calls = slow_drafter(16, {0: 3.0}, sleep=lambda seconds: clock.sleep(0.01 + seconds))
    frame = speculant.sweep(target, drafter, [[1, 2, 3]], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                            progress=False)
    assert calls[0] > 8  # the untimed round and the timed ones all drafted
    per_round = calls[0] // (1 + frame.attrs["repeats"])  # the same calls in every round (same seed, greedy)
    assert calls[0] == per_round * (1 + frame.attrs["repeats"])
    # the median round and the slowest (plain seconds over the least speedup: the plain rounds all last 0.1 s)
    assert frame.plain_seconds.item() == pytest.approx(0.1)
    assert frame.seconds.item() == pytest.approx(0.01 * per_round)
    assert frame.plain_seconds.item() / frame.speedup_min.item() == pytest.approx(0.01 * per_round)
    assert frame.seconds.item() < 1.5 and frame.plain_seconds.item() / frame.speedup_min.item() < 1.5


def test_siblings_are_an_axis_of_the_trees():
    """siblings= runs every tree once per way of drawing its children (the chains' rows have none there), the
    same seeds giving each way its own tokens; a name outside SpeculativeDecoder's is refused before anything
    runs."""
    from support.engine_checks import MarkovRows
    target, draft = (speculant.load(torch.jit.script(MarkovRows(t.float(), 64)))
                     for t in markov.target_and_draft(6, 4, draft_scale=1.0))
    frame = speculant.sweep(target, draft, PROMPTS, gammas=[2], trees=[[3]], siblings=["without_replacement", "top"],
                            temperatures=[1.0], max_new_tokens=12, seed=1, repeats=1, progress=False)
    assert frame.siblings.isna().tolist() == [True, False, False]  # the chain's row
    assert frame.siblings.tolist()[1:] == ["without_replacement", "top"]
    for row in frame.itertuples():
        if row.tree is None:
            continue
        decoder = speculant.SpeculativeDecoder(target, draft, tree=row.tree, siblings=row.siblings, temperature=1.0)
        results = [decoder.generate(p, max_new_tokens=12, seed=1 + i) for i, p in enumerate(PROMPTS)]
        assert row.target_calls == sum(r.stats.target_calls for r in results)
    with pytest.raises(ValueError, match="siblings must be one of"):
        speculant.sweep(target, draft, PROMPTS, trees=[[2]], siblings=["sorted"], progress=False)
    with pytest.raises(ValueError, match="siblings must be one of"):
        speculant.sweep(target, draft, PROMPTS, trees=[[2]], siblings=[], progress=False)


def test_head_to_head_counts_rounds_and_their_sign_test():
    """timing.head_to_head on two fake generates of known cost: each round's ratio is the second's seconds per
    token over the first's; the first (three times faster) wins every round, and the sign test's two-sided p
    for n of n wins is 2 / 2^n; swapped, it wins none (the same p)."""
    from types import SimpleNamespace

    from speculant import timing

    def fake(seconds):
        def generate(prompt_ids, max_new_tokens, seed):
            time.sleep(seconds)
            return SimpleNamespace(stats=SimpleNamespace(new_tokens=max_new_tokens, target_calls=1, draft_calls=0,
                                                         drafted_tokens=0, accepted_tokens=0, target_seconds=0.0,
                                                         draft_seconds=0.0, other_seconds=0.0, total_seconds=0.0))
        return generate

    calls = [{"prompt_ids": [1, 2]}]
    duel = timing.head_to_head(fake(0.01), fake(0.03), calls, max_new_tokens=4, seed=0, repeats=6)
    assert duel.first_faster == 6 and len(duel.ratios) == 6
    assert duel.sign_test_p == pytest.approx(2 / 2 ** 6)
    assert duel.ratio_min <= duel.ratio <= duel.ratio_max and duel.ratio > 1.5
    loser = timing.head_to_head(fake(0.03), fake(0.01), calls, max_new_tokens=4, seed=0, repeats=4)
    assert loser.first_faster == 0 and loser.sign_test_p == pytest.approx(2 / 2 ** 4) and loser.ratio < 0.7


def test_noisy_and_off_theory_rows_are_flagged_with_one_warning():
    torch.manual_seed(0)
    target = speculant.load(script_cached(TinyGPT(TinyGPTConfig(16, 1, 2, 16, 64))))
    # 7 drafter calls per round (8 tokens, the last drafts nothing): call 15 is in the second of the 3 timed
    # rounds, slowed by 0.3 s: a spread far above 25%
    drafter, _ = slow_drafter(16, {15: 0.3})
    with pytest.warns(RuntimeWarning, match=r"1 of 1 settings are flagged .* noisy \(the speedup spread over more than 25%"):
        frame = speculant.sweep(target, drafter, [[1, 2, 3]], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                                progress=False)
    assert "noisy" in frame.flag.item() and frame.spread.item() > 0.25
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        speculant.sweep(target, drafter, [[1, 2, 3]], gammas=[2], repeats=0, progress=False)


def test_cost_model_counts_what_the_engine_timed():
    """timing.cost_model on rounds whose times are set: Theorem 3.8 at the measured costs, each over the target's
    call in plain decoding (1 s here): a verification of gamma + 1 = 4 tokens at 1.6 (slope 0.2 per draft), a
    draft call of 0.25, the engine's 0.1 per iteration and 0.05 per plain token."""
    from types import SimpleNamespace

    from speculant import timing

    def stats(**values):
        keys = ("target_calls", "drafted_tokens", "draft_calls", "target_seconds", "draft_seconds", "other_seconds")
        return SimpleNamespace(**{**dict.fromkeys(keys, 0), **values})

    spec = stats(target_calls=10, drafted_tokens=30, draft_calls=30, target_seconds=16.0, draft_seconds=7.5,
                 other_seconds=1.0)
    plain = stats(target_calls=40, target_seconds=40.0, other_seconds=2.0)
    rounds = [timing.Round([SimpleNamespace(stats=spec, levels=())], [SimpleNamespace(stats=plain)], 1.0, 1.0)]
    want = analysis.expected_tokens(0.7, 3) * 1.05 / (1.6 + 0.1 + 3 * 0.25)
    assert timing.cost_model(rounds, acceptance=0.7, gamma=3) == pytest.approx(want)
    # a draft level: its model's mean call (0.3 s, 20 calls) is its unit; its drafter 0.03 s per drafted token,
    # its engine 0.06 s per iteration; the top's draft seconds are the level's and do not enter
    level = stats(target_calls=20, drafted_tokens=20, target_seconds=6.0, draft_seconds=0.6, other_seconds=1.2)
    level.beta_sum, level.beta_count, level.gamma = 6.0, 10, 1
    rounds = [timing.Round([SimpleNamespace(stats=spec, levels=(level,))], [SimpleNamespace(stats=plain)], 1.0, 1.0)]
    want = analysis.hierarchical_improvement([0.7, 0.6], [3, 1], [0.3, 0.1], verify_costs=[lambda w: 1 + 0.2 * (w - 1),
                                             None], overheads=[0.1, 0.2], plain_overhead=0.05)
    assert timing.cost_model(rounds, acceptance=0.7, gamma=3) == pytest.approx(want)
    # a tree [2, 1] (3 nodes, width 4 with the pending token): the tree theory at the same costs, the engine's
    # time per iteration added to the verification call's
    spec.tree_visits, spec.tree_accepted, spec.tree_offered = [10, 5], [[5, 3], [2]], [[10, 10], [5]]
    rounds = [timing.Round([SimpleNamespace(stats=spec, levels=())], [SimpleNamespace(stats=plain)], 1.0, 1.0)]
    table = [[0.5, 0.3], [0.4]]
    want = analysis.tree_speedup([2, 1], table, 0.25, verify_cost=lambda w: 1 + 0.2 * (w - 1) + 0.1) * 1.05
    assert timing.cost_model(rounds, acceptance=0.7, gamma=2, tree=[2, 1]) == pytest.approx(want)
    # with a sibling draft its call at depth 0 counts too, the one depth that branches (c the two models' mean call)
    want = analysis.tree_speedup([2, 1], table, 0.25, verify_cost=lambda w: 1 + 0.2 * (w - 1) + 0.1,
                                 draft_calls=3) * 1.05
    assert timing.cost_model(rounds, acceptance=0.7, gamma=2, tree=[2, 1], sibling=True) == pytest.approx(want)


def test_a_tree_whose_rates_are_no_positional_table_predicts_nothing():
    """Given parents [-1, 0, 0, 1, 2, 2]: of depth 1's nodes one has a child, one two. Rank 1's rate is over the
    nodes that had it, so depth 1's rates can sum above 1 (here 0.8 + 1.0), which no positional table does: the
    prediction is NaN, where the analysis would raise. Rates that fit (0.5 + 0.4) predict."""
    from types import SimpleNamespace

    from speculant import timing
    tree = [-1, 0, 0, 1, 2, 2]
    for accepted, offered, fits in (([[6, 4], [8, 2]], [[20, 20], [10, 2]], False),
                                    ([[6, 4], [5, 2]], [[20, 20], [10, 5]], True)):
        stats = SimpleNamespace(tree_visits=[20, 10], tree_accepted=accepted, tree_offered=offered)
        tokens, speedup = timing.tree_prediction([SimpleNamespace(stats=stats)], tree, c=0.1)
        if fits:
            assert tokens == pytest.approx(analysis.tree_expected_tokens(tree, [[0.3, 0.2], [0.5, 0.4]]))
            assert math.isfinite(speedup)
        else:
            assert math.isnan(tokens) and math.isnan(speedup)


def test_trees_beside_chains():
    """trees= rows sit beside the chains' (tree None), at every sampling setting and lenience 1 only, with the
    tree theory's expected tokens and prediction at the acceptance table they measured (MarkovRows: tables with
    the tree calls)."""
    from support.engine_checks import MarkovRows
    from speculant import timing
    target, draft = (speculant.load(torch.jit.script(MarkovRows(t.float(), 64)))
                     for t in markov.target_and_draft(6, 3, draft_scale=1.0))
    given = analysis.best_tree(5, [[0.6, 0.2], [0.5, 0.1], [0.5]])  # Sequoia's tree, passed whole
    assert given.tree[0] == -1 and analysis.tree_depth(given.tree) == 3
    frame = speculant.sweep(target, draft, PROMPTS, gammas=[2], trees=[[2, 2], [3], given], temperatures=[0.0, 1.0],
                            lenience=[1.0, 0.5], max_new_tokens=20, seed=5, repeats=1, progress=False)
    chains, trees = frame[frame.tree.isna()], frame[frame.tree.notna()]
    assert len(chains) == 4 and len(trees) == 6
    shapes = ((2, 2), (3,), tuple(given.tree))
    assert set(zip(trees.tree, trees.temperature)) == {(s, t) for s in shapes for t in (0.0, 1.0)}
    assert (trees.lenience == 1.0).all()
    assert (trees.gamma == trees.tree.map(lambda t: analysis.tree_depth(list(t)) if t[0] == -1 else len(t))).all()
    for row in trees.itertuples():
        decoder = speculant.SpeculativeDecoder(target, draft, tree=row.tree, temperature=row.temperature)
        results = [decoder.generate(p, max_new_tokens=20, seed=5 + i) for i, p in enumerate(PROMPTS)]
        table = timing.tree_table(results)
        assert row.new_tokens == sum(r.stats.new_tokens for r in results)
        assert row.target_calls == sum(r.stats.target_calls for r in results)
        assert row.expected_tokens == pytest.approx(float(analysis.tree_expected_tokens(list(row.tree), table)))
        assert row.predicted_speedup == pytest.approx(analysis.tree_speedup(list(row.tree), table, row.c))
        assert row.cost_model_speedup > 0
    assert np.allclose(chains.expected_tokens, analysis.expected_tokens(chains.acceptance.to_numpy(), 2))


def test_a_sibling_draft_draws_the_trees_later_children():
    """sibling_draft= makes every tree row draw its later children from the sibling (the tokens and counts of
    SpeculativeDecoder(..., sibling_draft=) at the same seeds), leaves the chains alone, counts both models'
    calls and prices them (analysis.tree_draft_calls: the sibling's down to the deepest level that branches, [2, 1, 2]
    through its single-child level 1); it is refused by name where it cannot apply, before anything runs."""
    from support.engine_checks import MarkovRows
    from speculant import timing
    target, draft, sibling = (speculant.load(torch.jit.script(MarkovRows(t.float(), 64)))
                              for t in (*markov.target_and_draft(6, 3, draft_scale=1.0),
                                        markov.target_and_draft(6, 103, mask_prob=0.1)[1]))
    frame = speculant.sweep(target, draft, PROMPTS, gammas=[2], trees=[[2, 2], [3], [2, 1, 2]],
                            siblings=["coupled", "with_replacement"], temperatures=[1.0], max_new_tokens=20,
                            seed=5, repeats=1, progress=False, sibling_draft=sibling)
    assert list(frame.columns) == sweep_module.COLUMNS
    assert frame.sibling_draft.tolist() == [False] + [True] * 6  # the chain's row first
    for row in frame[frame.tree.notna()].itertuples():
        decoder = speculant.SpeculativeDecoder(target, draft, tree=row.tree, siblings=row.siblings, temperature=1.0,
                                               sibling_draft=sibling)
        results = [decoder.generate(p, max_new_tokens=20, seed=5 + i) for i, p in enumerate(PROMPTS)]
        assert row.new_tokens == sum(r.stats.new_tokens for r in results)
        assert row.target_calls == sum(r.stats.target_calls for r in results)
        assert row.draft_calls == sum(r.stats.draft_calls for r in results)
        table = timing.tree_table(results)
        assert row.expected_tokens == pytest.approx(float(analysis.tree_expected_tokens(list(row.tree), table)))
        calls = {(2, 2): 4, (3,): 2, (2, 1, 2): 6}[tuple(row.tree)]  # the draft's d, the sibling's to the last branch
        assert analysis.tree_draft_calls(list(row.tree), sibling=True) == calls
        assert row.predicted_speedup == pytest.approx(
            analysis.tree_speedup(list(row.tree), table, row.c, draft_calls=calls))
        assert row.predicted_speedup < analysis.tree_speedup(list(row.tree), table, row.c)
        # the sibling's laws, not the draft's: the same tree without it keeps other tokens at the same seeds
        alone = speculant.SpeculativeDecoder(target, draft, tree=row.tree, siblings=row.siblings, temperature=1.0)
        assert [alone.generate(p, max_new_tokens=20, seed=5 + i).tokens for i, p in enumerate(PROMPTS)] != \
            [r.tokens for r in results]
    refusals = [
        (dict(gammas=[2]), "sibling_draft draws the later children of token trees: give trees="),
        (dict(trees=[[2, 2]], siblings=["coupled", "top"]), "sibling_draft: its children are independent draws"),
        (dict(trees=[speculant.DynamicTree(budget=4)]), "sibling_draft draws the later children of a token tree of a "
                                                         "fixed shape"),
        (dict(trees=[[2]], sibling_draft=draft), "sibling_draft must be another model than the draft"),
    ]
    for kwargs, match in refusals:
        kwargs = {"sibling_draft": sibling, **kwargs}
        with pytest.raises(ValueError, match=match):
            speculant.sweep(target, draft, PROMPTS, progress=False, **kwargs)


def test_contended_rows_are_flagged_beside_busy_loops(pair):
    """Issue 67: beside busy loops (two per core this process may run on) a sweep's process gets well under a
    core, and every row says so ("contended", its cpu_share under timing.CONTENDED_SHARE); the timed runs use
    one torch thread (column threads) and leave torch's own setting as it was. No time is asserted: only the
    flags, which the loops force (each process gets at most cores / (loops + 1) < 0.5 of a core)."""
    import os
    import subprocess
    import sys

    from speculant import timing

    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cores)]
    try:
        time.sleep(0.5)  # the loops running before the timed rounds start
        frame = speculant.sweep(*pair, PROMPTS, gammas=[1, 3], temperatures=[1.0], max_new_tokens=60, seed=0,
                                progress=False)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert (frame.threads == 1).all() and torch.get_num_threads() == before
    assert (frame.cpu_share < timing.CONTENDED_SHARE).all(), frame.cpu_share.tolist()
    assert frame.flag.str.contains("contended").all(), frame.flag.tolist()


def _round(spec_seconds, plain_seconds, *, spec_cpu=None, plain_cpu=None, draft_seconds=0.0, on_cpu=True):
    """A timed round of one prompt with set counts and times: speculative decoding made 20 tokens in 5 target
    calls (tau = 4), plain decoding 20 tokens in 20 calls of 0.01 s."""
    from types import SimpleNamespace

    from speculant import timing

    def stats(new_tokens, target_calls, target_seconds, draft):
        return SimpleNamespace(new_tokens=new_tokens, target_calls=target_calls, draft_calls=5 if draft else 0,
                               drafted_tokens=15 if draft else 0, accepted_tokens=0, target_seconds=target_seconds,
                               draft_seconds=draft, other_seconds=0.0, total_seconds=0.0)

    spec = SimpleNamespace(stats=stats(20, 5, 0.05, draft_seconds))
    plain = SimpleNamespace(stats=stats(20, 20, 0.2, 0.0))
    return timing.Round([spec], [plain], spec_seconds, plain_seconds,
                        spec_seconds if spec_cpu is None else spec_cpu,
                        plain_seconds if plain_cpu is None else plain_cpu, 1, on_cpu)


def test_a_speedup_beyond_its_tokens_per_call_is_impossible():
    """Issue 67: at tau = 4 tokens per target call no round can be more than 4x faster than plain decoding, and
    less when the draft costs time: speedup_bound = tau (t + o) / (t + D + o), here 4 * 0.01 / (0.01 + 0.01) = 2
    with a draft of 0.01 s per iteration. A round above the bound (by more than BOUND_MARGIN) makes its row
    "impossible"; one below it does not. Process CPU time under CONTENDED_SHARE of the wall time makes a CPU
    row "contended", and never a device row's (its host waits on the device)."""
    from speculant import timing

    free = _round(0.1, 0.2)  # 2x at a bound of 4
    assert timing.speedup_bound(free) == pytest.approx(4.0)
    assert timing.timing_checks([free], [2.0])["flags"] == []
    fast = _round(0.02, 0.2)  # 10x: more than tau allows
    assert timing.timing_checks([free, fast], [2.0, 10.0])["flags"] == ["impossible"]
    drafted = _round(0.08, 0.2, draft_seconds=0.05)  # 2.5x against a bound of 2
    assert timing.speedup_bound(drafted) == pytest.approx(2.0)
    assert timing.timing_checks([drafted], [2.5])["flags"] == ["impossible"]
    assert timing.timing_checks([drafted], [2.1])["flags"] == []  # within the margin
    waited = _round(0.1, 0.2, spec_cpu=0.05)  # half a core while it was timed
    checks = timing.timing_checks([free, waited], [2.0, 2.0])
    assert checks["flags"] == ["contended"] and checks["cpu_share"] == pytest.approx(0.5)
    on_device = _round(0.1, 0.2, spec_cpu=0.0, on_cpu=False)
    checks = timing.timing_checks([on_device], [2.0])
    assert checks["flags"] == [] and math.isnan(checks["cpu_share"])


def test_the_sweeps_warning_says_what_each_flag_means():
    import pandas as pd

    flagged = pd.DataFrame({"flag": ["contended", "impossible, noisy", "contended, off theory"]})
    text = sweep_module.flag_warning(flagged, 5, 3, 0.25)
    assert text.startswith("3 of 5 settings are flagged")
    assert "2 contended (the process got less than 80% of a core" in text
    assert "1 impossible (a round was faster than its tokens per target call allow" in text
    assert "1 noisy (the speedup spread over more than 25% across the 3 rounds)" in text
    assert "1 off theory" in text and "Timing on a shared machine" in text


def test_threads_are_checked_by_name(pair):
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        speculant.sweep(*pair, PROMPTS, gammas=[1], threads=0, progress=False)
