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
theorem composed: the draft level's expected cost of exactly g tokens, by its recurrence) for three. Both assume,
as the paper does, that a call on w tokens costs one call, which a CPU does not grant; so each row also has a
width-aware prediction: the same formula with verify_costs, each model's w-token call over its one-token call
timed directly at a cached prefix (--calls alternating calls per width), and c from one-token calls. Neither
counts the engine's own work, and a call timed from Python carries Python's call overhead, which the engine's
calls from C++ do not. So each row also has the cost model (timing.cost_model, the sweep's cost_model_speedup):
the same composition with every cost as the engine timed it in the row's own rounds (timing.engine_costs, in
the record: its verification calls by width, its time per iteration outside the models at each level and per
plain token), which leaves only the number of calls per token at each level to the theory. Last, at each temperature, the best
three-level setting and the best two-level one are timed against each other directly (head_to_head). The issue's
goals: the measured speedup within 15% of the composed prediction, and on a pair with c >= 0.2 three levels
ahead of the best two-level setting. Results: --out (JSON).
"""
import argparse
import functools
import json
import platform
import statistics
import sys
import warnings
from pathlib import Path

import torch

import speculant
from speculant import analysis, demo_pair, drafters, timing

sys.path.insert(0, str(Path(__file__).parent))
from drafters import demo_prompts  # noqa: E402  (benchmarks/drafters.py, beside this script)
from trees import paired  # noqa: E402  (benchmarks/trees.py: two calls timed alternately)

PREFIX = 48

TWO_LEVEL = [2, 3, 4, 6, 8]
THREE_LEVEL = [(2, 1), (3, 1), (3, 2), (4, 1), (4, 2), (6, 2), (8, 2), (8, 3)]


def build(paths, bigram, gammas, temperature):
    """(target, decoder): freshly loaded models; gammas [g] is SpeculativeDecoder(target, draft, gamma=g), [g, h]
    SpeculativeDecoder(target, SpeculativeDecoder(draft, bigram, gamma=h), gamma=g)."""
    target, draft = speculant.load(paths[0]), speculant.load(paths[1])
    if len(gammas) == 2:
        draft = speculant.SpeculativeDecoder(draft, bigram, gamma=gammas[1], temperature=temperature)
    return target, speculant.SpeculativeDecoder(target, draft, gamma=gammas[0], temperature=temperature)


def run(paths, bigram, gammas, temperature, calls, args) -> dict:
    """One setting timed against plain decoding (speculant.timing), with its levels' statistics and the costs the
    engine timed (timing.engine_costs), the cost model's inputs."""
    target, decoder = build(paths, bigram, gammas, temperature)
    baseline = functools.partial(speculant.generate, target, temperature=temperature)
    rounds = timing.timed_rounds(decoder.generate, baseline, calls, max_new_tokens=args.tokens, seed=0,
                                 repeats=args.repeats)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = timing.summarize(rounds, gamma=gammas[0], lenience=1.0)
    return {**summary, "costs": timing.engine_costs(rounds)}


def width_costs(path, widths: int, calls: int):
    """(seconds of the model's one-token extend at a cached prefix of PREFIX tokens, [its w-token extend over
    its one-token extend for w = 1 .. widths]), each ratio one of medians of `calls` alternating calls; the
    one-token seconds the median of those pairs' one-token medians."""
    torch.manual_seed(0)
    module = torch.jit.load(str(path))
    module.prefill(torch.randint(0, 256, (1, PREFIX)))

    def extend(width):
        ids = torch.randint(0, 256, (1, width))
        return lambda: module.extend(ids), lambda: module.truncate(PREFIX)

    ones, costs = [], [1.0]
    for w in range(2, widths + 1):
        base, wide = paired(extend(1), extend(w), calls)
        ones.append(base)
        costs.append(wide / base)
    return statistics.median(ones), costs  # the one-token call: the median over the pairs, robust to a slow spell


def width_aware(row: dict, c: float, target_widths: list, draft_widths: list) -> float:
    """The row's prediction with the measured cost of wide calls (analysis.hierarchical_improvement's
    verify_costs): the top's verification of gamma + 1 tokens, and a draft level's of g + 1, cost what they were
    timed to; c is the draft model's one-token call over the target's. The bigram's cost per token, in draft
    one-token calls, is its engine-measured c (over the draft level's mean call) times that mean call's cost over
    the target's, over c."""
    if row["depth"] == 2:
        return analysis.hierarchical_improvement([row["acceptance"]], row["gammas"], [c], verify_costs=[target_widths])
    level, bottom = row["levels"]
    alphas = [row["acceptance"], level["alpha"]]
    return analysis.hierarchical_improvement(alphas, row["gammas"], [c, bottom["c"] * level["c"] / c],
                                             verify_costs=[target_widths, draft_widths])


