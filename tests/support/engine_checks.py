"""What the engine's tests share to check a generation and to build the models it runs on.

Checks of a Result: `check_stats` (every invariant between tokens, trace and stats), `same`, `vars_of`,
`assert_same_result` (tokens, trace and counts equal, alpha to a tolerance) and `check_rows` (row r of a batch is the
batch-1 run with seed + r). Models: `load_pair` (a loaded Markov target and draft of VOCAB tokens), `poisoned_table`
(non-finite logits after token 0), `MarkovRows` (tests/support/markov.py's cached table model with the native batched
and tree calls, checked at every call) loaded by `markov_model` and `table_model` (or a subclass of it, for the graph
tests), and `tiny_models` (the batch tests' TinyGPT pair; `loaded_tiny_models` loaded) with the batch tests' PROMPTS,
MAX_NEW, GAMMA and SETTINGS. `same_seed_outputs` runs the seeded decode SAME_SEED in fresh processes (determinism
across processes and thread counts).
"""

import math
from typing import Tuple

import pytest
import torch
from torch import Tensor

from . import markov
import speculant
from speculant import tiny_gpt

VOCAB = 5


def load_pair(seed: int = 1, *, vocab: int = VOCAB, forms=("cached", "cached"), **kwargs):
    target, draft = markov.target_and_draft(vocab, seed, **kwargs)
    return speculant.load(markov.script(target, forms[0])), speculant.load(markov.script(draft, forms[1]))


def vars_of(it) -> dict:
    return {name: getattr(it, name) for name in ("drafted", "accepted", "token", "bonus")}


def check_stats(result, gamma: int, max_new_tokens: int, *, vocab: int = VOCAB, eos=None, seed=None):
    """Every invariant the spec states between tokens, trace and stats.

    An iteration drafts γ tokens, except that near max_new_tokens the engine may draft fewer (it drafts
    min(γ, tokens still due - 1): more would be wasted work), so draft_calls = Σ len(drafted), which is
    γ · iterations whenever no iteration was shortened.
    """
    tokens, stats, trace = result.tokens, result.stats, list(result.trace)
    assert stats.new_tokens == len(tokens) <= max_new_tokens
    if eos is not None and eos in tokens:
        assert tokens.index(eos) == len(tokens) - 1  # stops at the first EOS, which is included
    elif max_new_tokens > 0:
        assert len(tokens) == max_new_tokens
    assert stats.iterations == len(trace) == stats.target_calls
    assert stats.draft_calls == sum(len(it.drafted) for it in trace)
    rebuilt: list[int] = []
    for i, it in enumerate(trace):
        drafted = list(it.drafted)
        assert 0 <= it.accepted <= len(drafted) <= gamma
        if len(rebuilt) + gamma + 1 <= max_new_tokens:
            assert len(drafted) == gamma  # only the iterations near max_new_tokens may draft fewer
        assert it.bonus == (it.accepted == len(drafted))
        assert all(0 <= t < vocab for t in drafted + [it.token])
        block = drafted[: it.accepted] + [it.token]
        if i < len(trace) - 1:
            rebuilt += block
        else:  # the last iteration may be cut at max_new_tokens or the EOS
            rebuilt += block[: len(tokens) - len(rebuilt)]
    assert rebuilt == tokens
    assert sum(len(it.drafted[: it.accepted]) + 1 for it in trace) - stats.new_tokens in range(0, gamma + 1)
    # Per position: position i was accepted in the iterations that kept more than i drafts. One entry per
    # position this generation could draft: no iteration drafts more than max_new_tokens - 1 tokens.
    positions = min(gamma, max(max_new_tokens - 1, 1))
    assert len(stats.accepted_per_position) == len(stats.drafted_per_position) == positions
    assert list(stats.accepted_per_position) == [sum(it.accepted > i for it in trace) for i in range(positions)]
    assert list(stats.drafted_per_position) == [sum(len(it.drafted) > i for it in trace) for i in range(positions)]
    accepted, drafted = sum(stats.accepted_per_position), sum(stats.drafted_per_position)
    if drafted:
        assert stats.acceptance_rate == pytest.approx(accepted / drafted, rel=1e-12)
        assert 0.0 <= stats.alpha <= 1.0
    else:
        assert math.isnan(stats.acceptance_rate) and math.isnan(stats.alpha)
    if stats.target_calls:
        assert stats.tokens_per_target_call == pytest.approx(stats.new_tokens / stats.target_calls, rel=1e-12)
    for name in ("draft_seconds", "target_seconds", "other_seconds", "total_seconds"):
        assert getattr(stats, name) >= 0.0, name
    assert stats.draft_seconds + stats.target_seconds <= stats.total_seconds + 1e-9
    if seed is not None:
        assert stats.seed == seed
    as_dict = stats.as_dict()
    for name in ("target_calls", "draft_calls", "iterations", "new_tokens", "tokens_per_target_call",
                 "acceptance_rate", "alpha", "accepted_per_position", "drafted_per_position", "draft_seconds",
                 "target_seconds", "other_seconds", "total_seconds", "seed"):
        assert same(as_dict[name], getattr(stats, name)), name


