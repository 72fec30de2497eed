"""Speculative beam search (the paper's Appendix A.4) against transformers' beam search on the same models.

    python benchmarks/train_pairs.py --stage gpt2       # the GPT-2 pair (cached; ~12 min on 2 cores)
    python benchmarks/beams.py                          # -> benchmarks/results/beams-gpt2-cpu-cpu.json
    python benchmarks/beams.py --widths 2 --gammas 2 3 --repeats 3 --prompts 4
    python benchmarks/beams.py --pair t5                # the T5 pair (train_pairs.py --stage t5 first)

On a trained pair (train_pairs.GPT2_CPU: a 12.3M target, a 0.76M draft, one BPE vocabulary; or T5_CPU), batch
1, held-out prompts (train_pairs.heldout_prompts: GPT-2 windows, T5 sources), --tokens new tokens per prompt;
GPT-2 without an EOS (every beam runs the same length, as in benchmarks/assisted.py), T5 stopping at </s> as
its task defines, for each beam width w in --widths:

* transformers' ``generate(num_beams=w, do_sample=False)`` on the target (length_penalty 1, early_stopping
  False: its defaults);
* speculant's plain beam search of the exported target (``speculant.generate(target, num_beams=w)``);
* speculative beam search, ``SpeculativeDecoder(target, draft, gamma=g).generate(num_beams=w, draft_beams=u)``,
  for every u in (w, 2w) and g in --gammas;
* with --live, the same on the live transformers objects (``speculant.load`` of the save_pretrained models):
  plain beam search and speculative beam search with u = 2w.

Every method gets an untimed warm-up generation, then --repeats rounds over all prompts, the methods in turn and
in reversed order on odd rounds (ABBA); tokens per second is the median over the rounds and a ratio between two
methods is the median of their per-round ratios, with its min-max (benchmarks/assisted.py's Method). The
speculative rows also give the search's alignment: beam search steps per target call and the tree nodes the
target scored per step (w for plain beam search). Every method's best beam must equal transformers' best beam
prompt for prompt (the run fails otherwise). The issue's goal: >= 1.5x transformers' beam search per token at
w = 2. Results: --out (JSON) and a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import speculant

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import assisted  # noqa: E402  (benchmarks/assisted.py: the pair, Method, ratio_range, machine)
import train_pairs  # noqa: E402

WARMUP_TOKENS = 16


def hf_beams(pair: assisted.Pair, width: int):
    def run(prompt: Dict, n: int, seed: int) -> List[int]:
        inputs = torch.tensor([next(iter(prompt.values()))], device=pair.device)  # the prompt or the source
        skip = 1 if pair.kind == "t5" else inputs.size(1)  # the decoder start, or the prompt
        with torch.no_grad():
            out = pair.hf_target.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), num_beams=width,
                                          do_sample=False, temperature=None, top_k=None, top_p=None,
                                          max_new_tokens=n, pad_token_id=train_pairs.PAD, eos_token_id=pair.eos)
        ids = out[0, skip:].tolist()
        return ids[:ids.index(pair.eos) + 1] if pair.eos in ids else ids  # without the padding after an EOS
    return run


def methods_for(pair: assisted.Pair, width: int, gammas: Sequence[int], live=None) -> List[assisted.Method]:
    """The methods at one width; live: (target, draft) as live transformers objects (speculant.load of the pair's
    save_pretrained models) for the live_* methods, or None."""
    def plain(prompt, n, seed, target=pair.target):
        return speculant.generate(target, **prompt, max_new_tokens=n, num_beams=width, eos_token_id=pair.eos)

    def speculative(draft_beams: int, gamma: int, models=(pair.target, pair.draft)):
        decoder = speculant.SpeculativeDecoder(*models, gamma=gamma)
        return lambda prompt, n, seed: decoder.generate(**prompt, max_new_tokens=n, num_beams=width,
                                                        draft_beams=draft_beams, eos_token_id=pair.eos)

    def method(name: str, generate_one, draft_beams: Optional[int] = None, gamma: Optional[int] = None):
        out = assisted.Method(name, gamma, generate_one)
        out.width, out.draft_beams = width, draft_beams
        return out

    methods = [method(f"hf_w{width}", hf_beams(pair, width)), method(f"plain_w{width}", plain)]
    for u in (width, 2 * width):
        methods += [method(f"spec_w{width}_u{u}_g{gamma}", speculative(u, gamma), u, gamma) for gamma in gammas]
    if live:
        methods.append(method(f"live_plain_w{width}", lambda prompt, n, seed: plain(prompt, n, seed, live[0])))
        methods += [method(f"live_spec_w{width}_u{2 * width}_g{gamma}", speculative(2 * width, gamma, live),
                           2 * width, gamma) for gamma in gammas]
    return methods


def measure(pair: assisted.Pair, widths: Sequence[int], gammas: Sequence[int], prompts: Sequence[Dict],
            tokens: int, repeats: int, live: bool = False) -> Dict:
    """Every method timed (module docstring); rows per method and the run's per-round tokens per second."""
    models = (speculant.load(pair.hf_target), speculant.load(pair.hf_draft)) if live else None
    methods = [m for w in widths for m in methods_for(pair, w, gammas, models)]
    for method in methods:  # untimed warm-up
        method.run(pair, prompts[:1], WARMUP_TOKENS, record=False)
    for rep in range(repeats):
        for method in (methods if rep % 2 == 0 else methods[::-1]):
            method.run(pair, prompts, tokens)
    tps = {m.name: m.tps for m in methods}
    rows = []
    for width in widths:
        reference = next(m for m in methods if m.name == f"hf_w{width}")
        for method in (m for m in methods if m.width == width):
            row = {"method": method.name, "width": width, "draft_beams": method.draft_beams,
                   "gamma": method.gamma, "tokens_per_second": method.median_tps,
                   "mismatches": sum(a != b for a, b in zip(method.tokens, reference.tokens))}
            row["vs_hf"], row["vs_hf_min"], row["vs_hf_max"] = assisted.ratio_range(tps, method.name, reference.name)
            if not method.name.startswith("hf"):
                steps = sum(r.stats.steps for r in method.results)
                calls = sum(r.stats.target_calls for r in method.results)
                row["vs_plain"], row["vs_plain_min"], row["vs_plain_max"] = assisted.ratio_range(
                    tps, method.name, f"plain_w{width}")
                row["steps_per_call"] = steps / calls
                row["target_tokens_per_step"] = sum(r.stats.target_tokens for r in method.results) / steps
                row["draft_tokens_per_step"] = sum(r.stats.draft_tokens for r in method.results) / steps
            rows.append(row)
    return {"rows": rows, "tps_repeats": tps}


