"""Soak: many generations mixing sampling modes, drafters, gamma policies, EOS stops and errors raised mid-run,
with resident memory (RSS, /proc/self/statm) measured after a warm-up and at the end (issue 15).

    python benchmarks/soak.py                          # 10,000 generations on the CPU
    python benchmarks/soak.py --generations 500 --device cuda

Models: small random TinyGPTs (cached TorchScript contract; what they generate does not matter here, what the
engine holds on to does): a target, a draft model, a plain-form copy of the target, and a plain-form model
whose logits turn NaN past a position (the engine raises ValueError mid-run). Drafters: the draft model,
speculant.drafters.Unigram / Bigram / PromptLookup, a Python drafter, and per error case a Python drafter
that raises or proposes NaN. Generation i takes case i modulo the list of cases (every drafter x sampling mode x
gamma policy, and every error case), a prompt and, for every other run that should succeed, an EOS id from a
seeded generator; every 10th generation builds its decoder afresh instead of reusing one.

Reported: generations, tokens and errors by type; RSS after the warm-up and at the end, and the growth in %;
on CUDA, after each generation (torch.cuda.synchronize) how many left torch.cuda.memory_allocated() above its
value after the warm-up.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import time
from typing import Callable, Dict, List, Optional

import torch

import speculant
from speculant import drafters, tiny_gpt

VOCAB = 64
MAX_LENGTH = 96
MODES = {"greedy": dict(temperature=0.0), "temperature": dict(temperature=0.8),
         "top_k": dict(temperature=1.0, top_k=8), "top_p": dict(temperature=1.0, top_p=0.9)}
POLICIES = {"fixed": {}, "heuristic": dict(gamma_policy="heuristic", max_gamma=6),
            "alpha": dict(gamma_policy="alpha", max_gamma=6, cost=0.1)}


def rss_bytes() -> int:
    """Resident set size of this process (Linux: /proc/self/statm, second field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class DrafterError(RuntimeError):
    """What the raising Python drafter raises: it must reach the caller with its type."""


class NaNAfter(torch.nn.Module):
    """Plain contract, forward(input_ids[1, T]) -> logits[1, T, V]: an embedding lookup whose logits are NaN at
    positions >= `after` (the one-token probe at load passes; a longer run fails mid-generation)."""

    def __init__(self, vocab: int, after: int):
        super().__init__()
        self.after = after
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.table[input_ids]  # [1, T, V]
        if input_ids.size(1) > self.after:
            logits[:, self.after:] = float("nan")
        return logits


def tiny(layers: int, d_model: int, seed: int) -> tiny_gpt.TinyGPT:
    torch.manual_seed(seed)
    return tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(VOCAB, layers, 2, d_model, MAX_LENGTH)).eval()


def point_mass(token: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([token]), VOCAB).to(torch.float32)  # [1, V]


def python_propose(context: List[int], gamma: int):
    """A drafter of the next token as (last token + 1) mod V, as a point mass."""
    token = (context[-1] + 1) % VOCAB
    return [token], point_mass(token)


def raising_propose(context: List[int], gamma: int):
    if len(context) > 6:
        raise DrafterError("the drafter gave up")
    return python_propose(context, gamma)


def nan_propose(context: List[int], gamma: int):
    tokens, q = python_propose(context, gamma)
    return tokens, q * float("nan") if len(context) > 6 else q


