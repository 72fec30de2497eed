"""LayerSkip's shared cache: an early-exit draft and its live target keep the first l layers' keys and values once.

An early-exit draft (early_exit.py) runs the target's own first l layers, so for the same tokens at the same
positions it computes exactly the keys and values that the target's first l layers compute. Here the two keep them
in one place, the target's own cache (a transformers DynamicCache, whose layer i is model layer i's), and neither
computes an entry the other has:

* The draft keeps no cache of its own. Its calls append to the target's first l layers, after the entries that
  hold its sequence; the target's prompt and every token the target verified are already there, so the draft
  skips its prefill and any committed token the target computed before it.
* The target's verification reuses the draft's work, as LayerSkip's self-speculation does: for a chain of
  γ + 1 tokens, the first γ were run through the first l layers by the draft while it drafted (their entries and
  the hidden states after layer l are kept). The target's call is one forward in which layers 1 .. l - 1 pass
  their input on and layer l's place holds `_Resumed`: it returns the kept hidden states of those γ tokens and runs
  the real layers 1 .. l on the last token alone (their arguments cut to its query), so only layers l + 1 .. L run
  over all γ + 1. A draft call whose first tokens the target already ran goes the same way through the draft's
  view. The logits are the model's own forward's (the same weights over the same inputs; a probe at load and
  tests/test_early_exit.py check them against transformers' forward).

Each row of the target (live.py: a replica per batch row) keeps records beside its first l layers: per entry the
token, the position and the hidden state after layer l (a forward hook on layer l takes them; it is registered
around each forward that writes entries and removed after it, so the user's model keeps no hook of ours). A chain
call trusts an entry only where the records show its own token at its own position, and an entry written by the
other party's tree call never (a tree node attends to its ancestors only); past the first mismatch the entries
are dropped and computed again. Reading the match costs one host read per call (of a comparison; for a tree call,
of its nodes and the entries). A kept tree path (keep) is a chain again. A draft call on another sequence than its
target's would drop the target's entries; the target's next call then says so when fewer than its own are left
(SpeculativeDecoder makes the draft decode with the target it was built on).

A token tree's verification reuses the draft's tree the same way. The draft ran the tree's inner nodes while it
drafted them (level by level, in its own order). The target's tree call finds, for each node, an entry the draft
left with the node's token at its position that sees the same entries: every entry before the call, and of the
later ones exactly those of the nodes the node sees, themselves found (tree_nodes; each tree entry's records keep
which entries it sees, so any mask is judged by what it shows, not by how the engine builds trees). The found nodes
go first: their entries are gathered in place in layers 1 .. l and their hidden states feed layer l + 1, the other
nodes (the leaves) run through the real layers 1 .. l after them, and the call's entries and logits are then put
back in the call's order. Twin nodes (one token drawn twice under one parent) are matched to the draft's twins in
turn, so that each twin's children find theirs. So every token goes through layers 1 .. l once, as in chains,
unless the draft ran a node the tree then left out (a grown tree's pruned nodes). A target call when the target
also records features for an EAGLE or Medusa draft (whose hooks want the whole forward) runs as it is. Speculative
beam search refuses a sharing draft: its beams are not the target's, and the shared layers hold one set of entries.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import layer_masks
from .features import decoder_layers, with_layers
from .live import LiveModel


def crop_layers(cache, length: int, layers: Optional[int] = None) -> None:
    """Cuts the entries of `cache`'s first `layers` layers (None: all) back to `length`."""
    for layer in cache.layers[:layers]:
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.dim() == 4 and keys.size(-2) > length:
            layer.keys, layer.values = keys[..., :length, :], layer.values[..., :length, :]


