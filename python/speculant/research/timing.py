"""Timing speculative against plain decoding so that a reported speedup is not noise, and Theorem 3.8 next to it.

Both decodings run the same prompts with the same seeds. First one untimed run of each over every prompt: it
warms every input shape the timed runs use (TorchScript's executor profiles and re-optimizes each new shape
during its first calls, seconds in a fresh process). Then ``repeats`` timed rounds, speculative and plain
interleaved ABBA (the order flips every round), so that a drift of the machine's speed hits both. Times are
medians over the rounds, each with its range; the speedup is the median of the rounds' speedups, and Theorem
3.8 predicts it from the measured alpha and c. ``speculant.sweep`` and the demo time this way.

A shared machine breaks timings, so each row says when it was broken. The timed runs use one torch thread
(``threads=1``; ``None`` keeps torch's setting): the engine's models are small, and a second intra-op thread
waits for a core that other work holds. Each round measures the process's CPU time beside its wall time; on
the CPU a round that got less than ``CONTENDED_SHARE`` of a core was waiting for one, and its row is flagged
"contended". A round whose speedup exceeds what the row's tokens per target call allow at its measured call
costs (``speedup_bound``) was timed wrongly, and its row is flagged "impossible".

Prompts may run in batches (``batch_size``): each batch is one ``generate`` call whose row r has the seed the
prompt would have alone, so the tokens do not depend on the batch size. A round's time is the wall time of its
calls, which for batches is what a researcher waits (a row's own times count the whole batch's calls).
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from . import analysis
from ..decoding.trees import Tree

THEORY_FACTOR = 2.0  # a measured speedup outside [predicted / 2, predicted * 2] is flagged "off theory"
SPREAD_THRESHOLD = 0.25  # a (max - min) / median of the rounds' speedups above this is flagged "noisy"
# A CPU round whose process ran less than this share of one core while it was timed waited for a core: flagged
# "contended". One core, whatever the threads: the engine's calls run on the calling thread, and a small model's
# operations often leave torch's other threads idle. An idle machine gives 0.95-1.0.
CONTENDED_SHARE = 0.8
# A round's speedup above speedup_bound by more than this factor is flagged "impossible" (the factor covers the
# noise of the call costs the bound is made of).
BOUND_MARGIN = 1.1
COLUMNS = [
    "alpha", "acceptance", "tokens_per_target_call", "expected_tokens", "token_expected_tokens",
    "block_expected_tokens",
    "new_tokens", "target_calls", "draft_calls", "seconds", "plain_seconds", "c", "speedup", "speedup_min",
    "speedup_max", "spread", "speedup_bound", "threads", "cpu_share", "predicted_speedup", "cost_model_speedup",
    "flag", "levels",
]


class Round(NamedTuple):
    """One timed round: the results, one per prompt, the wall seconds of all their generate calls, the process's
    CPU seconds over the same calls, the torch threads it ran with, and whether its models ran on the CPU (on a
    device the host waits for the device, so its CPU time says nothing of contention)."""
    speculative: List[Any]
    plain: List[Any]
    speculative_seconds: float
    plain_seconds: float
    speculative_cpu_seconds: float = math.nan
    plain_cpu_seconds: float = math.nan
    threads: Optional[int] = None
    on_cpu: bool = False


def check_repeats(repeats) -> int:
    if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1 (timed rounds per setting), got {repeats!r}")
    return int(repeats)


def check_spread_threshold(spread_threshold) -> float:
    if isinstance(spread_threshold, bool) or not isinstance(spread_threshold, numbers.Real) or \
            not spread_threshold > 0:
        raise ValueError(f"spread_threshold must be a number > 0, got {spread_threshold!r}")
    return float(spread_threshold)


def check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (prompts per generate call), got {batch_size!r}")
    return int(batch_size)


def check_threads(threads) -> Optional[int]:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral)
                                or threads < 1):
        raise ValueError(f"threads must be an integer >= 1 (torch's intra-op threads for the timed runs) or None "
                         f"(torch's own setting), got {threads!r}")
    return None if threads is None else int(threads)


def timed_rounds(speculative: Callable, plain: Callable, calls: Sequence[Mapping[str, Any]], *,
                 max_new_tokens: int, seed: int, repeats: int, batch_size: int = 1, threads: Optional[int] = 1,
                 device="cpu") -> List[Round]:
    """An untimed warm-up of both, then ``repeats`` rounds interleaved ABBA (module docstring).

    speculative, plain: ``generate``-like callables (a decoder's ``generate``; ``speculant.generate`` bound to
    the target and the same sampling settings); calls: the keyword arguments per prompt
    (``analysis.generation_kwargs``), prompt i generated with seed ``seed + i``, ``batch_size`` prompts per
    call (``analysis.batch_kwargs``). threads: torch's intra-op threads while they run (torch's setting is
    restored after); None keeps torch's setting. device: where the models run; on the CPU the rounds' CPU time
    is checked for contention (``summarize``)."""
    repeats = check_repeats(repeats)
    batch_size = check_batch_size(batch_size)
    threads = check_threads(threads)
    batches = [(first, analysis.batch_kwargs(calls[first:first + batch_size]))
               for first in range(0, len(calls), batch_size)]

    def run(generate_one) -> Tuple[list, float, float]:
        results, start, cpu = [], time.perf_counter(), time.process_time()
        for first, (kwargs, batched) in batches:
            out = generate_one(**kwargs, max_new_tokens=max_new_tokens, seed=seed + first)
            results.extend(out if batched else [out])
        return results, time.perf_counter() - start, time.process_time() - cpu

    before = torch.get_num_threads()
    used = before if threads is None else threads
    on_cpu = torch.device(device).type == "cpu"
    torch.set_num_threads(used)
    try:
        pair = (speculative, plain)
        for generate_one in pair:  # untimed: every shape the timed rounds will use
            run(generate_one)
        rounds = []
        for r in range(repeats):
            done = {i: run(pair[i]) for i in ((0, 1) if r % 2 == 0 else (1, 0))}  # ABBA
            rounds.append(Round(done[0][0], done[1][0], done[0][1], done[1][1], done[0][2], done[1][2], used,
                                on_cpu))
    finally:
        torch.set_num_threads(before)
    return rounds


class HeadToHead(NamedTuple):
    """Two decoders timed against each other (head_to_head): per round, the second's seconds per token over the
    first's (> 1: the first is faster); their median with min-max; how many rounds the first won; and the
    two-sided sign test's p-value of that count under "neither is faster" (each round a fair coin)."""
    ratio: float
    ratio_min: float
    ratio_max: float
    ratios: List[float]
    first_faster: int
    sign_test_p: float


