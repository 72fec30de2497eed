"""The batch-size effect (issue 12): speculative and plain decoding of the same prompts in batches of
B = 1, 2, 4, 8, 16, 32, measured side by side in one run.

    python benchmarks/batch.py [--pair demo|gpt2] [--preset cpu|cuda] [--device cpu|cuda] [--prompts 32]
                               [--tokens 64] [--gamma 4] [--repeats 3]

Every B generates the same `--prompts` prompts (prompt i with seed i, so the tokens do not depend on B) in
batches of B through speculant.timing: an untimed warm-up of every shape, then `--repeats` rounds interleaved
ABBA. Per B: tokens/s of speculative and of batched plain decoding (median and min-max over the rounds), the
speedup (median of the rounds' ratios, min-max), its growth over B = 1, alpha, c (a batched draft call's time
over a batched target call's) and Theorem 3.8's prediction at them, and Theorem 3.11's operations factor at
c-hat = the draft's parameters over the target's (the arithmetic a batch makes the target spend: the gain
shrinks once a large batch makes the target compute-bound, section 3.4).

The pair: `demo`, the embedded default pair (speculant.demo_pair, TinyGPT target and draft trained on
Python's standard library, as `speculant demo` uses); or `gpt2`, benchmarks/train_pairs.py's GPT-2 pair of the
preset (train it first), exported here from its save_pretrained directories with speculant.export. Both run
as TorchScript, each batch step one model call for the rows still running. Results go to
benchmarks/results/batch-<pair>-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import torch

import speculant
from speculant import analysis, demo_pair, timing

sys.path.insert(0, str(Path(__file__).parent))
import shapes  # noqa: E402  (benchmarks/ is not a package)

warnings.filterwarnings("ignore", message=r".*TorchScript.*")
SIZES = (1, 2, 4, 8, 16, 32)


def prompts(count: int, length: int = 24):
    """`count` prompts of varied lengths (length/2 .. length tokens) from the pair's held-out text (bytes)."""
    _, held_out, _ = demo_pair.load_corpus()
    step = max(held_out.numel() // (count + 1), length)
    return [held_out[i * step:i * step + length // 2 + (i * 7) % (length // 2 + 1)].tolist() for i in range(count)]


def load_pair(args, scratch: Path):
    """(target path, draft path, generate calls) of the chosen pair."""
    if args.pair == "demo":
        target_path, draft_path = demo_pair.default_pair(progress=False)
        return target_path, draft_path, [{"prompt_ids": p} for p in prompts(args.prompts)]
    import train_pairs
    from speculant.export import load_pretrained

    recipe = train_pairs.PRESETS[args.preset][args.pair]
    out = train_pairs.pair_dir(recipe)
    if not (out / "pair.json").exists():
        raise SystemExit(f"{out}/pair.json missing: python benchmarks/train_pairs.py --preset {args.preset} "
                         f"--stage {args.pair}")
    paths = []
    for name in ("target", "draft"):  # exported anew: the batched methods are those of this speculant
        paths.append(scratch / f"{name}.pt")
        speculant.export(load_pretrained(out / name), paths[-1])
    return paths[0], paths[1], train_pairs.heldout_prompts(recipe, out, args.prompts, 24)


def parameters(path) -> int:
    return sum(p.numel() for p in torch.jit.load(str(path), map_location="cpu").parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--preset", choices=["cpu", "cuda", "lease"], default="cpu",
                        help="train_pairs preset (--pair gpt2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=shapes.DTYPE_CHOICES, default=None, help=shapes.DTYPE_HELP)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--cuda-graphs", default="off", choices=speculant.graphs.CUDA_GRAPHS,
                        help="both methods' cuda_graphs (each batch size captures its own graphs in the warm-up)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target_path, draft_path, calls = load_pair(args, Path(tempfile.mkdtemp(prefix="speculant-batch-")))
    dtype = shapes.load_dtype(args.device, args.dtype)
    target = speculant.load(target_path, device=args.device, dtype=dtype)
    draft = speculant.load(draft_path, device=args.device, dtype=dtype)
    c_hat = parameters(draft_path) / parameters(target_path)
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=args.gamma, temperature=args.temperature,
                                           cuda_graphs=args.cuda_graphs)

    def plain(**kwargs):
        return speculant.generate(target, temperature=args.temperature, cuda_graphs=args.cuda_graphs, **kwargs)

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or \
        platform.machine()
    print(f"pair {args.pair}; device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{len(calls)} prompts x "
          f"{args.tokens} tokens, gamma {args.gamma}, T {args.temperature}, cuda_graphs {args.cuda_graphs}; "
          f"c-hat (parameters) {c_hat:.3f}")
    rows, base = [], None
    for size in (int(s) for s in args.sizes.split(",")):
        rounds = timing.timed_rounds(decoder.generate, plain, calls, max_new_tokens=args.tokens, seed=0,
                                     repeats=args.repeats, batch_size=size)
        summary = timing.summarize(rounds, gamma=args.gamma, lenience=1.0)
        tokens = summary["new_tokens"]
        spec_rates = sorted(tokens / r.speculative_seconds for r in rounds)
        plain_rates = sorted(sum(len(x.tokens) for x in r.plain) / r.plain_seconds for r in rounds)
        spec_rate = timing.median_range(spec_rates)
        base = base or spec_rate[0]
        row = {"batch": size, "spec_tokens_per_s": spec_rate, "plain_tokens_per_s": timing.median_range(plain_rates),
               "scaling": spec_rate[0] / base, "speedup": [summary["speedup"], summary["speedup_min"],
                                                           summary["speedup_max"]],
               "alpha": summary["alpha"], "c": summary["c"], "predicted_speedup": summary["predicted_speedup"],
               "operations_factor": float(analysis.operations_factor(summary["alpha"], args.gamma, c_hat)),
               "flag": summary["flag"]}
        rows.append(row)
        print(f"B {size:2d}: speculative {spec_rate[0]:8.1f} tok/s ({spec_rate[1]:.1f}-{spec_rate[2]:.1f}), "
              f"plain {row['plain_tokens_per_s'][0]:8.1f} tok/s, speedup {summary['speedup']:.2f}x "
              f"({summary['speedup_min']:.2f}-{summary['speedup_max']:.2f}), x{row['scaling']:.2f} of B 1, "
              f"alpha {summary['alpha']:.3f}, c {summary['c']:.3f}, Thm 3.8 {summary['predicted_speedup']:.2f}x, "
              f"Thm 3.11 ops {row['operations_factor']:.2f} {summary['flag']}", flush=True)
    name = f"batch-{args.pair}-{args.device.split(':')[0]}.json"
    out = Path(args.out or Path(__file__).parent / "results" / name)
    out.write_text(json.dumps({"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                               "args": vars(args), "c_hat": c_hat, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
