"""EAGLE and Medusa heads and early exit against the pair's own draft model, on one trained target.

    python benchmarks/feature_heads.py [--prompts 8] [--tokens 64] [--repeats 3] [--threads 2] [--steps N]
                                       [--drafts draft eagle medusa early-exit eagle3] [--exit-layer l]
                                       [--target live|export]
                                       [--cuda-graphs off fixed auto] [--pair llama-cpu|gpt2-lease]
                                       [--device cpu|cuda] [--compile] [--no-best-tree]

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
   --drafts (default: the draft model, the EAGLE head, the Medusa heads and, on the live target, an
   EarlyExitDraft at --exit-layer, default L // 2, sharing the cache of a target handle of its own (plain
   decoding runs on an unshared one) and with a cache of its own; an export's layers cannot be cut, so early
   exit needs the live target): tokens per target call, α, c (the
   draft's seconds per call over the target's in plain decoding, both measured by the engine), and the speedup
   over plain decoding with the two run side by side in each round (median and range over --repeats rounds
   after an untimed one), with Theorem 3.8's prediction at that α and the median c beside each chain. With
   several --cuda-graphs modes each draft runs in each, side by side, plain decoding beside it in the same mode:
   "fixed" (which needs --target export) runs the heads' decoding calls through their fixed-shape buffers
   (feature_draft.py) and the exported models' calls with fixed shapes; "auto" captures them on CUDA. With
   --compile each head runs beside itself compiled (compile=True: its steps through torch.compile). After each
   grown tree, "best tree of 16": Sequoia's tree of 16 drafts (analysis.best_tree) at the acceptance table by
   depth and rank that the grown tree measured (timing.tree_table), static, with the theory's expected tokens
   per target call beside it (--no-best-tree skips it).
3. Each head's faster tree (grown or Sequoia's) against the draft model: its tokens per second over the draft
   model's best (chain or either tree) at the same temperature and mode. Issue 50's GPU goal: an EAGLE tree >= 1.5x, on the GPT-2 pair of a GPU
   lease (--pair gpt2-lease --device cuda --target export --cuda-graphs auto: benchmarks/gpu.sh heads trains it
   there, 92M / 3.8M, 1,000 steps each, and the head with the draft's budget).

Writes benchmarks/results/feature-heads-cpu.json (--out).
"""
import argparse
import collections
import contextlib
import json
import platform
import shutil
import statistics
import tempfile
import types
from pathlib import Path

import torch

import rounds
import speculant
import train_pairs
from speculant import analysis, timing

BUDGET, GROWN, BEST = 16, "tree of 16", "best tree of 16"
SHAPES = {"chain gamma=4": {"gamma": 4}, GROWN: {"tree": speculant.DynamicTree(budget=BUDGET, depth=6)}}


PAIRS = {"llama-cpu": train_pairs.LLAMA_CPU, "gpt2-lease": train_pairs.PRESETS["lease"]["gpt2"]}


def pair(smoke: bool, cache=None, name: str = "llama-cpu", device: str = "cpu"):
    """The trained target and draft (live, eval mode, on the CPU), the recipe and its directory; trained on
    `device` (TF32 matrix products there on CUDA, as train_pairs.py trains)."""
    import transformers

    recipe = PAIRS[name].smoke() if smoke else PAIRS[name]
    with tf32(device):
        root = train_pairs.build(recipe, stages=("target", "draft"), device=device, cache=cache,
                                 progress=not smoke)
    load = transformers.AutoModelForCausalLM.from_pretrained
    return load(root / "target").eval(), load(root / "draft").eval(), recipe, root


