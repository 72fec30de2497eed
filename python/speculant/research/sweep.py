"""Sweeps: a target / draft pair over grids of gamma (and token-tree shapes), temperature, lenience, top-k and
top-p on a prompt set, each setting measured against plain decoding of the same target, one row per setting (a
pandas DataFrame).

Each setting runs as one call of ``run_setting``: in this process (serial), or as one task of an executor
(``executor=``), where ``task`` rebuilds the models from the files that ``speculant.workers`` describes."""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import numbers
import uuid
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import analysis, timing, workers
from ..decoding.decoder import SIBLINGS, VERIFICATIONS, DynamicTree, SpeculativeDecoder, generate, tree_gamma
from ..decoding.sampling import SamplingSettings, overridden
from ..models.model import Model

Grid = Union[float, Sequence[float]]

# SpeculativeDecoder's arguments (sibling_draft: whether the row's tree draws its later children from the sweep's
# sibling draft)
SETTING = ["gamma", "tree", "siblings", "verification", "sibling_draft", "temperature", "top_k", "top_p", "lenience"]
COLUMNS = [*SETTING, *timing.COLUMNS]
_RESERVED = {"prompt_ids", "max_new_tokens", "seed", "temperature", "top_k", "top_p", "gamma", "tree", "lenience",
             "sampling"}
GRIDS = {"temperatures": "temperature", "top_k": "top_k", "top_p": "top_p", "lenience": "lenience"}  # grid: field


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


def run_setting(target, draft, setting: Mapping[str, Any], calls: Sequence[Mapping[str, Any]], *,
                max_new_tokens: int, seed: int, repeats: int, spread_threshold: float,
                batch_size: int = 1, sibling_draft: Optional[Model] = None,
                threads: Optional[int] = 1) -> Dict[str, Any]:
    """One row of a sweep: speculative decoding at ``setting`` (the ``SETTING`` columns) timed against plain
    decoding of the target at the same sampling settings (``timing.timed_rounds``), then ``timing.summarize``.
    calls: one dict of ``generate`` keyword arguments per prompt (``analysis.generation_kwargs``); sibling_draft:
    the model of a setting whose ``sibling_draft`` is True (its calls then count as draft calls); threads: torch's
    threads for the timed runs (``timing.timed_rounds``)."""
    decoder = SpeculativeDecoder(target, _level(draft, setting), **_options(setting, sibling_draft))
    baseline = functools.partial(generate, target, sampling=_sampling(setting))
    rounds = timing.timed_rounds(decoder.generate, baseline, calls, max_new_tokens=max_new_tokens, seed=seed,
                                 repeats=repeats, batch_size=batch_size, threads=threads, device=target.device)
    return {**setting, **timing.summarize(rounds, gamma=setting["gamma"], lenience=setting["lenience"],
                                          spread_threshold=spread_threshold, tree=setting["tree"],
                                          sibling=setting["sibling_draft"])}


def _level(draft, setting: Mapping[str, Any]):
    """The draft for a setting: a hierarchical draft (a SpeculativeDecoder) at the setting's sampling settings,
    since every level samples at the top's (SpeculativeDecoder); any other draft as it is."""
    if isinstance(draft, SpeculativeDecoder):
        return draft.with_sampling(*_sampling(setting).standardization())
    return draft


def _sampling(setting: Mapping[str, Any]) -> SamplingSettings:
    """A setting's temperature, top_k, top_p and lenience, checked."""
    return SamplingSettings(*(setting[field] for field in GRIDS.values()))


def task(target: workers.Spec, draft: workers.Spec, setting: Dict[str, Any], calls: List[Dict[str, Any]],
         options: Dict[str, Any], task_id: str, sibling_draft: Optional[workers.Spec] = None) -> Dict[str, Any]:
    """One setting in an executor's worker: ``run_setting`` on the models and drafter rebuilt from their specs
    (``speculant.workers``: loaded once per worker and reused; the sibling draft's only for a setting that uses
    it). Every argument is plain data; ``options`` holds run_setting's keywords. ``task_id`` is unique to each
    task, so that an executor that caches pure function calls by their arguments (dask's, by default) runs every
    setting of every sweep anew."""
    del task_id
    sibling = workers.rebuild(sibling_draft, "sibling_draft") if setting["sibling_draft"] else None
    return run_setting(workers.rebuild(target, "target"), workers.rebuild(draft, "draft"), setting, calls,
                       sibling_draft=sibling, **options)


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _describe(setting: Mapping[str, Any]) -> str:
    """'gamma=2, temperature=0.0, ...': a chain's setting leaves out tree=None and siblings=None, and a setting
    without a sibling draft sibling_draft=False."""
    return ", ".join(f"{key}={setting[key]!r}" for key in SETTING
                     if not (key in ("tree", "siblings") and setting[key] is None)
                     and not (key == "sibling_draft" and not setting[key]))