def head_to_head(first: Callable, second: Callable, calls: Sequence[Mapping[str, Any]], *, max_new_tokens: int,
                 seed: int, repeats: int) -> HeadToHead:
    """``first`` against ``second`` (generate-like callables), timed as timed_rounds times speculative against
    plain: a warm-up, then ``repeats`` rounds interleaved ABBA. A slow spell of the machine hits one round, so the
    count of rounds won says more than the range of the ratios."""
    rounds = timed_rounds(first, second, calls, max_new_tokens=max_new_tokens, seed=seed, repeats=repeats)
    ratios = [_per_token(r.plain_seconds, totals(r.plain)) / _per_token(r.speculative_seconds, totals(r.speculative))
              for r in rounds]
    ratio, low, high = median_range(ratios)
    wins, n = sum(x > 1.0 for x in ratios), len(ratios)
    tail = sum(math.comb(n, k) for k in range(min(wins, n - wins) + 1)) / 2.0 ** n  # the smaller tail
    return HeadToHead(ratio, low, high, ratios, wins, min(1.0, 2.0 * tail))


def totals(results) -> Dict[str, float]:
    """The counts and seconds of several generations' stats, summed."""
    stats = [r.stats for r in results]
    return {key: sum(getattr(s, key) for s in stats)
            for key in ("new_tokens", "target_calls", "draft_calls", "drafted_tokens", "accepted_tokens",
                        "target_seconds", "draft_seconds", "other_seconds", "total_seconds")}


def rule_expectations(results) -> Dict[str, float]:
    """Each rule's tokens per target call on the drafts that several generations verified (Stats'
    token_expected_tokens and block_expected_tokens, pooled over their iterations). Chains give both rules; trees
    give the rule that ran, and NaN for the other one."""
    stats = [r.stats for r in results]
    iterations = sum(s.predicted_iterations for s in stats)
    if not iterations:
        return {"token_expected_tokens": math.nan, "block_expected_tokens": math.nan}
    return {f"{rule}_expected_tokens": 1.0 + sum(getattr(s, f"{rule}_kept_sum") for s in stats) / iterations
            for rule in ("token", "block")}


