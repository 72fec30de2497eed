"""Table-driven Markov language models in both forms of speculant's TorchScript model contract.

A model is a logits table ``table[parity, prev2, prev1] -> logits [V]`` of shape [2, V+1, V, V]:
the next-token logits after a sequence s depend on its last two tokens and on the parity of the
position being predicted. ``prev2 == V`` (START) stands for "no token" at the first position. The
second-order and parity dependence make a wrong cache, an off-by-one cache length or a missed
rollback change the outputs (a first-order, position-free model would hide them).

For the row of logits after token index j of the full sequence s (0-based; the row predicts index
j + 1):  parity = (j + 1) % 2,  prev1 = s[j],  prev2 = s[j - 1] if j >= 1 else START.

The cached form keeps its token history as its "KV cache" and checks every call against the
contract (input shape, dtype and range, max_length, truncate bounds), so an engine that breaks the
contract fails loudly. Both forms count their calls in ``calls`` so tests can compare the engine's
statistics with what really happened.

Exact laws: ``continuation_law`` enumerates the target's k-token continuation law under a sampling
configuration with tests/support/reference.py's standardize; ``speculative_law`` enumerates the law of the
first k tokens produced by Algorithm 1 (any lenience), memoised on the Markov state.
"""

import itertools
from typing import Callable, List, Optional, Sequence

import torch

from . import reference

Tensor = torch.Tensor


# --------------------------------------------------------------------------------------------------
# TorchScript modules
# --------------------------------------------------------------------------------------------------


class MarkovCached(torch.nn.Module):
    """Cached contract form: prefill / extend / truncate / cache_length over a token history."""

    vocab_size: int
    max_length: int
    calls: int
    history: List[int]

    def __init__(self, table: Tensor, max_length: int = 0):
        super().__init__()
        self.register_buffer("table", table.clone())  # [2, V+1, V, V]
        self.vocab_size = int(table.shape[-1])
        self.max_length = max_length
        self.calls = 0
        self.history = []

    def _rows(self, start: int) -> Tensor:
        """Logits rows for history positions start..len-1 -> [1, len - start, V]."""
        n = len(self.history)
        hist = torch.tensor(self.history, dtype=torch.long, device=self.table.device)
        pos = torch.arange(start, n, device=self.table.device)
        prev1 = hist[start:n]
        before = hist[torch.clamp(pos - 1, min=0)]
        prev2 = torch.where(pos >= 1, before, torch.full_like(before, self.vocab_size))
        parity = (pos + 1) % 2
        return self.table[parity, prev2, prev1].unsqueeze(0)

    def _append(self, input_ids: Tensor) -> int:
        if input_ids.dim() != 2 or input_ids.size(0) != 1 or input_ids.size(1) < 1:
            raise RuntimeError("MarkovCached: input_ids must have shape [1, k], k >= 1")
        if input_ids.dtype != torch.long:
            raise RuntimeError("MarkovCached: input_ids must be int64")
        if bool((input_ids < 0).any()) or bool((input_ids >= self.vocab_size).any()):
            raise RuntimeError("MarkovCached: token id out of range")
        start = len(self.history)
        if self.max_length > 0 and start + input_ids.size(1) > self.max_length:
            raise RuntimeError("MarkovCached: cache overflow past max_length")
        ids: List[int] = input_ids[0].tolist()
        for t in ids:
            self.history.append(t)
        self.calls += 1
        return start

    @torch.jit.export
    def prefill(self, input_ids: Tensor) -> Tensor:
        self.history = torch.jit.annotate(List[int], [])
        return self._rows(self._append(input_ids))

    @torch.jit.export
    def extend(self, input_ids: Tensor) -> Tensor:
        # After truncate(0) this is a prefill: the contract allows extending an empty cache.
        return self._rows(self._append(input_ids))

    @torch.jit.export
    def truncate(self, length: int) -> None:
        if length < 0 or length > len(self.history):
            raise RuntimeError("MarkovCached: truncate length out of range")
        self.history = self.history[:length]

    @torch.jit.export
    def cache_length(self) -> int:
        return len(self.history)

    def forward(self, input_ids: Tensor) -> Tensor:
        # Not used by the engine for cached models; present so the module is a normal nn.Module.
        return self.prefill(input_ids)


