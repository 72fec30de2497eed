"""A sweep scaled out: the same speculant.sweep serially in this process, serially in batches of --batch-size
prompts, and on a 2-worker dask LocalCluster; wall time of each, and how close the cluster comes to a linear
speedup.

    python benchmarks/sweep_scale.py                 # the demo pair (shipped with the package)
    python benchmarks/sweep_scale.py --pair gpt2     # a benchmark pair (python benchmarks/train_pairs.py first)
    python benchmarks/sweep_scale.py --quick         # smoke run: the demo pair after 2 training steps, 2 settings

Method: one grid (gammas x temperatures, --prompts held-out prompts, --max-new-tokens each, --repeats timed
rounds per setting, as the sweep times them). Serial: torch.set_num_threads(1) in this process, one untimed
sweep of the first setting (first-call costs), then the timed sweep. Parallel: a LocalCluster of 2 worker
processes with 1 thread each, torch.set_num_threads(1) on each, then one untimed task of the first setting
pinned to each worker (the models loaded and their first calls made), then the timed sweep with
executor=client.get_executor(). Wall time is time.perf_counter around each timed sweep call; the serial
and parallel sweeps run one after the other, so the machine should be otherwise idle and have >= 2 cores.

Reported: serial and parallel seconds, ratio = serial / parallel, efficiency = serial / (2 * parallel) (1 is a
linear speedup), and a check that both sweeps gave the same tokens, alpha and counts (the seed fixes them).

Output: benchmarks/results/sweep_scale-<pair>.json (-quick for --quick) with the machine, the settings, both
times, the ratio, the efficiency and both frames' per-setting speedups.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import speculant
from speculant import analysis, demo_pair, workers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import assisted  # noqa: E402  (benchmarks/ is not a package)
import train_pairs  # noqa: E402

sweep_module = importlib.import_module("speculant.sweep")  # the module; speculant.sweep is the function
WORKERS = 2
TIMES = {"seconds", "plain_seconds", "c", "speedup", "speedup_min", "speedup_max", "spread", "predicted_speedup",
         "flag"}


def demo_prompts(count: int, length: int) -> List[List[int]]:
    """`count` windows of `length` tokens evenly spread over the demo corpus's held-out bytes."""
    _, held_out, _ = demo_pair.load_corpus()
    starts = torch.linspace(0, len(held_out) - length - 1, count).long().tolist()
    return [held_out[s:s + length].tolist() for s in starts]


def load(args, scratch: Path) -> Tuple[Path, Path, List]:
    """(target path, draft path, prompts) of the chosen pair."""
    if args.quick:  # the demo pair's code path and sizes after two training steps: seconds, not minutes
        target, draft = demo_pair.default_pair(progress=False, recipe=demo_pair.DEFAULT_RECIPE.smoke(),
                                               cache_dir=scratch)
        return target, draft, demo_prompts(args.prompts, args.prompt_tokens)
    if args.pair == "demo":
        target, draft = demo_pair.default_pair()
        return target, draft, demo_prompts(args.prompts, args.prompt_tokens)
    recipe = train_pairs.PRESETS["cpu"][args.pair]
    out = train_pairs.pair_dir(recipe)
    if not (out / "pair.json").exists():
        raise SystemExit(f"{out}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage "
                         f"{args.pair})")
    return out / "target.pt", out / "draft.pt", train_pairs.heldout_prompts(recipe, out, args.prompts,
                                                                           args.prompt_tokens)


def warm_workers(client, target, draft, grid: Dict, calls: List) -> None:
    """One untimed task of the grid's first setting on every worker (pinned to it): each loads the models into
    the thread that will run the timed tasks, and makes the first calls of every input shape."""
    setting = {"gamma": grid["gammas"][0], "temperature": grid["temperatures"][0], "top_k": 0, "top_p": 1.0,
               "lenience": 1.0}
    options = {"max_new_tokens": grid["max_new_tokens"], "seed": grid["seed"], "repeats": 1,
               "spread_threshold": 0.25}
    specs = workers.spec(target, "target"), workers.spec(draft, "draft")
    futures = [client.submit(sweep_module.task, *specs, setting, calls, options, uuid.uuid4().hex,
                             workers=[address], pure=False)
               for address in client.scheduler_info()["workers"]]
    client.gather(futures)


