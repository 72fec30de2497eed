"""CUDA graphs against uncaptured calls, side by side in one run (issue: model calls at the hardware's speed).

    python benchmarks/graphs.py --device cuda --preset cuda --hf-compiled --big   # a GPU: graphs off / on
    python benchmarks/graphs.py --modes off fixed                                 # CPU: what fixed shapes cost

The pair: benchmarks/train_pairs.py's GPT-2 pair of the preset (train it first), exported anew with
speculant.export (as benchmarks/batch.py does); `--pair demo` takes the embedded demo pair instead. Batch 1,
`--prompts` held-out prompts, prompt i with seed i, `--tokens` new tokens each, temperature `--temperature`.

For each mode of `cuda_graphs` (`--modes`: off and on on a GPU; off and fixed on CPU, where nothing is captured):

* plain decoding's milliseconds per token (its whole time, the engine's share included) and per-call
  milliseconds by width k, from the engine's own statistics with profile=True (which synchronizes the
  device around each call): the target's k = 1 calls from plain decoding and its k = gamma + 1 verifications
  from speculative runs, the draft's calls from the same runs. Each is differential: the time and call count
  of a `--tokens` run minus those of a run a quarter as long, so that the prefill (never captured) drops out;
  the median of five such pairs;
* plain and speculative (each gamma, each tree) tokens per second, end to end with the device synchronized, over
  every prompt; methods run in turn, in reversed order on odd rounds (ABBA), after an untimed warm-up round
  that also captures the graphs; medians over `--repeats` rounds with min-max;
* the speedup of each speculative run over plain decoding in the same mode and of each mode over the first
  (medians of the per-round ratios, min-max), alpha, c (the draft call over the target's k = 1 call) and
  Theorem 3.8's prediction at them.
* `--trees k1,k2,...`: token trees beside the chains, their tree calls (the draft's levels, the target's masked
  verification) fixed-shape and captured as the chains' calls are: tokens per second, the speedup over plain
  decoding in the same mode and tokens per target call.
* for every chain and tree, after the timed rounds: one profiled run over the prompts, its milliseconds per
  iteration in the draft's calls, the target's calls and the engine's own work (where a tree's iteration
  costs more than a chain's).

`--hf-compiled`: transformers' generate with a static cache and torch.compile(mode="reduce-overhead") on the
same target, per token (differential, as above). `--big`: a Llama-architecture target of about 1.1B parameters
in bf16 with random weights (latency only): plain per-token milliseconds in each mode (and as the live object
with compile=True where --backends names "compiled") against its read floor (benchmarks/floor.py: its weight
bytes and the keys and values at the run's mean length over the read bandwidth measured in the same run, the
datasheet figure beside it). `--backends live compiled pt2`: the pair's per-call
times as live transformers objects (eager; compile=True: static cache and torch.compile) and .pt2 packages.
Results: benchmarks/results/graphs-<pair>-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

import speculant
from speculant import analysis

sys.path.insert(0, str(Path(__file__).parent))
import batch  # noqa: E402  (benchmarks/batch.py: the pairs and their prompts)
import floor  # noqa: E402
import shapes  # noqa: E402
import train_pairs  # noqa: E402

warnings.filterwarnings("ignore", message=r".*TorchScript.*")
warnings.filterwarnings("ignore", message=r".*torch\.jit.*")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_range(values: Sequence[float]) -> List[float]:
    return [statistics.median(values), min(values), max(values)]


def per_call(run: Callable[[int], object], tokens: int, seconds: str, calls: str, repeats: int = 5) -> float:
    """Milliseconds per call: (seconds, calls) of a `tokens` run minus those of a run a quarter as long, the
    median of `repeats` such pairs."""
    values = []
    for _ in range(repeats):
        long, short = run(tokens), run(max(tokens // 4, 2))
        extra = getattr(long.stats, calls) - getattr(short.stats, calls)
        values.append(1e3 * (getattr(long.stats, seconds) - getattr(short.stats, seconds)) / max(extra, 1))
    return statistics.median(values)


class Method:
    def __init__(self, name: str, mode: str, gamma: int, generate: Callable, decoder=None, tree: bool = False):
        # decoder: a speculative method's SpeculativeDecoder (its verification's captures are read after the runs)
        self.name, self.mode, self.gamma, self.generate = name, mode, gamma, generate
        self.decoder, self.tree = decoder, tree
        self.rates: List[float] = []
        self.results: List = []

    def run(self, prompts, tokens: int, device: torch.device, record: bool = True) -> None:
        results, seconds = [], 0.0
        for i, prompt in enumerate(prompts):
            sync(device)
            start = time.perf_counter()
            results.append(self.generate(prompt, tokens, i))
            sync(device)
            seconds += time.perf_counter() - start
        if record:
            self.rates.append(sum(len(r.tokens) for r in results) / seconds)
            self.results = results


def call_times(target, draft, prompt: Dict, args, mode: str, label: str = "") -> Dict:
    """Per-call milliseconds of `target` by width k (1 from plain decoding, gamma + 1 from speculative runs) and
    of `draft` by gamma, and plain decoding's ms per token, in cuda_graphs mode `mode` (differential, per_call)."""
    def plain(n, profile=False):
        return speculant.generate(target, **prompt, max_new_tokens=n, temperature=args.temperature, seed=0,
                                  cuda_graphs=mode, profile=profile)

    for _ in range(2):
        plain(args.tokens)  # warm-up: the executor's first runs, the width-1 graph captured
    target_calls = {1: per_call(lambda n: plain(n, profile=True), args.tokens, "target_seconds", "target_calls")}
    plain_token = per_call(plain, args.tokens, "total_seconds", "new_tokens")
    draft_calls = {}
    for gamma in args.gammas:
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=args.temperature,
                                               cuda_graphs=mode)
        run = lambda n, d=decoder: d.generate(**prompt, max_new_tokens=n, seed=0, profile=True)  # noqa: E731
        for _ in range(2):
            run(args.tokens)  # warm-up: every width captured
        target_calls[gamma + 1] = per_call(run, args.tokens, "target_seconds", "target_calls")
        draft_calls[gamma] = per_call(run, args.tokens, "draft_seconds", "draft_calls")
    out = {"target_ms_by_k": target_calls, "draft_ms_by_gamma": draft_calls, "plain_ms_per_token": plain_token,
           "graphs_captured": [m._core.graphs_captured for m in (target, draft)],
           "graph_failure": [m._core.graph_failure for m in (target, draft)]}
    print(f"[{label or mode}] target ms/call by k: " + ", ".join(f"{k}: {v:.3f}" for k, v in target_calls.items())
          + "; draft ms/call by gamma: " + ", ".join(f"{g}: {v:.3f}" for g, v in draft_calls.items())
          + f"; plain decoding {plain_token:.3f} ms/token; graphs {out['graphs_captured']}", flush=True)
    return out


