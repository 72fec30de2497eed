"""What the side-by-side benchmarks share (cross_tokenizer.py, feature_drafts.py, feature_heads.py): their common
options, timed rounds that alternate the methods' order, and rounds of a decoder beside plain decoding."""
import argparse
import statistics
import time

import speculant


def common_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """--prompts, --tokens (per prompt), --repeats (timed rounds after a warm-up), --threads and --out."""
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=out)


def timed_rounds(methods: dict, prompts, repeats: int) -> dict:
    """Each method's seconds per round over all prompts, the rounds alternating the methods' order."""
    rounds = {name: [] for name in methods}
    for r in range(repeats):
        for name in (list(methods) if r % 2 == 0 else list(reversed(methods))):
            start = time.perf_counter()
            for p in prompts:
                methods[name](p)
            rounds[name].append(time.perf_counter() - start)
    return rounds


def ratio_row(name: str, times, base, tokens: int, key: str) -> dict:
    """A method's ms per token (median and range over rounds) and the median and range of its per-round ratios
    base / times (`key`: the ratio's name)."""
    ratios = [b / t for b, t in zip(base, times)]
    return {"method": name, "ms_per_token": 1e3 * statistics.median(times) / tokens,
            "ms_min": 1e3 * min(times) / tokens, "ms_max": 1e3 * max(times) / tokens,
            key: statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios)}


def against_plain(target, decoder, prompts, eos, tokens: int, repeats: int, cuda_graphs: str = "off") -> tuple:
    """Rounds of plain decoding (T = 0, with `cuda_graphs` as the decoder's) and `decoder` side by side, `repeats`
    timed after an untimed one, each generating `tokens` per prompt (prompt i with seed i). Returns (speedups over
    plain, c per round: the draft's seconds per call over the target's in plain decoding, both timed by the
    engine, the last round's stats, and the decoder's tokens per second per round)."""
    speedups, costs, rates = [], [], []
    for r in range(repeats + 1):  # round 0: untimed
        plain = [speculant.generate(target, p, max_new_tokens=tokens, temperature=0.0, eos_token_id=eos,
                                    cuda_graphs=cuda_graphs).stats for p in prompts]
        stats = [decoder.generate(p, max_new_tokens=tokens, eos_token_id=eos, seed=i).stats
                 for i, p in enumerate(prompts)]
        if r == 0:
            continue
        base = sum(s.total_seconds for s in plain) / sum(s.new_tokens for s in plain)
        per_call = sum(s.target_seconds for s in plain) / sum(s.target_calls for s in plain)
        rates.append(sum(s.new_tokens for s in stats) / sum(s.total_seconds for s in stats))
        speedups.append(base * rates[-1])
        costs.append(sum(s.draft_seconds for s in stats) / sum(s.draft_calls for s in stats) / per_call)
    return speedups, costs, stats, rates