@contextlib.contextmanager
def tf32(device: str):
    """TF32 matrix products for training on CUDA (the measurements run without)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = device.startswith("cuda")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


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
    with tf32(str(target.device)):
        result = speculant.distill(target, draft, data="corpus", corpus=corpus, heldout=held, steps=steps,
                                   batch_size=schedule.batch_size, window=recipe.context, lr=schedule.lr,
                                   temperature=1.0, loss="forward_kl", seed=51, progress=not smoke,
                                   save=directory)
    record = {"steps": steps, "batch_size": schedule.batch_size, "window": recipe.context, "temperature": 1.0,
              "loss": "forward_kl", "lr": schedule.lr, "parameters": draft.parameters(), "config": draft.config,
              "alpha_before": result.alpha_before.mean, "alpha_before_sem": result.alpha_before.sem,
              "alpha_after": result.alpha_after.mean, "alpha_after_sem": result.alpha_after.sem,
              "train_seconds": result.seconds, "final_loss": result.losses[-1]}
    (directory / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{kind}: {draft.parameters():,} parameters, alpha {result.alpha_before} -> {result.alpha_after} in "
          f"{result.seconds:.0f} s")
    return result.draft, record


def gpt2_eagle(steps: int = 0) -> tuple:
    """The trained GPT-2 CPU pair's target, live, and the EAGLE head distilled on it (train_pairs.GPT2_CPU; the
    head trained once with the recipe's draft steps, or `steps`, then loaded from the pair's heads/ folder)."""
    import transformers

    root = train_pairs.pair_dir(train_pairs.GPT2_CPU)
    if not (root / "pair.json").exists():
        raise SystemExit(f"{root}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage gpt2)")
    target = speculant.load(transformers.AutoModelForCausalLM.from_pretrained(root / "target").eval())
    steps = steps or train_pairs.GPT2_CPU.draft_train.steps
    return target, trained_head("eagle", target, train_pairs.GPT2_CPU, root, steps, smoke=False)[0]


def exported(module, directory: str, name: str, device: str = "cpu") -> speculant.Model:
    """`module` exported by this version of speculant.export to `directory`/`name` and loaded on `device`."""
    path = Path(directory) / name
    speculant.export(module, path)
    return speculant.load(path, device=device)


def decoding_table(target, drafts: dict, prompts, eos, tokens: int, repeats: int, modes=("off",),
                   best: bool = True) -> list:
    """Per draft, cuda_graphs mode, temperature and shape: tokens per target call, α, c and the speedup over plain
    decoding (median and range over `repeats` rounds after an untimed one), Theorem 3.8 beside each chain. A draft
    given as (draft, its target) decodes with that target; plain decoding always runs on `target`. `best`: after
    the grown tree, Sequoia's best tree of 16 drafts at the acceptance table (by depth and rank) it measured."""
    rows = []
    for (name, draft), mode in ((item, mode) for item in drafts.items() for mode in modes):
        draft, own = draft if isinstance(draft, tuple) else (draft, target)
        for temperature in (0.0, 1.0):
            shapes = collections.deque(SHAPES.items())
            while shapes:
                shape, options = shapes.popleft()
                decoder = speculant.SpeculativeDecoder(own, draft, temperature=temperature, cuda_graphs=mode,
                                                       **options)
                row, stats = measured(target, decoder, prompts, eos, tokens, repeats, mode, options)
                rows.append({"draft": name, "cuda_graphs": mode, "temperature": temperature, "shape": shape, **row})
                if best and shape == GROWN:
                    table = timing.tree_table([types.SimpleNamespace(stats=s) for s in stats], reached=True)
                    choice = analysis.best_tree(BUDGET, table) if table else None
                    if choice is not None and len(choice.tree) > 1:  # no tree when nothing is ever accepted
                        shapes.append((BEST, {"tree": choice.tree}))
                        rows[-1].update(best_tree=choice.tree, best_tree_expected_tokens=choice.expected_tokens)
                print_row(rows[-1])
    return rows


def measured(target, decoder, prompts, eos, tokens: int, repeats: int, mode: str, options: dict) -> tuple:
    """One row's figures (rounds.against_plain) and its last round's stats."""
    speedups, costs, stats, rates = rounds.against_plain(target, decoder, prompts, eos, tokens, repeats,
                                                         cuda_graphs=mode)
    alpha = statistics.mean(s.alpha for s in stats)
    c = statistics.median(costs)
    row = {"alpha": alpha, "tokens_per_target_call": sum(s.new_tokens for s in stats) / sum(s.target_calls
                                                                                              for s in stats),
           "c": c, "c_min": min(costs), "c_max": max(costs), "measured_speedup": statistics.median(speedups),
           "speedup_min": min(speedups), "speedup_max": max(speedups),
           "tokens_per_second": statistics.median(rates), "rate_min": min(rates), "rate_max": max(rates),
           "predicted_speedup": float(analysis.walltime_improvement(alpha, 4, c)) if "gamma" in options else None}
    return row, stats


def print_row(row: dict) -> None:
    predicted = row["predicted_speedup"]
    print(f"{row['draft']:14} {row['cuda_graphs']:5} T={row['temperature']} {row['shape']:16} alpha "
          f"{row['alpha']:.3f}, {row['tokens_per_target_call']:.2f} tokens/target call, c {row['c']:.3f}, "
          f"{row['tokens_per_second']:.0f} tokens/s, speedup {row['measured_speedup']:.2f}x "
          f"[{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]"
          + (f" (Theorem 3.8: {predicted:.2f}x)" if predicted is not None else ""))


def against_the_draft(rows: list) -> list:
    """Per head, cuda_graphs mode and temperature: its faster tree's tokens per second (the grown tree or
    Sequoia's) over the draft model's best (chain or tree) in the same mode and temperature, the ratio of their
    medians (issue 50's GPU goal: >= 1.5 for EAGLE)."""
    best, trees = {}, {}
    for r in rows:
        key = (r["cuda_graphs"], r["temperature"])
        if r["draft"] == "draft model":
            best[key] = max(best.get(key, 0.0), r["tokens_per_second"])
        elif r["shape"] in (GROWN, BEST):
            mine = trees.get((r["draft"], *key))
            if mine is None or r["tokens_per_second"] > mine["tokens_per_second"]:
                trees[(r["draft"], *key)] = r
    return [{"draft": r["draft"], "cuda_graphs": r["cuda_graphs"], "temperature": r["temperature"],
             "tree": r["shape"], "tree_over_draft_best": r["tokens_per_second"] / best[key[1:]]}
            for key, r in trees.items() if key[1:] in best]