def median_range(values: Sequence[float]) -> Tuple[float, float, float]:
    """(median, min, max) of the rounds' values."""
    return float(np.median(values)), float(min(values)), float(max(values))


def _per_token(seconds: float, summed: Dict[str, float]) -> float:
    return seconds / summed["new_tokens"] if summed["new_tokens"] else math.nan


def tree_table(results, reached: bool = False) -> List[List[float]]:
    """The acceptance table by depth and rank (analysis.acceptance_from_counts) of token-tree generations,
    their counts summed; empty when a depth was never visited (no estimate for it). reached=True: the table down
    to the first depth never visited instead (the depths a grown tree's accepted paths reached)."""
    visits, accepted, offered = _tree_counts(results)
    if reached:
        depth = _reached(visits)
        visits, accepted, offered = visits[:depth], accepted[:depth], offered[:depth]
    if not visits or min(visits) == 0:
        return []
    return analysis.acceptance_from_counts(accepted, visits, offered)


def _reached(visits) -> int:
    """The first depth never visited (the depths above it are the ones the accepted paths reached)."""
    return next((i for i, v in enumerate(visits) if v == 0), len(visits))


def _tree_counts(results):
    """The token-tree counts of `results` summed: visits by depth, accepted and offered by depth and rank."""
    def table(name):
        return [[sum(c) for c in zip(*rows)] for rows in zip(*(getattr(r.stats, name) for r in results))]
    return [sum(v) for v in zip(*(r.stats.tree_visits for r in results))], table("tree_accepted"), table("tree_offered")


def tree_prediction(results, tree, c: float, verify_cost=None, sibling: bool = False) -> Tuple[float, float]:
    """(expected tokens per target call, predicted speedup) by the tree theory at the acceptance table the
    generations `results` measured (``tree_table``); verify_cost as analysis.tree_speedup's (None: a wide call
    costs one target call); sibling: drafted with a sibling draft, whose calls count too (analysis.tree_draft_calls,
    each costing c, then the mean of the two models' calls). A shape: its own (analysis.tree_expected_tokens,
    analysis.tree_speedup at analysis.tree_draft_calls's calls); NaN if a depth was never visited or the table is
    no positional model (a depth's rates summing above 1, see _covers). A grown tree
    (speculant.DynamicTree), whose shape changes every iteration: the mean over the iterations of the expected
    tokens of the tree each drafted (Iteration.tree), over the mean of its cost (analysis.tree_draft_calls times c,
    plus verify_cost of its width); the table stops at the first depth the accepted paths never reached with
    children to try, and each tree is cut there (what lies deeper was never reached, so it adds nothing
    measurable)."""
    nan = math.nan
    if isinstance(tree, Sequence):
        table = tree_table(results)
        if not _covers(table, tree):
            return nan, nan
        calls = analysis.tree_draft_calls(list(tree), sibling)
        speedup = nan if math.isnan(c) else analysis.tree_speedup(list(tree), table, c, verify_cost, draft_calls=calls)
        return float(analysis.tree_expected_tokens(list(tree), table)), speedup
    visits, accepted, offered = _tree_counts(results)
    reached = _reached(visits)
    drafted = [_cut(it.tree, reached) for r in results for it in r.trace if len(it.tree) > 1]
    if reached == 0 or not drafted:
        return nan, nan
    table = analysis.acceptance_from_counts(accepted[:reached], visits[:reached], offered[:reached])
    if not all(_covers(table, t) for t in drafted):
        return nan, nan
    tokens = float(np.mean([float(analysis.tree_expected_tokens(t, table)) for t in drafted]))
    width = analysis.verify_cost_function(verify_cost)
    cost = float(np.mean([analysis.tree_draft_calls(t, sibling) * c + width(len(t)) for t in drafted]))
    return tokens, tokens / cost


def _covers(table: List[List[float]], tree) -> bool:
    """Whether the acceptance table estimates every rank `tree` has at every depth (a rank never offered on the
    accepted paths has no estimate: acceptance_from_counts ends the row before it) and is a positional model at
    all: where the nodes of one depth have different numbers of children (given parents, grown trees), each rank's
    rate is over the nodes that had it, and the rates of one depth can sum above 1 (nodes with more children
    accepting more often), which no positional table does; such a table predicts nothing."""
    need = Tree(list(tree)).max_children
    return len(table) >= len(need) and all(len(table[i]) >= k for i, k in enumerate(need)) \
        and all(sum(row) <= 1.0 + 1e-9 for row in table)