def _options(setting: Mapping[str, Any], sibling_draft=None) -> Dict[str, Any]:
    """SpeculativeDecoder's keyword arguments for a setting (its sampling settings as ``sampling``; a chain's row
    has no siblings; sibling_draft: the model a setting whose sibling_draft is True draws with)."""
    options = {key: value for key, value in setting.items() if key not in ("sibling_draft", *GRIDS.values())
               and not (key == "siblings" and value is None)}
    options["sampling"] = _sampling(setting)
    if setting["sibling_draft"]:
        if sibling_draft is None:
            raise ValueError(f"the setting {_describe(setting)} draws with a sibling draft: give its model")
        options["sibling_draft"] = sibling_draft
    return options


def _run_on(executor, specs, settings: List[Dict[str, Any]], calls, options: Dict[str, Any], bar,
            results: Dict[int, Dict[str, Any]], failures: Dict[int, str]) -> None:
    """Submits one task per setting (specs: what rebuilds target and draft), then fills `results` and `failures`
    (by grid index) as they finish: an exception from submit or from a future's result() (the task raised, or
    its worker died) is a failure of that setting. On KeyboardInterrupt cancels the futures that have not
    started, and re-raises."""
    sweep_id = uuid.uuid4().hex
    futures = {}
    try:
        for i, setting in enumerate(settings):
            try:
                futures[i] = executor.submit(task, *specs[:2], setting, calls, options, f"{sweep_id}-{i}", specs[2])
            except Exception as error:  # noqa: BLE001 - a broken or shut-down executor, unpicklable arguments
                failures[i] = _error(error)
                bar.update()
        # concurrent.futures' own futures (ProcessPoolExecutor's, dask's ClientExecutor's) as they finish, so
        # that the bar counts finished settings; any other future with result(), in grid order
        if all(isinstance(f, concurrent.futures.Future) for f in futures.values()):
            index = {f: i for i, f in futures.items()}
            done = (index[f] for f in concurrent.futures.as_completed(index))
        else:
            done = iter(futures)
        for i in done:
            try:
                results[i] = futures[i].result()
            except Exception as error:  # noqa: BLE001 - the task's exception, BrokenProcessPool, KilledWorker
                failures[i] = _error(error)
            bar.update()
    except KeyboardInterrupt:
        for future in futures.values():
            future.cancel()
        raise


def _trees(trees) -> list:
    """trees= as a list of shapes, breadth-first parents (analysis.best_tree's results too) and DynamicTrees (each
    checked by SpeculativeDecoder)."""
    if trees is None:
        return []
    if isinstance(trees, (str, bytes)) or not isinstance(trees, Sequence):
        trees = None
    else:
        trees = [t.tree if isinstance(t, (analysis.TreeChoice, analysis.TreeSpeedup)) else t for t in trees]
    if trees is None or not all(isinstance(t, DynamicTree) or (isinstance(t, Sequence) and
                                                               not isinstance(t, (str, bytes))) for t in trees):
        raise ValueError(f"trees must be a list of tree shapes [k_1, ..., k_d], breadth-first parents [-1, p_1, ...] "
                         f"or speculant.DynamicTree (e.g. [[2, 2], [3, 1, 1], DynamicTree(budget=16)]), got {trees!r}")
    return [t if isinstance(t, DynamicTree) else tuple(t) for t in trees]  # checked by SpeculativeDecoder



