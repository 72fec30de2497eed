"""The demo: speculative decoding with the default pair (trained on first use), its trace drawn like the
paper's Figure 1, and its statistics next to plain decoding of the same target."""

from __future__ import annotations

import json
import sys
from typing import Optional

from . import demo_pair
from .analysis import walltime_improvement
from .decoder import SpeculativeDecoder, generate
from .model import load

DEFAULT_PROMPT = "def __init__(self"


def _row(name: str, spec, plain) -> str:
    return f"  {name:<26}{spec:>14}{plain:>14}"


def run(*, prompt: str = DEFAULT_PROMPT, gamma: int = 4, temperature: float = 0.8, top_k: int = 0,
        top_p: float = 1.0, lenience: float = 1.0, max_new_tokens: int = 200, seed: int = 0,
        color: Optional[bool] = None, out=sys.stdout) -> dict:
    """Runs the demo and prints it; returns the figures it printed."""
    color = out.isatty() if color is None else color
    target_path, draft_path = demo_pair.default_pair(progress=True)
    info = json.loads((target_path.parent / "pair.json").read_text())
    target, draft = load(target_path), load(draft_path)
    prompt_ids = demo_pair.encode(prompt)
    decoder = SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature, top_k=top_k,
                                 top_p=top_p, lenience=lenience)
    # Warm-up: TorchScript optimizes a method on its first calls; time neither run with that in it.
    decoder.generate(prompt_ids, max_new_tokens=16, seed=seed)
    generate(target, prompt_ids, max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    spec = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
    plain = generate(target, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                     top_p=top_p, seed=seed)
    s, b = spec.stats, plain.stats
    print(f"speculant demo: target {info['params']['target']:,} params, draft {info['params']['draft']:,} params "
          f"(byte-level GPTs trained on Python's standard library; held-out loss {info['target_loss']:.3f} / "
          f"{info['draft_loss']:.3f} nats per byte)", file=out)
    print(f"gamma={gamma} temperature={temperature} top_k={top_k} top_p={top_p} lenience={lenience} "
          f"seed={seed}\n", file=out)
    print("Trace (one line per target call; green: accepted draft tokens, red: rejected draft token, "
          "blue: the target's correction, underlined blue: bonus token):" if color else
          "Trace (one line per target call: [accepted:...] draft tokens, the [rejected:...] draft token, and the "
          "target's [correction:...] or [bonus:...] token):", file=out)
    print(spec.trace.with_decoder(demo_pair.decode).render(color=color, prefix=prompt), file=out)
    print(file=out)
    speed = s.new_tokens / s.total_seconds
    plain_speed = b.new_tokens / b.total_seconds
    print(_row("", "speculative", "plain"), file=out)
    for name, x, y in [
        ("new tokens", s.new_tokens, b.new_tokens),
        ("target calls", s.target_calls, b.target_calls),
        ("draft calls", s.draft_calls, 0),
        ("tokens per target call", f"{s.tokens_per_target_call:.2f}", f"{b.tokens_per_target_call:.2f}"),
        ("acceptance rate", f"{s.acceptance_rate:.3f}", "-"),
        ("alpha (Corollary 3.6)", f"{s.alpha:.3f}", "-"),
        ("draft seconds", f"{s.draft_seconds:.3f}", "-"),
        ("target seconds", f"{s.target_seconds:.3f}", f"{b.target_seconds:.3f}"),
        ("other seconds", f"{s.other_seconds:.3f}", f"{b.other_seconds:.3f}"),
        ("tokens per second", f"{speed:.1f}", f"{plain_speed:.1f}"),
    ]:
        print(_row(name, x, y), file=out)
    c = (s.draft_seconds / max(s.draft_calls, 1)) / (b.target_seconds / max(b.target_calls, 1))
    a, g = s.alpha, gamma
    predicted = walltime_improvement(a, g, c)
    print(f"\n  speedup over plain decoding: {speed / plain_speed:.2f}x measured; Theorem 3.8 predicts "
          f"{predicted:.2f}x from alpha = {a:.3f} and c = {c:.3f} (draft call / target call time)", file=out)
    print(f"  accepted per draft position: {list(s.accepted_per_position)} of {list(s.drafted_per_position)}",
          file=out)
    return {"speedup": speed / plain_speed, "predicted": predicted, "alpha": a, "c": c,
            "tokens_per_target_call": s.tokens_per_target_call, "text": demo_pair.decode(spec.tokens)}


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="speculant demo", description=__doc__)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--lenience", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    args = parser.parse_args(argv)
    color = {"auto": None, "always": True, "never": False}[args.color]
    run(prompt=args.prompt, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        lenience=args.lenience, max_new_tokens=args.max_new_tokens, seed=args.seed, color=color)
    return 0