class MarkovPlain(torch.nn.Module):
    """Plain contract form: forward(input_ids [1, T]) -> logits [1, T, V], no state."""

    vocab_size: int
    calls: int

    def __init__(self, table: Tensor):
        super().__init__()
        self.register_buffer("table", table.clone())
        self.vocab_size = int(table.shape[-1])
        self.calls = 0

    def forward(self, input_ids: Tensor) -> Tensor:
        if input_ids.dim() != 2 or input_ids.size(0) != 1 or input_ids.size(1) < 1:
            raise RuntimeError("MarkovPlain: input_ids must have shape [1, T], T >= 1")
        if bool((input_ids < 0).any()) or bool((input_ids >= self.vocab_size).any()):
            raise RuntimeError("MarkovPlain: token id out of range")
        self.calls += 1
        ids = input_ids[0]
        n = ids.size(0)
        pos = torch.arange(0, n, device=ids.device)
        before = ids[torch.clamp(pos - 1, min=0)]
        prev2 = torch.where(pos >= 1, before, torch.full_like(before, self.vocab_size))
        parity = (pos + 1) % 2
        return self.table[parity, prev2, ids].unsqueeze(0)


def cached_model(table: Tensor, *, max_length: int = 0, dtype: torch.dtype = torch.float32):
    """TorchScript cached-form model over ``table`` (logits emitted in ``dtype``)."""
    return torch.jit.script(MarkovCached(table.to(dtype), max_length))


def plain_model(table: Tensor, *, dtype: torch.dtype = torch.float32):
    """TorchScript plain-form model over ``table``."""
    return torch.jit.script(MarkovPlain(table.to(dtype)))


def script(table: Tensor, form: str, **kwargs):
    """``cached_model`` or ``plain_model`` by name ("cached" / "plain")."""
    if form == "cached":
        return cached_model(table, **kwargs)
    if form == "plain":
        return plain_model(table, dtype=kwargs.get("dtype", torch.float32))
    raise ValueError(f"unknown form {form!r}")


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------