def same(got, want) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, (list, tuple)):
        return list(got) == list(want)
    return got == want


def poisoned_table(value: float) -> torch.Tensor:
    """A V = 3 table whose rows after token 0 hold `value` (NaN / +inf) or are entirely -inf."""
    table = markov.random_table(3, 4)
    if value == -math.inf:
        table[:, :, 0, :] = -math.inf
    else:
        table[:, :, 0, 1] = value
    return table


PROMPTS = [[5], [1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]]  # lengths 1, 3, 7, 2
MAX_NEW = 20
GAMMA = 3
TINY_VOCAB = 32  # drafter_sets.every_drafter()'s vocabulary
TINY_MAX_LENGTH = 7 + MAX_NEW - 1  # the longest prompt plus MAX_NEW - 1: exactly enough
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "T1": dict(temperature=1.0),
    "T0.8-topk8-topp0.9": dict(temperature=0.8, top_k=8, top_p=0.9),
}
COUNTS = ("iterations", "target_calls", "draft_calls", "drafted_tokens", "accepted_tokens", "new_tokens", "gamma",
          "seed", "drafted_per_position", "accepted_per_position", "acceptance_rate", "tokens_per_target_call")


def iteration(it) -> dict:
    return {**vars_of(it), "emitted": it.emitted}


def assert_same_result(got, want, label: str, *, alpha_rel: float = 1e-6) -> None:
    """Same tokens, trace and counts; alpha within alpha_rel (0: bit for bit)."""
    assert got.tokens == want.tokens, f"{label}: tokens"
    assert [iteration(it) for it in got.trace] == [iteration(it) for it in want.trace], f"{label}: trace"
    for name in COUNTS:
        assert same(getattr(got.stats, name), getattr(want.stats, name)), f"{label}: stats.{name}"
    if math.isnan(want.stats.alpha):
        assert math.isnan(got.stats.alpha), f"{label}: alpha"
    else:
        assert got.stats.alpha == pytest.approx(want.stats.alpha, rel=alpha_rel, abs=1e-12), f"{label}: alpha"


def check_rows(generate, rows, *, seed: int, alpha_rel: float = 1e-6, **kwargs) -> list:
    """generate(rows, seed=seed) as one batch, each row against generate(rows[r], seed=seed + r) alone."""
    batch = generate(rows, seed=seed, **kwargs)
    assert isinstance(batch, list) and len(batch) == len(rows)
    for r, row in enumerate(rows):
        alone = generate(row, seed=seed + r, **kwargs)
        assert not isinstance(alone, list)
        assert_same_result(batch[r], alone, f"row {r}", alpha_rel=alpha_rel)
        assert batch[r].stats.seed == seed + r
    return batch


def tiny_models(max_length: int = TINY_MAX_LENGTH):
    """A TinyGPT away from its near-uniform init (so attention and positions matter) and a noisy copy as draft."""
    torch.manual_seed(0)
    target = tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(TINY_VOCAB, 2, 2, 32, max_length))
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p), alpha=0.3)
    draft = tiny_gpt.TinyGPT(target.config)
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return target.eval(), draft.eval()


def loaded_tiny_models(plain: bool = False) -> tuple:
    """tiny_models() loaded in the script_cached form (native batched): (target, draft), and with plain=True the
    target's script_plain form third."""
    target, draft = tiny_models()
    loaded = (speculant.load(tiny_gpt.script_cached(target)), speculant.load(tiny_gpt.script_cached(draft)))
    return (*loaded, speculant.load(tiny_gpt.script_plain(target))) if plain else loaded


