"""Traversal against token verification of the same trees (verification="block" on a tree, cpp/math/tree.h).

    python benchmarks/traversal.py [--pair demo|gpt2] [--draft model|eagle] [--prompts 8] [--tokens 96]
                                   [--seeds 4] [--threads 1]

The demo pair (shipped, nothing trained; its 8 prompts) or the trained GPT-2 pair (train_pairs.py; --prompts of
its held-out prompts), with the pair's draft model or (--draft eagle, GPT-2 only) the EAGLE head distilled on
its target (feature_heads.gpt2_eagle; the target runs live). Each prompt times --seeds seeds, each generation run
by both rules with the same seed: mean tokens per target call for each tree and sibling rule at T = 1 and 0.6, and
their ratio with a 95% bootstrap interval over the generations (pairs kept). The trees: four small shapes, and
Sequoia's best tree of 16 drafts (analysis.best_tree) at the acceptance table a token-verified probe of the tree
[4, 2, 2, 1, 1, 1] measured on the same prompts; beside the token rule's figure where siblings are drawn without
replacement, its prediction at that table (analysis.tree_expected_tokens, positional acceptance). Untimed: tokens per call do not depend on the machine's load.
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


def per_call(target, draft, prompts, tree, siblings, temperature, rule, args) -> np.ndarray:
    """Tokens per target call of each generation (prompt-major, --seeds seeds each)."""
    decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings, temperature=temperature,
                                           verification=rule)
    return np.array([decoder.generate(p, max_new_tokens=args.tokens, seed=100 + i * 7 + s).stats.tokens_per_target_call
                     for i, p in enumerate(prompts) for s in range(args.seeds)])


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft, held_out = models(args.pair, args.draft)
    prompts = [demo_pair.encode(text) for text in DEMO_PROMPTS] if args.pair == "demo" else held_out(args.prompts)
    print("| T | tree | siblings | token (predicted) | traversal | traversal / token (95% interval) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for temperature in (1.0, 0.6):
        table = probe_table(target, draft, prompts, temperature, args)
        best = analysis.best_tree(BUDGET, table).tree
        for tree, siblings in TREES + [(best, "without_replacement")]:
            token, block = (per_call(target, draft, prompts, tree, siblings, temperature, rule, args)
                            for rule in ("token", "block"))
            picks = rng.integers(0, len(token), (2000, len(token)))  # the generations resampled, pairs kept
            low, high = np.percentile(block[picks].mean(1) / token[picks].mean(1), [2.5, 97.5])
            name = tree if tree is not best else f"best of {BUDGET}: parents {tree}"
            predicted = f" ({analysis.tree_expected_tokens(tree, below(table, tree)):.3f})" \
                if siblings == "without_replacement" else ""  # the probe's table is of that rule's ranks
            print(f"| {temperature} | {name} | {siblings} | {token.mean():.3f}{predicted} | {block.mean():.3f} | "
                  f"{block.mean() / token.mean():.3f} ({low:.3f}-{high:.3f}) |", flush=True)


if __name__ == "__main__":
    main()
