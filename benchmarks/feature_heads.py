"""EAGLE and Medusa heads against the pair's own draft model, on one trained target.

    python benchmarks/feature_heads.py [--prompts 8] [--tokens 64] [--repeats 3] [--threads 2] [--steps N]
                                       [--drafts draft eagle medusa eagle3] [--target live|export]
                                       [--cuda-graphs off fixed]

The pair: train_pairs.LLAMA_CPU (a 6-layer d=256 Llama target and a 1-layer d=128 Llama draft, both trained on the
stdlib), because its target is the one the early-exit benchmark (feature_drafts.py) runs on and its draft has more
parameters than a one-layer head of the target's width (the GPT-2 CPU pair's 0.76M draft is smaller than such a
head at d=384). Every model runs live (transformers objects through speculant.load), or with --target export as
TorchScript files this speculant.export writes (to a temporary directory): the heads, trained on the live
target, are loaded onto the exported one, which keeps its features per cache slot (docs/feature-drafts.md).

1. The heads (cached beside the pair, heads/<kind>-<steps>/ with training.json): an EagleDraft (EAGLE-1/2,
   intermediate size = the hidden size), a MedusaDraft of 4 heads and, with --drafts eagle3, an EAGLE-3
   EagleDraft over layers 1, 3 and 5. Each is trained by speculant.distill with the draft's own budget: the
   recipe's draft_train steps and batch size, windows of the recipe's context from the same training stream,
   forward KL at T = 1. α before and after on held-out prompts (the first draft position's, as distill reports).
2. Decoding, at T = 0 and T = 1, chains of gamma 4 and a DynamicTree of 16 nodes per iteration, for each of
   --drafts (default: the draft model, the EAGLE head, the Medusa heads): tokens per target call, α, c (the
   draft's seconds per call over the target's in plain decoding, both measured by the engine), and the speedup
   over plain decoding with the two run side by side in each round (median and range over --repeats rounds
   after an untimed one), with Theorem 3.8's prediction at that α and the median c beside each chain. With
   several --cuda-graphs modes (the speculative decoder's; plain decoding stays dynamic) each draft runs in each,
   side by side: "fixed" runs the heads' decoding calls through their fixed-shape buffers (feature_draft.py),
   and with --target export the target's calls too.

Writes benchmarks/results/feature-heads-cpu.json (--out).
"""
import argparse
import json
import platform
import shutil
import statistics
import tempfile
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