def table(rows: Sequence[Dict]) -> str:
    def span(row, key):
        return f"{row[key]:.2f}x ({row[key + '_min']:.2f}-{row[key + '_max']:.2f})" if key in row else "-"

    lines = ["| w | method | u | gamma | tokens/s | vs transformers (min-max) | vs plain beam search (min-max) | "
             "steps per target call | target nodes per step | mismatches |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        kind = row["method"].split("_")[0]
        lines.append(
            f"| {row['width']} | {kind} | {row['draft_beams'] or '-'} | {row['gamma'] or '-'} | "
            f"{row['tokens_per_second']:.1f} | {span(row, 'vs_hf')} | {span(row, 'vs_plain')} | "
            f"{row.get('steps_per_call', float('nan')):.2f} | {row.get('target_tokens_per_step', float('nan')):.2f} | "
            f"{row['mismatches']} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=["gpt2", "t5"], default="gpt2")
    parser.add_argument("--preset", choices=sorted(train_pairs.PRESETS), default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--widths", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=None, help="train_pairs' cache directory (default: its own)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--live", action="store_true",
                        help="also the live transformers objects: plain and speculative (u = 2w) beam search")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*|.*torch\.jit.*")
    recipe = train_pairs.PRESETS[args.preset][args.pair]
    pair = assisted.load_pair(recipe, args.device, cache=args.cache)
    prompts = train_pairs.heldout_prompts(recipe, pair.directory, args.prompts, args.prompt_tokens)
    record = measure(pair, args.widths, args.gammas, prompts, args.tokens, args.repeats, args.live)
    record.update({"pair": args.pair, "preset": args.preset, "device": args.device, "prompts": len(prompts),
                   "prompt_tokens": args.prompt_tokens, "tokens": args.tokens, "repeats": args.repeats,
                   "machine": assisted.machine(), "pair_info": json.loads((pair.directory / "pair.json").read_text())})
    out = Path(args.out or assisted.RESULTS / f"beams-{args.pair}-{args.preset}-{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str))
    print(table(record["rows"]))
    bad = sum(row["mismatches"] for row in record["rows"])
    if bad:
        print(f"EQUALITY FAILED: {bad} best beams differ from transformers' beam search")
        raise SystemExit(1)
    print(f"every method's best beam equals transformers' on all {len(prompts)} prompts at every width")
    return out


if __name__ == "__main__":
    main()
