"""Hierarchical drafts against one level on the demo pair, with Theorem 3.8 composed over the levels beside it.

    python benchmarks/hierarchy.py [--threads 1] [--tokens 128] [--prompts 8] [--repeats 5] [--temperatures 0 1]

The demo pair (speculant.demo_pair: byte-level TinyGPTs, a 4-layer d128 target and a 1-layer d64 draft) and, as
the third level under the draft model, a bigram table fit on the demo corpus's training part (the natural
three-level stack: the table drafts for the draft model, which drafts for the target). On held-out prompts,
batch 1, at each temperature, every setting timed by speculant.timing against plain decoding of the target
(warm-up, then --repeats rounds interleaved ABBA; median speedup with min-max):

* two levels: SpeculativeDecoder(target, draft, gamma=g) for g in TWO_LEVEL;
* three levels: SpeculativeDecoder(target, SpeculativeDecoder(draft, bigram, gamma=h), gamma=g) for (g, h) in
  THREE_LEVEL.

Each row has alpha and c of every level (speculant.timing.level_table: a level's model time per call over the
model's above it) and the predicted speedup: Theorem 3.8 for two levels, analysis.hierarchical_improvement (the
theorem composed: the draft level's expected cost of exactly g tokens, by its recurrence) for three. The
issue's goals: the measured speedup within 15% of the composed prediction, and on a pair with c >= 0.2 three
levels ahead of the best two-level setting. Results: --out (JSON).
"""
import argparse
import functools
import json
import platform
import sys
import warnings
from pathlib import Path

import torch

import speculant
from speculant import demo_pair, drafters, timing

sys.path.insert(0, str(Path(__file__).parent))
from drafters import demo_prompts  # noqa: E402  (benchmarks/drafters.py, beside this script)

TWO_LEVEL = [2, 3, 4, 6, 8]
THREE_LEVEL = [(4, 1), (4, 2), (6, 2), (8, 2), (8, 3)]


def run(target, draft, levels, temperature, calls, args) -> dict:
    """One setting timed against plain decoding (speculant.timing), with its levels' statistics."""
    options = {"temperature": temperature}
    inner = draft
    for model, gamma in levels[1:]:
        inner = speculant.SpeculativeDecoder(model, inner, gamma=gamma, **options)
    decoder = speculant.SpeculativeDecoder(target, inner, gamma=levels[0][1], **options)
    baseline = functools.partial(speculant.generate, target, **options)
    rounds = timing.timed_rounds(decoder.generate, baseline, calls, max_new_tokens=args.tokens, seed=0,
                                 repeats=args.repeats)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = timing.summarize(rounds, gamma=levels[0][1], lenience=1.0)
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--out", default="benchmarks/results/hierarchy-demo-cpu.json")
    parser.add_argument("--quick", action="store_true", help="two settings per kind (the smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target_path, draft_path = demo_pair.default_pair()
    train, _, _ = demo_pair.load_corpus()
    bigram = drafters.Bigram.fit(train, 256)  # the demo's byte vocabulary
    calls = [{"prompt_ids": p} for p in demo_prompts(args.prompts)]
    two, three = (TWO_LEVEL[1:3], THREE_LEVEL[1:3]) if args.quick else (TWO_LEVEL, THREE_LEVEL)
    rows = []
    for temperature in args.temperatures:
        for gamma in two:
            target, draft = speculant.load(target_path), speculant.load(draft_path)
            rows.append({"temperature": temperature, "depth": 2, "gammas": [gamma],
                         **run(target, draft, [(target, gamma)], temperature, calls, args)})
            print(json.dumps(rows[-1]), flush=True)
        for gamma, inner_gamma in three:
            target, draft = speculant.load(target_path), speculant.load(draft_path)
            rows.append({"temperature": temperature, "depth": 3, "gammas": [gamma, inner_gamma],
                         **run(target, bigram, [(target, gamma), (draft, inner_gamma)], temperature, calls, args)})
            print(json.dumps(rows[-1]), flush=True)
    report = {"machine": f"{platform.machine()} {platform.processor() or ''} threads={args.threads}".strip(),
              "torch": torch.__version__, "tokens": args.tokens, "prompts": args.prompts, "repeats": args.repeats,
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for temperature in args.temperatures:
        print(f"\nT = {temperature}: depth gammas | alpha c | speedup (min-max) | predicted | measured/predicted")
        for row in (r for r in rows if r["temperature"] == temperature):
            alphas = [row["alpha"]] + [lv["alpha"] for lv in (row["levels"] or [])[:-1]]
            costs = [lv["c"] for lv in row["levels"]] if row["levels"] else [row["c"]]
            print(f"  {row['depth']} {row['gammas']} | {' '.join(f'{a:.2f}' for a in alphas)} "
                  f"{' '.join(f'{c:.3f}' for c in costs)} | {row['speedup']:.2f}x ({row['speedup_min']:.2f}-"
                  f"{row['speedup_max']:.2f}) | {row['predicted_speedup']:.2f}x | "
                  f"{row['speedup'] / row['predicted_speedup']:.2f}")


if __name__ == "__main__":
    main()
