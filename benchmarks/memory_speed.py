"""Decoding at the GPU's memory speed (issue 48): the models users run against the read floor, one summary table.

    python benchmarks/memory_speed.py --device cuda                 # a GPU, bf16: every goal of issue 48
    python benchmarks/memory_speed.py --device cpu --models tiny    # the same code on tiny shapes (tests)

Random weights (shapes.py: a call's time does not depend on them), exported by speculant.export and run by the
engine with CUDA graphs ("auto"; "fixed" on a CPU, where nothing is captured), greedy, with torch's operations or
speculant's fused ones (`--kernels`). In order of value, each
part cut off at `--deadline` seconds (the rest said to be skipped):

1. plain decoding of the target (`llama-8b`; `tiny-llama` with `--models tiny`): ms per token end to end and
   the target's call alone (the engine's device time per call, device_clock.h), both differential (a run minus
   one a quarter as long, so the prefill drops out; median and min-max of `--repeats` pairs), against the read
   floor (floor.py: the weight bytes a call reads and the keys and values at the run's mean length, over the
   read bandwidth measured here, the datasheet figure beside it) and SGLang's documented 158 tok/s for
   Llama-3.1-8B on one H100;
2. the draft (`llama-1b`): its call, c = draft call / target call against the parameter ratio, and Theorem 3.8's
   speedup at ALPHA (the trained GPT-2 pair's α at γ = 4, T = 0, measured on an H100 lease, not these random
   weights) with plain tokens/s times it: what speculation would give at that α;
3. verification width: the target's call for a chain of γ = 4 (5 tokens) and a 4-node tree (tree=[2, 1]: 5
   tokens under a mask) over its one-token call;
4. attention over the used slots: `gpt2-target` exported with a 4096-slot cache against the same with 64 slots,
   a call at under 64 used positions (the cache bucket, native_rows.h);
5. the GPT-2-shaped pair: its calls, c against the parameter ratio;
6. the demo pair (trained, shipped) through speculant.timing at γ = 2, 4, 6: the measured speedup over plain
   decoding against Theorem 3.8 at the engine's α and c (device time).

Results: `--out` (JSON) and `--summary` (the table, markdown), also printed last.
"""
from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

import speculant
from speculant import analysis

sys.path.insert(0, str(Path(__file__).parent))
import floor  # noqa: E402
import shapes  # noqa: E402

warnings.filterwarnings("ignore", message=r".*torch\.jit.*")
warnings.filterwarnings("ignore", message=r".*TorchScript.*")

ALPHA, ALPHA_GAMMA = 0.737, 4  # the trained GPT-2 pair, T = 0, gamma 4: ../shared/gpu-runs/2026-11-27-h100
SGLANG_8B = 158.0  # tok/s, Llama-3.1-8B on one H100, batch 1, no speculation (SGLang's documentation)
PROMPT = list(range(3, 35))  # 32 tokens
MODELS = {"full": ("llama-8b", "llama-1b", "gpt2-target", "gpt2-draft"),
          "tiny": ("tiny-llama", "tiny-llama-draft", "tiny-llama", "tiny-llama-draft")}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_range(values: List[float]) -> List[float]:
    return [statistics.median(values), min(values), max(values)]


def exported(model, max_length: int, device: torch.device, kernels: str):
    """speculant.export's TorchScript module of `model` with `kernels` loaded onto `device` (in memory: an 8B file
    would cost a minute of disk)."""
    from speculant.export import gpt2, llama

    module = llama if model.config.model_type == "llama" else gpt2
    return speculant.load(module.script(model, max_length=max_length, kernels=kernels), device=device)