def _cut(parents: Sequence[int], depth: int) -> List[int]:
    """A tree's breadth-first parents without its nodes deeper than `depth`."""
    depths = [0]
    for v in range(1, len(parents)):
        depths.append(depths[parents[v]] + 1)
    return [parents[v] for v in range(len(parents)) if depths[v] <= depth]


def _per_call(seconds: float, calls: float) -> float:
    return seconds / calls if calls else math.nan


def level_table(rounds: Sequence[Round], plain_target_calls: Sequence[float]) -> List[Dict[str, float]]:
    """A hierarchical draft's levels below the top (Result.levels), one dict each: gamma, alpha (pooled over the
    prompts), tokens_per_target_call, and c: the median over the rounds of the level's model time per call over
    the time per call of the model above it (the top's target: plain_target_calls[r], its seconds per call in
    round r's plain decoding); the lowest level's drafter counts per call, or per drafted token when it calls no
    model. Empty without levels."""
    first = rounds[0].speculative
    depth = len(first[0].levels) if first and getattr(first[0], "levels", ()) else 0
    out = []
    for i in range(depth):
        stats = [r.levels[i] for r in first]
        beta_count = sum(s.beta_count for s in stats)
        calls = sum(s.target_calls for s in stats)
        costs = []
        for r, round_ in enumerate(rounds):
            level = [x.levels[i] for x in round_.speculative]
            above = [x.levels[i - 1] for x in round_.speculative] if i else None
            above_call = plain_target_calls[r] if i == 0 else _per_call(
                sum(s.target_seconds for s in above), sum(s.target_calls for s in above))
            costs.append(_per_call(sum(s.target_seconds for s in level), sum(s.target_calls for s in level))
                         / above_call)
        out.append({"gamma": stats[0].gamma, "alpha": sum(s.beta_sum for s in stats) / beta_count if beta_count
                    else math.nan, "tokens_per_target_call": sum(s.new_tokens for s in stats) / calls if calls
                    else math.nan, "c": float(np.median(costs))})
    if out:  # the lowest level's drafter, against that level's model
        bottom, costs = len(out) - 1, []
        for round_ in rounds:
            level = [x.levels[bottom] for x in round_.speculative]
            per = sum(s.draft_calls for s in level) or sum(s.drafted_tokens for s in level)
            costs.append(_per_call(sum(s.draft_seconds for s in level), per)
                         / _per_call(sum(s.target_seconds for s in level), sum(s.target_calls for s in level)))
        out.append({"gamma": math.nan, "alpha": math.nan, "tokens_per_target_call": math.nan,
                    "c": float(np.median(costs))})
    return out


def _pooled(stats) -> Dict[str, float]:
    keys = ("target_calls", "drafted_tokens", "draft_calls", "target_seconds", "draft_seconds", "other_seconds")
    return {key: sum(getattr(s, key) for s in stats) for key in keys}


def _slope(counts: Dict[str, float], unit: float) -> float:
    """A verification call of w tokens costs 1 + slope * (w - 1) calls of `unit` seconds: the slope from the mean
    verification call at its mean width (1 + drafted tokens per call)."""
    drafts = counts["drafted_tokens"] / counts["target_calls"] if counts["target_calls"] else 0.0
    return max(0.0, counts["target_seconds"] / counts["target_calls"] / unit - 1.0) / drafts if drafts else 0.0


