"""The two forms of a decoder-only .pt2 package side by side: the tree form (positions, a mask over the static cache
and the moves of a kept path as inputs: what token trees and beam search need) against the chain form (the slots
alone, transformers' own causal mask), on the trained GPT-2 pair, greedy, gamma 4.

    python benchmarks/train_pairs.py --stage gpt2 && python benchmarks/pt2_forms.py [--repeats 5] [--prompts 6]

Both forms of the target and the draft are exported from the pair's save_pretrained directories (the chain form with
pt2.export_pt2(..., tree_calls=False)); then plain and speculative decoding of each form over the held-out prompts,
one untimed pass each, then --repeats passes in ABBA order; the ratio (tree form over chain form, tokens per second)
is the median of the per-pass ratios, with its min-max.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import speculant
from speculant.export import load_pretrained, pt2

sys.path.insert(0, str(Path(__file__).parent))
import train_pairs  # noqa: E402


def export_both(directory: Path, out: Path, max_length: int) -> dict:
    """form -> (target, draft) packages loaded in the engine."""
    paths = {}
    for form in ("tree", "chain"):
        for role in ("target", "draft"):
            path = out / f"{role}-{form}.pt2"
            model = load_pretrained(directory / role).eval()
            pt2.export_pt2(model, path, max_length=max_length, metadata_json=json.dumps({"form": form}),
                           tree_calls=form == "tree")
            paths.setdefault(form, []).append(path)
    return {form: [speculant.load(p) for p in pair] for form, pair in paths.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    directory = train_pairs.pair_dir(train_pairs.GPT2_CPU)
    prompts = [p["prompt_ids"] for p in train_pairs.heldout_prompts(train_pairs.GPT2_CPU, directory, args.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        forms = export_both(directory, Path(tmp), train_pairs.GPT2_CPU.context)
        assert forms["tree"][0].tree_obstacle == "" and forms["chain"][0].tree_obstacle != ""

        def tokens_per_second(form: str, speculative: bool) -> float:
            target, draft = forms[form]
            start, count = time.perf_counter(), 0
            for prompt in prompts:
                if speculative:
                    decoder = speculant.SpeculativeDecoder(target, draft, gamma=4, temperature=0)
                    count += len(decoder.generate(prompt, max_new_tokens=args.tokens).tokens)
                else:
                    count += len(speculant.generate(target, prompt, max_new_tokens=args.tokens,
                                                    temperature=0).tokens)
            return count / (time.perf_counter() - start)

        print(f"# GPT-2 pair, {len(prompts)} prompts x {args.tokens} tokens, {args.threads} threads, torch "
              f"{torch.__version__}; tree form / chain form tokens per second, median of {args.repeats} [min-max]")
        for speculative in (False, True):
            for form in ("chain", "tree"):
                tokens_per_second(form, speculative)  # warm-up
            ratios = []
            for rep in range(args.repeats):
                order = ("chain", "tree") if rep % 2 == 0 else ("tree", "chain")
                measured = {form: tokens_per_second(form, speculative) for form in order}
                ratios.append(measured["tree"] / measured["chain"])
            print(f"{'speculative (gamma 4)' if speculative else 'plain'}: {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
