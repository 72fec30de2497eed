"""speculant's model backends side by side (TorchScript `.pt`, live transformers objects eager and compiled,
AOTInductor `.pt2`) against transformers' plain and assisted `generate`, for one trained pair at one temperature,
in one run.

    python benchmarks/train_pairs.py --threads 2                         # the pairs (cached; ~20 min on 2 cores)
    python benchmarks/backends.py --pair gpt2 --temperature 0            # and 1; --pair t5 likewise
    python benchmarks/backends.py --pair gpt2 --temperature 0 --quick    # smoke run: 2 prompts, 16 tokens, 1 repeat
    python benchmarks/backends.py --pair gpt2 --temperature 1 --tree 2,1,1 --backends ts live compiled  # trees

Methods (batch 1, CPU, the prompts of train_pairs.heldout_prompts, max_new_tokens per prompt as in assisted.py):

* `<backend>_plain`: `speculant.generate(target)`; `<backend>_speculative`: `SpeculativeDecoder(target, draft,
  gamma)` with a fixed gamma (with --tree k1,k2,...: that token tree of drafts instead, siblings coupled), for
  backend in
  - `ts`: the pair's exported TorchScript files (target.pt, draft.pt);
  - `live`: the transformers model objects loaded from the pair's save_pretrained dirs (target/, draft/): the
    C++ loop calls their forward in Python;
  - `compiled`: the same objects loaded with compile=True (a static cache, calls through torch.compile; the
    first call of each width compiles, in the warm-up); decoder-only pairs only;
  - `pt2`: AOTInductor packages exported once from those dirs and cached beside them (target.pt2, draft.pt2;
    with --pt2-max-length N: target-L<N>.pt2), by default with the same capacity as the .pt files
    (max_length, and max_source_length for T5). For T5 a failed export or load skips pt2 with the reason.
* `hf_plain`: transformers' `generate`; `hf_assisted`: `generate(assistant_model=draft)` with
  num_assistant_tokens = gamma, schedule "constant", no confidence stop (assisted.set_assistant). Temperature
  as in assisted.py: 0 is greedy (do_sample=False), 1 samples with top_k=0, top_p=1.

Timing (assisted.Method): time.perf_counter around each generate call; a method's tokens/s for one repetition is
all new tokens over all prompts divided by the summed seconds. Each method gets one untimed warm-up generation
(the first prompt, 16 tokens), then --repeats repetitions over all prompts, methods interleaved in ABBA order
(the list reversed on odd repetitions). Reported: median tokens/s over the repetitions and its min-max; each
ratio is taken per repetition (both methods ran in the same repetition, adjacent in time) and its median and
min-max are reported.

Greedy sanity (temperature 0): every speculant method's tokens must equal transformers' plain greedy tokens
prompt for prompt; `greedy_mismatches` counts the prompts that differ and the run fails (exit 1, after
writing the results) if any does. transformers' assisted output is counted too, for information only.

Output: benchmarks/results/backends-<pair>-T<temperature>.json (-quick for --quick) with the machine, the pair,
every repetition's tokens/s, the ratios and the mismatches, and a markdown table for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import speculant

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import assisted  # noqa: E402  (benchmarks/ is not a package)
import train_pairs  # noqa: E402

BACKENDS = ("ts", "live", "compiled", "pt2")
# (numerator, denominator, goal or None): the ratios reported, each the median of per-repetition ratios
RATIOS = [("live_speculative", "hf_assisted", 1.3),  # the goal: live speculative >= 1.3x HF assisted
          ("pt2_plain", "ts_plain", 1.0), ("pt2_speculative", "ts_speculative", 1.0),  # pt2 >= TorchScript
          ("compiled_plain", "live_plain", None), ("compiled_speculative", "live_speculative", None),
          ("compiled_speculative", "ts_speculative", None),
          *((f"{b}_speculative", f"{b}_plain", None) for b in BACKENDS),  # speedup over its own plain decoding
          ("hf_assisted", "hf_plain", None)]


def pt2_file(pair: assisted.Pair, role: str, max_length: Optional[int]) -> Path:
    """The role's .pt2 package beside the pair's files, exported on first use (AOTInductor compiles C++: tens of
    seconds per model), with max_length (default: the .pt file's) and, for T5, the .pt file's max_source_length."""
    ts = pair.target if role == "target" else pair.draft
    path = pair.directory / (f"{role}.pt2" if max_length is None else f"{role}-L{max_length}.pt2")
    if not path.exists():
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.pt2")  # written whole, then renamed: no half files
        start = time.perf_counter()
        try:
            speculant.export(pair.directory / role, tmp, max_length=max_length or ts.max_length,
                             max_source_length=ts.max_source_length if ts.encoder_decoder else None)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        print(f"exported {path} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return path


def load_backends(pair: assisted.Pair, backends: Sequence[str], pt2_max_length: Optional[int], skipped: Dict):
    """backend -> (target, draft) speculant.Model handles. A pt2 failure on T5 is recorded in `skipped`."""
    handles = {}
    for backend in backends:
        if backend == "ts":  # assisted.load_pair loaded target.pt / draft.pt
            handles[backend] = (pair.target, pair.draft)
        elif backend == "live":  # the same objects transformers' generate runs below
            handles[backend] = (speculant.load(pair.hf_target), speculant.load(pair.hf_draft))
        elif backend == "compiled":  # those objects again, with a static cache and torch.compile
            if pair.kind == "t5":
                skipped[backend] = "compile=True runs decoder-only models"
                continue
            handles[backend] = (speculant.load(pair.hf_target, compile=True),
                                speculant.load(pair.hf_draft, compile=True))
        else:
            try:
                handles[backend] = tuple(speculant.load(pt2_file(pair, role, pt2_max_length), device="cpu")
                                         for role in ("target", "draft"))
            except Exception as error:
                if pair.kind != "t5":
                    raise
                skipped[backend] = f"{type(error).__name__}: {error}"
                print(f"skipping pt2 for T5: {skipped[backend]}", file=sys.stderr)
    return handles


def methods_for(pair: assisted.Pair, handles: Dict, temperature: float, gamma: int,
                tree: Optional[List[int]] = None) -> List[assisted.Method]:
    eos = pair.eos

    def plain(target):
        return lambda prompt, n, seed: speculant.generate(target, **prompt, max_new_tokens=n,
                                                          temperature=temperature, eos_token_id=eos, seed=seed)

    def speculative(target, draft):
        shape = {"gamma": gamma} if tree is None else {"tree": tree}
        decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, **shape)
        return lambda prompt, n, seed: decoder.generate(**prompt, max_new_tokens=n, eos_token_id=eos, seed=seed)

    def hf(assisted_):
        return lambda prompt, n, seed: assisted.hf_generate(pair, prompt, temperature, n, seed, assisted_)

    assisted.set_assistant(pair, gamma)  # fixed gamma drafts, constant schedule, no confidence stop
    methods = []
    for backend, (target, draft) in handles.items():
        methods += [assisted.Method(f"{backend}_plain", None, plain(target)),
                    assisted.Method(f"{backend}_speculative", gamma, speculative(target, draft))]
    return methods + [assisted.Method("hf_plain", None, hf(False)), assisted.Method("hf_assisted", gamma, hf(True))]


def measure(pair: assisted.Pair, methods: List[assisted.Method], prompts: Sequence[Dict], max_new_tokens: int,
            repeats: int, greedy: bool) -> Dict:
    """Runs the methods (warm-up, then ABBA repetitions) and returns the results dict (tokens/s, ratios, mismatches)."""
    for method in methods:  # untimed warm-up: first calls compile / profile shapes
        method.run(pair, prompts[:1], assisted.WARMUP_TOKENS, record=False)
    for rep in range(repeats):
        for method in (methods if rep % 2 == 0 else methods[::-1]):
            method.run(pair, prompts, max_new_tokens)
    by_name = {m.name: m for m in methods}
    reference = by_name["hf_plain"].tokens  # transformers' plain generate, last repetition, per prompt

    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_repeat": values}

    tps = {m.name: {**spread(m.tps), "new_tokens": sum(len(t) for t in m.tokens)} for m in methods}
    ratios = {}
    for num, den, goal in RATIOS:
        if num in by_name and den in by_name:
            per_rep = [a / b for a, b in zip(by_name[num].tps, by_name[den].tps)]
            ratios[f"{num} / {den}"] = {**spread(per_rep), "goal": goal}
    mismatches = {m.name: sum(a != b for a, b in zip(m.tokens, reference)) for m in methods
                  if m.name != "hf_plain"} if greedy else {}
    return {"tokens_per_second": tps, "ratios": ratios, "greedy_mismatches": mismatches}


def tables(results: Dict) -> str:
    """Markdown: tokens/s per method (median over repetitions, min-max), then the ratios (median of per-repetition
    ratios, min-max, goal)."""
    tps, ratios = results["tokens_per_second"], results["ratios"]
    lines = ["| method | tokens/s (median) | min-max | × its plain |", "|---|---|---|---|"]
    for name, t in tps.items():
        own = ratios.get(f"{name} / {name.rsplit('_', 1)[0]}_plain")
        lines.append(f"| {name} | {t['median']:.1f} | {t['min']:.1f}-{t['max']:.1f} | "
                     f"{'' if own is None else format(own['median'], '.2f') + '×'} |")
    lines += ["", "| ratio | median | min-max | goal |", "|---|---|---|---|"]
    for name, r in ratios.items():
        met = r["goal"] is not None and r["median"] >= r["goal"]
        goal = "" if r["goal"] is None else f"≥ {r['goal']:.1f}× ({'met' if met else 'NOT met'})"
        lines.append(f"| {name} | {r['median']:.2f}× | {r['min']:.2f}-{r['max']:.2f} | {goal} |")
    return "\n".join(lines)


def run(args) -> Path:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*|.*torch\.jit.*")
    recipe = train_pairs.PRESETS["cpu"][args.pair]
    if args.smoke:  # the tiny recipe (seconds to train): for tests
        recipe = recipe.smoke()
        train_pairs.build(recipe, cache=args.cache, progress=False)
    if args.quick:
        args.prompts, args.max_new_tokens, args.repeats = 2, 16, 1
    pair = assisted.load_pair(recipe, "cpu", cache=args.cache)
    prompts = train_pairs.heldout_prompts(recipe, pair.directory, args.prompts, args.prompt_tokens)
    max_new = args.max_new_tokens or (64 if args.pair == "t5" else 96)
    skipped: Dict[str, str] = {}
    handles = load_backends(pair, args.backends, args.pt2_max_length, skipped)
    methods = methods_for(pair, handles, args.temperature, args.gamma, args.tree)
    greedy = args.temperature == 0
    results = measure(pair, methods, prompts, max_new, args.repeats, greedy)
    meta = {"pair": args.pair, "smoke": args.smoke, "temperature": args.temperature, "gamma": args.gamma,
            "tree": args.tree,
            "prompts": len(prompts), "prompt_tokens": args.prompt_tokens, "max_new_tokens": max_new,
            "repeats": args.repeats, "backends": list(handles), "skipped": skipped,
            "pt2_max_length": handles["pt2"][0].max_length if "pt2" in handles else None, "machine": assisted.machine(),
            "pair_info": assisted._pair_info(pair.directory), **results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tree = "" if args.tree is None else "-tree" + "".join(map(str, args.tree))
    path = out / f"backends-{args.pair}-T{args.temperature:g}{tree}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(meta, indent=2, default=str))
    drafts = f"gamma={args.gamma}" if args.tree is None else f"tree={args.tree} (assisted: gamma={args.gamma})"
    print(f"{args.pair}, T={args.temperature:g}, {drafts}: {len(prompts)} prompts x {max_new} new tokens, "
          f"{args.repeats} repeats, {args.threads} threads{'; skipped: ' + str(skipped) if skipped else ''}\n")
    print(tables(results))
    print(f"\nresults: {path}")
    if greedy:
        bad = {name: n for name, n in results["greedy_mismatches"].items() if n and not name.startswith("hf_")}
        if bad:
            raise SystemExit(f"GREEDY SANITY FAILED: prompts whose tokens differ from transformers' greedy "
                             f"generate: {bad}")
        print(f"greedy sanity: every speculant method equals transformers' greedy tokens on all {len(prompts)} "
              f"prompts (transformers' assisted: {results['greedy_mismatches']['hf_assisted']} differ)")
    return path


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["gpt2", "t5"], default="gpt2")
    parser.add_argument("--temperature", type=float, choices=[0.0, 1.0], default=0.0)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--tree", type=lambda s: [int(k) for k in s.split(",")], default=None,
                        help="k1,k2,...: speculant's speculative methods draft this token tree instead of gamma")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--pt2-max-length", type=int, default=None,
                        help="static KV cache positions of the .pt2 packages (default: the .pt files' max_length)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 96 (GPT-2), 64 (T5)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, 16 new tokens, 1 repeat")
    parser.add_argument("--smoke", action="store_true", help="the tiny smoke recipe (trained if missing)")
    parser.add_argument("--cache", default=None, help="cache root of the pairs (default: ~/.cache/speculant)")
    parser.add_argument("--out", default=str(assisted.RESULTS))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