def sweep(target: Model, draft, prompts, *, gammas: Optional[Grid] = None, trees=None,
          siblings: Union[str, Sequence[str]] = "coupled", temperatures: Optional[Grid] = None,
          lenience: Optional[Grid] = None, top_k: Optional[Grid] = None, top_p: Optional[Grid] = None,
          max_new_tokens: int = 64, seed: int = 0, repeats: int = 3,
          spread_threshold: float = timing.SPREAD_THRESHOLD, progress: bool = True,
          generate_kwargs: Optional[Mapping[str, Any]] = None, executor=None, batch_size: int = 1,
          sibling_draft=None, threads: Optional[int] = 1, sampling: Optional[SamplingSettings] = None,
          verifications: Union[str, Sequence[str]] = "token"):
    """Runs speculative decoding for every combination of the grids and returns a ``pandas.DataFrame``, one row
    per setting (columns in ``COLUMNS``).

    target, draft: ``speculant.Model`` handles or anything ``speculant.load`` takes (loaded once); draft may be
    a drafter from ``speculant.drafters`` or a SpeculativeDecoder (a hierarchical draft, rebuilt at each
    setting's sampling settings; its rows add the ``levels`` column and Theorem 3.8 composed over the levels as
    ``predicted_speedup``). prompts: one prompt or a sequence of them; each is token ids, or a
    mapping of ``generate`` keyword arguments (see ``speculant.analysis.generation_kwargs``). ``generate_kwargs``
    go to every generation, speculative and plain (``eos_token_id``, ...).

    The sampling grids (``temperatures``, ``top_k``, ``top_p``, ``lenience``: one value or several) default to
    (1.0,), (0,), (1.0,), (1.0,). ``sampling`` (a speculant.SamplingSettings) supplies the fixed ones instead: a
    grid left out is that field's one value, and a grid given overrides its field
    (``sweep(..., sampling=SamplingSettings(temperature=0.8, top_p=0.9), lenience=[1, 0.5])``).

    Every setting generates ``max_new_tokens`` from every prompt, prompt i with seed ``seed + i``, so the same
    seed gives the same tokens, alpha and counts (not the same times), serial or on an executor. Each setting
    is timed by ``speculant.timing``, so that no speedup is noise: an untimed run of speculative and plain
    decoding (the target alone at the same sampling settings) over every prompt warms every input shape, then
    ``repeats`` timed rounds interleaved ABBA; times are medians, ``speedup`` comes with ``speedup_min`` /
    ``speedup_max`` and ``spread`` = (max - min) / median. A row whose spread exceeds ``spread_threshold``, or
    whose speedup lies outside a factor timing.THEORY_FACTOR = 2 of Theorem 3.8's prediction, is flagged in
    ``flag`` ("noisy", "off theory"), with one RuntimeWarning for the sweep.

    threads: torch's intra-op threads while the settings are timed (default 1; torch's setting is restored
    after; None keeps it). On a machine shared with other work a second thread waits for a core and the timings
    fall apart; the models a sweep times are small enough that one thread is their fastest setting. Column
    ``threads`` says what each row ran with. On the CPU each round's process CPU time is measured beside its wall
    time: a row whose process got less than timing.CONTENDED_SHARE = 0.8 of a core in any round is flagged
    "contended" (column ``cpu_share``: the least it got). A row with a round faster than its tokens per target
    call allow at its measured call costs (column ``speedup_bound``, ``timing.speedup_bound``) is flagged
    "impossible": its timing is broken, and ``plots`` do not draw it as a measurement.

    batch_size: prompts per generate call, speculative and plain alike (a batch, ``SpeculativeDecoder.generate``):
    row r of a batch keeps its prompt's seed, so the tokens, alpha and counts do not depend on it, while the
    times and the speedup are those of batched decoding against batched plain decoding. 1 (the default) is
    the paper's setting. Times are the wall time of each round's calls.

    trees: token-tree shapes [k_1, ..., k_d], breadth-first parents (``analysis.best_tree``'s trees) or
    ``speculant.DynamicTree`` (``SpeculativeDecoder``'s tree=) to run beside the chains of ``gammas`` (give
    either or both), each at every temperature, top_k and top_p, with lenience 1 (trees have no lenience; other
    lenience values apply to the chains) and each of ``siblings`` (one name or several of SpeculativeDecoder's:
    "coupled", the default, "without_replacement", "with_replacement", "top"; a chain's row has none there: NaN
    in the frame). A tree's row has gamma = its depth and its shape in ``tree`` (None for chains); its
    ``expected_tokens`` and ``predicted_speedup`` come from the tree theory at the acceptance table its
    generations measured (``speculant.timing.summarize``, ``speculant.analysis``; for a grown tree, over the
    trees its iterations drafted).

    verifications: how the chains of ``gammas`` are verified, one name or several of SpeculativeDecoder's
    ``verification``: "token" (the default, Algorithm 1) and "block" (block verification); column
    ``verification``. Block verification has no lenience: its rows run at lenience 1 only, and the lenience grid's
    other values give token rows alone. Fixed trees take "block" too (traversal), but not coupled or grown ones.

    sibling_draft: a second draft model (a ``speculant.Model`` or anything ``speculant.load`` takes, loaded once)
    that draws the later children of every tree row's nodes (SpeculativeDecoder's ``sibling_draft=``; trained by
    ``speculant.distill(..., loss="residual", beside=draft)``). It needs ``trees`` of fixed shapes and siblings
    "coupled" or "with_replacement", and leaves the chains of ``gammas`` as they are: column ``sibling_draft``
    says which rows drew with it. Such a row's draft calls count both models' (the sibling runs at each depth
    down to the deepest that branches: ``analysis.tree_draft_calls``), its ``c`` is their mean call, and its
    predictions price the tree at that many calls. To compare a tree with and without the sibling
    in one frame, concatenate two sweeps (``pandas.concat``): the same seeds give the rows without it the same
    tokens.

    Columns: the setting (gamma, tree, siblings, verification, sibling_draft, temperature, top_k, top_p,
    lenience), then ``timing.COLUMNS``, defined in ``speculant.timing.summarize``: ``alpha`` (Corollary 3.6; it does not depend
    on lenience), ``acceptance`` (the alpha that sets the speed at the row's lenience, A.5),
    ``tokens_per_target_call`` and Equation (1)'s ``expected_tokens``, ``token_expected_tokens`` and
    ``block_expected_tokens`` (each rule's expectation on the drafts verified; trees: the rule that ran), totals
    over the prompts, ``c`` (Definition 3.7), the measured ``speedup`` and Theorem 3.8's ``predicted_speedup``.

    executor: None runs the settings one after the other in this process, with these models; an exception
    raised by a setting propagates (a bug in the call). Otherwise any ``concurrent.futures``-style executor (an
    object whose ``submit(fn, *args)`` returns a future with ``result()``): ``ProcessPoolExecutor``, dask's
    ``Client.get_executor()``, or a thin adaptor for Ray (docs/research.md, "Sweeps on a cluster"). Each setting becomes
    one task (``task`` in the module speculant.sweep), sent plain data only (``speculant.workers``): a model as
    its file or save_pretrained directory plus its device (and a directory's dtype and vocab_size), loaded once
    per worker; a drafter as its constructor arguments (a PythonDrafter's propose must pickle: a module-level
    function). These paths must be readable on the workers (shared storage on a real cluster). A model without
    a file (a transformers object, a ScriptModule in memory) or a drafter that cannot be rebuilt raises
    ValueError naming target or draft before anything runs. A TorchScript file that ``speculant.load(path, dtype=...)``
    converted is converted so in the workers too.

    On an executor, rows come in grid order whatever order the tasks finish in. A task that raises or whose
    worker dies (BrokenProcessPool, dask's KilledWorker, any exception from ``result()``) does not stop the
    sweep: the frame holds the settings that succeeded, ``frame.attrs["failed"]`` lists the others as dicts of
    the setting's columns and ``"error"`` ("ExceptionType: message"), and one RuntimeWarning names every failed
    setting (``attrs["failed"]`` is ``[]`` otherwise, and always serially). Workers that share a machine's cores
    time slower than one process alone: give each worker one core (``torch.set_num_threads(1)`` in the workers,
    threads_per_worker=1) and compare speedups rather than seconds.

    A progress bar (tqdm) counts the finished settings. Interrupting the sweep (KeyboardInterrupt, the Jupyter
    stop button) returns the rows finished so far with a RuntimeWarning and ``frame.attrs["interrupted"] =
    True`` (on an executor it cancels the tasks that have not started; running ones finish unread).
    """
    import pandas as pd  # before anything runs: the frame needs it

    repeats, spread_threshold, batch_size = _checked(generate_kwargs, seed, executor, repeats, spread_threshold,
                                                     batch_size)
    threads = timing.check_threads(threads)
    grids = _grids(sampling, temperatures=temperatures, top_k=top_k, top_p=top_p, lenience=lenience)
    settings = _settings(gammas, trees, siblings, *grids, sibling_draft, verifications)
    target, draft, sibling_draft = _loaded(target, draft, sibling_draft, settings)
    calls = analysis.generation_kwargs(prompts, generate_kwargs)
    options = {"max_new_tokens": max_new_tokens, "seed": seed, "repeats": repeats,
               "spread_threshold": spread_threshold, "batch_size": batch_size, "threads": threads}
    specs = _specs(executor, target, draft, sibling_draft)
    results, failures, interrupted = _run_all(executor, specs, target, draft, sibling_draft, settings, calls,
                                              options, progress)
    frame = pd.DataFrame([results[i] for i in sorted(results)], columns=COLUMNS)
    return _recorded(frame, failures, settings, interrupted=interrupted, prompts=len(calls),
                     max_new_tokens=max_new_tokens, seed=seed, repeats=repeats, batch_size=batch_size,
                     spread_threshold=spread_threshold, threads=threads)


