"""EAGLE and Medusa heads against the pair's own draft model, on one trained target.

    python benchmarks/feature_heads.py [--prompts 8] [--tokens 64] [--repeats 3] [--threads 2] [--steps N]

The pair: train_pairs.LLAMA_CPU (a 6-layer d=256 Llama target and a 1-layer d=128 Llama draft, both trained on the
stdlib), because its target is the one the early-exit benchmark (feature_drafts.py) runs on and its draft has more
parameters than a one-layer head of the target's width (the GPT-2 CPU pair's 0.76M draft is smaller than such a
head at d=384). Every model runs live (transformers objects through speculant.load).

1. The heads (cached beside the pair, heads/eagle and heads/medusa, with heads.json): an EagleDraft (EAGLE-1/2,
   intermediate size = the hidden size) and a MedusaDraft of 4 heads, each trained by speculant.distill with the
   draft's own budget: the recipe's draft_train steps and batch size, windows of the recipe's context from the same
   training stream, forward KL at T = 1. α before and after on held-out prompts (the first draft position's, as
   distill reports it).
2. Decoding, at T = 0 and T = 1, chains of gamma 4 and a DynamicTree of 16 nodes per iteration: for the draft model,
   the EAGLE head and the Medusa heads, tokens per target call, α, c (the draft's seconds per call over the
   target's in plain decoding, both measured by the engine), and the speedup over plain decoding with the two run
   side by side in each round (median and range over --repeats rounds after an untimed one), with Theorem 3.8's
   prediction at that α and the median c beside each chain.

Writes benchmarks/results/feature-heads-cpu.json.
"""
import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

import rounds
import speculant
import train_pairs
from speculant import analysis

SHAPES = {"chain gamma=4": {"gamma": 4}, "tree of 16": {"tree": speculant.DynamicTree(budget=16, depth=6)}}


def pair(smoke: bool, cache=None):
    """The trained target and draft (live, eval mode), the recipe and its directory."""
    import transformers

    recipe = train_pairs.LLAMA_CPU.smoke() if smoke else train_pairs.LLAMA_CPU
    root = train_pairs.build(recipe, stages=("target", "draft"), cache=cache, progress=not smoke)
    load = transformers.AutoModelForCausalLM.from_pretrained
    return load(root / "target").eval(), load(root / "draft").eval(), recipe, root


def trained_heads(target, recipe, root: Path, steps: int, smoke: bool) -> tuple:
    """The distilled EagleDraft and MedusaDraft (trained once, then loaded from heads/) and heads.json's record."""
    directory = root / "heads"
    record_path = directory / f"heads-{steps}.json"
    kinds = {"eagle": speculant.EagleDraft, "medusa": speculant.MedusaDraft}
    if record_path.exists():
        record = json.loads(record_path.read_text())
        return {k: cls.load(directory / f"{k}-{steps}", target) for k, cls in kinds.items()}, record
    train_texts, _, _ = train_pairs.load_corpus(recipe)
    corpus = train_pairs.stream(train_pairs.load_tokenizer(root / "tokenizer.json"), train_texts)
    held = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, 8)]
    hidden = target.module.config.hidden_size
    fresh = {"eagle": speculant.EagleDraft(target, intermediate_size=hidden, seed=50),
             "medusa": speculant.MedusaDraft(target, heads=4)}
    schedule = recipe.draft_train
    drafts, record = {}, {"steps": steps, "batch_size": schedule.batch_size, "window": recipe.context,
                          "temperature": 1.0, "loss": "forward_kl"}
    for kind, draft in fresh.items():
        result = speculant.distill(target, draft, data="corpus", corpus=corpus, heldout=held, steps=steps,
                                   batch_size=schedule.batch_size, window=recipe.context, lr=schedule.lr,
                                   temperature=1.0, loss="forward_kl", seed=51, progress=not smoke,
                                   save=directory / f"{kind}-{steps}")
        drafts[kind] = result.draft
        record[kind] = {"parameters": draft.parameters(), "alpha_before": result.alpha_before.mean,
                        "alpha_before_sem": result.alpha_before.sem, "alpha_after": result.alpha_after.mean,
                        "alpha_after_sem": result.alpha_after.sem, "train_seconds": result.seconds,
                        "final_loss": result.losses[-1]}
        print(f"{kind}: {draft.parameters():,} parameters, alpha {result.alpha_before} -> {result.alpha_after} "
              f"in {result.seconds:.0f} s")
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return drafts, record


def decoding_table(target, drafts: dict, prompts, eos, tokens: int, repeats: int) -> list:
    """Per draft, temperature and shape: tokens per target call, α, c and the speedup over plain decoding (median
    and range over `repeats` rounds after an untimed one), Theorem 3.8 beside each chain."""
    rows = []
    for name, draft in drafts.items():
        for temperature in (0.0, 1.0):
            for shape, options in SHAPES.items():
                decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, **options)
                speedups, costs, stats = rounds.against_plain(target, decoder, prompts, eos, tokens, repeats)
                new = sum(s.new_tokens for s in stats)
                alpha = statistics.mean(s.alpha for s in stats)
                c = statistics.median(costs)
                row = {"draft": name, "temperature": temperature, "shape": shape, "alpha": alpha,
                       "tokens_per_target_call": new / sum(s.target_calls for s in stats), "c": c,
                       "c_min": min(costs), "c_max": max(costs), "measured_speedup": statistics.median(speedups),
                       "speedup_min": min(speedups), "speedup_max": max(speedups),
                       "predicted_speedup": (float(analysis.walltime_improvement(alpha, 4, c))
                                             if "gamma" in options else None)}
                rows.append(row)
                predicted = row["predicted_speedup"]
                print(f"{name:14} T={temperature} {shape:14} alpha {alpha:.3f}, "
                      f"{row['tokens_per_target_call']:.2f} tokens/target call, c {c:.3f}, speedup "
                      f"{row['measured_speedup']:.2f}x [{min(speedups):.2f}-{max(speedups):.2f}]"
                      + (f" (Theorem 3.8: {predicted:.2f}x)" if predicted is not None else ""))
    return rows


def main(argv=None, smoke: bool = False, cache=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rounds.common_arguments(parser, str(Path(__file__).parent / "results" / "feature-heads-cpu.json"))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the draft's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_module, draft_module, recipe, root = pair(smoke, cache)
    target = speculant.load(target_module)
    steps = args.steps or recipe.draft_train.steps
    heads, training = trained_heads(target, recipe, root, steps, smoke)
    eos = target_module.config.eos_token_id
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, args.prompts)]
    drafts = {"draft model": speculant.load(draft_module), "EagleDraft": heads["eagle"],
              "MedusaDraft": heads["medusa"]}
    rows = decoding_table(target, drafts, prompts, eos, args.tokens, args.repeats)
    record = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "target": json.loads((root / "target.json").read_text()),
              "draft": json.loads((root / "draft.json").read_text()), "training": training,
              "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
