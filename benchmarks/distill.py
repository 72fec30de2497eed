"""A pair's draft distilled for α by speculant.distill, before against after, next to Theorem 3.8.

    python benchmarks/distill.py [--steps 600] [--lr 3e-4] [--batch 16] [--threads 2] [--tokens 64] [--prompts 8]
                                 [--repeats 3]
    python benchmarks/distill.py --pair gpt2 --steps 300    # the GPT-2 pair (benchmarks/train_pairs.py --stage gpt2)

--pair demo (the default) is described below; --pair gpt2 runs the same three parts on the trained GPT-2 pair
(train_pairs.GPT2_CPU: 12.3M target, 0.76M draft, a 4096-token BPE): the draft's save_pretrained directory
distilled against the exported target, prompts of 32 tokens cut from the training modules' token stream, α held
out on 24 held-out windows (train_pairs.heldout_prompts), the distilled draft exported with speculant.export
for the sweep (as the original draft is), and from random init a GPT-2 draft of the same shape distilled against
one trained the ordinary way (train_pairs.train: next-token cross-entropy) for --steps steps.

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

Writes benchmarks/results/distill-<pair>-cpu.json.
"""
import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

import speculant
from speculant import demo_pair, distillation, tiny_gpt

sys.path.insert(0, str(Path(__file__).parent))
from drafters import demo_prompts  # noqa: E402  (benchmarks/drafters.py, beside this script)
import train_pairs  # noqa: E402

PROMPT_LENGTH = 48  # training, held-out and decoding prompts alike (the demo pair's bytes)
GPT2_PROMPT_LENGTH = 32  # the GPT-2 pair's tokens, as benchmarks/assisted.py's prompts


def windows(stream: torch.Tensor, count: int, length: int, seed: int) -> list:
    starts = torch.randint(0, stream.numel() - length, (count,), generator=torch.Generator().manual_seed(seed))
    return [stream[s:s + length].tolist() for s in starts.tolist()]


def training_prompts(count: int, seed: int) -> list:
    train, _, _ = demo_pair.load_corpus()
    return windows(train, count, PROMPT_LENGTH, seed)


@dataclasses.dataclass
class Setup:
    """What the three parts need from a pair."""
    target: str  # the exported target
    draft: object  # the draft distill trains (a module or a save_pretrained directory)
    draft_file: str  # the draft as the sweep runs it before distillation
    heldout: list
    prompts: list  # training prompts
    decode_prompts: list
    save: str  # where distill writes the distilled draft
    random_draft: object  # a randomly initialised draft of the same shape
    ordinary: object  # () -> a draft of that shape trained the ordinary way for --steps steps


def demo_setup(args, out_dir: Path) -> Setup:
    target_path, draft_path = demo_pair.default_pair()
    info = json.loads((Path(target_path).parent / "pair.json").read_text())
    config = tiny_gpt.TinyGPTConfig(**info["recipe"]["draft"])
    train_tokens, _, _ = demo_pair.load_corpus()
    torch.manual_seed(5)
    return Setup(str(target_path), tiny_gpt.unscript(draft_path, config), str(draft_path),
                 demo_prompts(24, PROMPT_LENGTH), training_prompts(512, seed=0),
                 demo_prompts(args.prompts, PROMPT_LENGTH), str(out_dir / "distilled-draft.pt"),
                 tiny_gpt.TinyGPT(config),
                 lambda: demo_pair.train(config, train_tokens, demo_pair.TrainConfig(
                     steps=args.steps, batch_size=8, lr=3e-3, seed=5), progress=False))


