"""Time per iteration of Algorithm 1 spent outside the models' forward calls (sampling math, verification,
bookkeeping, cache rollback): speculant's C++ engine against a straightforward pure-PyTorch implementation of
the same algorithm on the same TorchScript models, measured side by side in one run.

    python benchmarks/overhead.py [--gamma 4] [--generations 6] [--tokens 128]
    python benchmarks/overhead.py --trees 2,1,1 3,2,1 [--siblings coupled] [--batch 16] [--cuda-graphs fixed]
                                                        # chains and trees, both paths

With --trees: the engine's overhead per iteration for the chain of --gamma and each tree, on the CPU's host
kernels and on the tensor path that accelerators run (speculant.testing.tensor_path: the same code as on a GPU,
less the CUDA graphs; on a CPU each tensor operation costs microseconds of dispatch, as each costs a kernel launch
on a GPU, so this path's overhead on the CPU shows what a GPU's host pays per iteration for it). Medians over the
generations with min-max, the configurations interleaved. Beside them, from one profiled generation each (seed 0),
the engine's operations per iteration that would each launch a GPU kernel (views and no-op conversions left out):
exact counts, where a CPU's timings of microsecond operations are noisy. With --batch B, B prompts decode as one
batch: each row's overhead per iteration (the batch's time outside its model calls, over the row's iterations),
averaged over the rows; the operations per iteration are the batch's. With --cuda-graphs fixed every model call
runs through the fixed-shape buffers that a GPU's CUDA graphs replay (uncaptured on a CPU), as calls do on a GPU
with graphs on: the count then includes the copies into those buffers (a host-to-device copy stays a copy on the
CPU), the verification's work through its own buffers (cpp/device/verification_graphs.h) and the draft's draws inside
its calls (cpp/models/rows.h: extend_then, extend_tree_then). Its "captured" column counts what a GPU would launch with
those graphs captured: the verification's work as one replay and the copy of its output, the draws inside the
call's replay, and each model call's graph output copied once.

Goal (issue 2): the engine's overhead is under 20% of the pure-PyTorch one's, and under 5% of an iteration for
a target of at least 10M parameters. Weights are random (seeded): overhead depends on shapes and on how many
drafts are accepted, not on what the models learned; alpha is printed so the acceptance pattern is visible.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
import warnings

import torch

import speculant
from speculant.testing import tensor_path
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached

warnings.filterwarnings("ignore", message=r".*TorchScript.*")


class PurePyTorch:
    """Algorithm 1 written directly in PyTorch, calling the same cached-contract modules."""

    def __init__(self, target, draft, gamma: int, temperature: float):
        self.target, self.draft, self.gamma, self.temperature = target, draft, gamma, temperature
        self.model_seconds = 0.0

    def _call(self, fn, ids):
        start = time.perf_counter()
        out = fn(ids)
        self.model_seconds += time.perf_counter() - start
        return out

    def generate(self, prompt: list, max_new_tokens: int, generator: torch.Generator):
        ids = torch.tensor([prompt])
        self._call(self.target.prefill, ids[:, :-1])
        self._call(self.draft.prefill, ids[:, :-1])
        tokens, pending_t, pending_d, iterations = [], ids[:, -1:], ids[:, -1:], 0
        while len(tokens) < max_new_tokens:
            gamma = min(self.gamma, max_new_tokens - len(tokens) - 1)
            length = self.target.cache_length() + pending_t.size(1)
            drafts, qs, feed = [], [], pending_d
            for _ in range(gamma):
                q = torch.softmax(self._call(self.draft.extend, feed)[0, -1] / self.temperature, -1)
                x = torch.multinomial(q, 1, generator=generator)
                drafts.append(int(x))
                qs.append(q)
                feed = x.view(1, 1)
            logits = self._call(self.target.extend, torch.cat([pending_t, torch.tensor([drafts], dtype=torch.long)], 1))
            p = torch.softmax(logits[0] / self.temperature, -1)  # [gamma + 1, V]
            n = 0
            while n < gamma:
                x = drafts[n]
                r = torch.rand((), generator=generator)
                if r < torch.clamp(p[n, x] / qs[n][x], max=1.0):
                    n += 1
                else:
                    break
            if n < gamma:
                residual = torch.clamp(p[n] - qs[n], min=0)
                t = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            else:
                t = int(torch.multinomial(p[gamma], 1, generator=generator))
            new = drafts[:n] + [t]
            tokens += new[: max_new_tokens - len(tokens)]
            iterations += 1
            self.target.truncate(length + n)
            if n < gamma:
                self.draft.truncate(length + n)
                pending_d = torch.tensor([[t]])
            else:
                pending_d = torch.tensor([[drafts[-1], t]]) if gamma else torch.tensor([[t]])
            pending_t = torch.tensor([[t]])
        return tokens, iterations


# Operations that launch no kernel on a GPU (views, allocations, metadata); `to`, `reshape`, `contiguous` and
# `flatten` launch one only where they copy (a child that copies).
NO_LAUNCH = {"aten::" + name for name in (
    "narrow", "slice", "select", "squeeze", "unsqueeze", "view", "reshape", "expand", "flatten", "as_strided",
    "permute", "transpose", "t", "alias", "detach", "to", "contiguous", "empty", "empty_strided", "numel", "size",
    "resolve_conj", "resolve_neg", "lift_fresh", "_reshape_alias", "unbind", "split", "chunk")}
COPIES = {"aten::_to_copy", "aten::copy_", "aten::clone"}


PHASES = ("draft", "verify", "accept")  # the engine's profiler scopes, "speculant::<phase>" (cpp/loop/batch.cpp)


def operations_per_iteration(decoder, prompts, tokens: int) -> dict:
    """The engine's tensor operations per iteration that would each launch a kernel on a GPU (views and no-op
    conversions left out), outside the models' calls, by phase (PHASES; "other": outside them, once per
    generation): one generation under torch.profiler, counting the operations the engine itself calls, at the top
    level or directly in a phase's scope (a model's calls are TorchScript methods, whose operations nest under
    them). Also "captured": the operations a GPU would launch with the graphs captured: the verification's work
    through its buffers (cpp/device/verification_graphs.h, its "speculant::graphed" scope) becomes one replay and the copy
    of its output, the draft's draws inside its calls (rows.h: extend_then, extend_tree_then; "speculant::fused")
    join the call's replay, and each model call through fixed-shape buffers adds the copy of its graph's output
    (graphs.h)."""
    # acc_events: no schedule, so one cycle either way; without it torch 2.11's profiler warns that it clears events
    # at each cycle's end (an error under the suite's warnings-as-errors; fixed in later releases)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profile:
        results = decoder.generate(prompts, max_new_tokens=tokens, seed=0)
    results = results if isinstance(results, list) else [results]
    launches = dict.fromkeys(PHASES + ("other",), 0)
    graphed = replays = 0  # operations inside graphs (the verification's, a step's draws); the verification's runs
    for event in profile.events():
        parent = event.cpu_parent
        inside = parent is not None and parent.name in ("speculant::graphed", "speculant::fused")
        if inside:
            parent = parent.cpu_parent
        phase = parent.name.removeprefix("speculant::") if parent is not None else "other"
        if phase not in launches:
            continue
        if event.name == "speculant::graphed":
            replays += 1
        elif event.name.startswith("aten::") and (
                event.name not in NO_LAUNCH or any(child.name in COPIES for child in event.cpu_children)):
            launches[phase] += 1
            graphed += inside
    iterations = max(r.stats.iterations for r in results)
    out = {phase: count / iterations for phase, count in launches.items()}
    fixed_calls = sum(max(getattr(r.stats, calls) for r in results)
                      for calls, shapes in zip(("target_calls", "draft_calls"), decoder.shapes) if shapes != "dynamic")
    return out, (sum(launches.values()) - graphed + 2 * replays + fixed_calls) / iterations


def tree_overhead(target, draft, args) -> None:
    """The engine's overhead per iteration for the chain and each tree, on host kernels and on the tensor path."""
    drafts = [(f"chain gamma = {args.gamma}", dict(gamma=args.gamma))]
    drafts += [(f"tree {shape} {args.siblings}", dict(tree=[int(k) for k in shape.split(",")], siblings=args.siblings))
               for shape in args.trees]
    decoders = {name: speculant.SpeculativeDecoder(target, draft, temperature=args.temperature,
                                                   cuda_graphs=args.cuda_graphs, **options)
                for name, options in drafts}
    prompts = [list(range(1 + b, 17 + b)) for b in range(args.batch)]
    runs, operations = {}, {}
    for path in ("host kernels", "tensor path"):
        with tensor_path() if path == "tensor path" else contextlib.nullcontext():
            for name, decoder in decoders.items():  # warm-up, then the operations count (not timed)
                decoder.generate(prompts, max_new_tokens=32, seed=0)
                operations[name, path] = operations_per_iteration(decoder, prompts, args.tokens)
            for g in range(args.generations):
                for name, decoder in decoders.items():
                    results = decoder.generate(prompts, max_new_tokens=args.tokens, seed=g)
                    results = results if isinstance(results, list) else [results]  # one prompt: one Result
                    rows = [r.stats for r in results]
                    runs.setdefault((name, path), []).append(tuple(statistics.mean(column) for column in zip(*(
                        (s.other_seconds / s.iterations * 1e6, s.total_seconds / s.iterations * 1e3,
                         s.new_tokens / s.iterations) for s in rows))))
    print("| draft | path | engine overhead / iteration (µs) [min-max] | operations / iteration | of which draft, "
          "verify, accept, other | captured (GPU estimate) | iteration (ms) | tokens / iteration |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, path), values in runs.items():
        other, total, tokens = (sorted(column) for column in zip(*values))
        counts, captured = operations[name, path]
        captured = f"{captured:.1f}" if path == "tensor path" and args.cuda_graphs == "fixed" else "-"
        print(f"| {name} | {path} | {statistics.median(other):.0f} [{other[0]:.0f}-{other[-1]:.0f}] | "
              f"{sum(counts.values()):.1f} | {', '.join(f'{v:.1f}' for v in counts.values())} | "
              f"{captured} | {statistics.median(total):.2f} | {statistics.median(tokens):.2f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trees", nargs="*", default=None, metavar="K1,K2,..",
                        help="measure the chain and these trees on both paths instead of the pure-PyTorch comparison")
    parser.add_argument("--siblings", default="coupled")
    parser.add_argument("--batch", type=int, default=1, help="with --trees: prompts decoded as one batch")
    parser.add_argument("--cuda-graphs", choices=("off", "fixed"), default="off",
                        help="with --trees: 'fixed' runs every model call through the fixed-shape buffers that a GPU's "
                             "graphs replay (uncaptured here), so that the count includes the copies into them")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    target = TinyGPT(TinyGPTConfig(vocab_size=args.vocab, n_layer=6, n_head=6, d_model=384, max_length=512)).eval()
    torch.manual_seed(1)
    draft = TinyGPT(TinyGPTConfig(vocab_size=args.vocab, n_layer=1, n_head=2, d_model=128, max_length=512)).eval()
    params = sum(p.numel() for p in target.parameters())
    draft_params = sum(p.numel() for p in draft.parameters())
    target_script, draft_script = script_cached(target), script_cached(draft)
    if args.trees is not None:
        print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
              f"torch {torch.__version__}, CPU; target {params / 1e6:.1f}M params, draft {draft_params / 1e6:.2f}M, "
              f"vocab {args.vocab}, temperature {args.temperature}, {args.generations} x {args.tokens} tokens, "
              f"batch {args.batch}, cuda_graphs {args.cuda_graphs}")
        tree_overhead(speculant.load(target_script), speculant.load(draft_script), args)
        return
    engine = speculant.SpeculativeDecoder(speculant.load(target_script), speculant.load(draft_script),
                                          gamma=args.gamma, temperature=args.temperature)
    pure = PurePyTorch(target_script, draft_script, args.gamma, args.temperature)
    prompt = list(range(1, 17))

    # Warm up both (TorchScript profiles and optimizes methods on their first calls).
    engine.generate(prompt, max_new_tokens=32, seed=0)
    pure.generate(prompt, 32, torch.Generator().manual_seed(0))

    e_other = e_total = p_other = p_total = 0.0
    e_iters = p_iters = 0
    alphas = []
    for g in range(args.generations):  # interleaved, so both see the same machine state
        r = engine.generate(prompt, max_new_tokens=args.tokens, seed=g)
        e_other += r.stats.other_seconds
        e_total += r.stats.total_seconds
        e_iters += r.stats.iterations
        alphas.append(r.stats.alpha)
        pure.model_seconds = 0.0
        start = time.perf_counter()
        _, iterations = pure.generate(prompt, args.tokens, torch.Generator().manual_seed(g))
        total = time.perf_counter() - start
        p_other += total - pure.model_seconds
        p_total += total
        p_iters += iterations

    e_per, p_per = e_other / e_iters * 1e6, p_other / p_iters * 1e6
    e_frac = e_other / e_total
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, CPU")
    print(f"target {params / 1e6:.1f}M params, draft {draft_params / 1e6:.2f}M params, vocab {args.vocab}, "
          f"gamma {args.gamma}, temperature {args.temperature}, {args.generations} x {args.tokens} tokens, "
          f"alpha {sum(alphas) / len(alphas):.3f}")
    print(f"{'':<28}{'speculant (C++)':>18}{'pure PyTorch':>16}")
    print(f"{'iterations':<28}{e_iters:>18}{p_iters:>16}")
    print(f"{'overhead per iteration (us)':<28}{e_per:>18.1f}{p_per:>16.1f}")
    print(f"{'iteration time (ms)':<28}{e_total / e_iters * 1e3:>18.2f}{p_total / p_iters * 1e3:>16.2f}")
    print(f"{'overhead share of iteration':<28}{e_frac:>18.1%}{p_other / p_total:>16.1%}")
    ratio = e_per / p_per
    print(f"engine overhead / pure-PyTorch overhead: {ratio:.1%} (goal < 20%: {'met' if ratio < 0.2 else 'NOT met'})")
    print(f"engine overhead share of an iteration: {e_frac:.1%} (goal < 5%: {'met' if e_frac < 0.05 else 'NOT met'})")


if __name__ == "__main__":
    main()