def differential(run: Callable[[int], object], tokens: int, repeats: int) -> Dict[str, List[float]]:
    """ms per new token end to end and ms per target call (device time): a `tokens` run minus one a quarter as
    long, median and min-max over `repeats` pairs."""
    per_token, per_call = [], []
    for _ in range(repeats):
        (long, long_wall), (short, short_wall) = run(tokens), run(max(tokens // 4, 2))
        new = long.stats.new_tokens - short.stats.new_tokens
        calls = long.stats.target_calls - short.stats.target_calls
        per_token.append(1e3 * (long_wall - short_wall) / new)
        per_call.append(1e3 * (long.stats.target_seconds - short.stats.target_seconds) / calls)
    return {"ms_per_token": median_range(per_token), "ms_per_call": median_range(per_call)}


def timer(generate: Callable[[int], object], device: torch.device) -> Callable[[int], tuple]:
    def run(tokens: int):
        sync(device)
        start = time.perf_counter()
        result = generate(tokens)
        sync(device)
        return result, time.perf_counter() - start
    return run


def plain(model, device: torch.device, graphs: str, tokens: int, repeats: int) -> Dict:
    run = timer(lambda n: speculant.generate(model, PROMPT, max_new_tokens=n, temperature=0.0, cuda_graphs=graphs),
                device)
    run(tokens), run(max(tokens // 4, 2))  # warm-up: the executor's first runs, every bucket's capture
    return differential(run, tokens, repeats)


def verification(target, draft, device: torch.device, graphs: str, tokens: int, repeats: int, **shape) -> Dict:
    """The target's call in speculative runs (ms, device time): chains of gamma or a tree."""
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=0.0, cuda_graphs=graphs, **shape)
    run = timer(lambda n: decoder.generate(PROMPT, max_new_tokens=n), device)
    run(tokens), run(max(tokens // 4, 2))
    return differential(run, tokens, repeats)


def floor_of(model, config, device_read: Dict, tokens: int) -> Dict:
    """The read floor of a call at the run's mean length (the prompt and half the new tokens)."""
    weights = shapes.read_weight_bytes(model)
    kv = floor.kv_bytes_per_slot(config, next(model.parameters()).element_size()) * (len(PROMPT) + tokens // 2)
    sheet = device_read["datasheet_bytes_per_s"]
    return {"read_weight_bytes": weights, "kv_bytes": kv,
            "floor_ms": floor.floor_ms(weights, kv, device_read["read_bytes_per_s"]),
            "datasheet_floor_ms": sheet and floor.floor_ms(weights, kv, sheet)}


class Run:
    """What the parts share: the arguments, the device and the results so far."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = shapes.dtype_for(self.device, args.dtype)
        self.graphs = "auto" if self.device.type == "cuda" else "fixed"
        self.names = MODELS[args.models]
        self.results: Dict = {}
        self.loaded: Dict = {}

    def load(self, name: str, positions: Optional[int] = None) -> Dict:
        """Shape `name` built, its floor computed, exported and loaded (kept under (name, positions))."""
        key = (name, positions)
        if key not in self.loaded:
            model = shapes.build(name, self.device, self.dtype, positions)
            config = model.config
            facts = {"parameters": sum(p.numel() for p in model.parameters()),
                     **floor_of(model, config, self.results["device"], self.args.tokens)}
            length = positions or shapes.SHAPES[name].max_length
            self.loaded[key] = {"model": exported(model, length, self.device, self.args.kernels), **facts}
            del model
        return self.loaded[key]


def part_target(run: Run) -> Dict:
    target = run.load(run.names[0])
    out = plain(target["model"], run.device, run.graphs, run.args.tokens, run.args.repeats)
    ms = out["ms_per_token"][0]
    return {**{k: v for k, v in target.items() if k != "model"}, **out, "tokens_per_s": 1e3 / ms,
            "over_floor": ms / target["floor_ms"],
            "over_datasheet_floor": target["datasheet_floor_ms"] and ms / target["datasheet_floor_ms"]}


def part_draft(run: Run) -> Dict:
    draft = run.load(run.names[1])
    out = plain(draft["model"], run.device, run.graphs, run.args.tokens, run.args.repeats)
    target = run.results["target"]
    c = out["ms_per_call"][0] / target["ms_per_call"][0]
    speedup = analysis.walltime_improvement(ALPHA, ALPHA_GAMMA, c)
    return {**{k: v for k, v in draft.items() if k != "model"}, **out, "c": c,
            "parameter_ratio": draft["parameters"] / target["parameters"],
            "predicted_speedup_at_alpha": speedup, "predicted_tokens_per_s": target["tokens_per_s"] * speedup}


def part_verification(run: Run) -> Dict:
    target, draft = run.load(run.names[0])["model"], run.load(run.names[1])["model"]
    one = run.results["target"]["ms_per_call"][0]
    out = {}
    for label, shape in (("chain gamma 4", {"gamma": 4}), ("tree [2, 1]", {"tree": [2, 1]})):
        found = verification(target, draft, run.device, run.graphs, run.args.tokens, run.args.repeats, **shape)
        out[label] = {**found, "over_one_token_call": found["ms_per_call"][0] / one}
    return out


def part_buckets(run: Run) -> Dict:
    """A call at under 64 used positions: a 4096-slot cache against a 64-slot one (the same weights)."""
    name = run.names[2]
    out = {}
    for slots in (64, 4096):
        model = shapes.build(name, run.device, run.dtype, positions=4096)
        loaded = exported(model, slots, run.device, run.args.kernels)
        del model
        run_ = timer(lambda n, m=loaded: speculant.generate(m, PROMPT[:8], max_new_tokens=n, temperature=0.0,
                                                             cuda_graphs=run.graphs), run.device)
        run_(48), run_(12)
        out[slots] = differential(run_, 48, run.args.repeats)
    out["ratio"] = out[4096]["ms_per_call"][0] / out[64]["ms_per_call"][0]
    return out


def part_gpt2_pair(run: Run) -> Dict:
    found = {}
    for role, name in (("target", run.names[2]), ("draft", run.names[3])):
        model = run.load(name)
        found[role] = {"parameters": model["parameters"], "floor_ms": model["floor_ms"],
                       **plain(model["model"], run.device, run.graphs, run.args.tokens, run.args.repeats)}
    found["c"] = found["draft"]["ms_per_call"][0] / found["target"]["ms_per_call"][0]
    found["parameter_ratio"] = found["draft"]["parameters"] / found["target"]["parameters"]
    return found


def part_demo(run: Run) -> Dict:
    """speculant.demo's timing (speculant.timing: warm-up, ABBA rounds) at three gammas: speedup vs Theorem 3.8."""
    from speculant import demo

    out = {}
    for gamma in (2, 4, 6):
        figures = demo.run(gamma=gamma, temperature=0.0, max_new_tokens=run.args.tokens, repeats=run.args.repeats,
                           device=run.args.device, dtype=run.args.dtype, out=io.StringIO())
        out[gamma] = {k: figures[k] for k in ("speedup", "speedup_min", "speedup_max", "predicted", "alpha", "c")}
        out[gamma]["measured_over_predicted"] = figures["speedup"] / figures["predicted"]
    return out


PARTS = [("target", part_target), ("draft", part_draft), ("verification", part_verification),
         ("buckets", part_buckets), ("gpt2_pair", part_gpt2_pair), ("demo", part_demo)]


def summary(results: Dict) -> List[List[str]]:
    """[goal, measured, goal's bound, met] rows of every part that ran (issue 48's goals: an H100's figures)."""
    rows = []

    def row(goal: str, value: float, shown: str, bound: str, met: bool) -> None:
        rows.append([goal, shown.format(value), bound, "yes" if met else "no"])

    device = results["device"]
    sheet = device["datasheet_bytes_per_s"]
    rows.append([f"read bandwidth (one-pass sum), {device['device']}", f"{device['read_bytes_per_s'] / 1e12:.2f} TB/s",
                 f"datasheet {sheet / 1e12:.2f} TB/s" if sheet else "no datasheet entry", "-"])
    if "target" in results:
        t = results["target"]
        row("target: plain decoding", t["tokens_per_s"], "{:.1f} tok/s", ">= 175 (SGLang 158, H100)",
            t["tokens_per_s"] >= 175)
        row("target: ms/token over the read floor", t["over_floor"],
            f"{t['ms_per_token'][0]:.3f} / {t['floor_ms']:.3f} ms = {{:.2f}}x", "<= 1.2x", t["over_floor"] <= 1.2)
        row("target: call alone (device) over the floor", t["ms_per_call"][0] / t["floor_ms"],
            f"{t['ms_per_call'][0]:.3f} ms = {{:.2f}}x", "-", True)
    if "draft" in results:
        d = results["draft"]
        row("draft: c over the parameter ratio", d["c"] / d["parameter_ratio"],
            f"c {d['c']:.3f} / {d['parameter_ratio']:.3f} = {{:.2f}}x", "<= 2x", d["c"] <= 2 * d["parameter_ratio"])
        row(f"speculative at alpha {ALPHA} (Theorem 3.8, gamma {ALPHA_GAMMA})", d["predicted_tokens_per_s"],
            f"{{:.0f}} tok/s ({d['predicted_speedup_at_alpha']:.2f}x)", "predicted, not run", True)
    for label, v in results.get("verification", {}).items():
        row(f"verification, {label}, over a one-token call", v["over_one_token_call"], "{:.2f}x",
            "<= 1.1x (tree)" if "tree" in label else "-", v["over_one_token_call"] <= 1.1 or "tree" not in label)
    if "buckets" in results:
        b = results["buckets"]
        row("a call at < 64 used slots, 4096-slot cache over 64-slot", b["ratio"],
            f"{b[4096]['ms_per_call'][0]:.3f} / {b[64]['ms_per_call'][0]:.3f} ms = {{:.2f}}x", "<= 1.2x",
            b["ratio"] <= 1.2)
    if "gpt2_pair" in results:
        g = results["gpt2_pair"]
        for role, bound in (("target", 0.25), ("draft", 0.06)):
            row(f"GPT-2 {role} call", g[role]["ms_per_call"][0], "{:.3f} ms", f"<= {bound} ms",
                g[role]["ms_per_call"][0] <= bound)
        row("GPT-2 pair: c over the parameter ratio", g["c"] / g["parameter_ratio"],
            f"c {g['c']:.3f} / {g['parameter_ratio']:.3f} = {{:.2f}}x", "<= 2x", g["c"] <= 2 * g["parameter_ratio"])
    for gamma, v in results.get("demo", {}).items():
        row(f"demo pair gamma {gamma}: measured / Theorem 3.8", v["measured_over_predicted"],
            f"{v['speedup']:.2f}x / {v['predicted']:.2f}x = {{:.0%}}", ">= 90%", v["measured_over_predicted"] >= 0.9)
    return rows


def markdown(rows: List[List[str]]) -> str:
    lines = ["| goal | measured | bound | met |", "|---|---|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: Optional[List[str]] = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=shapes.DTYPE_CHOICES, default=None, help=shapes.DTYPE_HELP)
    parser.add_argument("--models", choices=sorted(MODELS), default="full")
    parser.add_argument("--parts", nargs="+", choices=[name for name, _ in PARTS], default=[n for n, _ in PARTS])
    parser.add_argument("--kernels", choices=["aten", "speculant"], default="aten",
                        help="the exports' operations (speculant.export's kernels=)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=1e9, help="seconds after which no part starts")
    parser.add_argument("--out", default=None)
    parser.add_argument("--summary", default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    run = Run(args)
    run.results["device"] = floor.describe(run.device, 1 << 30 if run.device.type == "cuda" else 1 << 26)
    run.results["setup"] = {"torch": torch.__version__, "python": platform.python_version(), "dtype": str(run.dtype),
                            "cuda_graphs": run.graphs, "kernels": args.kernels, "tokens": args.tokens, "repeats": args.repeats,
                            "models": run.names}
    for name, part in PARTS:
        if name not in args.parts:
            continue
        if time.perf_counter() - started > args.deadline:
            print(f"[{time.perf_counter() - started:.0f} s] {name}: skipped (past the deadline)", flush=True)
            continue
        run.results[name] = part(run)
        print(f"[{time.perf_counter() - started:.0f} s] {name}: {json.dumps(run.results[name], default=str)}",
              flush=True)
    table = markdown(summary(run.results))
    print(f"\n{run.results['device']['device']}, torch {torch.__version__}, {run.dtype}, cuda_graphs "
          f"{run.graphs}, kernels {args.kernels}\n{table}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(run.results, indent=1, default=str))
    if args.summary:
        Path(args.summary).write_text(table + "\n")
    return run.results


if __name__ == "__main__":
    main()