def iteration_phases(method: Method, prompts, tokens: int) -> Dict[str, float]:
    """One profiled run of `method` over the prompts (profile=True synchronizes the device around each model
    call): milliseconds per iteration in the draft's calls, the target's, and the engine's own work."""
    results = [method.generate(prompt, tokens, i, profile=True) for i, prompt in enumerate(prompts)]
    iterations = sum(r.stats.iterations for r in results)
    return {phase: 1e3 * sum(getattr(r.stats, f"{phase}_seconds") for r in results) / iterations
            for phase in ("draft", "target", "other")}


def measure_pair(target, draft, prompts, args, device: torch.device) -> Dict:
    methods: List[Method] = []
    calls: Dict[str, Dict] = {}
    for mode in args.modes:
        def plain(prompt, n, seed, mode=mode, profile=False):
            return speculant.generate(target, **prompt, max_new_tokens=n, temperature=args.temperature, seed=seed,
                                      cuda_graphs=mode, profile=profile)
        methods.append(Method("plain", mode, 0, plain))
        for gamma in args.gammas:
            decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=args.temperature,
                                                   cuda_graphs=mode)
            methods.append(Method(f"speculative g{gamma}", mode, gamma, lambda p, n, s, profile=False, d=decoder:
                                  d.generate(**p, max_new_tokens=n, seed=s, profile=profile), decoder=decoder))
        for tree in args.trees:
            decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, temperature=args.temperature,
                                                   cuda_graphs=mode)
            methods.append(Method(f"tree {tree}", mode, len(tree), lambda p, n, s, profile=False, d=decoder:
                                  d.generate(**p, max_new_tokens=n, seed=s, profile=profile), decoder=decoder,
                                  tree=True))
        calls[mode] = call_times(target, draft, prompts[0], args, mode)
    for method in methods:  # warm-up round: untimed
        method.run(prompts, args.tokens, device, record=False)
    for r in range(args.repeats):
        for method in (methods if r % 2 == 0 else methods[::-1]):
            method.run(prompts, args.tokens, device)
    rows = []
    first = {m.name: m for m in methods if m.mode == args.modes[0]}
    for method in methods:
        plain = next(m for m in methods if m.mode == method.mode and m.gamma == 0)
        row = {"method": method.name, "mode": method.mode, "tokens_per_s": median_range(method.rates),
               "over_first_mode": median_range([a / b for a, b in zip(method.rates, first[method.name].rates)])}
        if method.decoder is not None:
            _, captured, failure = method.decoder._core.verification_graphs
            row.update(verification_graphs=captured, verification_graph_failure=failure)
        if method.tree:
            row.update(speedup=median_range([a / b for a, b in zip(method.rates, plain.rates)]),
                       tokens_per_call=sum(r.stats.new_tokens for r in method.results)
                       / sum(r.stats.target_calls for r in method.results))
        elif method.gamma:
            alpha = float(statistics.mean(r.stats.alpha for r in method.results))
            c = calls[method.mode]["draft_ms_by_gamma"][method.gamma] / calls[method.mode]["target_ms_by_k"][1]
            row.update(speedup=median_range([a / b for a, b in zip(method.rates, plain.rates)]), alpha=alpha, c=c,
                       predicted=float(analysis.walltime_improvement(alpha, method.gamma, c)))
        if method.gamma:
            row["ms_per_iteration"] = iteration_phases(method, prompts, args.tokens)
        rows.append(row)
        extra = "" if not method.gamma else f", speedup {row['speedup'][0]:.2f}x ({row['speedup'][1]:.2f}-" \
                                            f"{row['speedup'][2]:.2f})"
        if method.tree:
            extra += f", {row['tokens_per_call']:.2f} tokens / target call"
        elif method.gamma:
            extra += f", alpha {row['alpha']:.3f}, c {row['c']:.3f}, Thm 3.8 {row['predicted']:.2f}x"
        if method.decoder is not None:
            failure = row["verification_graph_failure"]
            extra += f", verifications captured {row['verification_graphs']}" + (f" ({failure})" if failure else "")
        if method.gamma:
            extra += "; ms / iteration " + ", ".join(f"{k} {v:.3f}" for k, v in row["ms_per_iteration"].items())
        print(f"[{method.mode}] {method.name}: {row['tokens_per_s'][0]:.1f} tok/s ({row['tokens_per_s'][1]:.1f}-"
              f"{row['tokens_per_s'][2]:.1f}), x{row['over_first_mode'][0]:.2f} of {args.modes[0]}{extra}",
              flush=True)
    same = all(a.tokens == b.tokens for m in methods for a, b in zip(m.results, first[m.name].results))
    print(f"tokens identical across modes: {same}")
    return {"calls": calls, "rows": rows, "tokens_identical_across_modes": same}