class _Skipped(torch.nn.Module):
    """A decoder layer left out of a call: its output is its input, and it reads and writes no cache."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        if hasattr(layer, "attention_type"):  # which mask the model hands it (sliding or full)
            self.attention_type = layer.attention_type

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def _last_queries(value, first: int, count: int):
    """A decoder layer's argument for a call of `count` queries cut to the queries from `first` on: 4-D masks on
    their query axis, rotary tables [B, count, d] and position ids [., count] on theirs; anything else as it is.
    (The load-time probe checks the result against the model's own forward.)"""
    if isinstance(value, tuple):
        return tuple(_last_queries(v, first, count) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 4 and value.size(-2) == count:
        return value[..., first:, :]
    if value.dim() == 3 and value.size(1) == count:
        return value[:, first:]
    if value.dim() in (1, 2) and value.size(-1) == count:
        return value[..., first:]
    return value


class _Resumed(_Skipped):
    """Layer l in a call whose first r tokens went through layers 1 .. l before: its output is their kept hidden
    states (`value`, [1, r, H]), then the other tokens' through the real layers 1 .. l (since the layers before it
    are skipped, its input is the embeddings), which append to those layers' cache."""

    value: Optional[torch.Tensor] = None

    def __init__(self, layers: list):
        super().__init__(layers[-1])
        self.lower = layers  # a plain list: the modules stay the model's

    def forward(self, hidden_states, *args, **kwargs):
        kept, count = self.value.size(1), hidden_states.size(1)
        if kept == count:
            return self.value
        args = [_last_queries(a, kept, count) for a in args]
        kwargs = {key: _last_queries(v, kept, count) for key, v in kwargs.items()}
        h = hidden_states[:, kept:]
        for layer in self.lower:
            h = layer(h, *args, **kwargs)
            h = h if isinstance(h, torch.Tensor) else h[0]
        return torch.cat([self.value, h], 1)


class SharedRows:
    """One target row's records of its first l layers' entries (the module docstring)."""

    def __init__(self, hub: "ExitShare"):
        self.hub = hub
        self.clear()

    def clear(self) -> None:
        device = self.hub.device
        self.tokens = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = torch.zeros(0, dtype=torch.long, device=device)
        self.exits = torch.zeros(0, self.hub.hidden, dtype=self.hub.dtype, device=device)
        self._chain()

    def _chain(self) -> None:
        """No tree entries: every entry sees the entries before it."""
        self.tree_from, self.tree_writer = math.inf, None  # entries from here on were a tree call's, by whom
        # per entry from tree_from on: which of those entries it sees, and whether it sees every entry before them
        self.region = torch.zeros(0, 0, dtype=torch.bool, device=self.hub.device)
        self.whole = torch.zeros(0, dtype=torch.bool, device=self.hub.device)

    def fresh(self) -> "SharedRows":
        return SharedRows(self.hub)

    @property
    def length(self) -> int:
        return self.tokens.numel()

    def crop(self, length: int) -> None:
        self.tokens, self.positions, self.exits = self.tokens[:length], self.positions[:length], self.exits[:length]
        if self.tree_from >= length:
            self._chain()
        else:
            n = length - self.tree_from
            self.region, self.whole = self.region[:n, :n], self.whole[:n]

    def keep(self, entries: torch.Tensor) -> None:
        """A kept path: entry i at entries[i]; a path is a chain, whoever wrote it."""
        self.tokens, self.positions, self.exits = (t.index_select(0, entries)
                                                   for t in (self.tokens, self.positions, self.exits))
        self._chain()

    def crop_cache(self, cache, length: int) -> None:
        """The target's truncate: every layer of `cache`, and the records, back to `length` entries."""
        if cache is not None:
            crop_layers(cache, length)
        self.crop(length)

    def matching(self, start: int, tokens: torch.Tensor, positions: torch.Tensor, reader) -> int:
        """How many of `tokens` at `positions` the entries from `start` on hold, read by `reader` (a tree call's
        entries match their writer only)."""
        end = min(self.length, start + tokens.numel())
        if reader is not self.tree_writer:
            end = min(end, max(start, self.tree_from))
        if end <= start:
            return 0
        same = (self.tokens[start:end] == tokens[:end - start]) & (self.positions[start:end] == positions[:end - start])
        return int(same.cumprod(0).sum())

    def append(self, tokens: torch.Tensor, positions: torch.Tensor, exits: torch.Tensor, writer,
               mask: Optional[torch.Tensor]) -> None:
        """Records entries appended by `writer`'s call: `exits` their hidden states after layer l, `mask` the tree
        call's (bool [k, entries + k]) or None for a chain."""
        k = tokens.numel()
        if mask is not None and self.tree_from > self.length:
            self.tree_from, self.tree_writer = self.length, writer
        if self.tree_from <= self.length:
            if mask is None:
                mask = torch.ones(k, self.length + k, dtype=torch.bool, device=tokens.device).tril(self.length)
            rows = mask[:, self.tree_from:]
            region = F.pad(self.region, (0, rows.size(1) - self.region.size(1)))
            self.region = torch.cat([region, rows])
            self.whole = torch.cat([self.whole, mask[:, :self.tree_from].all(1)])
        self.tokens = torch.cat([self.tokens, tokens])
        self.positions = torch.cat([self.positions, positions])
        self.exits = torch.cat([self.exits, exits])

    @contextlib.contextmanager
    def taking(self, count: int):
        """Around a forward that runs `count` tokens through layer l: yields a list that then holds their hidden
        states after it ([count, H])."""
        hub, taken = self.hub, []
        if count == 0:
            yield taken
            taken.append(torch.zeros(0, hub.hidden, dtype=hub.dtype, device=hub.device))
            return
        with hub.hooked():
            yield taken
        states, hub.taken = hub.taken, None
        if states is None or states.shape[-2] != count:
            raise RuntimeError(f"EarlyExitDraft: layer {hub.exit_layer} gave no hidden states for the {count} "
                               "tokens of the call (its forward hook did not run)")
        taken.append(states[0])

    @contextlib.contextmanager
    def recording(self, tokens: torch.Tensor, positions: torch.Tensor, writer, mask: Optional[torch.Tensor]):
        """Around a forward that appends `tokens` at `positions` to the first l layers: records them, with the
        hidden states after layer l that the forward computed."""
        with self.taking(tokens.numel()) as taken:
            yield
        self.append(tokens, positions, taken[0], writer, mask)

    def run(self, target: LiveModel, tokens: torch.Tensor, logits: bool, positions: Optional[torch.Tensor],
            mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The target's call (live.py's _run): the draft's entries reused where they are the call's chain, or
        nodes of the call's tree."""
        start, k = target.length, tokens.numel()
        if self.length < start:
            raise RuntimeError(f"{target.name}: {self.length} entries of its first {self.hub.exit_layer} layers' "
                               f"cache are left, fewer than its {start}: its sharing EarlyExitDraft ran on another "
                               "sequence (decode with the target the draft was built on)")
        where = target.positions(start, k) if positions is None else positions
        if target.records_features:  # its hooks want the whole forward
            reused = 0
        elif mask is not None:
            return self.run_tree(target, tokens, logits, where, mask)
        else:
            reused = self.matching(start, tokens, where, target)
        crop_layers(target.cache, start + reused, self.hub.exit_layer)
        self.crop(start + reused)
        if reused == 0:
            with self.recording(tokens, where, target, mask):
                return target.own_forward(tokens, logits, positions, mask)
        with self.recording(tokens[reused:], where[reused:], target, None):
            out = self.hub.resumed(target, self.hub.upper, tokens, where, start, self.exits[start:start + reused])
        return target.end_call(out if logits else None, start + k)

    def run_tree(self, target: LiveModel, tokens: torch.Tensor, logits: bool, positions: torch.Tensor,
                 mask: torch.Tensor) -> Optional[torch.Tensor]:
        """The target's tree call: the nodes whose entries the draft left (tree_nodes) run first, in one forward
        that starts them above layer l; the cache entries and the logits are then put back in the call's order."""
        start, k = target.length, tokens.numel()
        found = tree_nodes(self, start, tokens, positions, mask)
        kept = [i for i in range(k) if found[i] >= 0]
        if not kept:
            crop_layers(target.cache, start, self.hub.exit_layer)
            self.crop(start)
            with self.recording(tokens, positions, target, mask):
                return target.own_forward(tokens, logits, positions, mask)
        order = kept + [i for i in range(k) if found[i] < 0]  # a tree order still: a node's ancestors are kept
        device = tokens.device
        sources = torch.tensor([found[i] for i in kept], device=device)
        exits = self.exits.index_select(0, sources)
        gather_layers(target.cache, start, sources, self.hub.exit_layer)
        self.crop(start)
        moved = order != list(range(k))
        if moved:
            into = torch.tensor(order, device=device)
            tokens_in, positions_in = tokens[into], positions[into]
            mask_in = torch.cat([mask[into, :start], mask[into][:, start + into]], 1)
        else:
            tokens_in, positions_in, mask_in = tokens, positions, mask
        with self.taking(k - len(kept)) as taken:
            out = self.hub.resumed(target, self.hub.upper, tokens_in, positions_in, start, exits, mask_in)
        exits = torch.cat([exits, taken[0]])
        if moved:
            back = torch.empty_like(into)
            back[into] = torch.arange(k, device=device)
            reorder_tail(target.cache, start, back)
            out, exits = out[:, back], exits[back]
        self.append(tokens, positions, exits, target, mask)
        return target.end_call(out if logits else None, start + k)


def tree_nodes(rows: SharedRows, start: int, tokens: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor) -> list:
    """Per node of a tree call at entry `start` (mask: bool [k, start + k]), the entry from `start` on that the
    draft left with the same token at the same position, seeing the same entries (every entry before `start`, and
    from `start` on the entries of the nodes the node sees, themselves found), or -1. Such an entry's keys, values
    and hidden state after layer l are the node's. One host read."""
    k, n = tokens.numel(), rows.length - start
    if n <= 0 or not isinstance(rows.tree_writer, (SharingDraft, type(None))) or rows.tree_from < start:
        return [-1] * k
    region = rows.region.size(0)
    values = torch.cat([tokens, positions, mask[:, start:].flatten().long(), mask[:, :start].all(1).long(),
                        rows.tokens[start:], rows.positions[start:], rows.region.flatten().long(),
                        rows.whole.long()]).tolist()
    parts, at = [], 0
    for size in (k, k, k * k, k, n, n, region * region, region):
        parts.append(values[at:at + size])
        at += size
    node_tokens, node_positions, seen, node_whole, entry_tokens, entry_positions, region_rows, entry_whole = parts
    entries = {}
    for e in range(start, rows.length):
        if e < rows.tree_from:
            sees = tuple(range(start, e))
        else:
            r = e - rows.tree_from
            row = region_rows[r * region:(r + 1) * region]
            if not entry_whole[r] or not row[r] or any(row[r + 1:]):
                continue
            sees = tuple(range(start, rows.tree_from)) + tuple(rows.tree_from + c for c in range(r) if row[c])
        entries.setdefault((entry_tokens[e - start], entry_positions[e - start], sees), []).append(e)
    found, twins = [], {}
    for i in range(k):
        row = seen[i * k:(i + 1) * k]
        above = [found[j] for j in range(i) if row[j]]
        if not node_whole[i] or not row[i] or any(row[i + 1:]) or min(above, default=0) < 0:
            found.append(-1)
            continue
        key = (node_tokens[i], node_positions[i], tuple(sorted(above)))
        same = entries.get(key, [-1])
        turn = twins.get(key, 0)  # the n-th twin takes the n-th (the first when the draft ran fewer)
        twins[key] = turn + 1
        found.append(same[turn] if turn < len(same) else same[0])
    return found


def gather_layers(cache, start: int, sources: torch.Tensor, layers: int) -> None:
    """The first `layers` layers of `cache`: the entries at `sources` (all from `start` on; twin nodes share one)
    become entries start .. start + len(sources) - 1, and the later ones go. In place where they fit."""
    end = start + sources.numel()
    with torch.inference_mode():
        for layer in cache.layers[:layers]:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                chosen = tensor.index_select(-2, sources)
                if end <= tensor.size(-2):
                    tensor[..., start:end, :] = chosen
                    setattr(layer, name, tensor[..., :end, :])
                else:
                    setattr(layer, name, torch.cat([tensor[..., :start, :], chosen], -2))


def reorder_tail(cache, start: int, order: torch.Tensor) -> None:
    """Every layer of `cache`: its entries from `start` on become, in turn, those at start + order."""
    with torch.inference_mode():
        for layer in cache.layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                tensor[..., start:, :] = tensor[..., start:, :].index_select(-2, order)


class ExitShare:
    """What a live target family (a target and its replicas) shares with its early-exit draft: the hook on layer
    l, the calls that start above it or stop at it, and each row's records (the module docstring)."""

    def __init__(self, target: LiveModel, draft_view, exit_layer: int):
        module = target.model
        _, _, layers = decoder_layers(module)
        self.exit_layer = exit_layer
        self.device, self.dtype = module.device, module.dtype
        self.hidden = module.config.get_text_config().hidden_size
        lower = list(layers)[:exit_layer]
        self.resuming = _Resumed(lower)
        skipped = [_Skipped(layer) for layer in lower[:-1]]
        self.upper = with_layers(module, skipped + [self.resuming] + list(layers)[exit_layer:])  # the target's
        self.exit = with_layers(draft_view, skipped + [self.resuming], draft_view.config)  # the draft's
        self.layer = layers[exit_layer - 1]  # hooked around each forward that writes the shared layers (taking)
        self.taken = None
        self.closed = False
        self.root = target.row(0)
        for member in target.family():
            member.start_sharing(SharedRows(self))

    def _take(self, module, args, output) -> None:
        self.taken = output if isinstance(output, torch.Tensor) else output[0]

    @contextlib.contextmanager
    def hooked(self):
        """Around a forward: `taken` then holds layer l's output hidden states, or None where it did not run. The hook
        is registered for this forward only: the model keeps no hook of ours."""
        self.taken = None
        hook = self.layer.register_forward_hook(self._take)
        try:
            yield
        finally:
            hook.remove()

    def close(self) -> None:
        """The draft is gone, or a newer one shares the target's cache: the target keeps it alone again."""
        if self.closed:
            return
        self.closed = True
        for member in self.root.family():
            if member.sharing is not None and member.sharing.hub is self:
                member.stop_sharing()

    def resumed(self, model: LiveModel, view, tokens: torch.Tensor, positions: torch.Tensor, start: int,
                kept: torch.Tensor, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [1, k, V] of `view` (upper: the target's, exit: the draft's) over `tokens` at `positions`
        appended to `model`'s cache at entry `start`, whose first r went through layers 1 .. l before (`kept`: their
        hidden states after layer l, [r, H], their entries in those layers); the others go through them now. A
        chain, or the tree that `visible` (bool [k, start + k]) gives."""
        k = tokens.numel()
        if visible is None:
            visible = torch.ones(k, start + k, dtype=torch.bool, device=tokens.device).tril(start)
        mask = model.attention_mask(visible, positions)
        self.resuming.value = kept.unsqueeze(0)
        try:
            with torch.inference_mode():
                return view(input_ids=tokens.view(1, k), position_ids=positions.view(1, k), attention_mask=mask,
                            past_key_values=model.cache, use_cache=True).logits
        finally:
            self.resuming.value = None


class SharingDraft(LiveModel):
    """An early-exit draft's calls when it shares its target's first l layers (the module docstring): a LiveModel
    of the early-exit view whose cache is its target row's. It records its own sequence (tokens and positions)
    and finds its entries in the shared layers at each call. Until share() (its load-time probes) it is a plain
    LiveModel with a cache of its own."""

    _hub: Optional[ExitShare] = None

    def share(self, target: LiveModel, hub: ExitShare) -> None:
        """From now on, row r of this draft runs in row r of `target`'s cache."""
        self._root, self._hub, self._index = target, hub, 0
        self._cache, self._length = None, 0
        self._forget()

    def beam_obstacle(self) -> str:
        if self._hub is None:
            return super().beam_obstacle()
        return ("an EarlyExitDraft that shares its target's cache cannot draft for beam search: its beams are not the "
                "target's, and the shared first layers hold one set of entries (pass share_cache=False)")

    def _forget(self) -> None:
        self._tokens = torch.zeros(0, dtype=torch.long, device=self._hub.device)
        self._places = self._tokens

    def replica(self) -> "SharingDraft":
        other = super().replica()
        if self._hub is None:
            return other
        other._index = len(self._family) - 1
        other._forget()
        return other

    def reset(self, tokens: torch.Tensor) -> None:
        """Its sequence is `tokens`; their entries are found (or computed) at the next call."""
        if self._hub is None:
            return super().reset(tokens)
        self._tokens = tokens.clone()
        self._places = torch.arange(tokens.numel(), device=tokens.device)
        self._length = tokens.numel()

    def truncate(self, length: int) -> None:
        if self._hub is None:
            return super().truncate(length)
        self._tokens, self._places = self._tokens[:length], self._places[:length]
        self._length = length

    def keep(self, entries: torch.Tensor) -> None:
        if self._hub is None:
            return super().keep(entries)
        self._tokens, self._places = self._tokens.index_select(0, entries), self._places.index_select(0, entries)
        self._length = entries.numel()

    def _run(self, tokens: torch.Tensor, logits: bool, positions: Optional[torch.Tensor] = None,
             mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        if self._hub is None:
            return super()._run(tokens, logits, positions, mask)
        if self._hub.closed:
            raise ValueError(f"{self.name}: a newer EarlyExitDraft shares its target's cache now (one draft per "
                             "target does); build this one again, or with share_cache=False to keep both")
        target = self._root.row(self._index)
        if target.cache is None:
            target.reset(tokens[:0])
        rows = target.sharing
        self._cache = target.cache
        held, k = self._length, tokens.numel()
        where = self.positions(held, k) if positions is None else positions
        chain = mask is None  # a chain's new tokens may be found too; a tree's are always run
        found = rows.matching(0, torch.cat([self._tokens[:held], tokens]) if chain else self._tokens[:held],
                              torch.cat([self._places[:held], where]) if chain else self._places[:held], self)
        if found < held:
            self._rebuild(target, rows, found)
        reused = max(0, found - held)  # one host read for both
        crop_layers(self._cache, held + reused, self._hub.exit_layer)
        rows.crop(held + reused)
        with rows.recording(tokens[reused:], where[reused:], self, mask):
            if reused:
                out = self.end_call(self._hub.resumed(self, self._hub.exit, tokens, where, held,
                                                     rows.exits[held:held + reused]), held + k)
            else:
                out = self.own_forward(tokens, logits, positions, mask)
        self._tokens, self._places = torch.cat([self._tokens, tokens]), torch.cat([self._places, where])
        self._length = held + k
        return out

    def _rebuild(self, target: LiveModel, rows: SharedRows, found: int) -> None:
        """Computes its entries from `found` on again (a chain: a kept path or a truncated one)."""
        held = self._length
        if not torch.equal(self._places[found:held], torch.arange(found, held, device=self._places.device)):
            raise RuntimeError(f"{self.name}: its tree entries past {found} are no longer in the cache it shares "
                               "with its target (a target call came between its tree calls)")
        crop_layers(self._cache, found, self._hub.exit_layer)
        rows.crop(found)
        self._length = found
        with rows.recording(self._tokens[found:held], self._places[found:held], self, None):
            self.own_forward(self._tokens[found:held], False)
        self._length = held


def probe(draft: SharingDraft, target: LiveModel) -> str:
    """Why sharing does not give this model's own logits, or "": the draft computes a token, the target reuses it
    and runs one more through its first layers, against uncached forwards of both sequences."""
    a, b, c, d = (i % target.vocab_size for i in (1, 2, 3, 4))
    ids = lambda *values: torch.tensor(values, device=target.model.device)  # noqa: E731
    try:
        target.reset(ids(a, b))
        draft.reset(ids(a, b))
        drafted = draft.extend(ids(c))
        verified = target.extend(ids(c, d))
        worst = 0.0
        for got, reference in ((drafted[0], draft.uncached_logits([a, b, c])),
                               (verified[0], target.uncached_logits([a, b, c])),
                               (verified[1], target.uncached_logits([a, b, c, d]))):
            reference = reference.float()
            worst = max(worst, (got.float()[:reference.numel()] - reference).abs().max().item()
                        / max(1.0, reference.abs().max().item()))
    except Exception as error:  # noqa: BLE001 - the model refused a call: say so
        return f"a shared call failed: {type(error).__name__}: {error}"
    finally:
        empty = torch.zeros(0, dtype=torch.long, device=target.model.device)
        target.reset(empty)
        draft.reset(empty)
    tolerance = layer_masks.TOLERANCE.get(verified.dtype, 1e-2)
    if not worst <= tolerance:
        return (f"logits of calls that share the first layers' cache differ from the model's own by {worst:.3g} "
                f"(relative; allowed {tolerance:g})")
    return ""