HEADS = {  # kind -> (its row's name, how it is built on a target of hidden size h and L layers)
    "eagle": ("EagleDraft", lambda target, h, L: speculant.EagleDraft(target, intermediate_size=h, seed=50)),
    "eagle3": ("EagleDraft (EAGLE-3)", lambda target, h, L: speculant.EagleDraft(  # low, middle, high: 1, 3, 5 of 6
        target, feature_layers=tuple(sorted({1 % L, L // 2, L - 1})), intermediate_size=h, seed=52)),
    "medusa": ("MedusaDraft", lambda target, h, L: speculant.MedusaDraft(target, heads=4)),
}


def trained_head(kind: str, target, recipe, root: Path, steps: int, smoke: bool) -> tuple:
    """The distilled head of `kind` (trained once, then loaded from heads/<kind>-<steps>/) and its training
    record (training.json there)."""
    directory = root / "heads" / f"{kind}-{steps}"
    cls = speculant.MedusaDraft if kind == "medusa" else speculant.EagleDraft
    if (directory / "training.json").exists():
        return cls.load(directory, target), json.loads((directory / "training.json").read_text())
    train_texts, _, _ = train_pairs.load_corpus(recipe)
    corpus = train_pairs.stream(train_pairs.load_tokenizer(root / "tokenizer.json"), train_texts)
    held = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, 8)]
    config = target.module.config
    draft = HEADS[kind][1](target, config.hidden_size, config.num_hidden_layers)
    schedule = recipe.draft_train
    result = speculant.distill(target, draft, data="corpus", corpus=corpus, heldout=held, steps=steps,
                               batch_size=schedule.batch_size, window=recipe.context, lr=schedule.lr,
                               temperature=1.0, loss="forward_kl", seed=51, progress=not smoke, save=directory)
    record = {"steps": steps, "batch_size": schedule.batch_size, "window": recipe.context, "temperature": 1.0,
              "loss": "forward_kl", "lr": schedule.lr, "parameters": draft.parameters(), "config": draft.config,
              "alpha_before": result.alpha_before.mean, "alpha_before_sem": result.alpha_before.sem,
              "alpha_after": result.alpha_after.mean, "alpha_after_sem": result.alpha_after.sem,
              "train_seconds": result.seconds, "final_loss": result.losses[-1]}
    (directory / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{kind}: {draft.parameters():,} parameters, alpha {result.alpha_before} -> {result.alpha_after} in "
          f"{result.seconds:.0f} s")
    return result.draft, record


def exported(module, directory: str, name: str) -> speculant.Model:
    """`module` exported by this version of speculant.export to `directory`/`name` and loaded."""
    path = Path(directory) / name
    speculant.export(module, path)
    return speculant.load(path)


def decoding_table(target, drafts: dict, prompts, eos, tokens: int, repeats: int, modes=("off",)) -> list:
    """Per draft, cuda_graphs mode, temperature and shape: tokens per target call, α, c and the speedup over plain
    decoding (median and range over `repeats` rounds after an untimed one), Theorem 3.8 beside each chain."""
    rows = []
    for (name, draft), mode in ((item, mode) for item in drafts.items() for mode in modes):
        for temperature in (0.0, 1.0):
            for shape, options in SHAPES.items():
                decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, cuda_graphs=mode,
                                                       **options)
                speedups, costs, stats = rounds.against_plain(target, decoder, prompts, eos, tokens, repeats)
                new = sum(s.new_tokens for s in stats)
                alpha = statistics.mean(s.alpha for s in stats)
                c = statistics.median(costs)
                row = {"draft": name, "cuda_graphs": mode, "temperature": temperature, "shape": shape, "alpha": alpha,
                       "tokens_per_target_call": new / sum(s.target_calls for s in stats), "c": c,
                       "c_min": min(costs), "c_max": max(costs), "measured_speedup": statistics.median(speedups),
                       "speedup_min": min(speedups), "speedup_max": max(speedups),
                       "predicted_speedup": (float(analysis.walltime_improvement(alpha, 4, c))
                                             if "gamma" in options else None)}
                rows.append(row)
                predicted = row["predicted_speedup"]
                print(f"{name:14} {mode:5} T={temperature} {shape:14} alpha {alpha:.3f}, "
                      f"{row['tokens_per_target_call']:.2f} tokens/target call, c {c:.3f}, speedup "
                      f"{row['measured_speedup']:.2f}x [{min(speedups):.2f}-{max(speedups):.2f}]"
                      + (f" (Theorem 3.8: {predicted:.2f}x)" if predicted is not None else ""))
    return rows


def main(argv=None, smoke: bool = False, cache=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rounds.common_arguments(parser, str(Path(__file__).parent / "results" / "feature-heads-cpu.json"))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the draft's)")
    parser.add_argument("--drafts", nargs="+", choices=["draft", *HEADS], default=["draft", "eagle", "medusa"],
                        help="the drafts to measure: the pair's draft model and heads of these kinds")
    parser.add_argument("--target", choices=["live", "export"], default="live",
                        help="run the target and the draft model live or as TorchScript exports")
    parser.add_argument("--cuda-graphs", nargs="+", choices=["off", "fixed"], default=["off"],
                        help="the speculative decoder's modes, side by side (fixed: needs --target export)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_module, draft_module, recipe, root = pair(smoke, cache)
    live = speculant.load(target_module)
    files = tempfile.mkdtemp(prefix="feature-heads-")
    target = exported(target_module, files, "target.pt") if args.target == "export" else live
    steps = args.steps or recipe.draft_train.steps
    drafts, training = {}, {}
    for kind in args.drafts:
        if kind == "draft":
            drafts["draft model"] = (exported(draft_module, files, "draft.pt") if args.target == "export"
                                     else speculant.load(draft_module))
            continue
        head, training[kind] = trained_head(kind, live, recipe, root, steps, smoke)
        drafts[HEADS[kind][0]] = head if target is live else type(head).load(root / "heads" / f"{kind}-{steps}",
                                                                             target)
    eos = target_module.config.eos_token_id
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, args.prompts)]
    if "fixed" in args.cuda_graphs and args.target != "export":
        parser.error("--cuda-graphs fixed needs --target export: a live target has no fixed-shape calls")
    rows = decoding_table(target, drafts, prompts, eos, args.tokens, args.repeats, args.cuda_graphs)
    record = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "target_form": args.target, "torch": torch.__version__,
              "target": json.loads((root / "target.json").read_text()),
              "draft": json.loads((root / "draft.json").read_text()), "training": training,
              "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(files)
    return record


if __name__ == "__main__":
    main()
