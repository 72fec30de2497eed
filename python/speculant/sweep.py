"""Sweeps: a target / draft pair over grids of gamma, temperature, lenience, top-k and top-p on a prompt set,
each setting measured against plain decoding of the same target, one row per setting (a pandas DataFrame)."""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import analysis
from .decoder import SpeculativeDecoder, generate
from .model import Model

Grid = Union[float, Sequence[float]]

COLUMNS = [
    "gamma", "temperature", "top_k", "top_p", "lenience",
    "alpha", "acceptance", "tokens_per_target_call", "expected_tokens",
    "new_tokens", "target_calls", "draft_calls", "seconds", "plain_seconds", "c", "speedup", "speedup_min",
    "speedup_max", "spread", "predicted_speedup", "flag",
]
THEORY_FACTOR = 2.0  # a measured speedup outside [predicted / 2, predicted * 2] is flagged
_RESERVED = {"prompt_ids", "max_new_tokens", "seed", "temperature", "top_k", "top_p", "gamma", "lenience"}


def _grid(values: Grid, name: str) -> List:
    """A grid as a list of Python numbers: one number, or a sequence or 1-D array of them."""
    values = values.tolist() if isinstance(values, np.ndarray) else values
    values = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else [values]
    if not values:
        raise ValueError(f"{name} must hold at least one value")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be numbers, got {value!r}")
    return values


def _totals(results) -> Dict[str, float]:
    stats = [r.stats for r in results]
    return {key: sum(getattr(s, key) for s in stats)
            for key in ("new_tokens", "target_calls", "draft_calls", "accepted_tokens", "target_seconds",
                        "draft_seconds", "total_seconds")}