class Soak:
    """The models, drafters and cases; run(i) performs generation i and returns its outcome."""

    def __init__(self, device: str, seed: int):
        self.device = device
        load = lambda module: speculant.load(module, device=device)  # noqa: E731
        target = tiny(2, 32, seed)
        self.target = load(tiny_gpt.script_cached(target))
        self.target_plain = load(tiny_gpt.script_plain(target))
        self.draft = load(tiny_gpt.script_cached(tiny(1, 16, seed + 1)))
        torch.manual_seed(seed + 2)
        self.nan_model = load(torch.jit.script(NaNAfter(VOCAB, after=8)))
        corpus = torch.randint(0, VOCAB, (4000,), generator=torch.Generator().manual_seed(seed + 3))
        self.drafters: Dict[str, Callable[[], object]] = {
            "draft_model": lambda: self.draft,
            "unigram": lambda: drafters.Unigram.fit(corpus, VOCAB, device=device),
            "bigram": lambda: drafters.Bigram.fit(corpus, VOCAB, device=device),
            "prompt_lookup": lambda: drafters.PromptLookup(VOCAB, device=device),
            "python": lambda: drafters.PythonDrafter(python_propose, VOCAB, device=device),
        }
        self.made = {name: make() for name, make in self.drafters.items()}
        self.cases: List[tuple] = [("ok", d, m, p) for d, m, p in itertools.product(self.drafters, MODES, POLICIES)]
        self.cases += [("plain", None, m, "fixed") for m in MODES]
        self.cases += [("nan_target", "draft_model", "temperature", "fixed"), ("nan_target", None, "greedy", "fixed"),
                       ("nan_draft", "nan_model", "top_k", "fixed"),
                       ("raising_drafter", "raising", "top_p", "heuristic"),
                       ("nan_drafter", "nan_q", "temperature", "alpha")]
        self.decoders: Dict[tuple, speculant.SpeculativeDecoder] = {}
        self.random = torch.Generator().manual_seed(seed + 4)

    def _draft(self, name: str, fresh: bool):
        if name == "nan_model":
            return self.nan_model
        if name in ("raising", "nan_q"):
            return drafters.PythonDrafter(raising_propose if name == "raising" else nan_propose, VOCAB,
                                          device=self.device)
        return self.drafters[name]() if fresh else self.made[name]

    def _decoder(self, case: tuple, fresh: bool) -> speculant.SpeculativeDecoder:
        kind, draft, mode, _ = case
        if fresh or case not in self.decoders:
            target = self.nan_model if kind == "nan_target" else self.target
            made = speculant.SpeculativeDecoder(target, self._draft(draft, fresh), gamma=3, **MODES[mode])
            if fresh:
                return made
            self.decoders[case] = made
        return self.decoders[case]

    def run(self, i: int) -> tuple:
        """Generation i: (case kind, new tokens, the exception's type name or None)."""
        case = self.cases[i % len(self.cases)]
        kind, draft, mode, policy = case
        length = int(torch.randint(1, 9, (1,), generator=self.random))
        prompt = torch.randint(0, VOCAB, (length,), generator=self.random).tolist()
        eos = int(torch.randint(0, VOCAB, (1,), generator=self.random))
        eos = eos if i % 2 and kind in ("ok", "plain") else None  # an error case always reaches its error
        kwargs = dict(max_new_tokens=24, eos_token_id=eos, seed=i)
        try:
            if kind == "plain" or draft is None:
                target = self.nan_model if kind == "nan_target" else self.target_plain
                result = speculant.generate(target, prompt, **kwargs, **MODES[mode])
            else:
                result = self._decoder(case, fresh=i % 10 == 0).generate(prompt, **kwargs, **POLICIES[policy])
            return kind, len(result.tokens), None
        except (ValueError, DrafterError) as error:
            if kind in ("ok", "plain"):
                raise
            return kind, 0, type(error).__name__


def soak(generations: int, warmup: int, device: str = "cpu", seed: int = 0, report_every: int = 0) -> dict:
    """Runs `warmup` then `generations` generations; returns the figures (see the module docstring)."""
    state = Soak(device, seed)
    cuda = device.startswith("cuda")
    for i in range(warmup):
        state.run(i)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        allocated_base = torch.cuda.memory_allocated()
    rss_base = rss_bytes()
    counts: Dict[str, int] = {}
    errors: Dict[str, int] = {}
    tokens, cuda_above, trend = 0, 0, []
    start = time.perf_counter()
    for i in range(warmup, warmup + generations):
        kind, new, error = state.run(i)
        counts[kind] = counts.get(kind, 0) + 1
        tokens += new
        if error:
            errors[f"{kind}: {error}"] = errors.get(f"{kind}: {error}", 0) + 1
        if cuda:
            torch.cuda.synchronize()
            cuda_above += torch.cuda.memory_allocated() > allocated_base
        if report_every and (i - warmup + 1) % report_every == 0:
            trend.append((i - warmup + 1, rss_bytes()))
            print(f"  {i - warmup + 1} generations: RSS {trend[-1][1] / 2**20:.1f} MiB", flush=True)
    seconds = time.perf_counter() - start
    gc.collect()
    rss_end = rss_bytes()
    expected = {"nan_target", "nan_draft", "raising_drafter", "nan_drafter"}
    return {
        "device": device, "generations": generations, "warmup": warmup, "cases": len(state.cases),
        "by_kind": counts, "errors": errors, "new_tokens": tokens, "seconds": seconds,
        "rss_after_warmup_mib": rss_base / 2**20, "rss_end_mib": rss_end / 2**20,
        "rss_growth_percent": 100.0 * (rss_end - rss_base) / rss_base,
        "rss_trend_mib": [(n, r / 2**20) for n, r in trend],
        "cuda_generations_above_baseline": cuda_above if cuda else None,
        "error_cases_that_raised": sum(errors.values()), "error_cases": sum(counts.get(k, 0) for k in expected),
    }


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=int, default=10_000, help="measured generations (default 10000)")
    parser.add_argument("--warmup", type=int, default=500, help="generations before the baseline (default 500)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--report-every", type=int, default=1000, help="print RSS every this many generations")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    torch.set_num_threads(args.threads)
    figures = soak(args.generations, args.warmup, args.device, args.seed, args.report_every)
    print(json.dumps(figures, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)
    return figures


if __name__ == "__main__":
    main()