def head_to_head(rows, paths, bigram, temperature, calls, args) -> dict:
    """The best three-level setting of the temperature against its best two-level one (by median speedup), timed
    against each other directly: 4 * --repeats rounds interleaved ABBA after a warm-up; the ratio is two-level
    seconds per token over three-level seconds per token, median with min-max over the rounds, and how many
    rounds three levels won, with the two-sided sign test's p-value (a slow spell hits a single round, so the
    count says more than the range)."""
    best = {depth: max((r for r in rows if r["temperature"] == temperature and r["depth"] == depth),
                       key=lambda r: r["speedup"])["gammas"] for depth in (2, 3)}
    _, three = build(paths, bigram, best[3], temperature)
    _, two = build(paths, bigram, best[2], temperature)
    duel = timing.head_to_head(three.generate, two.generate, calls, max_new_tokens=args.tokens, seed=0,
                               repeats=4 * args.repeats)
    return {"temperature": temperature, "two": best[2], "three": best[3], "ratio": duel.ratio,
            "ratio_min": duel.ratio_min, "ratio_max": duel.ratio_max, "rounds": len(duel.ratios),
            "ratios": duel.ratios, "three_faster": duel.first_faster, "sign_test_p": duel.sign_test_p}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--out", default="benchmarks/results/hierarchy-demo-cpu.json")
    parser.add_argument("--calls", type=int, default=100, help="alternating calls per width-cost ratio")
    parser.add_argument("--quick", action="store_true", help="two settings per kind (the smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target_path, draft_path = demo_pair.default_pair()
    train, _, _ = demo_pair.load_corpus()
    bigram = drafters.Bigram.fit(train, 256)  # the demo's byte vocabulary
    calls = [{"prompt_ids": p} for p in demo_prompts(args.prompts)]
    two, three = (TWO_LEVEL[1:3], [(4, 2), (3, 1)]) if args.quick else (TWO_LEVEL, THREE_LEVEL)
    rows = []
    paths, duels = (target_path, draft_path), []
    for temperature in args.temperatures:
        for gammas in [[g] for g in two] + [list(g) for g in three]:
            rows.append({"temperature": temperature, "depth": len(gammas) + 1, "gammas": gammas,
                         **run(paths, bigram, gammas, temperature, calls, args)})
            print(json.dumps(rows[-1]), flush=True)
        duels.append(head_to_head(rows, paths, bigram, temperature, calls, args))
    widest = max([g for g in two] + [g for g, _ in three]) + 2  # the pending token(s) and the drafts
    target_call, target_widths = width_costs(target_path, widest, args.calls)
    draft_call, draft_widths = width_costs(draft_path, widest, args.calls)
    c = draft_call / target_call
    for row in rows:
        row["predicted_width_aware"] = width_aware(row, c, target_widths, draft_widths)
    report = {"machine": f"{platform.machine()} {platform.processor() or ''} threads={args.threads}".strip(),
              "torch": torch.__version__, "tokens": args.tokens, "prompts": args.prompts, "repeats": args.repeats,
              "target_call_seconds": target_call, "draft_call_seconds": draft_call, "c": c,
              "target_widths": target_widths, "draft_widths": draft_widths, "rows": rows, "head_to_head": duels}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\none-token calls: target {target_call * 1e3:.3f} ms, draft {draft_call * 1e3:.3f} ms (c = {c:.3f}); "
          f"a w-token call over a one-token call, w = 1 .. {widest}: target "
          f"{' '.join(f'{v:.2f}' for v in target_widths)}, draft {' '.join(f'{v:.2f}' for v in draft_widths)}")
    for temperature in args.temperatures:
        print(f"\nT = {temperature}: depth gammas | alpha c | speedup (min-max) | predicted | measured/predicted "
              "| width-aware prediction | measured/width-aware | cost model | measured/cost model")
        for row in (r for r in rows if r["temperature"] == temperature):
            alphas = [row["alpha"]] + [lv["alpha"] for lv in (row["levels"] or [])[:-1]]
            costs = [lv["c"] for lv in row["levels"]] if row["levels"] else [row["c"]]
            print(f"  {row['depth']} {row['gammas']} | {' '.join(f'{a:.2f}' for a in alphas)} "
                  f"{' '.join(f'{c:.3f}' for c in costs)} | {row['speedup']:.2f}x ({row['speedup_min']:.2f}-"
                  f"{row['speedup_max']:.2f}) | {row['predicted_speedup']:.2f}x | "
                  f"{row['speedup'] / row['predicted_speedup']:.2f} | {row['predicted_width_aware']:.2f}x | "
                  f"{row['speedup'] / row['predicted_width_aware']:.2f} | {row['cost_model_speedup']:.2f}x | "
                  f"{row['speedup'] / row['cost_model_speedup']:.2f}")
    for duel in duels:
        print(f"\nT = {duel['temperature']}: three levels {duel['three']} against two {duel['two']}, timed against "
              f"each other: {duel['ratio']:.2f}x ({duel['ratio_min']:.2f}-{duel['ratio_max']:.2f}); three levels "
              f"faster in {duel['three_faster']} of {duel['rounds']} rounds (sign test p = {duel['sign_test_p']:.3g})")


if __name__ == "__main__":
    main()
