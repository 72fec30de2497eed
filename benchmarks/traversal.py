"""Traversal against token verification of the same trees (verification="block" on a tree, cpp/math/tree.h).

    python benchmarks/traversal.py [--tokens 96] [--seeds 4] [--threads 1]

The demo pair (shipped, nothing trained), the demo's 8 prompts times --seeds seeds, each generation run by both
rules with the same seed: mean tokens per target call for each tree and sibling rule at T = 1 and 0.6, and their
ratio. Untimed: tokens per call do not depend on the machine's load.
"""

import argparse
import statistics

import torch

import speculant
from speculant import demo_pair

PROMPTS = ["def __init__(self", "import os\n", "    return ", "class Foo(", "for i in range(", "if __name__ ==",
           "    def run(self,", "# The "]
TREES = [([2, 2], "without_replacement"), ([2, 2], "top"), ([3, 1, 1], "without_replacement"),
         ([1, 1, 1, 1], "with_replacement")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target_path, draft_path = demo_pair.default_pair()
    target, draft = speculant.load(target_path), speculant.load(draft_path)
    prompts = [demo_pair.encode(text) for text in PROMPTS]
    print("| T | tree | siblings | token | traversal | traversal / token |")
    print("|---|---|---|---|---|---|")
    for temperature in (1.0, 0.6):
        for tree, siblings in TREES:
            per_call = {}
            for rule in ("token", "block"):
                decoder = speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings,
                                                       temperature=temperature, verification=rule)
                per_call[rule] = statistics.mean(
                    decoder.generate(p, max_new_tokens=args.tokens, seed=100 + i * 7 + s).stats.tokens_per_target_call
                    for i, p in enumerate(prompts) for s in range(args.seeds))
            print(f"| {temperature} | {tree} | {siblings} | {per_call['token']:.3f} | {per_call['block']:.3f} | "
                  f"{per_call['block'] / per_call['token']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