def main(argv=None, smoke: bool = False, cache=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rounds.common_arguments(parser, str(Path(__file__).parent / "results" / "feature-heads-cpu.json"))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the draft's)")
    parser.add_argument("--drafts", nargs="+", choices=["draft", *HEADS, "early-exit"], default=None,
                        help="the drafts to measure: the pair's draft model, heads of these kinds and early exit "
                             "(default: draft eagle medusa, and early-exit on the live target)")
    parser.add_argument("--exit-layer", type=int, default=None, help="early exit's layer (default: L // 2)")
    parser.add_argument("--target", choices=["live", "export"], default="live",
                        help="run the target and the draft model live or as TorchScript exports")
    parser.add_argument("--cuda-graphs", nargs="+", choices=["off", "fixed", "auto"], default=["off"],
                        help="the decoders' modes, side by side (fixed: needs --target export)")
    parser.add_argument("--compile", action="store_true",
                        help="each head also with compile=True (its decoding steps through torch.compile)")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="llama-cpu",
                        help="llama-cpu (LLAMA_CPU), or gpt2-lease: the GPT-2 pair of a GPU lease (92M / 3.8M)")
    parser.add_argument("--device", default="cpu", help="where the pair and the heads train and decode")
    parser.add_argument("--no-best-tree", action="store_true",
                        help="skip Sequoia's best tree of 16 at each grown tree's acceptance table")
    args = parser.parse_args(argv)
    if "fixed" in args.cuda_graphs and args.target != "export":
        parser.error("--cuda-graphs fixed needs --target export: a live target has no fixed-shape calls")
    if args.drafts is None:
        args.drafts = ["draft", "eagle", "medusa"] + (["early-exit"] if args.target == "live" else [])
    if "early-exit" in args.drafts and args.target != "live":
        parser.error("--drafts early-exit needs --target live: an export's layers cannot be cut")
    torch.set_num_threads(args.threads)
    target_module, draft_module, recipe, root = pair(smoke, cache, args.pair, args.device)
    files = tempfile.mkdtemp(prefix="feature-heads-")
    target = exported(target_module, files, "target.pt", args.device) if args.target == "export" else None
    live = speculant.load(target_module.to(args.device))
    target = target or live
    steps = args.steps or recipe.draft_train.steps
    drafts, training = {}, {}
    for kind in args.drafts:
        if kind == "draft":
            drafts["draft model"] = (exported(draft_module, files, "draft.pt", args.device)
                                     if args.target == "export" else speculant.load(draft_module.to(args.device)))
            continue
        if kind == "early-exit":  # the sharing draft on a target handle of its own: plain decoding stays unshared
            layer = args.exit_layer or target_module.config.num_hidden_layers // 2
            sharing = speculant.load(target_module)
            drafts[f"EarlyExitDraft, layer {layer}"] = (speculant.EarlyExitDraft(sharing, exit_layer=layer), sharing)
            drafts[f"EarlyExitDraft, layer {layer}, own cache"] = speculant.EarlyExitDraft(
                live, exit_layer=layer, share_cache=False)
            continue
        head, training[kind] = trained_head(kind, live, recipe, root, steps, smoke)
        saved = root / "heads" / f"{kind}-{steps}"
        drafts[HEADS[kind][0]] = head if target is live else type(head).load(saved, target)
        if args.compile:
            drafts[f"{HEADS[kind][0]}, compiled"] = type(head).load(saved, target, compile=True)
    eos = target_module.config.eos_token_id
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, args.prompts)]
    rows = decoding_table(target, drafts, prompts, eos, args.tokens, args.repeats, args.cuda_graphs,
                          best=not args.no_best_tree)
    ratios = against_the_draft(rows)
    for r in ratios:
        print(f"{r['draft']} {r['tree']}, {r['cuda_graphs']}, T={r['temperature']}: "
              f"{r['tree_over_draft_best']:.2f}x the draft model's best tokens/s")
    machine = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
               else platform.processor() or platform.machine())
    record = {"machine": machine, "threads": args.threads, "pair": args.pair, "device": args.device,
              "target_form": args.target, "torch": torch.__version__, "against_the_draft": ratios,
              "target": json.loads((root / "target.json").read_text()),
              "draft": json.loads((root / "draft.json").read_text()), "training": training,
              "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(files)
    return record


if __name__ == "__main__":
    main()