def engine_costs(rounds: Sequence[Round]) -> Optional[Dict[str, float]]:
    """The costs the engine timed in these rounds, pooled, in one-token calls of the target in plain decoding
    (``unit``, seconds): ``slope`` (a verification call of w tokens costs 1 + slope * (w - 1)), ``overhead`` (the
    engine's own time per iteration outside the models: Stats.other_seconds per target call), ``plain_overhead``
    (the same per plain token) and ``c`` (the draft's time per call; per drafted token for a drafter that calls no
    model). With a hierarchical draft, its level below the top, in its model's mean call (``level_unit``,
    seconds): ``alpha_level``, ``gamma_level``, ``level_overhead`` and ``bottom_c`` (everything below that level,
    per its call or drafted token); ``c`` is then the level's mean call over the unit. None without target calls
    (or, with levels, without a verified position at the level)."""
    spec = _pooled([r.stats for round_ in rounds for r in round_.speculative])
    plain = _pooled([r.stats for round_ in rounds for r in round_.plain])
    if not (spec["target_calls"] and plain["target_calls"] and plain["target_seconds"] > 0):
        return None
    unit = plain["target_seconds"] / plain["target_calls"]
    costs = {"unit": unit, "slope": _slope(spec, unit), "overhead": spec["other_seconds"] / spec["target_calls"] / unit,
             "plain_overhead": plain["other_seconds"] / plain["target_calls"] / unit}
    levels = [r.levels[0] for round_ in rounds for r in round_.speculative if getattr(r, "levels", ())]
    if not levels:
        per = spec["draft_calls"] or spec["drafted_tokens"]
        return {**costs, "c": spec["draft_seconds"] / per / unit if per else 0.0}
    level = _pooled(levels)
    beta_count = sum(s.beta_count for s in levels)
    if not (level["target_calls"] and beta_count):
        return None
    call = level["target_seconds"] / level["target_calls"]
    per = level["draft_calls"] or level["drafted_tokens"]
    return {**costs, "c": call / unit, "level_unit": call, "alpha_level": sum(s.beta_sum for s in levels) / beta_count,
            "gamma_level": levels[0].gamma, "level_overhead": level["other_seconds"] / level["target_calls"] / call,
            "bottom_c": level["draft_seconds"] / per / call if per else 0.0}


def cost_model(rounds: Sequence[Round], *, acceptance: float, gamma: int, tree=None, sibling: bool = False) -> float:
    """Theorem 3.8 (composed over a hierarchical draft's levels) at ``engine_costs``: only the calls per token are
    left to the theory (Equation (1) at ``acceptance``; the draft level's recurrence, at its model's mean call as
    its unit, everything below it counted as its drafter's time; for a token tree, ``tree_prediction`` with the
    engine's time folded into the verification call's, sibling as there). NaN without a verified position."""
    costs = engine_costs(rounds)
    if costs is None or math.isnan(acceptance):
        return math.nan
    slope, overhead, plain = costs["slope"], costs["overhead"], costs["plain_overhead"]
    if tree:
        _, speedup = tree_prediction(rounds[0].speculative, tree, costs["c"],
                                     lambda w: 1.0 + slope * (w - 1) + overhead, sibling)
        return speedup * (1.0 + plain)
    wide = [lambda w: 1.0 + slope * (w - 1)]
    if "bottom_c" not in costs:
        return analysis.hierarchical_improvement([acceptance], [gamma], [costs["c"]], verify_costs=wide,
                                                 overheads=[overhead], plain_overhead=plain)
    return analysis.hierarchical_improvement(
        [acceptance, costs["alpha_level"]], [gamma, costs["gamma_level"]], [costs["c"], costs["bottom_c"]],
        verify_costs=wide + [None], overheads=[overhead, costs["level_overhead"]], plain_overhead=plain)


def round_speedup(round_: Round) -> float:
    """A round's speedup: plain wall seconds per token over speculative wall seconds per token."""
    return (_per_token(round_.plain_seconds, totals(round_.plain))
            / _per_token(round_.speculative_seconds, totals(round_.speculative)))


def median_round(rounds: Sequence[Round]) -> int:
    """The index of the round whose speedup is the median of the rounds' (the nearer one for an even count), so
    that a table of one round's times agrees with the median speedup reported beside it."""
    speedups = [round_speedup(r) for r in rounds]
    middle = float(np.median(speedups))
    return min(range(len(rounds)), key=lambda i: abs(speedups[i] - middle))


def speedup_bound(round_: Round) -> float:
    """The most speedup a round's counts allow at its measured call costs. A speculative iteration costs at
    least one plain target call t (a verification call reads what a one-token call reads, and more), the
    draft's time D per iteration, and the engine's own time per plain token o (it does at least that per
    iteration). Plain decoding pays t + o per token; speculative decoding (t + D + o) per tau tokens, tau being
    the tokens per target call. So the speedup is at most tau (t + o) / (t + D + o), and at most tau where the
    costs are unknown."""
    spec, plain = totals(round_.speculative), totals(round_.plain)
    if not spec["target_calls"]:
        return math.nan
    tau = spec["new_tokens"] / spec["target_calls"]
    if not (plain["target_calls"] and plain["new_tokens"]):
        return tau
    t = plain["target_seconds"] / plain["target_calls"]
    o = plain["other_seconds"] / plain["new_tokens"]
    d = spec["draft_seconds"] / spec["target_calls"]
    return tau * (t + o) / (t + d + o) if t + d + o > 0 else tau


