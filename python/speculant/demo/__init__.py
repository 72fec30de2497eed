"""The demo (`speculant demo`): speculative decoding with the default pair (shipped with the package), its trace
drawn like the paper's Figure 1, and its statistics and speedup next to plain decoding of the same target, timed
by speculant.timing (warmed up, repeated, medians with their range) beside Theorem 3.8's prediction."""

from __future__ import annotations

import functools
import json
import sys
from typing import Optional, TextIO

import torch

from . import pair as demo_pair
from ..research import timing
from ..decoding.decoder import DEFAULT_GAMMA, SpeculativeDecoder, check_settings, generate
from ..models.model import load
from ..decoding.trace import use_color

DEFAULT_PROMPT = "def __init__(self"
DTYPES = ("float32", "bfloat16", "float16")  # the names speculant.load takes


def _row(name: str, spec, plain) -> str:
    return f"  {name:<26}{spec:>22}{plain:>22}"


def run(*, prompt: str = DEFAULT_PROMPT, gamma: int = DEFAULT_GAMMA, temperature: float = 0.8, top_k: int = 0,
        top_p: float = 1.0, lenience: float = 1.0, max_new_tokens: int = 200, seed: int = 0, repeats: int = 3,
        color: Optional[bool] = None, out: Optional[TextIO] = None, device: str = "cpu",
        dtype: Optional[str] = None, threads: Optional[int] = 1, verification: str = "token") -> dict:
    """Runs the demo and prints it (to ``out``, default sys.stdout); returns the figures it printed. The trace
    is in ANSI colours when ``color`` is True, or when it is None (the default) and ``out`` is a terminal and the
    NO_COLOR environment variable is unset (speculant.trace.use_color).

    Timed as speculant.sweep times (speculant.timing): one untimed run of speculative and plain decoding warms
    every shape, then ``repeats`` rounds interleaved ABBA, with ``threads`` torch threads (default 1; None keeps
    torch's setting). The speedup is the median of the rounds' speedups, with their range, next to Theorem 3.8's
    prediction from the measured alpha and c; the table's tokens per second are those of the round with that
    speedup (timing.median_round), so the two agree. Rows the timing cannot trust are flagged as the sweep flags
    them ("contended", "impossible", "noisy", "off theory").

    ``device``: where the models run ("cpu", "cuda", "cuda:1"); on a GPU in ``dtype`` (default bfloat16; on the CPU
    float32, the weights' own) with CUDA graphs (cuda_graphs="auto"), c from the phases' device time.
    ``verification``: SpeculativeDecoder's, "token" (Algorithm 1, the default) or "block"."""
    repeats = timing.check_repeats(repeats)  # every option is checked before the models are made
    threads = timing.check_threads(threads)
    check_settings(gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p, lenience=lenience,
                   verification=verification)
    for name, value in (("max_new_tokens", max_new_tokens), ("seed", seed)):
        minimum = 1 if name == "max_new_tokens" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    gpu, dtype = _placement(device, dtype)
    out = sys.stdout if out is None else out
    color = use_color(out, color)
    target_path, draft_path = demo_pair.default_pair(progress=True)
    info = json.loads((target_path.parent / "pair.json").read_text())
    target, draft = (load(path, device=device, dtype=dtype) for path in (target_path, draft_path))
    graphs = "auto" if gpu else "off"
    decoder = SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature, top_k=top_k,
                                 top_p=top_p, lenience=lenience, cuda_graphs=graphs, verification=verification)
    # The first generation is shown at once (the timed rounds after it repeat its tokens: same seed).
    spec = decoder.generate(demo_pair.encode(prompt), max_new_tokens=max_new_tokens, seed=seed)
    print(f"speculant demo: target {info['params']['target']:,} params, draft {info['params']['draft']:,} params "
          f"(byte-level GPTs trained on Python's standard library; held-out loss {info['target_loss']:.3f} / "
          f"{info['draft_loss']:.3f} nats per byte)", file=out)
    print(f"gamma={gamma} temperature={temperature} top_k={top_k} top_p={top_p} lenience={lenience} "
          f"verification={verification} seed={seed} device={device} dtype={dtype or 'float32'}\n", file=out)
    print("Trace (one line per target call; green: accepted draft tokens, red: rejected draft token, "
          "blue: the target's correction, underlined blue: bonus token):" if color else
          "Trace (one line per target call: [accepted:...] draft tokens, the [rejected:...] draft token, and the "
          "target's [correction:...] or [bonus:...] token):", file=out)
    print(spec.trace.with_decoder(demo_pair.decode).render(color=color, prefix=prompt), file=out, flush=True)
    plain_generate = functools.partial(generate, target, temperature=temperature, top_k=top_k, top_p=top_p,
                                       cuda_graphs=graphs)
    rounds = timing.timed_rounds(decoder.generate, plain_generate, [{"prompt_ids": demo_pair.encode(prompt)}],
                                 max_new_tokens=max_new_tokens, seed=seed, repeats=repeats, threads=threads,
                                 device=device)
    summary = timing.summarize(rounds, gamma=gamma, lenience=lenience)
    _times(rounds, summary, repeats, lenience, out)
    s = rounds[0][0][0].stats
    return {"speedup": summary["speedup"], "speedup_min": summary["speedup_min"],
            "speedup_max": summary["speedup_max"], "predicted": summary["predicted_speedup"],
            "cost_model": summary["cost_model_speedup"],
            "alpha": s.alpha, "c": summary["c"], "flag": summary["flag"], "threads": summary["threads"],
            "cpu_share": summary["cpu_share"], "speedup_bound": summary["speedup_bound"],
            "tokens_per_second": _rates(rounds[timing.median_round(rounds)]),
            "tokens_per_target_call": s.tokens_per_target_call, "text": demo_pair.decode(spec.tokens)}


