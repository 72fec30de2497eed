"""Negligible-cost drafters and adaptive gamma on a trained target (the paper's Table 3 analogue).

For the demo pair's target (byte-level, trained on the standard library; speculant.demo_pair) or, with
--pair gpt2, the assisted-generation benchmark's GPT-2 pair (4096-token BPE; benchmarks/train_pairs.py, trained
first if not cached), on held-out prompts: alpha (Corollary 3.6), tokens per target call and the measured speedup over plain decoding of the
same target, for the neural draft model, unigram and bigram tables fitted on the training bytes, and prompt
lookup; then, for the draft model, every fixed gamma against the heuristic and alpha policies. Each setting
is timed over the same prompts and seeds as plain decoding, interleaved with it, median of --repeats.

    python benchmarks/drafters.py [--pair demo|gpt2] [--threads 1] [--tokens 128] [--prompts 8] [--repeats 3]
"""
import argparse
import statistics
import time
import warnings

import torch

import speculant
from speculant import analysis, demo_pair, drafters


def demo_prompts(count: int, length: int = 48) -> list:
    """Held-out windows of the demo corpus, starting at line starts."""
    _, heldout, _ = demo_pair.load_corpus()
    data = heldout.tolist()
    out, step = [], max(1, len(data) // (count + 1))
    for i in range(1, count + 1):
        start = i * step
        while start < len(data) - length and data[start - 1] != ord("\n"):
            start += 1
        out.append(data[start:start + length])
    return out


def timed(run, prompts_ids, seed):
    start = time.perf_counter()
    results = [run(p, seed + i) for i, p in enumerate(prompts_ids)]
    return time.perf_counter() - start, results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*")
    torch.set_num_threads(args.threads)

    if args.pair == "demo":
        target_path, draft_path = demo_pair.default_pair()
        train, _, _ = demo_pair.load_corpus()
        ids = demo_prompts(args.prompts)
        draft_name = "draft model (1L d64)"
    else:
        import train_pairs  # benchmarks/train_pairs.py, beside this script

        recipe = train_pairs.GPT2_CPU
        out = train_pairs.build(recipe)
        target_path, draft_path = out / "target.pt", out / "draft.pt"
        train = train_pairs.stream(train_pairs.load_tokenizer(out / "tokenizer.json"),
                                   train_pairs.load_corpus(recipe)[0])
        ids = [p["prompt_ids"] for p in train_pairs.heldout_prompts(recipe, out, args.prompts)]
        draft_name = "draft model (1L d128)"
    target, draft_model = speculant.load(target_path), speculant.load(draft_path)
    vocab = target.vocab_size
    candidates = {
        draft_name: draft_model,
        "bigram": drafters.Bigram.fit(train, vocab),
        "unigram": drafters.Unigram.fit(train, vocab),
        "prompt lookup (n <= 3)": drafters.PromptLookup(vocab, min_ngram=1, max_ngram=3),
    }
    print(f"# target: {target_path}\n# torch threads: {args.threads}; {len(ids)} held-out prompts x "
          f"{args.tokens} tokens; median of {args.repeats} interleaved repeats\n")

    for temperature in args.temperatures:
        def plain(p, s):
            return speculant.generate(target, p, max_new_tokens=args.tokens, temperature=temperature, seed=s)

        def measure(decoder, **options):
            spec_times, plain_times = [], []
            for _ in range(args.repeats):
                t, results = timed(lambda p, s: decoder.generate(p, max_new_tokens=args.tokens, seed=s, **options),
                                   ids, 0)
                spec_times.append(t)
                plain_times.append(timed(plain, ids, 0)[0])
            stats = [r.stats for r in results]
            # alpha pooled over the generations: each one's mean beta weighted by its verified positions
            verified = [sum(min(it.accepted + 1, len(it.drafted)) for it in r.trace) for r in results]
            beta = sum(s.alpha * v for s, v in zip(stats, verified) if v) / max(sum(verified), 1)
            per_call = sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats)
            return beta, per_call, statistics.median(plain_times) / statistics.median(spec_times)

        print(f"## temperature {temperature}\n")
        print("| drafter | best fixed gamma | alpha | tokens / target call | measured speedup |")
        print("|---|---|---|---|---|")
        for name, drafter in candidates.items():
            best = None
            for gamma in (1, 2, 3, 4, 6, 8):
                decoder = speculant.SpeculativeDecoder(target, drafter, gamma=gamma, temperature=temperature)
                row = (gamma, *measure(decoder))
                if best is None or row[3] > best[3]:
                    best = row
            gamma, alpha, per_call, speedup = best
            print(f"| {name} | {gamma} | {alpha:.3f} | {per_call:.2f} | {speedup:.2f}x |", flush=True)

        print("\n| draft model, gamma policy | alpha | tokens / target call | measured speedup |")
        print("|---|---|---|---|")
        rows = {}
        for gamma in (1, 2, 3, 4, 6, 8):
            decoder = speculant.SpeculativeDecoder(target, draft_model, gamma=gamma, temperature=temperature)
            rows[f"fixed gamma = {gamma}"] = measure(decoder)
        best_fixed = max(rows, key=lambda k: rows[k][2])
        decoder = speculant.SpeculativeDecoder(target, draft_model, gamma=4, temperature=temperature)
        # c from plain decoding of each model (per forward call), for the alpha policy
        c_draft = speculant.generate(draft_model, ids[0], max_new_tokens=args.tokens, temperature=temperature)
        c_target = speculant.generate(target, ids[0], max_new_tokens=args.tokens, temperature=temperature)
        cost = (c_draft.stats.target_seconds / c_draft.stats.target_calls) / \
            (c_target.stats.target_seconds / c_target.stats.target_calls)
        rows["heuristic (start 4, max 8)"] = measure(decoder, gamma_policy="heuristic", max_gamma=8)
        rows[f"alpha (c = {cost:.2f}, max 8)"] = measure(decoder, gamma_policy="alpha", cost=cost, max_gamma=8)
        for name, (alpha, per_call, speedup) in rows.items():
            mark = " (best fixed)" if name == best_fixed else ""
            print(f"| {name}{mark} | {alpha:.3f} | {per_call:.2f} | {speedup:.2f}x |")
        best_alpha = rows[best_fixed][0]
        print(f"\nTheorem 3.8 at the best fixed gamma: {analysis.walltime_improvement(best_alpha, int(best_fixed.split()[-1]), cost):.2f}x "
              f"predicted from alpha {best_alpha:.3f} and c {cost:.2f}\n", flush=True)


if __name__ == "__main__":
    main()