def _checked(generate_kwargs, seed, executor, repeats, spread_threshold, batch_size) -> tuple:
    """sweep's run options checked. Returns (repeats, spread_threshold, batch_size)."""
    if generate_kwargs is not None and not isinstance(generate_kwargs, Mapping):
        raise ValueError("generate_kwargs must be a mapping of generate's keyword arguments, got "
                         f"{type(generate_kwargs).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (prompt i uses seed + i), got {seed!r}")
    reserved = sorted(_RESERVED.intersection(generate_kwargs or {}))
    if reserved:
        raise ValueError(f"generate_kwargs must not set {reserved}: the sweep sets them")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise ValueError("executor must be None or a concurrent.futures-style executor (with submit(fn, *args) "
                         f"returning a future), got {type(executor).__name__}")
    return (timing.check_repeats(repeats), timing.check_spread_threshold(spread_threshold),
            timing.check_batch_size(batch_size))


def _grids(sampling: Optional[SamplingSettings], **given) -> list:
    """The temperatures, top_k, top_p and lenience grids, unchecked: each given one (not None) as it is, the
    others the field of ``sampling`` (SamplingSettings() without it) alone."""
    fixed = overridden(sampling)
    return [getattr(fixed, field) if given[name] is None else given[name] for name, field in GRIDS.items()]


