"""What the side-by-side benchmarks against transformers share (cross_tokenizer.py, feature_drafts.py): their
common options, and timed rounds that alternate the methods' order."""
import argparse
import statistics
import time


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
