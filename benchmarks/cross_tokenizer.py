"""A draft with another tokenizer: speculant's CrossTokenizer against transformers' universal assisted generation.

    python benchmarks/cross_tokenizer.py [--prompts 8] [--tokens 64] [--repeats 3] [--threads 2] [--gammas 2 4 6]

The pair: two GPT-2 recipes of benchmarks/train_pairs.py trained on the same stdlib corpus with different BPE
vocabularies (so different merges): the target (4 layers, d 256, vocabulary 4096, 400 steps) of one and the
draft (1 layer, d 128, vocabulary 1024, 500 steps) of the other, trained once and cached beside the other
benchmark pairs. At temperature 0 on held-out prompts, each method generates --tokens tokens per prompt:

* transformers' greedy generate of the target alone, and its universal assisted generation (assistant_model
  with tokenizer and assistant_tokenizer: the draft's text re-tokenized for the target);
* speculant's plain decoding of the exported target, and speculative decoding with the exported draft through
  SpeculativeDecoder(draft_tokenizer=, target_tokenizer=) at each gamma.

Every output is checked equal to transformers' greedy output. After a warm-up round, --repeats rounds run the
methods in turn (alternating their order); each method's time is the median over rounds with min-max, and each
ratio is the median of the per-round ratios. At T = 1 (γ = 4, no timing) it reports α and tokens per target call
of both CrossTokenizer modes: greedy text (point masses) and sampling in the intersection. Writes
benchmarks/results/cross-tokenizer-cpu.json.
"""
import argparse
import dataclasses
import json
import platform
import statistics
from pathlib import Path

import torch

import rounds
import speculant
import train_pairs
from speculant.cross_tokenizer import CrossTokenizer

TARGET = dataclasses.replace(
    train_pairs.GPT2_CPU, vocab_size=4096,
    target=dict(n_layer=4, n_embd=256, n_head=4, n_inner=1024, activation_function="gelu_new"),
    target_train=train_pairs.Schedule(steps=400, batch_size=8, lr=2e-3, warmup=30, seed=30))
DRAFT = dataclasses.replace(
    train_pairs.GPT2_CPU, vocab_size=1024,
    draft=dict(n_layer=1, n_embd=128, n_head=2, n_inner=512, activation_function="gelu_new"),
    draft_train=train_pairs.Schedule(steps=500, batch_size=8, lr=3e-3, warmup=30, seed=31))


def pair(smoke: bool, cache=None):
    """(target directory, draft directory): the save_pretrained models with their tokenizer.json files (`smoke`:
    the recipes' tiny versions, for the test of this script)."""
    target_recipe = TARGET.smoke() if smoke else TARGET
    draft_recipe = dataclasses.replace(DRAFT.smoke(), vocab_size=280) if smoke else DRAFT
    target_root = train_pairs.build(target_recipe, stages=("target",), cache=cache, progress=not smoke)
    draft_root = train_pairs.build(draft_recipe, stages=("draft",), cache=cache, progress=not smoke)
    return target_root, draft_root


