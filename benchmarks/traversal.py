"""Traversal against token verification of the same trees (verification="block" on a tree, cpp/math/tree.h).

    python benchmarks/traversal.py [--pair demo|gpt2] [--prompts 8] [--tokens 96] [--seeds 4] [--threads 1]

The demo pair (shipped, nothing trained; its 8 prompts) or the trained GPT-2 pair (train_pairs.py; --prompts of
its held-out prompts), each prompt times --seeds seeds, each generation run by both rules with the same seed: mean
tokens per target call for each tree and sibling rule at T = 1 and 0.6, and their ratio with a 95% bootstrap
interval over the generations (pairs kept). Untimed: tokens per call do not depend on the machine's load.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import speculant
from speculant import demo_pair

sys.path.insert(0, str(Path(__file__).parent))
from trees import pair_paths  # noqa: E402  (benchmarks/trees.py, beside this script)

DEMO_PROMPTS = ["def __init__(self", "import os\n", "    return ", "class Foo(", "for i in range(", "if __name__ ==",
                "    def run(self,", "# The "]
TREES = [([2, 2], "without_replacement"), ([2, 2], "top"), ([3, 1, 1], "without_replacement"),
         ([1, 1, 1, 1], "with_replacement")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts of the GPT-2 pair")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target_path, draft_path, held_out = pair_paths(args.pair)
    target, draft = speculant.load(target_path), speculant.load(draft_path)
    prompts = [demo_pair.encode(text) for text in DEMO_PROMPTS] if args.pair == "demo" else held_out(args.prompts)
    print("| T | tree | siblings | token | traversal | traversal / token (95% interval) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for temperature in (1.0, 0.6):
        for tree, siblings in TREES:
            per_call = {}
            for rule in ("token", "block"):
                decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings,
                                                       temperature=temperature, verification=rule)
                per_call[rule] = np.array([
                    decoder.generate(p, max_new_tokens=args.tokens, seed=100 + i * 7 + s).stats.tokens_per_target_call
                    for i, p in enumerate(prompts) for s in range(args.seeds)])
            token, block = per_call["token"], per_call["block"]
            picks = rng.integers(0, len(token), (2000, len(token)))  # the generations resampled, pairs kept
            low, high = np.percentile(block[picks].mean(1) / token[picks].mean(1), [2.5, 97.5])
            print(f"| {temperature} | {tree} | {siblings} | {token.mean():.3f} | {block.mean():.3f} | "
                  f"{block.mean() / token.mean():.3f} ({low:.3f}-{high:.3f}) |", flush=True)


if __name__ == "__main__":
    main()