def run(args) -> Path:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*|.*torch\.jit.*")
    warnings.filterwarnings("ignore", message=r".*settings are flagged", category=RuntimeWarning)
    from dask.distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory() as scratch:
        target_path, draft_path, prompts = load(args, Path(scratch))
        target, draft = speculant.load(target_path), speculant.load(draft_path)
        grid = {"gammas": args.gammas, "temperatures": args.temperatures, "max_new_tokens": args.max_new_tokens,
                "seed": 0}
        kwargs = dict(grid, repeats=args.repeats, progress=not args.quiet)

        first = dict(kwargs, gammas=grid["gammas"][:1], temperatures=grid["temperatures"][:1], repeats=1,
                     progress=False)
        speculant.sweep(target, draft, prompts, **first)  # untimed: this process's first calls
        start = time.perf_counter()
        serial = speculant.sweep(target, draft, prompts, **kwargs)
        serial_seconds = time.perf_counter() - start
        # the same sweep in batches of --batch-size prompts (one untimed batched sweep first: its shapes)
        speculant.sweep(target, draft, prompts, **dict(first, batch_size=args.batch_size))
        start = time.perf_counter()
        batched = speculant.sweep(target, draft, prompts, **kwargs, batch_size=args.batch_size)
        batched_seconds = time.perf_counter() - start

        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            client.run(torch.set_num_threads, 1)
            warm_workers(client, target, draft, grid, analysis.generation_kwargs(prompts))
            start = time.perf_counter()
            parallel = speculant.sweep(target, draft, prompts, **kwargs, executor=client.get_executor())
            parallel_seconds = time.perf_counter() - start

    exact = [c for c in sweep_module.COLUMNS if c not in TIMES]
    same = bool(serial[exact].equals(parallel[exact]))
    # batched rows keep their seeds: the same tokens and counts; alpha may differ in the last bits (batched sums)
    counts = [c for c in exact if c not in ("alpha", "acceptance", "expected_tokens")]
    batched_same = bool(serial[counts].equals(batched[counts])) and bool(
        ((serial.alpha - batched.alpha).abs() <= 1e-6).all())
    ratio = serial_seconds / parallel_seconds
    result = {
        "pair": "demo-smoke" if args.quick else args.pair, "settings": len(serial), "prompts": len(prompts),
        "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "gammas": args.gammas, "temperatures": args.temperatures, "workers": WORKERS, "threads_per_worker": 1,
        "serial_seconds": serial_seconds, "parallel_seconds": parallel_seconds, "ratio": ratio,
        "efficiency": ratio / WORKERS, "same_tokens_alpha_counts": same,
        "batch_size": args.batch_size, "batched_seconds": batched_seconds,
        "batched_ratio": serial_seconds / batched_seconds, "batched_same_tokens_counts": batched_same,
        "failed": parallel.attrs["failed"],
        "speedups": {"serial": serial.speedup.tolist(), "parallel": parallel.speedup.tolist()},
        "machine": assisted.machine(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sweep_scale-{args.pair}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"{len(serial)} settings x {len(prompts)} prompts x {args.max_new_tokens} tokens, {args.repeats} timed "
          f"rounds each\nserial (1 process, 1 thread): {serial_seconds:.1f} s\n"
          f"dask LocalCluster ({WORKERS} workers x 1 thread): {parallel_seconds:.1f} s\n"
          f"ratio serial / parallel: {ratio:.2f}x; linear-speedup efficiency serial / ({WORKERS} x parallel): "
          f"{ratio / WORKERS:.0%}\nsame tokens, alpha and counts: {same}\n"
          f"serial in batches of {args.batch_size}: {batched_seconds:.1f} s, {serial_seconds / batched_seconds:.2f}x "
          f"faster than batch 1; same tokens and counts: {batched_same}\nwrote {path}")
    if not same or not batched_same or parallel.attrs["failed"]:
        raise SystemExit("the parallel sweep differs from the serial one (or lost settings): see the JSON")
    return path


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["demo", "gpt2", "t5"], default="demo")
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per call in the batched serial sweep")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: the demo pair after 2 training steps, 2 settings, 2 prompts of 8 tokens, "
                             "8 new tokens, 1 round")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", default=str(assisted.RESULTS))
    args = parser.parse_args(argv)
    if args.quick:
        args.pair = "demo"
        args.gammas, args.temperatures, args.prompts, args.prompt_tokens = [2, 4], [1.0], 2, 8
        args.max_new_tokens, args.repeats = 8, 1
    run(args)


if __name__ == "__main__":
    main()
