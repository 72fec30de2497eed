"""The demo pair's draft distilled for α by speculant.distill, before against after, next to Theorem 3.8.

    python benchmarks/distill.py [--steps 600] [--lr 3e-4] [--batch 16] [--threads 2] [--tokens 64] [--prompts 8]
                                 [--repeats 3]

1. The demo pair (speculant.demo_pair: byte-level TinyGPTs trained on the standard library) is found or trained;
   its draft is taken back to its training form (tiny_gpt.unscript) and distilled against the target at T = 1
   with the tv loss on the draft's own samples (data="draft": DistillSpec's on-policy choice), prompts cut from
   the corpus's training split, each continued by --tokens bytes (the positions the decoder meets in step 2: a
   draft trained on shorter continuations only is not better at the later ones). The held-out α before and
   after is distill's (24 held-out windows of the corpus's held-out split, 48 bytes + --tokens).
2. Both drafts run in speculative decoding (speculant.sweep: gamma 2 and 4 at T = 1 and T = 0, held-out prompts,
   warm-up then --repeats interleaved rounds against plain decoding; median speedup with min-max), with α, tokens
   per target call and Theorem 3.8's prediction beside each.
3. The issue's second goal: a randomly initialised draft distilled for --steps steps against one trained the
   ordinary way (next-byte cross-entropy on the corpus, demo_pair.train) for the same number of steps, both
   measured with heldout_alpha on the same held-out continuations.

Writes benchmarks/results/distill-demo-cpu.json.
"""
import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

import speculant
from speculant import demo_pair, distillation, tiny_gpt

sys.path.insert(0, str(Path(__file__).parent))
from drafters import demo_prompts  # noqa: E402  (benchmarks/drafters.py, beside this script)

PROMPT_LENGTH = 48  # training, held-out and decoding prompts alike


def training_prompts(count: int, seed: int) -> list:
    train, _, _ = demo_pair.load_corpus()
    starts = torch.randint(0, train.numel() - PROMPT_LENGTH, (count,), generator=torch.Generator().manual_seed(seed))
    return [train[s:s + PROMPT_LENGTH].tolist() for s in starts.tolist()]


def sweep_rows(target, draft, prompts, args) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flags are kept in the rows
        frame = speculant.sweep(target, draft, prompts, gammas=[2, 4], temperatures=[1.0, 0.0],
                                max_new_tokens=args.tokens, repeats=args.repeats, progress=False)
    keep = ["gamma", "temperature", "alpha", "tokens_per_target_call", "expected_tokens", "c", "speedup",
            "speedup_min", "speedup_max", "predicted_speedup", "flag"]
    return frame[keep].to_dict("records")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "distill-demo-cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target_path, draft_path = demo_pair.default_pair()
    info = json.loads((Path(target_path).parent / "pair.json").read_text())
    config = tiny_gpt.TinyGPTConfig(**info["recipe"]["draft"])
    draft = tiny_gpt.unscript(draft_path, config)
    heldout = demo_prompts(24, PROMPT_LENGTH)  # distill's held-out α: the target's continuations of --tokens
    prompts = training_prompts(512, seed=0)
    options = dict(heldout=heldout, new_tokens=args.tokens, batch_size=args.batch, lr=args.lr, temperature=1.0,
                   loss="tv", data="draft")  # the positions the sweep below decodes: 48-byte prompts + --tokens
    out_dir = Path(args.out).parent
    distilled_path = str(out_dir / "distilled-draft.pt")
    result = speculant.distill(str(target_path), draft, prompts, steps=args.steps, save=distilled_path, **options)
    print(f"demo draft distilled {args.steps} steps in {result.seconds:.0f} s: held-out alpha (T = 1) "
          f"{result.alpha_before} -> {result.alpha_after}")

    decode_prompts = demo_prompts(args.prompts, PROMPT_LENGTH)
    rows = {"before": sweep_rows(str(target_path), str(draft_path), decode_prompts, args),
            "after": sweep_rows(str(target_path), distilled_path, decode_prompts, args)}
    print(f"{'draft':7} {'gamma':>5} {'T':>4} {'alpha':>6} {'tok/call':>8} {'pred':>6} {'c':>5} "
          f"{'speedup [min-max]':>20} {'Thm 3.8':>7}")
    for which, records in rows.items():
        for r in records:
            print(f"{which:7} {r['gamma']:5d} {r['temperature']:4.1f} {r['alpha']:6.3f} "
                  f"{r['tokens_per_target_call']:8.2f} {r['expected_tokens']:6.2f} {r['c']:5.3f} "
                  f"{r['speedup']:6.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}] "
                  f"{r['predicted_speedup']:6.2f}x {r['flag']}")

    # A random draft distilled against one trained the ordinary way for the same number of steps.
    train_tokens, _, _ = demo_pair.load_corpus()
    began = time.perf_counter()
    ordinary = demo_pair.train(config, train_tokens, demo_pair.TrainConfig(steps=args.steps, batch_size=8,
                                                                             lr=3e-3, seed=5), progress=False)
    ordinary_seconds = time.perf_counter() - began
    torch.manual_seed(5)
    scratch = speculant.distill(str(target_path), tiny_gpt.TinyGPT(config), prompts, steps=args.steps,
                                **{**options, "lr": 3e-3})
    ordinary_alpha = distillation.heldout_alpha(str(target_path), ordinary, heldout, new_tokens=args.tokens)
    print(f"from random init, {args.steps} steps: distilled alpha {scratch.alpha_before} -> {scratch.alpha_after} "
          f"({scratch.seconds:.0f} s); ordinary next-byte training {ordinary_alpha} ({ordinary_seconds:.0f} s)")

    record = {
        "machine": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
                   f"{args.threads} threads",
        "args": vars(args), "pair": str(Path(target_path).parent),
        "distill": {"alpha_before": vars(result.alpha_before), "alpha_after": vars(result.alpha_after),
                    "seconds": result.seconds, "first_losses": result.losses[:10], "last_losses": result.losses[-10:]},
        "sweeps": rows,
        "from_scratch": {"distilled_before": vars(scratch.alpha_before), "distilled_after": vars(scratch.alpha_after),
                         "distilled_seconds": scratch.seconds, "ordinary": vars(ordinary_alpha),
                         "ordinary_seconds": ordinary_seconds},
    }
    Path(args.out).write_text(json.dumps(record, indent=1, default=str) + "\n")
    Path(distilled_path).unlink()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