def other_backends(pair_dir: Path, prompt: Dict, args, device: torch.device, scratch: Path,
                   save: Callable[[Dict], None]) -> None:
    """The same pair as live transformers objects (eager, "live", and compile=True, "compiled": a static cache
    and torch.compile, CUDA graphs of its own on a GPU) and as .pt2 packages (AOTInductor, compiled here for
    `device`): call_times by mode (live objects take no engine capture: "off" only; .pt2 packages in every
    mode of --modes), to set beside the TorchScript modes; `save` after each."""
    from speculant.export import load_pretrained

    out = {}
    for backend in args.backends:
        started = time.perf_counter()
        models = []
        for role in ("target", "draft"):
            model = load_pretrained(pair_dir / role).to(device, shapes.dtype_for(device, args.dtype)).eval()
            if backend == "pt2":
                speculant.export(model, scratch / f"{role}.pt2")
                model = scratch / f"{role}.pt2"
            models.append(speculant.load(model, device=device, compile=backend == "compiled"))
        print(f"[{backend}] ready in {time.perf_counter() - started:.0f} s", flush=True)
        out[backend] = {mode: call_times(*models, prompt, args, mode, label=f"{backend} {mode}")
                        for mode in (args.modes if backend == "pt2" else ["off"])}
        save(out)