def timing_checks(rounds: Sequence[Round], speedups: Sequence[float]) -> Dict[str, Any]:
    """What says whether the rounds' timings can be trusted: ``speedup_bound`` (the median over the rounds of
    ``speedup_bound``), ``threads`` (torch's threads in the rounds), ``cpu_share`` (the least CPU seconds per
    wall second of the process over any round's speculative or plain runs; NaN when the models ran on a
    device) and ``flags``: "contended" when cpu_share < CONTENDED_SHARE (the process waited for a core: other
    work shared the machine), "impossible" when a round's speedup exceeds its bound by more than BOUND_MARGIN
    (no exact decoding is that fast: the timing, not the decoding, was measured)."""
    bounds = [speedup_bound(r) for r in rounds]
    on_cpu = all(r.on_cpu for r in rounds)
    shares = [cpu / wall for r in rounds
              for cpu, wall in ((r.speculative_cpu_seconds, r.speculative_seconds),
                                (r.plain_cpu_seconds, r.plain_seconds)) if wall > 0]
    share = float(min(shares)) if on_cpu and shares else math.nan
    flags = []
    if share < CONTENDED_SHARE:
        flags.append("contended")
    if any(s > b * BOUND_MARGIN for s, b in zip(speedups, bounds) if not math.isnan(b)):
        flags.append("impossible")
    return {"speedup_bound": float(np.median(bounds)), "threads": rounds[0].threads, "cpu_share": share,
            "flags": flags}