def gpt2_setup(args, out_dir: Path) -> Setup:
    recipe = train_pairs.GPT2_CPU
    pair = train_pairs.pair_dir(recipe)
    if not (pair / "pair.json").exists():
        raise SystemExit(f"{pair}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage gpt2)")
    train_texts, _, _ = train_pairs.load_corpus(recipe)
    stream = train_pairs.stream(train_pairs.load_tokenizer(pair / "tokenizer.json"), train_texts)

    def held(count: int) -> list:
        return [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, pair, count, GPT2_PROMPT_LENGTH)]

    def ordinary():
        short = dataclasses.replace(recipe, draft_train=dataclasses.replace(recipe.draft_train, steps=args.steps))
        return train_pairs.train(short, "draft", stream, torch.device("cpu"), progress=False)

    return Setup(str(pair / "target.pt"), str(pair / "draft"), str(pair / "draft.pt"), held(24),
                 windows(stream, 512, GPT2_PROMPT_LENGTH, seed=0), held(args.prompts),
                 str(out_dir / "distilled-draft-gpt2"), train_pairs.make_model(recipe, "draft", seed=5), ordinary)


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
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/distill-<pair>-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out or Path(__file__).parent / "results" / f"distill-{args.pair}-cpu.json")
    out_dir = out.parent
    setup = (gpt2_setup if args.pair == "gpt2" else demo_setup)(args, out_dir)

    # distill's held-out α: the target's continuations of --tokens, the positions the sweep below decodes
    options = dict(heldout=setup.heldout, new_tokens=args.tokens, batch_size=args.batch, lr=args.lr,
                   temperature=1.0, loss="tv", data="draft")
    result = speculant.distill(setup.target, setup.draft, setup.prompts, steps=args.steps, save=setup.save,
                               **options)
    print(f"{args.pair} draft distilled {args.steps} steps in {result.seconds:.0f} s: held-out alpha (T = 1) "
          f"{result.alpha_before} -> {result.alpha_after}")
    distilled_file = setup.save
    if Path(setup.save).is_dir():  # a transformers draft: the sweep runs it exported, as the original
        distilled_file = setup.save + ".pt"
        speculant.export(setup.save, distilled_file)

    rows = {"before": sweep_rows(setup.target, setup.draft_file, setup.decode_prompts, args),
            "after": sweep_rows(setup.target, distilled_file, setup.decode_prompts, args)}
    print(f"{'draft':7} {'gamma':>5} {'T':>4} {'alpha':>6} {'tok/call':>8} {'pred':>6} {'c':>5} "
          f"{'speedup [min-max]':>20} {'Thm 3.8':>7}")
    for which, records in rows.items():
        for r in records:
            print(f"{which:7} {r['gamma']:5d} {r['temperature']:4.1f} {r['alpha']:6.3f} "
                  f"{r['tokens_per_target_call']:8.2f} {r['expected_tokens']:6.2f} {r['c']:5.3f} "
                  f"{r['speedup']:6.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}] "
                  f"{r['predicted_speedup']:6.2f}x {r['flag']}")

    # A random draft distilled against one trained the ordinary way for the same number of steps.
    began = time.perf_counter()
    ordinary = setup.ordinary()
    ordinary_seconds = time.perf_counter() - began
    scratch = speculant.distill(setup.target, setup.random_draft, setup.prompts, steps=args.steps,
                                **{**options, "lr": 3e-3})
    ordinary_alpha = distillation.heldout_alpha(setup.target, ordinary, setup.heldout, new_tokens=args.tokens)
    print(f"from random init, {args.steps} steps: distilled alpha {scratch.alpha_before} -> {scratch.alpha_after} "
          f"({scratch.seconds:.0f} s); ordinary training {ordinary_alpha} ({ordinary_seconds:.0f} s)")

    record = {
        "machine": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
                   f"{args.threads} threads",
        "args": vars(args), "pair": str(Path(setup.target).parent),
        "distill": {"alpha_before": vars(result.alpha_before), "alpha_after": vars(result.alpha_after),
                    "seconds": result.seconds, "first_losses": result.losses[:10], "last_losses": result.losses[-10:]},
        "sweeps": rows,
        "from_scratch": {"distilled_before": vars(scratch.alpha_before), "distilled_after": vars(scratch.alpha_after),
                         "distilled_seconds": scratch.seconds, "ordinary": vars(ordinary_alpha),
                         "ordinary_seconds": ordinary_seconds},
    }
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    for path in {setup.save, distilled_file}:
        shutil.rmtree(path) if Path(path).is_dir() else Path(path).unlink()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
