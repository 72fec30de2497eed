"""Token against block verification of the same chains (SpeculativeDecoder's verification=, cpp/math/tree.h).

    python benchmarks/verification.py [--pair demo|gpt2] [--draft model|eagle] [--gammas 2 4 8]
                                      [--temperatures 0.6 1] [--prompts 8] [--paired 64] [--tokens 128]
                                      [--repeats 3] [--threads 1]

The pair's draft model or (--draft eagle, GPT-2 only) the EAGLE head distilled on its target
(feature_heads.gpt2_eagle; the target runs live). One speculant.sweep over the pair's held-out prompts with
verifications=["token", "block"], so that both rules run every setting with the same seeds, side by side in one
run: each row's tokens per target call, Equation (1)'s expected tokens at its measured alpha (the token rule's
theory), and the measured speedup over plain decoding (warm-up, then --repeats rounds interleaved ABBA; median with
min-max). Then, per setting, block's tokens per call over token's. Then the same ratio over --paired prompts
(untimed; each prompt run by both rules with the same seed), with a 95% bootstrap interval over the prompts: the
spread of the ratio that the prompts' own difficulty gives; beside it, each rule's 1 + drafts kept per iteration
against its expectation on the drafts it verified (Stats.token_expected_tokens / block_expected_tokens: the coins
integrated out). The frame goes to results/verification-<pair>[-eagle]-cpu.csv.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import speculant

sys.path.insert(0, str(Path(__file__).parent))
from traversal import models  # noqa: E402  (benchmarks/traversal.py, beside this script)

SHOWN = ["gamma", "temperature", "verification", "tokens_per_target_call", "token_expected_tokens",
         "block_expected_tokens", "expected_tokens", "alpha", "speedup", "speedup_min", "speedup_max", "flag"]


def paired(target, draft, prompts, gammas, temperatures, tokens: int) -> list:
    """Per setting: block's tokens per target call over token's, summed over the prompts, its 95% bootstrap
    interval (prompts resampled, 2,000 times, seed 0), and for each rule its measured tokens per target call
    beside its expectation on the drafts it verified (speculant.timing.rule_expectations)."""
    rows = []
    for temperature in temperatures:
        for gamma in gammas:
            counts, beside = {}, {}
            for rule in ("token", "block"):
                decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature,
                                                       verification=rule)
                results = [decoder.generate(p, max_new_tokens=tokens, seed=i) for i, p in enumerate(prompts)]
                counts[rule] = np.array([[len(r.tokens), r.stats.target_calls] for r in results], float)
                expected = speculant.timing.rule_expectations(results)[f"{rule}_expected_tokens"]
                kept = sum(r.stats.accepted_tokens for r in results)
                beside[rule] = (1 + kept / sum(r.stats.predicted_iterations for r in results), expected)
            ratio = lambda pick: (counts["block"][pick, 0].sum() / counts["block"][pick, 1].sum()) / \
                (counts["token"][pick, 0].sum() / counts["token"][pick, 1].sum())  # noqa: E731
            rng = np.random.default_rng(0)
            spread = [ratio(rng.integers(0, len(prompts), len(prompts))) for _ in range(2000)]
            rows.append((temperature, gamma, ratio(slice(None)), *np.percentile(spread, [2.5, 97.5]), beside))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--draft", choices=["model", "eagle"], default="model")
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 1.0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts of the timed sweep (0: none)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paired", type=int, default=64, help="prompts of the paired ratio (0: none)")
    parser.add_argument("--csv", type=Path, default=None, help="default: results/verification-<pair>[-eagle]-cpu.csv")
    args = parser.parse_args(argv)
    target, draft, prompts = models(args.pair, args.draft)
    if args.prompts:
        timed(args, target, draft, prompts)
    if args.paired:
        torch.set_num_threads(args.threads)
        print(f"\nblock / token, tokens per target call over {args.paired} prompts x {args.tokens} tokens, "
              "each prompt by both rules with the same seed (95% bootstrap interval over the prompts):")
        print("  and each rule's 1 + drafts kept per iteration, measured / expected on its drafts (Stats)")
        for temperature, gamma, ratio, low, high, beside in paired(target, draft, prompts(args.paired),
                                                                   args.gammas, args.temperatures, args.tokens):
            rules = "  ".join(f"{rule} {m:.3f} / {e:.3f} ({m / e - 1:+.1%})" for rule, (m, e) in beside.items())
            print(f"  T {temperature}  gamma {gamma}:  {ratio:.3f}  ({low:.3f} - {high:.3f})   {rules}")


def timed(args, target, draft, prompts) -> None:
    """The sweep of both rules over --prompts prompts, printed and written to the csv."""
    frame = speculant.sweep(target, draft, prompts(args.prompts),
                            gammas=args.gammas, temperatures=args.temperatures, verifications=["token", "block"],
                            max_new_tokens=args.tokens, repeats=args.repeats, threads=args.threads, progress=False)
    print(f"{args.pair} pair, {args.draft} draft, torch {torch.__version__}, {args.prompts} prompts x "
          f"{args.tokens} tokens, {args.repeats} rounds, {args.threads} thread(s)")
    print(frame[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    wide = frame.pivot_table(index=["temperature", "gamma"], columns="verification",
                             values="tokens_per_target_call")
    wide["block / token"] = wide["block"] / wide["token"]
    print("\ntokens per target call, block over token:")
    print(wide.to_string(float_format=lambda v: f"{v:.3f}"))
    out = args.csv or Path(__file__).parent / "results" / \
        f"verification-{args.pair}{'-eagle' if args.draft == 'eagle' else ''}-cpu.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
