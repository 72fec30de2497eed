"""EAGLE drafts (Li et al. 2024: EAGLE-1/2; 2025: EAGLE-3): one decoder layer over the target's own features.

The head's input at position P is the pair (e(s_P), f_{P-1}): the embedding of the token there (the target's own
embedding) and the feature of the position before, fused by a linear layer; one Llama-style decoder layer
(RMSNorm, rotary attention over the head's own cache, SwiGLU) turns it into a prediction of f_P, and the
target's own LM head into the law of s_{P+1}. f_{P-1} is the target's where the target has computed it, and the
head's own prediction of it where it drafts ahead of the target (feature_draft.py says which). With
``feature_layers=(low, mid, high)`` the target's feature is EAGLE-3's: those decoder layers' outputs side by side,
fused to the hidden size by a linear layer of the head.

The head trains with ``speculant.distill`` (research/distillation.py): the target's features teacher-force the
first draft position, and EAGLE-3's training-time test unrolls the head on its own predictions for the next
(``EagleHead.unrolled``), each depth's queries attending to the keys it would see when drafting.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..arguments import integer
from .feature_draft import FeatureDraft, FeatureRows, feature_source, parents_from_mask, target_shapes


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [..., N, heads, d] by the angles' cos and sin [..., N, 1, d / 2] (halves
    rotated together)."""
    first, second = x.chunk(2, -1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], -1)


class EagleHead(nn.Module):
    """The draft's parameters: the fusion of (embedding, feature), one decoder layer, and for EAGLE-3 the fusion
    of the target's layers (`feature` > `hidden`)."""

    def __init__(self, hidden: int, heads: int, intermediate: int, feature: int, theta: float = 10000.0):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.fuse = nn.Linear(feature, hidden, bias=False) if feature != hidden else None
        self.fc = nn.Linear(2 * hidden, hidden)
        self.attention_norm = nn.RMSNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden, eps=1e-6)
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.register_buffer("inv_freq", theta ** (-torch.arange(0, self.dim, 2).float() / self.dim),
                             persistent=False)

    def real(self, features: torch.Tensor) -> torch.Tensor:
        """The target's recorded features [..., D] in the head's feature space [..., H]."""
        return features if self.fuse is None else self.fuse(features)

    def project(self, embedded: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor) -> tuple:
        """Inputs [B, N, H] at positions [B or 1, N] -> (x, q, k, v): x [B, N, H], the rest [B, N, heads, d]."""
        x = self.fc(torch.cat([embedded, feature], -1))
        q, k, v = self.qkv(self.attention_norm(x)).unflatten(-1, (3, self.heads, self.dim)).unbind(-3)
        angles = (positions.unsqueeze(-1).float() * self.inv_freq).unsqueeze(-2)  # [B or 1, N, 1, d / 2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return x, _rotated(q, cos, sin), _rotated(k, cos, sin), v

    def attend(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: Optional[torch.Tensor]) -> torch.Tensor:
        """N queries (x, q) over S keys and values [B, S, heads, d], query n seeing key s where mask[., n, s]
        (bool [B or 1, N, S]; None: every key) -> the layer's output [B, N, H], the predicted features."""
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                  attn_mask=None if mask is None else mask.unsqueeze(1))
        h = x + self.o(attended.transpose(1, 2).flatten(-2))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, -1)
        return h + self.down(F.silu(gate) * up)

    def unrolled(self, embedded: torch.Tensor, features: torch.Tensor, depths: int) -> list:
        """Training (teacher-forced sequences): embedded [B, T, H], the target's features [B, T, D] -> the
        predicted features [B, T, H] at each depth 1 .. `depths`. Depth 1 reads f_{i-1} at position i; depth d
        reads depth d - 1's output at i - 1 and attends, as when drafting, to depth 1's keys up to i - d + 1 and
        to depth k's key at i - d + k for k = 2 .. d."""
        T = embedded.size(1)
        positions = torch.arange(T, device=embedded.device).unsqueeze(0)

        def shifted(h: torch.Tensor) -> torch.Tensor:  # position i holds h at i - 1 (zeros at 0)
            return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)

        row = positions.view(T, 1)
        column = positions.view(1, T)
        outputs, keys, values = [], [], []
        feature = shifted(self.real(features))
        for depth in range(1, depths + 1):
            x, q, k, v = self.project(embedded, feature, positions)
            keys.append(k)
            values.append(v)
            blocks = [column <= row - depth + 1] + [column == row - depth + j for j in range(2, depth + 1)]
            out = self.attend(x, q, torch.cat(keys, 1), torch.cat(values, 1), torch.cat(blocks, 1).unsqueeze(0))
            outputs.append(out)
            feature = shifted(out)
        return outputs