def main(argv=None, smoke: bool = False, cache=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rounds.common_arguments(parser, str(Path(__file__).parent / "results" / "cross-tokenizer-cpu.json"))
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    target_root, draft_root = pair(smoke, cache)
    tokenizers = {role: transformers.PreTrainedTokenizerFast(tokenizer_file=str(root / role / "tokenizer.json"))
                  for role, root in (("target", target_root), ("draft", draft_root))}
    live = {role: transformers.AutoModelForCausalLM.from_pretrained(root / role).eval()
            for role, root in (("target", target_root), ("draft", draft_root))}
    eos = live["target"].config.eos_token_id
    recipe = TARGET.smoke() if smoke else TARGET
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, target_root, args.prompts)]
    target = speculant.load(target_root / "target.pt")
    draft = speculant.load(draft_root / "draft.pt")

    def hf(assisted: bool):
        def run(prompt):
            ids = torch.tensor([prompt])
            extra = dict(assistant_model=live["draft"], tokenizer=tokenizers["target"],
                         assistant_tokenizer=tokenizers["draft"]) if assisted else {}
            with torch.no_grad():
                out = live["target"].generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                              max_new_tokens=args.tokens, pad_token_id=eos, num_beams=1,
                                              top_k=None, top_p=None, temperature=None, **extra)
            return out[0, ids.size(1):].tolist()
        return run

    def ours(gamma):
        if gamma == 0:
            return lambda prompt: speculant.generate(target, prompt, max_new_tokens=args.tokens, temperature=0.0,
                                                     eos_token_id=eos).tokens
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0.0,
                                               draft_tokenizer=tokenizers["draft"],
                                               target_tokenizer=tokenizers["target"])
        return lambda prompt: decoder.generate(prompt, max_new_tokens=args.tokens, eos_token_id=eos).tokens

    methods = {"transformers greedy": hf(False), "transformers UAG": hf(True), "speculant plain": ours(0),
               **{f"speculant cross-tokenizer gamma={g}": ours(g) for g in args.gammas}}
    reference = [methods["transformers greedy"](p) for p in prompts]  # also the warm-up of that method
    for name, run in methods.items():  # warm-up, and every output checked against transformers' greedy
        got = [run(p) for p in prompts]
        assert got == reference, f"{name} differs from transformers' greedy output"
    timed = rounds.timed_rounds(methods, prompts, args.repeats)
    tokens = sum(len(t) for t in reference)
    uag = timed["transformers UAG"]
    rows = []
    print(f"{'method':38} {'ms/token':>9} {'[min-max]':>15} {'UAG / method':>13} {'[min-max]':>13}")
    for name, times in timed.items():
        row = rounds.ratio_row(name, times, uag, tokens, "speedup_over_uag")
        rows.append(row)
        print(f"{name:38} {row['ms_per_token']:9.2f} [{row['ms_min']:.2f}-{row['ms_max']:.2f}] "
              f"{row['speedup_over_uag']:12.2f}x [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]")
    stats = {}
    for g in args.gammas:
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=g, temperature=0.0,
                                               draft_tokenizer=tokenizers["draft"],
                                               target_tokenizer=tokenizers["target"])
        results = [decoder.generate(p, max_new_tokens=args.tokens, eos_token_id=eos) for p in prompts]
        new = sum(r.stats.new_tokens for r in results)
        stats[str(g)] = {"tokens_per_target_call": new / sum(r.stats.target_calls for r in results),
                         "alpha": statistics.mean(r.stats.alpha for r in results)}
        print(f"gamma={g}: {stats[str(g)]['tokens_per_target_call']:.2f} tokens per target call, alpha "
              f"{stats[str(g)]['alpha']:.3f}")
    sampled = {}  # T = 1: what each mode's q costs in α (no timing)
    for mode in ("text", "intersection"):
        drafter = CrossTokenizer(draft, tokenizers["draft"], tokenizers["target"], target.vocab_size, mode=mode)
        decoder = speculant.SpeculativeDecoder(target, drafter, gamma=4, temperature=1.0)
        results = [decoder.generate(p, max_new_tokens=args.tokens, eos_token_id=eos, seed=i)
                   for i, p in enumerate(prompts)]
        sampled[mode] = {"alpha": statistics.mean(r.stats.alpha for r in results),
                         "tokens_per_target_call": sum(r.stats.new_tokens for r in results)
                         / sum(r.stats.target_calls for r in results)}
        print(f"T = 1, gamma = 4, {mode} mode: alpha {sampled[mode]['alpha']:.3f}, "
              f"{sampled[mode]['tokens_per_target_call']:.2f} tokens per target call")
    record = {"machine": f"{platform.machine()} torch {torch.__version__}, {args.threads} threads",
              "args": vars(args), "target": str(target_root), "draft": str(draft_root), "tokens": tokens,
              "rows": rows, "gammas": stats,
              "temperature_1": sampled}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
