"""Sweeps: a target / draft pair over grids of gamma, temperature, lenience, top-k and top-p on a prompt set,
each setting measured against plain decoding of the same target, one row per setting (a pandas DataFrame)."""

from __future__ import annotations

import functools
import itertools
import numbers
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import analysis, timing
from .decoder import SpeculativeDecoder, generate
from .model import Model

Grid = Union[float, Sequence[float]]

COLUMNS = ["gamma", "temperature", "top_k", "top_p", "lenience", *timing.COLUMNS]
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


def sweep(target: Model, draft, prompts, *, gammas: Grid, temperatures: Grid = (1.0,),
          lenience: Grid = (1.0,), top_k: Grid = (0,), top_p: Grid = (1.0,), max_new_tokens: int = 64,
          seed: int = 0, repeats: int = 3, spread_threshold: float = timing.SPREAD_THRESHOLD, progress: bool = True,
          generate_kwargs: Optional[Mapping[str, Any]] = None):
    """Runs speculative decoding for every combination of the grids and returns a ``pandas.DataFrame``, one row
    per setting (columns in ``COLUMNS``).

    prompts: one prompt or a sequence of them; each is token ids, or a mapping of ``generate`` keyword
    arguments (see ``speculant.analysis.generation_kwargs``). ``generate_kwargs`` go to every generation,
    speculative and plain (``eos_token_id``, ...).

    Every setting generates ``max_new_tokens`` from every prompt, prompt i with seed ``seed + i``, so the same
    seed gives the same tokens, alpha and counts (not the same times). Each setting is timed by
    ``speculant.timing``, so that no speedup is noise: an untimed run of speculative and plain decoding (the
    target alone at the same sampling settings) over every prompt warms every input shape, then ``repeats``
    timed rounds interleaved ABBA; times are medians, ``speedup`` comes with ``speedup_min`` / ``speedup_max``
    and ``spread`` = (max - min) / median. A row whose spread exceeds ``spread_threshold``, or whose speedup
    lies outside a factor timing.THEORY_FACTOR = 2 of Theorem 3.8's prediction, is flagged in ``flag`` ("noisy",
    "off theory"), with one RuntimeWarning for the sweep.

    Columns: the setting (gamma, temperature, top_k, top_p, lenience), then ``timing.COLUMNS``, defined in
    ``speculant.timing.summarize``: ``alpha`` (Corollary 3.6; it does not depend on lenience), ``acceptance``
    (the alpha that sets the speed at the row's lenience, A.5), ``tokens_per_target_call`` and Equation (1)'s
    ``expected_tokens``, totals over the prompts, ``c`` (Definition 3.7), the measured ``speedup`` and Theorem
    3.8's ``predicted_speedup``.

    A progress bar (tqdm) counts the settings. Interrupting the sweep (KeyboardInterrupt, the Jupyter stop
    button) returns the rows finished so far with a RuntimeWarning and ``frame.attrs["interrupted"] = True``.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    if generate_kwargs is not None and not isinstance(generate_kwargs, Mapping):
        raise ValueError("generate_kwargs must be a mapping of generate's keyword arguments, got "
                         f"{type(generate_kwargs).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (prompt i uses seed + i), got {seed!r}")
    reserved = sorted(_RESERVED.intersection(generate_kwargs or {}))
    if reserved:
        raise ValueError(f"generate_kwargs must not set {reserved}: the sweep sets them")
    repeats = timing.check_repeats(repeats)
    spread_threshold = timing.check_spread_threshold(spread_threshold)
    grids = [_grid(temperatures, "temperatures"), _grid(top_k, "top_k"), _grid(top_p, "top_p"),
             _grid(gammas, "gammas"), _grid(lenience, "lenience")]
    settings = list(itertools.product(*grids))
    # Built first, so that a bad value anywhere in the grids raises before anything runs.
    decoders = [SpeculativeDecoder(target, draft, gamma=g, temperature=t, top_k=k, top_p=p, lenience=leniency)
                for t, k, p, g, leniency in settings]
    calls = analysis.generation_kwargs(prompts, generate_kwargs)

    rows: List[Dict[str, Any]] = []
    interrupted = False
    bar = tqdm(total=len(settings), desc="speculant sweep", disable=not progress)
    try:
        for (temperature, k, p, gamma, leniency), decoder in zip(settings, decoders):
            baseline = functools.partial(generate, target, temperature=temperature, top_k=k, top_p=p)
            rounds = timing.timed_rounds(decoder.generate, baseline, calls, max_new_tokens=max_new_tokens,
                                         seed=seed, repeats=repeats)
            rows.append({"gamma": gamma, "temperature": temperature, "top_k": k, "top_p": p, "lenience": leniency,
                         **timing.summarize(rounds, gamma=gamma, lenience=leniency,
                                            spread_threshold=spread_threshold)})
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
                      f"or the runs are too short) or a speedup outside a factor {timing.THEORY_FACTOR:g} of Theorem "
                      "3.8's prediction ('off theory'); read those rows with care", RuntimeWarning, stacklevel=2)
    return frame