def sweep(target: Model, draft, prompts, *, gammas: Grid, temperatures: Grid = (1.0,),
          lenience: Grid = (1.0,), top_k: Grid = (0,), top_p: Grid = (1.0,), max_new_tokens: int = 64,
          seed: int = 0, repeats: int = 3, spread_threshold: float = 0.25, progress: bool = True,
          generate_kwargs: Optional[Mapping[str, Any]] = None):
    """Runs speculative decoding for every combination of the grids and returns a ``pandas.DataFrame``, one row
    per setting (columns in ``COLUMNS``).

    prompts: one prompt or a sequence of them; each is token ids, or a mapping of ``generate`` keyword
    arguments (see ``speculant.analysis.generation_kwargs``). ``generate_kwargs`` go to every generation,
    speculative and plain (``eos_token_id``, ...).

    Every setting generates ``max_new_tokens`` from every prompt, prompt i with seed ``seed + i``, so the same
    seed gives the same tokens, alpha and counts (not the same times). Timing, so that no speedup is noise:
    each setting first runs once untimed, speculative and plain decoding of the target at the same sampling
    settings, over every prompt (this warms every input shape the timed runs use: TorchScript re-optimizes
    per shape in its first calls, which would otherwise cost seconds inside a timed run); then ``repeats``
    timed rounds, speculative and plain interleaved (ABBA: the order flips every round), so that a drift of
    the machine's speed hits both. Times are medians over the rounds; ``speedup`` is the median of the rounds'
    speedups, with ``speedup_min`` / ``speedup_max`` and ``spread`` = (max - min) / median. A row whose spread
    exceeds ``spread_threshold``, or whose speedup lies outside a factor THEORY_FACTOR = 2 of Theorem 3.8's
    prediction, is flagged in ``flag`` ("noisy", "off theory"), with one RuntimeWarning for the sweep.

    Columns: the setting; ``alpha``, Corollary 3.6: the engine's sum_x min(p, q) averaged over every verified
    position of every prompt (it does not depend on lenience); ``acceptance``, the alpha that governs the
    speed at the setting's lenience (A.5): equal to ``alpha`` at lenience 1, below 1 the fraction of verified
    drafts that were kept; ``tokens_per_target_call`` measured and ``expected_tokens`` from Equation (1) at
    ``acceptance``; totals over the prompts (``new_tokens``, ``target_calls``, ``draft_calls``, ``seconds`` of
    speculative and ``plain_seconds`` of plain decoding, the engine's own timings); ``c`` (Definition 3.7),
    the draft's mean seconds per call in the speculative runs (per drafted token for a drafter that calls no
    model: speculant.drafters) over the target's mean seconds per call in plain decoding (median over the
    rounds); ``speedup``, plain seconds per token over speculative seconds per token; ``predicted_speedup``,
    Theorem 3.8 at ``acceptance``, gamma and ``c`` (it assumes a verification call costs what a one-token call
    does, which a CPU does not grant).

    A progress bar (tqdm) counts the settings. Interrupting the sweep (KeyboardInterrupt, the Jupyter stop
    button) returns the rows finished so far with a RuntimeWarning and ``frame.attrs["interrupted"] = True``.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    reserved = sorted(_RESERVED.intersection(generate_kwargs or {}))
    if reserved:
        raise ValueError(f"generate_kwargs must not set {reserved}: the sweep sets them")
    if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1 (timed rounds per setting), got {repeats!r}")
    if isinstance(spread_threshold, bool) or not isinstance(spread_threshold, numbers.Real) or \
            not spread_threshold > 0:
        raise ValueError(f"spread_threshold must be a number > 0, got {spread_threshold!r}")
    grids = [_grid(temperatures, "temperatures"), _grid(top_k, "top_k"), _grid(top_p, "top_p"),
             _grid(gammas, "gammas"), _grid(lenience, "lenience")]
    settings = list(itertools.product(*grids))
    # Built first, so that a bad value anywhere in the grids raises before anything runs.
    decoders = [SpeculativeDecoder(target, draft, gamma=g, temperature=t, top_k=k, top_p=p, lenience=leniency)
                for t, k, p, g, leniency in settings]
    calls = analysis.generation_kwargs(prompts, generate_kwargs)

    def run(generate_one, tokens: int) -> list:
        return [generate_one(**kwargs, max_new_tokens=tokens, seed=seed + i) for i, kwargs in enumerate(calls)]

    rows: List[Dict[str, Any]] = []
    interrupted = False
    bar = tqdm(total=len(settings), desc="speculant sweep", disable=not progress)
    try:
        for (temperature, k, p, gamma, leniency), decoder in zip(settings, decoders):
            baseline = functools.partial(generate, target, temperature=temperature, top_k=k, top_p=p)
            pair = (decoder.generate, baseline)
            for run_one in pair:  # untimed: every shape the timed rounds will use
                run(run_one, max_new_tokens)
            rounds = []  # [(speculative results, plain totals)] per round
            for r in range(repeats):
                done = {i: run(pair[i], max_new_tokens) for i in ((0, 1) if r % 2 == 0 else (1, 0))}  # ABBA
                rounds.append((done[0], _totals(done[1])))
            rows.append(_row(rounds, spread_threshold, gamma=gamma, temperature=temperature, top_k=k, top_p=p,
                             lenience=leniency))
            bar.update()
    except KeyboardInterrupt:
        interrupted = True
        warnings.warn(f"sweep interrupted: returning the {len(rows)} of {len(settings)} settings it finished",
                      RuntimeWarning, stacklevel=2)
    finally:
        bar.close()
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs.update(interrupted=interrupted, prompts=len(calls), max_new_tokens=max_new_tokens, seed=seed,
                       repeats=repeats)
    flagged = frame[frame.flag != ""]
    if len(flagged):
        warnings.warn(f"{len(flagged)} of {len(frame)} settings are flagged (column 'flag'): a spread of the "
                      f"speedup over {repeats} rounds above {spread_threshold:.0%} ('noisy': the machine was busy, "
                      f"or the runs are too short) or a speedup outside a factor {THEORY_FACTOR:g} of Theorem "
                      "3.8's prediction ('off theory'); read those rows with care", RuntimeWarning, stacklevel=2)
    return frame


def _per_token(totals: Dict[str, float]) -> float:
    return totals["total_seconds"] / totals["new_tokens"] if totals["new_tokens"] else math.nan


def _row(rounds, spread_threshold: float, *, gamma: int, temperature: float, top_k: int, top_p: float,
         lenience: float) -> Dict[str, Any]:
    """One setting's row from its timed rounds [(speculative results, plain totals)]: counts and alpha from the
    first round (every round generates the same tokens), times as medians over the rounds."""
    results, _ = rounds[0]
    spec = _totals(results)
    positions = [analysis.verified_positions(r.trace) for r in results]
    verified = sum(positions)
    nan = math.nan
    alpha = sum(r.stats.alpha * n for r, n in zip(results, positions) if n) / verified if verified else nan
    acceptance = alpha if lenience == 1.0 or not verified else spec["accepted_tokens"] / verified
    # a draft model's time per call; for a drafter without model calls (speculant.drafters tables, prompt
    # lookup, Python code) its time per drafted token, the cost Theorem 3.8's c stands for
    drafted = sum(r.stats.drafted_tokens for r in results)
    per = spec["draft_calls"] or drafted
    speedups, costs, seconds, plain_seconds = [], [], [], []
    for round_results, plain in rounds:
        timed = _totals(round_results)
        speedups.append(_per_token(plain) / _per_token(timed))
        draft_call = timed["draft_seconds"] / per if per else nan
        target_call = plain["target_seconds"] / plain["target_calls"] if plain["target_calls"] else nan
        costs.append(draft_call / target_call if target_call > 0 else nan)
        seconds.append(timed["total_seconds"])
        plain_seconds.append(plain["total_seconds"])
    speedup, c = float(np.median(speedups)), float(np.median(costs))
    spread = (max(speedups) - min(speedups)) / speedup
    known = not (math.isnan(acceptance) or math.isnan(c))
    predicted = analysis.walltime_improvement(acceptance, gamma, c) if known else nan
    flags = []
    if spread > spread_threshold:
        flags.append("noisy")
    if known and not predicted / THEORY_FACTOR <= speedup <= predicted * THEORY_FACTOR:
        flags.append("off theory")
    return {
        "gamma": gamma, "temperature": temperature, "top_k": top_k, "top_p": top_p, "lenience": lenience,
        "alpha": alpha, "acceptance": acceptance,
        "tokens_per_target_call": spec["new_tokens"] / spec["target_calls"] if spec["target_calls"] else nan,
        "expected_tokens": analysis.expected_tokens(acceptance, gamma) if verified else nan,
        "new_tokens": spec["new_tokens"], "target_calls": spec["target_calls"], "draft_calls": spec["draft_calls"],
        "seconds": float(np.median(seconds)), "plain_seconds": float(np.median(plain_seconds)), "c": c,
        "speedup": speedup, "speedup_min": min(speedups), "speedup_max": max(speedups), "spread": spread,
        "predicted_speedup": predicted, "flag": ", ".join(flags),
    }