def _settings(gammas, trees, siblings, temperatures, top_k, top_p, lenience, sibling_draft,
              verifications="token") -> List[Dict[str, Any]]:
    """The grid, one setting per row: the chains of gammas (each with each of verifications, a block at lenience 1
    only), then each tree with each of siblings and verifications (a block where traversal verification applies)."""
    shapes = _trees(trees)
    if gammas is None and not shapes:
        raise ValueError("give gammas (chains), trees (token-tree shapes) or both")
    sampling = [_grid(temperatures, "temperatures"), _grid(top_k, "top_k"), _grid(top_p, "top_p")]
    chains = [] if gammas is None else [_grid(gammas, "gammas"), _grid(lenience, "lenience")]
    ways = [siblings] if isinstance(siblings, str) else list(siblings) if isinstance(siblings, Sequence) else None
    if not ways:
        raise ValueError(f"siblings must be one of {SIBLINGS} or a non-empty list of them, got {siblings!r}")
    rules = [verifications] if isinstance(verifications, str) else list(verifications) \
        if isinstance(verifications, Sequence) else None
    if not rules or any(rule not in VERIFICATIONS for rule in rules):
        raise ValueError(f"verifications must be one of {VERIFICATIONS} or a non-empty list of them, got "
                         f"{verifications!r}")
    if sibling_draft is not None and not shapes:
        raise ValueError("sibling_draft draws the later children of token trees: give trees= (the chains of gammas "
                         "do not use it)")
    settings = [{"gamma": g, "tree": None, "siblings": None, "verification": rule, "sibling_draft": False,
                 "temperature": t, "top_k": k, "top_p": p, "lenience": leniency}
                for t, k, p, g, leniency, rule in itertools.product(*sampling, *chains, rules)
                if rule == "token" or leniency == 1.0] if chains else []
    settings += [{"gamma": tree_gamma(shape), "tree": shape, "siblings": way, "verification": rule,
                  "sibling_draft": sibling_draft is not None, "temperature": t, "top_k": k, "top_p": p,
                  "lenience": 1.0}
                 for t, k, p in itertools.product(*sampling) for shape in shapes for way in ways for rule in rules
                 if rule == "token" or (way != "coupled" and not isinstance(shape, DynamicTree))]
    return settings


def _loaded(target, draft, sibling_draft, settings: List[Dict[str, Any]]) -> tuple:
    """Builds every setting's decoder, so that a bad value anywhere in the grids raises before anything runs.
    Returns (target, draft, sibling_draft) as the decoders loaded them, each once: the first decoder loads target
    and draft, when they are paths or transformers objects; the first tree with the sibling draft loads it."""
    for i, setting in enumerate(settings):
        decoder = SpeculativeDecoder(target, _level(draft, setting), **_options(setting, sibling_draft))
        if i == 0:
            target = decoder.target
            draft = draft if isinstance(draft, SpeculativeDecoder) else decoder.draft
        if setting["sibling_draft"]:
            sibling_draft = decoder.sibling_draft
    return target, draft, sibling_draft