class MarkovRows(markov.MarkovCached):
    """markov.MarkovCached with the native batched methods of export/cached.py (start_rows, extend_rows), so that
    the engine runs its rows in one call (cpp/models/script_model.cpp's ScriptRows) on exactly enumerable tables. Row r's
    tokens are kept at their slots; the next-token logits of a token need the one before it, read back after the
    call's own tokens are written. Checks the calls: a real token's slot is its position, positions are below
    `keys`, rows ascend, and no token reads a position that was never written.

    The tree calls (extend_rows_masked, copy_slots) keep each slot's position too: a node's predecessor is the one
    slot its mask shows at its position - 1, so a wrong mask (no such slot, or two) is an error, and copy_slots
    moves tokens with their positions."""

    def __init__(self, table: Tensor, max_length: int):
        super().__init__(table, max_length)
        self.register_buffer("row_tokens", torch.zeros(0, max_length + 1, dtype=torch.long), persistent=False)
        self.register_buffer("row_positions", torch.zeros(0, max_length + 1, dtype=torch.long), persistent=False)

    @torch.jit.export
    def start_rows(self, batch: int) -> None:
        self.row_tokens = torch.full((batch, self.max_length + 1), -1, dtype=torch.long, device=self.table.device)
        self.row_positions = torch.full_like(self.row_tokens, -1)

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        real = slots < self.max_length  # padding goes to the scratch slot max_length
        if bool((slots[real] != positions[real]).any()):
            raise RuntimeError("MarkovRows: a token's slot is not its position")
        if keys < 1 or keys > self.max_length or bool((positions[real] >= keys).any()):
            raise RuntimeError("MarkovRows: keys out of range")
        if rows.size(0) > 1 and bool((rows[1:] <= rows[:-1]).any()):
            raise RuntimeError("MarkovRows: rows must ascend")
        index = rows.unsqueeze(1).expand_as(slots)  # [R, T]
        self.row_tokens[index, slots] = input_ids
        self.row_positions[index, slots] = positions
        before = self.row_tokens[index, torch.clamp(positions - 1, min=0)]  # [R, T]
        if bool((before[real & (positions >= 1)] < 0).any()):
            raise RuntimeError("MarkovRows: a token's predecessor was never written")
        return self.logits(input_ids, positions, before)

    def logits(self, input_ids: Tensor, positions: Tensor, before: Tensor) -> Tensor:
        prev2 = torch.where(positions >= 1, before.clamp(min=0), torch.full_like(before, self.vocab_size))
        self.calls += 1
        return self.table[(positions + 1) % 2, prev2, input_ids]  # [R, T, V]

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        keys = mask.size(2)
        if mask.dtype != torch.bool or mask.shape[:2] != input_ids.shape or keys < 1 or keys > self.max_length:
            raise RuntimeError("MarkovRows: mask must be bool [R, T, S] with 1 <= S <= max_length")
        real = slots < self.max_length
        index = rows.unsqueeze(1).expand_as(slots)  # [R, T]
        own = mask.gather(2, slots.clamp(max=keys - 1).unsqueeze(2)).squeeze(2)  # [R, T]
        if bool((slots[real] >= keys).any()) or not bool(own[real].all()):
            raise RuntimeError("MarkovRows: a tree node does not see its own slot")
        self.row_tokens[index, slots] = input_ids
        self.row_positions[index, slots] = positions
        match, before = self.predecessors(rows, positions, mask)
        needed = real & (positions >= 1)
        if bool((match.sum(2)[needed] != 1).any()):
            raise RuntimeError("MarkovRows: a tree node does not see exactly one slot at its position - 1")
        return self.logits(input_ids, positions, before)

    def predecessors(self, rows: Tensor, positions: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
        """(the slots [R, T, S] each token's mask shows at its position - 1, the token [R, T] in the first)."""
        keys = mask.size(2)
        seen = self.row_positions[rows, :keys].unsqueeze(1)  # [R, 1, S]
        match = mask & (seen == (positions - 1).unsqueeze(2)) & (seen >= 0)  # [R, T, S]
        before = self.row_tokens[rows, :keys].unsqueeze(1).expand_as(match).gather(
            2, match.long().argmax(2, keepdim=True)).squeeze(2)  # [R, T]
        return match, before

    @torch.jit.export
    def copy_slots(self, rows: Tensor, sources: Tensor, targets: Tensor) -> None:
        index = rows.unsqueeze(1).expand_as(sources)
        if bool((self.row_positions[index, sources] < 0).any()):
            raise RuntimeError("MarkovRows: copy_slots from a slot never written")
        tokens, positions = self.row_tokens[index, sources], self.row_positions[index, sources]
        self.row_tokens[index, targets] = tokens
        self.row_positions[index, targets] = positions


def markov_model(table: Tensor, kind: str, max_length: int = 64):
    """A loaded table model: "replica" (markov.py's cached form: deep-copied replicas) or "native" (MarkovRows)."""
    module = markov.cached_model(table) if kind == "replica" else torch.jit.script(MarkovRows(table.float(),
                                                                                             max_length))
    model = speculant.load(module)
    assert model._core.batched == (kind == "native")
    return model


TABLE_MAX_LENGTH = 64


def table_model(table, cls=MarkovRows, device=None):
    """A loaded table model: `cls` (MarkovRows or a subclass) on `table`, TABLE_MAX_LENGTH positions."""
    return speculant.load(torch.jit.script(cls(table.float(), TABLE_MAX_LENGTH)), device=device)


# One process's seeded run, printed. argv: torch threads, device, cuda_graphs mode. cuBLAS repeats itself across
# processes only with a fixed workspace (docs/determinism.md): same_seed_outputs sets it.
SAME_SEED = r"""
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
import speculant
from speculant import tiny_gpt
models = []
for seed in (0, 1):  # a target and a draft that differ: rejections and residual draws happen
    torch.manual_seed(seed)
    models.append(speculant.load(tiny_gpt.script_cached(
        tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(64, 2, 2, 64, 128)).eval()), device=sys.argv[2]))
print(speculant.SpeculativeDecoder(*models, gamma=3, temperature=0.9, cuda_graphs=sys.argv[3]).generate(
    [1, 2, 3], max_new_tokens=60, seed=7).tokens)
"""


def same_seed_outputs(threads, device: str = "cpu", mode: str = "off") -> set:
    """The distinct outputs of SAME_SEED run once per entry of `threads`, each in a fresh process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    return {subprocess.run([sys.executable, "-c", SAME_SEED, str(t), device, mode], capture_output=True, text=True,
                           check=True, timeout=300, env=env).stdout for t in threads}