def summarize(rounds: Sequence[Round], *, gamma: int, lenience: float,
              spread_threshold: float = SPREAD_THRESHOLD, tree: Optional[Sequence[int]] = None,
              sibling: bool = False) -> Dict[str, Any]:
    """The ``COLUMNS`` of one setting from its timed rounds: counts and alpha from the first round (every round
    generates the same tokens), times as medians over the rounds.

    alpha, Corollary 3.6: the engine's sum_x min(p, q) averaged over every verified position of every prompt;
    acceptance: the alpha that governs the speed at this lenience (A.5), alpha at lenience 1, below 1 the
    fraction of verified drafts that were kept; tokens_per_target_call measured and expected_tokens by Equation
    (1) at acceptance; token_expected_tokens and block_expected_tokens, each rule's tokens per target call
    in expectation on the drafts these runs verified (``rule_expectations``: the rule that ran and, for chains, the
    other one on the same drafts; block NaN at lenience < 1); totals over the prompts (new_tokens,
    target_calls, draft_calls, seconds of speculative and plain_seconds of plain decoding, the engine's own
    timings); c (Definition 3.7): the draft's mean seconds per
    call in the speculative runs (per drafted token for a drafter that calls no model) over the target's in
    plain decoding (on a GPU the phases' device time, cpp/device/device_clock.h); speedup: plain seconds per token over
    speculative seconds per token, with speedup_min, speedup_max and spread = (max - min) / median;
    predicted_speedup: Theorem 3.8 at acceptance, gamma and c (it assumes a verification call costs what a
    one-token call does, which a CPU does not grant); flag:
    "noisy" when spread > spread_threshold, "off theory" when the speedup lies outside a factor THEORY_FACTOR
    of the prediction. A hierarchical draft (Result.levels): c is the top's cost per drafted token, ``levels``
    lists each level below the top (level_table: gamma, alpha, tokens per call, c against the model above; the
    last entry is the lowest drafter's c), and predicted_speedup is Theorem 3.8 composed over the levels
    (analysis.hierarchical_improvement); ``levels`` is None otherwise. cost_model_speedup: the same theory at
    the costs the engine measured (``cost_model``: wide verification calls and the engine's own time count).

    tree: the shape of a token-tree setting (SpeculativeDecoder's tree=; gamma is its depth), or a
    speculant.DynamicTree. Then expected_tokens and predicted_speedup come from the tree theory at the acceptance
    table the generations measured (``tree_table``): analysis.tree_expected_tokens and analysis.tree_speedup (one
    draft call per depth, a verification call costing one target call, as Theorem 3.8 assumes); for a grown tree
    at the trees its iterations drafted (``tree_prediction``); NaN if a depth was never visited or the measured
    rates of one depth sum above 1 (nodes of one depth with different numbers of children). sibling: the tree
    was drafted with a sibling draft (SpeculativeDecoder's sibling_draft=): c is then the mean of the two models'
    calls, and the tree costs analysis.tree_draft_calls(tree, sibling=True) of them.
    """
    spread_threshold = check_spread_threshold(spread_threshold)
    if not rounds:
        raise ValueError("rounds must hold at least one timed round")
    results = rounds[0][0]
    spec = totals(results)
    positions = [analysis.verified_positions(r.trace) for r in results]
    verified = sum(positions)
    nan = math.nan
    alpha = sum(r.stats.alpha * n for r, n in zip(results, positions) if n) / verified if verified else nan
    acceptance = alpha if lenience == 1.0 or not verified else spec["accepted_tokens"] / verified
    # a draft model's time per call; for a drafter without model calls (speculant.drafters tables, prompt
    # lookup, Python code) its time per drafted token, the cost Theorem 3.8's c stands for
    per = spec["draft_calls"] or spec["drafted_tokens"]
    speedups, costs, seconds, plain_seconds = [], [], [], []
    for round_ in rounds:
        timed, plain = totals(round_.speculative), totals(round_.plain)
        speedups.append(round_speedup(round_))
        draft_call = timed["draft_seconds"] / per if per else nan
        target_call = plain["target_seconds"] / plain["target_calls"] if plain["target_calls"] else nan
        costs.append(draft_call / target_call if target_call > 0 else nan)
        seconds.append(round_.speculative_seconds)
        plain_seconds.append(round_.plain_seconds)
    speedup, speedup_min, speedup_max = median_range(speedups)
    c = float(np.median(costs))
    spread = (speedup_max - speedup_min) / speedup
    checks = timing_checks(rounds, speedups)
    known = not (math.isnan(acceptance) or math.isnan(c))
    expected = analysis.expected_tokens(acceptance, gamma) if verified else nan
    predicted = analysis.walltime_improvement(acceptance, gamma, c) if known else nan
    plain_calls = []
    for round_ in rounds:
        plain = totals(round_.plain)
        plain_calls.append(_per_call(plain["target_seconds"], plain["target_calls"]))
    levels = level_table(rounds, plain_calls)
    if levels:  # Theorem 3.8 composed over the levels (analysis.hierarchical_improvement)
        alphas = [acceptance] + [level["alpha"] for level in levels[:-1]]
        gammas = [gamma] + [level["gamma"] for level in levels[:-1]]
        costs = [level["c"] for level in levels]
        known = all(not math.isnan(x) for x in alphas + costs)
        predicted = analysis.hierarchical_improvement(alphas, gammas, costs) if known else nan
    modelled = cost_model(rounds, acceptance=acceptance, gamma=gamma, tree=tree, sibling=sibling)
    if tree:
        expected, predicted = tree_prediction(results, tree, c, sibling=sibling)
        known = not (math.isnan(expected) or math.isnan(c))
        predicted = predicted if known else nan
    flags = checks.pop("flags")
    if spread > spread_threshold:
        flags.append("noisy")
    if known and not predicted / THEORY_FACTOR <= speedup <= predicted * THEORY_FACTOR:
        flags.append("off theory")
    return {
        "alpha": alpha, "acceptance": acceptance,
        "tokens_per_target_call": spec["new_tokens"] / spec["target_calls"] if spec["target_calls"] else nan,
        "expected_tokens": expected, **rule_expectations(results),
        "new_tokens": spec["new_tokens"], "target_calls": spec["target_calls"], "draft_calls": spec["draft_calls"],
        "seconds": float(np.median(seconds)), "plain_seconds": float(np.median(plain_seconds)), "c": c,
        "speedup": speedup, "speedup_min": speedup_min, "speedup_max": speedup_max, "spread": spread, **checks,
        "predicted_speedup": predicted, "cost_model_speedup": modelled, "flag": ", ".join(flags),
        "levels": levels or None,
    }