def _specs(executor, target, draft, sibling_draft) -> Optional[tuple]:
    """What travels to the workers (None without an executor). ValueError, before anything runs, for a model or
    drafter that cannot travel."""
    if executor is not None and isinstance(draft, SpeculativeDecoder):
        raise ValueError("executor=: a hierarchical draft (a SpeculativeDecoder) does not travel to workers; sweep "
                         "it with executor=None")
    return None if executor is None else (
        workers.spec(target, "target"), workers.spec(draft, "draft"),
        None if sibling_draft is None else workers.spec(sibling_draft, "sibling_draft"))


def _run_all(executor, specs, target, draft, sibling_draft, settings: List[Dict[str, Any]], calls,
             options: Dict[str, Any], progress: bool) -> tuple:
    """Runs every setting, here one after the other or on the executor, under a progress bar. Returns (results,
    failures, interrupted), results and failures by grid index. A KeyboardInterrupt warns and keeps the rows
    finished so far."""
    from tqdm.auto import tqdm

    results: Dict[int, Dict[str, Any]] = {}
    failures: Dict[int, str] = {}
    interrupted = False
    bar = tqdm(total=len(settings), desc="speculant sweep", disable=not progress)
    try:
        if executor is None:
            for i, setting in enumerate(settings):
                results[i] = run_setting(target, draft, setting, calls, sibling_draft=sibling_draft, **options)
                bar.update()
        else:
            _run_on(executor, specs, settings, calls, options, bar, results, failures)
    except KeyboardInterrupt:
        interrupted = True
        warnings.warn(f"sweep interrupted: returning the {len(results)} of {len(settings)} settings it finished",
                      RuntimeWarning, stacklevel=3)
    finally:
        bar.close()
    return results, failures, interrupted


def _recorded(frame, failures: Dict[int, str], settings: List[Dict[str, Any]], *, interrupted: bool, prompts: int,
              max_new_tokens: int, seed: int, repeats: int, batch_size: int, spread_threshold: float,
              threads: Optional[int]):
    """The frame with the run's options and its failed settings in its attrs. Warns once for the failed settings
    and once for the flagged rows."""
    failed = [{**settings[i], "error": failures[i]} for i in sorted(failures)]
    frame.attrs.update(interrupted=interrupted, failed=failed, prompts=prompts, max_new_tokens=max_new_tokens,
                       seed=seed, repeats=repeats, batch_size=batch_size, threads=threads)
    if failed:
        warnings.warn(f"{len(failed)} of {len(settings)} settings failed and are missing from the frame "
                      "(frame.attrs['failed'] holds their errors): " +
                      "; ".join(f"{_describe(f)} ({f['error']})" for f in failed), RuntimeWarning, stacklevel=3)
    flagged = frame[frame.flag != ""]
    if len(flagged):
        warnings.warn(flag_warning(flagged, len(frame), repeats, spread_threshold), RuntimeWarning, stacklevel=3)
    return frame


FLAG_MEANINGS = {
    "contended": "the process got less than {share:.0%} of a core in a round: other work held the cores",
    "impossible": "a round was faster than its tokens per target call allow (column speedup_bound): its timing "
                  "is broken",
    "noisy": "the speedup spread over more than {spread:.0%} across the {repeats} rounds",
    "off theory": "the speedup lies outside a factor {theory:g} of Theorem 3.8's prediction",
}


def flag_warning(flagged, rows: int, repeats: int, spread_threshold: float) -> str:
    """The sweep's one warning for its flagged rows: how many carry each flag, what each means, and how to
    time on a shared machine."""
    counts = {name: int(flagged.flag.str.contains(name).sum()) for name in FLAG_MEANINGS}
    meanings = "; ".join(f"{count} {name} (" + FLAG_MEANINGS[name].format(
        share=timing.CONTENDED_SHARE, spread=spread_threshold, repeats=repeats, theory=timing.THEORY_FACTOR) + ")"
        for name, count in counts.items() if count)
    return (f"{len(flagged)} of {rows} settings are flagged (column 'flag'): {meanings}. Read those rows with "
            "care; on a shared machine time with one thread and nothing else running (docs/research.md, "
            "'Timing on a shared machine')")