def _placement(device: str, dtype: Optional[str]):
    """(whether `device` is a GPU, the dtype name to load the pair in: None keeps the weights' float32)."""
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: this torch sees no CUDA device (torch {torch.__version__})")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gpu = where.type == "cuda"
    chosen = dtype or ("bfloat16" if gpu else None)
    return gpu, None if chosen in (None, "float32") else chosen


def _rates(round_) -> tuple:
    """(speculative, plain) tokens per wall second of one timed round."""
    return (round_.speculative[0].stats.new_tokens / round_.speculative_seconds,
            round_.plain[0].stats.new_tokens / round_.plain_seconds)


def _times(rounds, summary: dict, repeats: int, lenience: float, out: TextIO) -> None:
    """The rounds' table and the speedup next to Theorem 3.8's prediction: one statistic throughout, the
    median of the rounds' speedups, and the tokens per second of the round that has it."""
    s, b = rounds[0][0][0].stats, rounds[0][1][0].stats  # every round generates the same tokens
    middle = timing.median_round(rounds)

    def timed(side: int, of, digits: int = 3) -> str:  # the rounds' median (min-max) of a time
        median, low, high = timing.median_range([of(r[side][0].stats) for r in rounds])
        return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

    def rate(side: int) -> str:  # the median round's tokens per wall second, (min-max) over the rounds
        rates = [_rates(r)[side] for r in rounds]
        return f"{rates[middle]:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"

    threads = summary["threads"]
    print(f"\nTimes: after an untimed warm-up run of each, {repeats} rounds, speculative and plain interleaved, "
          f"with {threads} torch thread{'s' if threads != 1 else ''} (--threads); seconds are medians "
          "(min-max), tokens per second the round of the median speedup (min-max)", file=out)
    print(_row("", "speculative", "plain"), file=out)
    for name, x, y in [
        ("new tokens", s.new_tokens, b.new_tokens),
        ("target calls", s.target_calls, b.target_calls),
        ("draft calls", s.draft_calls, 0),
        ("tokens per target call", f"{s.tokens_per_target_call:.2f}", f"{b.tokens_per_target_call:.2f}"),
        ("acceptance rate", f"{s.acceptance_rate:.3f}", "-"),
        ("alpha (Corollary 3.6)", f"{s.alpha:.3f}", "-"),
        ("draft seconds", timed(0, lambda t: t.draft_seconds), "-"),
        ("target seconds", timed(0, lambda t: t.target_seconds), timed(1, lambda t: t.target_seconds)),
        ("other seconds", timed(0, lambda t: t.other_seconds), timed(1, lambda t: t.other_seconds)),
        ("tokens per second", rate(0), rate(1)),
    ]:
        print(_row(name, x, y), file=out)
    acceptance = summary["acceptance"]
    measured = (f"alpha = {acceptance:.3f}" if lenience == 1.0 else
                f"the acceptance {acceptance:.3f} at lenience {lenience} (A.5)")
    print(f"\n  speedup over plain decoding: {summary['speedup']:.2f}x measured (median of {repeats} rounds, range "
          f"{summary['speedup_min']:.2f}-{summary['speedup_max']:.2f}x; at most {summary['speedup_bound']:.2f}x at "
          f"these tokens per target call and call costs)\n  Theorem 3.8 predicts "
          f"{summary['predicted_speedup']:.2f}x from {measured} and c = {summary['c']:.3f} (draft call / target "
          f"call time);\n  {summary['cost_model_speedup']:.2f}x at the costs the engine measured (wide verification "
          "calls, its own work per iteration)", file=out)
    print(f"  tokens per target call on these drafts, in expectation: {s.token_expected_tokens:.2f} by the token "
          f"rule, {s.block_expected_tokens:.2f} by the block rule (measured {s.tokens_per_target_call:.2f}; "
          f"Equation (1) at this alpha: {summary['expected_tokens']:.2f})", file=out)
    _flags(summary, out)
    print(f"  accepted per draft position: {list(s.accepted_per_position)} of {list(s.drafted_per_position)}",
          file=out)


def _flags(summary: dict, out: TextIO) -> None:
    """A line for each flag of the timing (speculant.timing.timing_checks and summarize)."""
    flags = summary["flag"]
    if "contended" in flags:
        print(f"  contended: the process got {summary['cpu_share']:.0%} of a core in a round (under "
              f"{timing.CONTENDED_SHARE:.0%}): other work held the cores, so these times are not the engine's. "
              "Time on an otherwise idle machine (docs/research.md, 'Timing on a shared machine')", file=out)
    if "impossible" in flags:
        print(f"  impossible: a round ran faster than {summary['speedup_bound']:.2f}x, the most its tokens per target "
              "call allow at its call costs: that round's timing is broken, not the decoding fast", file=out)
    if "noisy" in flags:
        print(f"  noisy: the rounds' speedups spread over more than {timing.SPREAD_THRESHOLD:.0%} of their median "
              "(a busy machine, or runs too short: raise --max-new-tokens or --repeats)", file=out)
    if "off theory" in flags:
        print(f"  off theory: the measured speedup lies outside a factor {timing.THEORY_FACTOR:g} of Theorem 3.8's "
              "prediction", file=out)