def eagle_step(head: EagleHead, embed: nn.Embedding, own_vocab: int, out: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, feature: torch.Tensor,
               slots: torch.Tensor, visible: Optional[torch.Tensor], entries: int) -> torch.Tensor:
    """The head over tokens, positions [n] and input features [n, H], its keys, values and outputs written to
    entries `slots` [n] of the buffers (`out` [S, H], `keys` and `values` [S, heads, d]), query j attending to
    entry e < K where visible[j, e] (bool [n, K]; None: every one of the first `entries`) -> the outputs [n, H].
    Token ids past the embedding's `own_vocab` rows (the target's padding) read its last row."""
    x, q, k, v = head.project(embed(tokens.clamp(max=own_vocab - 1)).unsqueeze(0), feature.unsqueeze(0),
                              positions.unsqueeze(0))
    keys.index_copy_(0, slots, k[0])
    values.index_copy_(0, slots, v[0])
    width = entries if visible is None else visible.size(1)
    predicted = head.attend(x, q, keys[:width].unsqueeze(0), values[:width].unsqueeze(0),
                            None if visible is None else visible.unsqueeze(0))[0]
    out.index_copy_(0, slots, predicted)
    return predicted


class EagleRows(FeatureRows):
    """One row's head cache: per entry its predicted feature (`out`), its key and value. The first `real` entries
    were computed from the target's features; later ones, computed from the head's own predictions, are computed
    again from the target's once it has them (the accepted drafts, at the next call). The three live in buffers
    that double when full (`out`, `keys` and `values` are views of their first entries), so that a call writes its
    new entries in place instead of copying the old ones."""

    _buffers = None
    step_function = staticmethod(eagle_step)

    def clear(self) -> None:
        super().clear()
        self._views(0)  # the buffers stay: graphs captured over them stay valid
        self.real = 0

    def _unshare(self) -> None:
        super()._unshare()
        self._buffers = None

    def _state(self) -> list:
        return list(zip(("the head's features", "the head's keys", "the head's values"), self._buffers))

    def _views(self, length: int) -> None:
        """`out`, `keys` and `values`: the first `length` entries of the buffers (made, or doubled, to hold them;
        a power of two of entries, at least 64; the graphs over the old ones dropped)."""
        if self._buffers is None or self._buffers[0].size(0) < length:
            head, device = self.head, self.embed.weight.device
            dtype = head.fc.weight.dtype
            old = 0 if self._buffers is None else self._buffers[0].size(0)
            size = max(64, 2 * old, 1 << (length - 1).bit_length())
            with torch.inference_mode():  # always inference tensors, as a compiled step's guards expect
                grown = (torch.zeros(size, head.fc.out_features, dtype=dtype, device=device),
                         torch.zeros(size, head.heads, head.dim, dtype=dtype, device=device),
                         torch.zeros(size, head.heads, head.dim, dtype=dtype, device=device))
                if self._buffers is not None:
                    filled = self.out.size(0)
                    for new, old in zip(grown, self._buffers):
                        new[:filled] = old[:filled]
                    self._graphs.clear()
                self._entries = torch.arange(size, device=device)
            self._buffers = grown
        self.out, self.keys, self.values = (buffer[:length] for buffer in self._buffers)

    def truncate(self, length: int) -> None:
        super().truncate(length)
        self._views(min(length, self.out.size(0)))
        self.real = min(self.real, length)

    def keep(self, entries: torch.Tensor) -> None:
        """Keeps a path: the committed entries in place, then the accepted nodes (computed from predictions)."""
        super().keep(entries)
        kept = [t.index_select(0, entries) for t in (self.out, self.keys, self.values)]
        self._views(entries.numel())
        with torch.inference_mode():  # the buffers may be inference tensors (made in a call)
            for view, values in zip((self.out, self.keys, self.values), kept):
                view.copy_(values)
        self.real = min(self.real, entries.numel())

    def _inputs(self, positions: torch.Tensor, features: Optional[torch.Tensor]) -> torch.Tensor:
        """The target's f_{P - 1} in the head's space at each position P [n] (zeros at P = 0; positions past what
        the target recorded read its last entry, for callers that pick another input there)."""
        if features is None or features.size(0) == 0:
            return torch.zeros(positions.numel(), self.out.size(1), dtype=self.out.dtype, device=positions.device)
        inputs = self.head.real(features.index_select(0, (positions - 1).clamp(0, features.size(0) - 1)))
        return torch.where((positions > 0).unsqueeze(1), inputs, torch.zeros_like(inputs))

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, feature: torch.Tensor,
             mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Appends entries (tokens, positions [n], input features [n, H]); mask bool [n, entries + n] (None: the
        old entries and the earlier new ones). Returns their predicted features [n, H]. With fixed shapes a call
        after the first entries reads a power-of-two bucket of entries (at least 16), the rest hidden by its mask,
        so that its shapes depend on n, the bucket and whether it is a tree call alone."""
        n, m = tokens.numel(), self.length
        self._views(m + n)  # the new entries are written in place
        slots = self._entries[m:m + n]
        if (self.shapes == "dynamic" and not self.compiled) or m == 0:  # the prompt's entries run as they are
            visible = mask
            if mask is None and n > 1:  # one new token sees every entry: no mask
                visible = torch.ones(n, m + n, dtype=torch.bool, device=tokens.device).tril(m)
            out = eagle_step(self.head, self.embed, self._own_vocab, *self._buffers, tokens, positions, feature,
                             slots, visible, m + n)
        else:
            keys = min(self._entries.numel(), max(16, 1 << (m + n - 1).bit_length()))
            visible = (self._entries[:keys] <= slots.unsqueeze(1)) if mask is None else F.pad(mask, (0, keys - m - n))
            out = self.fixed((n, mask is not None, keys), [tokens, positions, feature, slots, visible], self._step)
        self.tokens, self.positions = torch.cat([self.tokens, tokens]), torch.cat([self.positions, positions])
        return out

    def _step(self, inputs: list) -> torch.Tensor:
        """A fixed-shape call's step (eagle_step; compiled with compile=True) over inputs (tokens, positions,
        features, slots, visible)."""
        return self.stepper(self.head, self.embed, self._own_vocab, *self._buffers, *inputs, 0)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [k] after the entries (the committed sequence) -> logits [k, V]. Entries computed from
        predictions that the target has since computed are computed again first, in the same call."""
        with torch.inference_mode():
            return self.logits(torch.cat(self._computed(tokens))[-tokens.numel():])

    def _computed(self, tokens: torch.Tensor) -> list:
        """Appends tokens [k] (k >= 0) after the entries computed again from the target's features where it has
        them (a reset's entries, which are computed lazily, included); the predicted features of every entry
        computed (the LM head runs on the new tokens' only). Entries computed from predictions stay as they are
        while the target has no feature for the first of them (within a round of drafting: their inputs are
        unchanged)."""
        features, committed = self.target_features()
        start = min(self.real, self.out.size(0)) if self.real <= committed else self.out.size(0)
        tokens = torch.cat([self.tokens[start:], tokens])
        self.truncate(start)
        positions = torch.arange(start, start + tokens.numel(), device=tokens.device)
        ready = max(0, min(tokens.numel(), committed + 1 - start))  # positions P <= committed read f_{P - 1}
        outputs = []
        if ready:
            outputs.append(self._run(tokens[:ready], positions[:ready],
                                     self._inputs(positions[:ready], features), None))
            self.real = start + ready
        for j in range(ready, tokens.numel()):  # ahead of the target: the previous entry's prediction
            previous = self.out[-1:] if self.out.size(0) else self._inputs(positions[j:j + 1], None)
            outputs.append(self._run(tokens[j:j + 1], positions[j:j + 1], previous, None))
        return outputs

    def extend_masked(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Tentative tree nodes (cpp/models/model.h's extend_masked): node j reads its parent's prediction (the
        entry its mask shows at the highest position), or the target's feature where the target has it. The
        engine feeds a draft's tree level by level, so a parent is an earlier call's entry; a node whose parent is
        in the same call reads zeros for it (its q is what the call returns, so the law stays exact), which keeps
        the call free of host reads."""
        with torch.inference_mode():
            if self.out.size(0) < self.length:  # a reset's entries, not computed yet
                self._computed(self.tokens[:0])
            features, committed = self.target_features()
            m = self.length
            parents = parents_from_mask(self.positions, positions, mask)
            if m:
                predicted = self.out.index_select(0, parents.clamp(0, m - 1))
                known = ((parents >= 0) & (parents < m)).unsqueeze(1)
                predicted = torch.where(known, predicted, torch.zeros_like(predicted))
            else:
                predicted = self._inputs(positions, None)
            feature = torch.where((positions <= committed).unsqueeze(1), self._inputs(positions, features),
                                  predicted)
            return self.logits(self._run(tokens, positions, feature, mask))


class EagleDraft(FeatureDraft):
    """An EAGLE draft on ``target`` (a live transformers decoder-only LM, ``speculant.load`` of one, or of its
    TorchScript export or .pt2 package with features: feature_draft.py): one decoder layer of its own over the target's
    features, the target's embedding and LM head shared (the module docstring). ``feature_layers``: None (the LM head's
    input: EAGLE-1/2) or EAGLE-3's decoder layer indices (low, middle, high). ``heads`` (default: the target's attention
    heads) and ``intermediate_size`` (default: twice the hidden size) shape the layer; ``seed`` fixes its initial
    weights. ``compile=True`` runs its decoding steps through torch.compile (feature_draft.py). Train it with
    ``speculant.distill``."""

    kind = "eagle"
    training_depths = 3  # distill's training-time test: the depths unrolled per position

    def __init__(self, target, *, feature_layers: Optional[Sequence[int]] = None, heads: Optional[int] = None,
                 intermediate_size: Optional[int] = None, seed: int = 0, compile: bool = False):
        handle, source = feature_source(target, "EagleDraft")
        shapes = target_shapes(handle, "EagleDraft")
        hidden = shapes["hidden_size"]
        view = _view(feature_layers, shapes["num_hidden_layers"])
        heads = shapes["num_attention_heads"] if heads is None else heads
        if integer(heads, "heads", 1) and (hidden % heads or (hidden // heads) % 2):
            raise ValueError(f"heads must divide the hidden size {hidden} into an even head size, got {heads}")
        intermediate = 2 * hidden if intermediate_size is None else integer(intermediate_size,
                                                                            "intermediate_size", 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = EagleHead(hidden, heads, intermediate, hidden * (1 if view is None else len(view)))
        self._become(handle, source, EagleRows, head, view, {"feature_layers": None if view is None else list(view),
                                                             "heads": heads, "intermediate_size": intermediate},
                     compile)

    @classmethod
    def built(cls, target, config: dict, compile: bool = False) -> "EagleDraft":
        return cls(target, feature_layers=config["feature_layers"], heads=config["heads"],
                   intermediate_size=config["intermediate_size"], compile=compile)

    def predictions(self, head: EagleHead, ids: torch.Tensor, features: torch.Tensor, all_depths: bool) -> tuple:
        """Depth 1 (all unrolled depths with `all_depths`), each read at every position i as a law of token i + 1
        from position depth - 1 on; and the regression of the predicted features on the target's (EAGLE-1/2; none
        for EAGLE-3, which trains on the laws alone)."""
        with torch.no_grad():
            embedded = self.target.module.get_input_embeddings()(ids)
        outputs = head.unrolled(embedded, features, self.training_depths if all_depths else 1)
        predicted = [(out, 0, depth) for depth, out in enumerate(outputs)]
        return predicted, ((outputs[0], features) if self.feature_layers is None else None)


def _view(feature_layers, layers: int):
    """None, or EAGLE-3's layer indices as a tuple, checked against the target's `layers`."""
    if feature_layers is None:
        return None
    try:
        view = tuple(feature_layers)
    except TypeError:
        view = None
    if (not view or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in view)
            or len(set(view)) != len(view)):
        raise ValueError(f"feature_layers must be None or distinct decoder layer indices in [0, {layers - 1}] "
                         f"(EAGLE-3: low, middle, high), got {feature_layers!r}")
    return view