def untrained_pair(preset: str, scratch: Path) -> Path:
    """The preset's GPT-2 target and draft with random weights (save_pretrained dirs and TorchScript exports in
    `scratch`): call latencies do not depend on the weights, so a lease can time them without training."""
    recipe = train_pairs.PRESETS[preset]["gpt2"]
    for seed, role in enumerate(("target", "draft")):
        model = train_pairs.make_model(recipe, role, seed).eval()
        model.save_pretrained(scratch / role)
        speculant.export(model, scratch / f"{role}.pt")
    return scratch


def hf_compiled(directory: Path, prompt: Dict, tokens: int, device: torch.device) -> Dict:
    """transformers' static-cache, torch.compile'd greedy generate on the target: ms per token (differential)."""
    from speculant.export import load_pretrained

    model = load_pretrained(directory / "target").to(device).eval()
    model.generation_config.eos_token_id = None
    if device.type != "cuda":
        # On CUDA generate compiles its decoding steps itself (a static cache, its default CompileConfig,
        # mode "reduce-overhead"); a forward compiled here too nests two CUDA-graph trees, which fails with
        # "accessing tensor output of CUDAGraphs that has been overwritten" (H200, transformers 5.17).
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ids = torch.tensor([prompt["prompt_ids"]], device=device)

    def run(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=0)
        sync(device)
        return time.perf_counter() - start

    for _ in range(3):  # compilation and graph capture
        run(tokens), run(max(tokens // 4, 2))
    if device.type == "cuda" and not hasattr(model, "_compiled_call"):
        raise RuntimeError("transformers' generate did not compile its decoding steps (no model._compiled_call): "
                           "this would time its eager forward")
    ms = [1e3 * (run(tokens) - run(max(tokens // 4, 2))) / (tokens - max(tokens // 4, 2)) for _ in range(5)]
    print(f"transformers static cache + torch.compile: {statistics.median(ms):.3f} ms/token", flush=True)
    return {"ms_per_token": median_range(ms)}


def big_llama(args, device: torch.device, scratch: Path) -> Dict:
    """~1.1B-parameter Llama, bf16, random weights: plain per-token ms per mode (and as a live object with
    compile=True where --backends has "compiled") vs weight bytes / bandwidth."""
    model = shapes.build("llama-1.1b", device, torch.bfloat16)
    config = model.config
    weight_bytes, parameters = shapes.read_weight_bytes(model), sum(p.numel() for p in model.parameters())
    path = scratch / "llama-1b.pt"
    speculant.export(model, path, max_length=512)
    exported = speculant.load(path, device=device)
    runs = {mode: (exported, mode) for mode in args.modes}
    if "compiled" in args.backends:  # the live object itself, compile=True (its own graphs on a GPU)
        runs["compiled"] = (speculant.load(model, compile=True, max_length=512), "off")
    del model
    prompt = {"prompt_ids": list(range(1, 33))}
    # the keys and values a call reads at the runs' mean length (the 32-token prompt and half of 64 new tokens)
    kv_bytes = floor.kv_bytes_per_slot(config, 2) * (len(prompt["prompt_ids"]) + 32)
    device_read = floor.describe(device, min(weight_bytes, 1 << 30))
    bandwidth, sheet = device_read["read_bytes_per_s"], device_read["datasheet_bytes_per_s"]
    floor_ms = floor.floor_ms(weight_bytes, kv_bytes, bandwidth)
    out = {"parameters": parameters, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, **device_read,
           "floor_ms": floor_ms, "datasheet_floor_ms": sheet and floor.floor_ms(weight_bytes, kv_bytes, sheet),
           "modes": {}}
    for mode, (target, graphs) in runs.items():
        run = lambda n, t=target, m=graphs: speculant.generate(t, **prompt, max_new_tokens=n,  # noqa: E731
                                                               temperature=0.0, cuda_graphs=m, profile=True)
        for _ in range(2):
            run(64)
        ms = [per_call(run, 64, "target_seconds", "target_calls", repeats=1) for _ in range(5)]
        out["modes"][mode] = {"ms_per_token": median_range(ms), "over_floor": statistics.median(ms) / floor_ms}
        print(f"[{mode}] 1.1B bf16 Llama: {statistics.median(ms):.3f} ms/token ({min(ms):.3f}-{max(ms):.3f}), "
              f"{out['modes'][mode]['over_floor']:.2f}x the read floor {floor_ms:.3f} ms "
              f"({(weight_bytes + kv_bytes) / 1e9:.2f} GB read at {bandwidth / 1e12:.2f} TB/s measured"
              + (f"; {out['datasheet_floor_ms']:.3f} ms at the datasheet's {sheet / 1e12:.2f} TB/s)" if sheet
                 else ")"), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="gpt2")
    parser.add_argument("--preset", choices=sorted(train_pairs.PRESETS), default="cpu",
                        help="train_pairs preset (--pair gpt2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=shapes.DTYPE_CHOICES, default=None, help=shapes.DTYPE_HELP)
    parser.add_argument("--modes", nargs="+", choices=list(speculant.graphs.CUDA_GRAPHS), default=None,
                        help="cuda_graphs modes to compare (default: off on on CUDA, off fixed on CPU)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4, 6])
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0],
                        help="one run of the pair's methods per temperature")
    parser.add_argument("--trees", type=lambda s: [int(k) for k in s.split(",")], nargs="*", default=[],
                        help="token trees beside the chains, each as k1,k2,... (their tree calls captured too)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--backends", nargs="*", choices=["live", "compiled", "pt2"], default=[],
                        help="also time the pair as live transformers objects (eager / compile=True) and .pt2 "
                             "packages (--pair gpt2)")
    parser.add_argument("--hf-compiled", action="store_true")
    parser.add_argument("--big", action="store_true")
    parser.add_argument("--untrained", action="store_true",
                        help="the preset's GPT-2 shapes with random weights, untrained: per-call times in each mode, "
                             "--backends, --hf-compiled, --big; no tokens/s, alpha or trees")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    args.modes = args.modes or (["off", "on"] if device.type == "cuda" else ["off", "fixed"])
    if args.threads:
        torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="speculant-graphs-"))
    if args.untrained:
        pair_dir = untrained_pair(args.preset, scratch)
        target_path, draft_path, prompts = pair_dir / "target.pt", pair_dir / "draft.pt", [
            {"prompt_ids": list(range(2, 26))}]
    else:
        batch_args = argparse.Namespace(pair=args.pair, preset=args.preset, prompts=args.prompts)
        target_path, draft_path, prompts = batch.load_pair(batch_args, scratch)
        pair_dir = train_pairs.pair_dir(train_pairs.PRESETS[args.preset]["gpt2"]) if args.pair == "gpt2" else None
    dtype = shapes.load_dtype(device, args.dtype)
    target = speculant.load(target_path, device=device, dtype=dtype)
    draft = speculant.load(draft_path, device=device, dtype=dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    temperatures = args.temperature
    args.temperature = temperatures[0]  # call_times, --backends, --big: the first
    print(f"pair {args.pair}; device: {name}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{len(prompts)} prompts x {args.tokens} tokens, T {temperatures}, modes {args.modes}", flush=True)
    out = Path(args.out or Path(__file__).parent / "results" / f"graphs-{args.pair}-{device.type}.json")
    result = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(), "args": dict(vars(args))}

    def save(key, value):  # after each part, so that a run stopped by a time limit keeps what it measured
        result[key] = value
        out.write_text(json.dumps(result, indent=1))

    if args.untrained:
        save("calls", {mode: call_times(target, draft, prompts[0], args, mode) for mode in args.modes})
    else:
        pairs = {}
        for temperature in temperatures:
            args.temperature = temperature
            pairs[str(temperature)] = measure_pair(target, draft, prompts, args, device)
            save("pair", pairs)
        args.temperature = temperatures[0]
    if args.hf_compiled and pair_dir is not None:
        save("hf_compiled", hf_compiled(pair_dir, prompts[0], args.tokens, device))
    if args.big:
        save("big", big_llama(args, device, scratch))
    if args.backends and pair_dir is not None:
        other_backends(pair_dir, prompts[0], args, device, scratch, lambda value: save("backends", value))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