def random_table(
    vocab: int,
    seed: int,
    *,
    concentration: float = 1.0,
    mask_prob: float = 0.0,
    floor: float = 1e-4,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Random logits table [2, V+1, V, V]: log of Dirichlet(concentration) rows, floored at ``floor``.

    With mask_prob > 0 each logit is set to -inf (a masked token) with that probability, keeping the
    largest entry of each row so no row is all -inf. The values are rounded to ``dtype`` (what a
    model emitting ``dtype`` logits produces) and returned as float64.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (2, vocab + 1, vocab, vocab)
    gamma = torch._standard_gamma(torch.full(shape, float(concentration), dtype=torch.float64), gen)
    probs = gamma / gamma.sum(-1, keepdim=True)
    logits = torch.log(torch.clamp(probs, min=floor))
    if mask_prob > 0:
        mask = torch.rand(shape, generator=gen, dtype=torch.float64) < mask_prob
        keep = torch.nn.functional.one_hot(logits.argmax(-1), vocab).bool()
        logits = logits.masked_fill(mask & ~keep, float("-inf"))
    return logits.to(dtype).to(torch.float64)


def perturb(table: Tensor, seed: int, scale: float, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """A draft table near ``table``: Gaussian noise of std ``scale`` added to the finite logits."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(table.shape, generator=gen, dtype=torch.float64) * scale
    out = torch.where(torch.isfinite(table), table + noise, table)
    return out.to(dtype).to(torch.float64)


def target_and_draft(
    vocab: int,
    seed: int,
    *,
    draft_scale: float = 0.7,
    concentration: float = 1.0,
    mask_prob: float = 0.0,
    independent_draft: bool = False,
) -> tuple[Tensor, Tensor]:
    """A random target table and a draft: perturbed from it, or (independent_draft) unrelated.

    An unrelated draft gets its own masks, so the draft proposes tokens the target forbids and the
    target allows tokens the draft never proposes (both edges of the acceptance rule).
    """
    target = random_table(vocab, seed, concentration=concentration, mask_prob=mask_prob)
    if independent_draft:
        draft = random_table(vocab, seed + 7919, concentration=concentration, mask_prob=mask_prob)
    else:
        draft = perturb(target, seed + 104729, draft_scale)
    return target, draft


def constant_table(dist: Tensor) -> Tensor:
    """A table whose every context has the same next-token distribution ``dist`` [V] (i.i.d. tokens)."""
    vocab = int(dist.shape[-1])
    return dist.to(torch.float64).log().expand(2, vocab + 1, vocab, vocab).clone()


# --------------------------------------------------------------------------------------------------
# Exact laws
# --------------------------------------------------------------------------------------------------


def START(table: Tensor) -> int:
    return int(table.shape[-1])


def row_logits(table: Tensor, tokens: list[int]) -> Tensor:
    """Next-token logits [V] after the sequence ``tokens`` (len >= 1)."""
    m = len(tokens)  # index of the predicted token
    prev2 = tokens[-2] if m >= 2 else START(table)
    return table[m % 2, prev2, tokens[-1]]


def standardized_table(table: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """reference.standardize applied to every row of the table -> probabilities [2, V+1, V, V]."""
    return reference.standardize(table, temperature, top_k, top_p)


def continuation_law(
    table: Tensor,
    prompt: list[int],
    k: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Exact law of the next k tokens after ``prompt`` under the sampling config -> [V] * k, float64."""
    vocab = int(table.shape[-1])
    probs = standardized_table(table, temperature, top_k, top_p)  # [2, V+1, V, V]
    law = torch.ones((), dtype=torch.float64)
    for i in range(1, k + 1):  # predicting continuation token c_i, at sequence index m
        m = len(prompt) + i - 1
        cond = probs[m % 2]  # [V+1 (prev2), V (prev1), V (next)]
        if i >= 3:  # prev2 = c_{i-2}, prev1 = c_{i-1}: both are law axes
            cond = cond[:vocab]  # [V, V, V]
        elif i == 2:  # prev2 = last prompt token, prev1 = c_1
            cond = cond[prompt[-1]]  # [V, V]
        else:  # prev2 = second to last prompt token (or START), prev1 = last prompt token
            prev2 = prompt[-2] if len(prompt) >= 2 else vocab
            cond = cond[prev2, prompt[-1]]  # [V]
        law = law.unsqueeze(-1) * cond
    return law


def marginal(law: Tensor, axes: list[int]) -> Tensor:
    """Marginal of a joint law [V] * k on the given (sorted) axes."""
    drop = [a for a in range(law.dim()) if a not in axes]
    return law.sum(dim=drop) if drop else law


VerifyFn = Callable[..., tuple[Tensor, Tensor]]


def speculative_law(
    target: Tensor,
    draft: Tensor,
    prompt: list[int],
    k: int,
    gamma: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    lenience: float = 1.0,
    verify: VerifyFn = reference.verify,
    clamp_gamma: bool = True,
    draft_block: Optional[Callable[[List[int], int], Tensor]] = None,
) -> Tensor:
    """Exact law [V] * k of the first k tokens produced by repeated Algorithm 1 steps.

    Each step drafts γ tokens from the draft's standardized distributions, verifies them with
    ``verify`` (reference.verify or speculant.sampling.verify), emits the accepted prefix and one
    correction / bonus token; tokens past k are cut. Memoised on the Markov state, since the law of
    what follows depends only on (prev2, prev1, parity of the next index) and the tokens still due.

    clamp_gamma: draft min(γ, tokens still due - 1) tokens, as the engine does (a longer draft is
    wasted work). With lenience 1 the law is the target's either way; with lenience < 1 the law of
    the last tokens depends on this schedule.

    draft_block(context, n): the joint law [V] * n of the n draft tokens after ``context`` when they are not
    drawn one by one from the draft's q (a hierarchical draft: see hierarchical_law); the verification still
    takes the draft table's standardized rows as q.
    """
    vocab = int(target.shape[-1])
    q_table = standardized_table(draft, temperature, top_k, top_p)  # [2, V+1, V, V]
    q_list = q_table.tolist()
    memo: dict[tuple[int, int, int, int], Tensor] = {}

    def law_after(seq: tuple[int, ...], remaining: int) -> Tensor:
        if remaining == 0:
            return torch.ones((), dtype=torch.float64)
        prev2 = seq[-2] if len(seq) >= 2 else vocab
        key = (prev2, seq[-1], len(seq) % 2, remaining)
        if key in memo:
            return memo[key]
        # Probability of each emitted block (accepted drafts + one token, cut at `remaining`).
        emitted_prob: dict[tuple[int, ...], float] = {}
        block = min(gamma, remaining - 1) if clamp_gamma else gamma
        block_law = draft_block(list(seq), block).tolist() if draft_block is not None and block > 0 else None
        for xs in itertools.product(range(vocab), repeat=block):
            ctx = list(seq)
            q_rows, p_logits, weight = [], [], 1.0
            if block_law is not None:
                weight = block_law
                for x in xs:
                    weight = weight[x]
            for x in xs:
                q_row = q_list[len(ctx) % 2][ctx[-2] if len(ctx) >= 2 else vocab][ctx[-1]]
                if block_law is None:
                    weight *= q_row[x]
                q_rows.append(q_row)
                p_logits.append(row_logits(target, ctx))
                ctx.append(x)
            if weight == 0.0:
                continue
            p_logits.append(row_logits(target, ctx))
            accept, next_dist = verify(
                torch.stack(p_logits),
                torch.tensor(q_rows, dtype=torch.float64).reshape(len(xs), vocab),
                torch.tensor(xs, dtype=torch.long),
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                lenience=lenience,
            )
            accept = accept.to(torch.float64).tolist()
            next_dist = next_dist.to(torch.float64).tolist()
            reach = weight  # probability of the draft block and of accepting its first n tokens
            for n in range(block + 1):
                stop = reach * (1.0 - accept[n]) if n < block else reach
                if stop > 0:
                    for t in range(vocab):
                        pt = stop * next_dist[n][t]
                        if pt > 0:
                            emitted = tuple((list(xs[:n]) + [t])[:remaining])
                            emitted_prob[emitted] = emitted_prob.get(emitted, 0.0) + pt
                if n < block:
                    reach *= accept[n]
        out = torch.zeros((vocab,) * remaining, dtype=torch.float64)
        for emitted, prob in emitted_prob.items():
            out[emitted] += prob * law_after(seq + emitted, remaining - len(emitted))
        memo[key] = out
        return out

    return law_after(tuple(prompt), k)


def hierarchical_law(
    tables: Sequence[Tensor],
    prompt: list[int],
    k: int,
    gammas: Sequence[int],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    lenience: float = 1.0,
    verify: VerifyFn = reference.verify,
) -> Tensor:
    """Exact law [V] * k of the first k tokens of a hierarchical draft (cpp/drafting/hierarchy.h): tables[0] verifies
    gammas[0] tokens per iteration drafted by a speculative decoder of tables[1] with tables[2] (gammas[1]
    tokens per iteration), and so on down; the last table drafts alone. Each level below the top emits exactly
    the tokens asked of it (its drafts clamped to the tokens still due - 1) at lenience 1, and reports the
    standardized rows of its own target as q."""
    if len(tables) < 2 or len(gammas) != len(tables) - 1:
        raise ValueError("hierarchical_law needs at least two tables and one gamma per level")
    below = None
    if len(tables) > 2:
        def below(context: List[int], n: int) -> Tensor:
            return hierarchical_law(tables[1:], context, n, gammas[1:], temperature, top_k, top_p, 1.0, verify)
    return speculative_law(tables[0], tables[1], prompt, k, gammas[0], temperature, top_k, top_p, lenience, verify,
                           draft_block=below)
