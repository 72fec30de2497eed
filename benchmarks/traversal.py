"""Traversal against token verification of the same trees (verification="block" on a tree, cpp/math/tree.h).

    python benchmarks/traversal.py [--pair demo|gpt2] [--draft model|eagle] [--prompts 8] [--tokens 96]
                                   [--seeds 4] [--threads 1] [--timed] [--repeats 3] [--host]

The demo pair (shipped, nothing trained; its 8 prompts) or the trained GPT-2 pair (train_pairs.py; --prompts of its
held-out prompts), with the pair's draft model or (--draft eagle, GPT-2 only) the EAGLE head distilled on its
target (feature_heads.gpt2_eagle; the target runs live). Each prompt times --seeds seeds, each generation run by
both rules with the same seed: mean tokens per target call for each tree and sibling rule at T = 1 and 0.6, and
their ratio with a 95% bootstrap interval over the generations (pairs kept). The trees: four small shapes, and
Sequoia's best tree of 16 drafts (analysis.best_tree) at the acceptance table a token-verified probe of the tree
[4, 2, 2, 1, 1, 1] measured on the same prompts; beside the token rule's figure where siblings are drawn without
replacement, its prediction at that table (analysis.tree_expected_tokens, positional acceptance). The last column:
for each rule, 1 + the drafts kept per iteration, measured over expected on the drafts it verified (Stats: the
engine's expectation of the rule that ran, its coins integrated out; cpp/math/tree.h, expected_kept), and z, the
generations' mean of kept minus expected over its standard error. Untimed: tokens
per call do not depend on the machine's load.
--timed instead times the trees drawn without replacement ([2, 2], [3, 1, 1], the best of 16) under both rules in
one speculant.sweep over the prompts (seed i for prompt i; an untimed warm-up, then --repeats rounds interleaved
ABBA against plain decoding): tokens per call, the speedup (median, min-max) and the sweep's predicted speedup (the
tree theory at the table each row measured, which prices the token rule).
--host instead prints, for the same trees, the engine's own time per iteration (Stats.other_seconds over target
calls: verification and everything but the model calls) beside the target's and the draft's, each rule run twice in
turn (ABAB) over the prompts, 96 tokens, seed i for prompt i; the means of the two runs.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import speculant
from speculant import analysis, demo_pair, timing

sys.path.insert(0, str(Path(__file__).parent))
from trees import PROBE, below, pair_paths  # noqa: E402  (benchmarks/trees.py, beside this script)

DEMO_PROMPTS = ["def __init__(self", "import os\n", "    return ", "class Foo(", "for i in range(", "if __name__ ==",
                "    def run(self,", "# The "]
TREES = [([2, 2], "without_replacement"), ([2, 2], "top"), ([3, 1, 1], "without_replacement"),
         ([1, 1, 1, 1], "with_replacement")]
BUDGET = 16


def models(pair: str, draft: str) -> tuple:
    """(target, draft, prompts: count -> prompt ids) of the pair and its draft ("model", or "eagle": the head
    distilled on the trained GPT-2 target, which then runs live)."""
    target_path, draft_path, prompts = pair_paths(pair)
    if draft == "model":
        return speculant.load(target_path), speculant.load(draft_path), prompts
    if pair != "gpt2":
        raise SystemExit("--draft eagle takes --pair gpt2 (the head is distilled on the trained GPT-2 target)")
    from feature_heads import gpt2_eagle  # benchmarks/feature_heads.py: transformers and the head's training

    return (*gpt2_eagle(), prompts)


def per_call(target, draft, prompts, tree, siblings, temperature, rule, args) -> tuple:
    """Tokens per target call of each generation (prompt-major, --seeds seeds each), and 1 + the drafts kept per
    iteration over all of them, measured / the engine's expectation on their drafts, with z: the mean over the
    generations of drafts kept minus expected, over its standard error."""
    decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings, temperature=temperature,
                                           verification=rule)
    stats = [decoder.generate(p, max_new_tokens=args.tokens, seed=100 + i * 7 + s).stats
             for i, p in enumerate(prompts) for s in range(args.seeds)]
    kept = np.array([s.accepted_tokens for s in stats], float)
    expected = np.array([getattr(s, f"{rule}_kept_sum") for s in stats])
    iterations = sum(s.predicted_iterations for s in stats)
    gaps = kept - expected
    z = gaps.mean() / (gaps.std(ddof=1) / np.sqrt(len(gaps)))  # over the generations
    fit = (1 + kept.sum() / iterations) / (1 + expected.sum() / iterations)
    return np.array([s.tokens_per_target_call for s in stats]), f"{fit:.3f} (z {z:+.1f})"


def probe_table(target, draft, prompts, temperature, args) -> list:
    """The acceptance table by depth and rank of a token-verified PROBE tree (siblings drawn without
    replacement), down to the depths its accepted paths reached."""
    probe = speculant.SpeculativeDecoder(target, draft, tree=PROBE, siblings="without_replacement",
                                         temperature=temperature)
    results = [probe.generate(p, max_new_tokens=args.tokens, seed=1000 + i) for i, p in enumerate(prompts)]
    return timing.tree_table(results, reached=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--draft", choices=["model", "eagle"], default="model")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts of the GPT-2 pair")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timed", action="store_true", help="time the trees drawn without replacement instead")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (--timed)")
    parser.add_argument("--host", action="store_true", help="the engine's own time per iteration instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft, held_out = models(args.pair, args.draft)
    prompts = [demo_pair.encode(text) for text in DEMO_PROMPTS] if args.pair == "demo" else held_out(args.prompts)
    if args.host:
        print("| T | tree | rule | engine ms / iteration | target ms / iteration | draft ms / iteration |")
    elif args.timed:
        print("| T | tree | rule | tokens per target call | predicted speedup | speedup |")
    else:
        print("| T | tree | siblings | token (predicted) | traversal | traversal / token (95% interval) | "
              "measured / expected: token, traversal |")
    print("|---|---|---|---|---|---|" + ("" if args.host or args.timed else "---|"))
    rng = np.random.default_rng(0)  # the bootstrap's resamples
    for temperature in (1.0, 0.6):
        table = probe_table(target, draft, prompts, temperature, args)
        best = analysis.best_tree(BUDGET, table).tree
        if args.host:
            host(target, draft, prompts, temperature, best, args)
        elif args.timed:
            timed(target, draft, prompts, temperature, best, args)
        else:
            untimed(target, draft, prompts, temperature, table, best, args, rng)


def untimed(target, draft, prompts, temperature, table, best, args, rng) -> None:
    """Each tree's row: both rules' mean tokens per target call and their ratio with its bootstrap interval."""
    for tree, siblings in TREES + [(best, "without_replacement")]:
        (token, token_fit), (block, block_fit) = (per_call(target, draft, prompts, tree, siblings, temperature, rule,
                                                           args) for rule in ("token", "block"))
        picks = rng.integers(0, len(token), (2000, len(token)))  # the generations resampled, pairs kept
        low, high = np.percentile(block[picks].mean(1) / token[picks].mean(1), [2.5, 97.5])
        predicted = f" ({analysis.tree_expected_tokens(tree, below(table, tree)):.3f})" \
            if siblings == "without_replacement" else ""  # the probe's table is of that rule's ranks
        print(f"| {temperature} | {name(tree, best)} | {siblings} | {token.mean():.3f}{predicted} | "
              f"{block.mean():.3f} | {block.mean() / token.mean():.3f} ({low:.3f}-{high:.3f}) | "
              f"{token_fit}, {block_fit} |", flush=True)


def timed(target, draft, prompts, temperature, best, args) -> None:
    """One sweep of the trees drawn without replacement under both rules, timed against plain decoding."""
    trees = [tree for tree, siblings in TREES if siblings == "without_replacement"] + [best]
    frame = speculant.sweep(target, draft, prompts, trees=trees, siblings="without_replacement",
                            temperatures=[temperature], verifications=["token", "block"],
                            max_new_tokens=args.tokens, repeats=args.repeats, threads=args.threads, progress=False)
    for row in frame.itertuples():
        print(f"| {temperature} | {name(row.tree, best)} | {row.verification} | {row.tokens_per_target_call:.3f} | "
              f"{predicted(row.predicted_speedup)} | {row.speedup:.2f}x ({row.speedup_min:.2f}-{row.speedup_max:.2f})"
              f"{' ' + row.flag if isinstance(row.flag, str) and row.flag else ''} |", flush=True)


def host(target, draft, prompts, temperature, best, args) -> None:
    """Per tree drawn without replacement and rule: the engine's, the target's and the draft's seconds per
    iteration (one target call), over the prompts, the rules run in turn twice (ABAB) and averaged."""
    for tree in [tree for tree, siblings in TREES if siblings == "without_replacement"] + [best]:
        seconds = {"token": [], "block": []}
        for rule in ("token", "block") * 2:
            decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, siblings="without_replacement",
                                                   temperature=temperature, verification=rule)
            stats = [decoder.generate(p, max_new_tokens=args.tokens, seed=i).stats for i, p in enumerate(prompts)]
            calls = sum(s.target_calls for s in stats)
            seconds[rule].append([sum(getattr(s, f"{role}_seconds") for s in stats) / calls * 1e3
                                  for role in ("other", "target", "draft")])
        for rule, runs in seconds.items():
            engine, target_ms, draft_ms = np.mean(runs, axis=0)
            print(f"| {temperature} | {name(tree, best)} | {rule} | {engine:.3f} | {target_ms:.3f} | {draft_ms:.3f} |",
                  flush=True)


def predicted(speedup: float) -> str:
    """The sweep's prediction, or "none" where the measured rates are no positional table (timing.tree_prediction)."""
    return "none" if np.isnan(speedup) else f"{speedup:.2f}x"


def name(tree, best) -> str:
    return f"best of {BUDGET}: parents {list(best)}" if list(tree) == list(best) else str(list(tree))


if __name__ == "__main__":
    main()
