"""Drafts that read the target itself: speculant's EarlyExitDraft against transformers' assisted generation with
assistant_early_exit, on the same target and exit layer.

    python benchmarks/feature_drafts.py [--prompts 8] [--tokens 64] [--repeats 3] [--threads 2] [--gammas 2 4]
                                        [--layer-prompts 4] [--confidence 0.4] [--exit-layer L]

The target: train_pairs.LLAMA_CPU's (a 6-layer d=384 Llama trained on the stdlib, 500 steps; Llama because
transformers' early exit needs a forward that honours config.num_hidden_layers, which GPT-2's does not). It was not
trained for early exit (LayerSkip trains for it), so its middle layers predict less well than a LayerSkip model's.
Both sides run the live transformers model (speculant: speculant.load(model) and EarlyExitDraft(target, l), a view
sharing its weights and, by default, its first l layers' cache; transformers: generate(assistant_early_exit=l,
num_assistant_tokens=gamma, constant schedule), whose assistant keeps a cache of its own).

1. The exit layer: for every l in 1 .. L - 1, on the first --layer-prompts prompts, α and tokens per target call
   at T = 0 and T = 1 (γ = 4), c (the draft's seconds per call over the target's in plain decoding, both measured
   by the engine) and the speedup over plain decoding, each round running plain decoding and the draft side by
   side (median and range over --repeats rounds after an untimed one), with Theorem 3.8's speedup at that α and
   the median c beside it; the best layer is the one with the highest median speedup at T = 0. --exit-layer L
   skips this table and times layer L.
2. At that layer, T = 0 on held-out prompts, each method generates --tokens tokens per prompt: transformers'
   greedy generate and its early-exit assisted generation at each gamma, speculant's plain decoding and its
   EarlyExitDraft at each gamma, with and without draft_confidence=--confidence (transformers' assistant stops
   below assistant_confidence_threshold, 0.4 by default, at every gamma), each with the shared cache and with a
   cache of its own (share_cache=False). Every output is checked equal to
   transformers' greedy output. After a warm-up
   round, --repeats rounds run the methods in turn (alternating their order); each method's time is the median
   over rounds with min-max, and each ratio is the median of the per-round ratios against transformers' early
   exit at the same gamma.

Writes benchmarks/results/feature-drafts-cpu.json.
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


def target_model(smoke: bool, cache=None):
    """The trained Llama target (live, eval mode) and the recipe it came from (`smoke`: the tiny version)."""
    import transformers

    recipe = train_pairs.LLAMA_CPU.smoke() if smoke else train_pairs.LLAMA_CPU
    root = train_pairs.build(recipe, stages=("target",), cache=cache, progress=not smoke)
    return transformers.AutoModelForCausalLM.from_pretrained(root / "target").eval(), recipe, root


def layer_table(target, prompts, eos, tokens: int, gamma: int, repeats: int) -> list:
    """Per exit layer and temperature: α, tokens per target call, c and the speedup over plain decoding (median and
    range over `repeats` rounds after an untimed one, plain decoding and the draft's run side by side in each), and
    Theorem 3.8 at that α and the median c."""
    rows = []
    for layer in range(1, target.module.config.num_hidden_layers):
        draft = speculant.EarlyExitDraft(target, exit_layer=layer)
        for temperature in (0.0, 1.0):
            decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature)
            speedups, costs, stats, _ = rounds.against_plain(target, decoder, prompts, eos, tokens, repeats)
            new = sum(s.new_tokens for s in stats)
            alpha = statistics.mean(s.alpha for s in stats)  # the same every round: seeded
            c = statistics.median(costs)
            row = {"exit_layer": layer, "temperature": temperature, "gamma": gamma, "alpha": alpha,
                   "tokens_per_target_call": new / sum(s.target_calls for s in stats), "c": c,
                   "c_min": min(costs), "c_max": max(costs),
                   "predicted_speedup": float(analysis.walltime_improvement(alpha, gamma, c)),
                   "measured_speedup": statistics.median(speedups), "speedup_min": min(speedups),
                   "speedup_max": max(speedups)}
            rows.append(row)
            print(f"exit {layer} T={temperature}: alpha {alpha:.3f}, {row['tokens_per_target_call']:.2f} tokens per "
                  f"target call, c {c:.3f} [{min(costs):.3f}-{max(costs):.3f}], speedup "
                  f"{row['measured_speedup']:.2f}x [{min(speedups):.2f}-{max(speedups):.2f}] (Theorem 3.8: "
                  f"{row['predicted_speedup']:.2f}x)")
    return rows


def main(argv=None, smoke: bool = False, cache=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rounds.common_arguments(parser, str(Path(__file__).parent / "results" / "feature-drafts-cpu.json"))
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layer-prompts", type=int, default=4, help="prompts of the exit-layer table")
    parser.add_argument("--exit-layer", type=int, default=None, help="time this layer (no exit-layer table)")
    parser.add_argument("--confidence", type=float, default=0.4,
                        help="speculant's draft_confidence beside the plain chains (transformers' default threshold)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, recipe, root = target_model(smoke, cache)
    eos = model.config.eos_token_id
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, root, args.prompts)]
    target = speculant.load(model)
    if args.exit_layer is None:
        layers = layer_table(target, prompts[:args.layer_prompts], eos, args.tokens, gamma=4, repeats=args.repeats)
        best = max((r for r in layers if r["temperature"] == 0.0), key=lambda r: r["measured_speedup"])["exit_layer"]
        print(f"best exit layer at T = 0: {best}")
    else:
        layers, best = [], args.exit_layer
    drafts = {"": speculant.EarlyExitDraft(target, exit_layer=best),
              ", own cache": speculant.EarlyExitDraft(target, exit_layer=best, share_cache=False)}

    def hf(gamma: int):
        extra = dict(assistant_early_exit=best, num_assistant_tokens=gamma,
                     num_assistant_tokens_schedule="constant") if gamma else {}

        def run(prompt):
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=args.tokens, pad_token_id=eos, eos_token_id=eos, num_beams=1,
                                     top_k=None, top_p=None, temperature=None, **extra)
            return out[0, ids.size(1):].tolist()
        return run

    def ours(gamma: int, confidence=None, draft=None):
        if gamma == 0:
            return lambda prompt: speculant.generate(target, prompt, max_new_tokens=args.tokens, temperature=0.0,
                                                     eos_token_id=eos).tokens
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0.0,
                                               draft_confidence=confidence)
        return lambda prompt: decoder.generate(prompt, max_new_tokens=args.tokens, eos_token_id=eos).tokens

    methods = {"transformers greedy": hf(0), "speculant plain": ours(0)}
    against = {"speculant plain": "transformers greedy"}  # each method's ratio: against transformers at its gamma
    for g in args.gammas:
        methods[f"transformers early exit gamma={g}"] = hf(g)
        for cache, draft in drafts.items():
            for confidence in (None, args.confidence):
                name = (f"speculant EarlyExitDraft gamma={g}{cache}"
                        + (f", draft_confidence={confidence}" if confidence else ""))
                methods[name] = ours(g, confidence, draft)
                against[name] = f"transformers early exit gamma={g}"
    reference = [methods["transformers greedy"](p) for p in prompts]
    for name, run in methods.items():  # warm-up, and every output checked against transformers' greedy
        assert [run(p) for p in prompts] == reference, f"{name} differs from transformers' greedy output"
    timed = rounds.timed_rounds(methods, prompts, args.repeats)
    tokens = sum(len(t) for t in reference)
    rows = []
    print(f"{'method':62} {'ms/token':>9} {'[min-max]':>15} {'vs transformers':>16} {'[min-max]':>13}")
    for name, times in timed.items():
        base = timed[against.get(name, name)]
        row = rounds.ratio_row(name, times, base, tokens, "speedup_over_transformers")
        rows.append(row)
        print(f"{name:62} {row['ms_per_token']:9.2f} [{row['ms_min']:.2f}-{row['ms_max']:.2f}] "
              f"{row['speedup_over_transformers']:15.2f}x [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]")
    record = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "target": json.loads((root / "target.json").read_text()),
              "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats, "best_exit_layer": best,
              "layers": layers, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
