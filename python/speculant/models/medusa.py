"""Medusa drafts (Cai et al. 2024): k heads on the target's last hidden state, head j predicting the token j
positions past the target's own next token.

Head j is a residual block, h + SiLU(W_j h + b_j), followed by the target's own LM head (shared: Medusa-1 gives
each head its own copy; sharing keeps the draft at k (H^2 + H) parameters). W_j starts at zero, so an untrained
head predicts what the LM head does. The anchor is the target's feature at its last committed position, f_{L-1},
from which the target drew the token at L: the draft's law for the token at L + j is head j's, whatever tokens were
drafted before it (a draft law may ignore them: the engine verifies the q each call returns). Past the k-th
position the k-th head's law stands in. With ``tree=`` the heads' top candidates (T = 0) or draws form the tree.
"""
from __future__ import annotations

import torch
from torch import nn

from ..arguments import integer
from .feature_draft import FeatureDraft, FeatureRows, feature_source, target_shapes


class MedusaHeads(nn.Module):
    """k residual blocks over a hidden state [..., H] -> [..., k, H] (head j's in row j - 1)."""

    def __init__(self, hidden: int, count: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(count))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([hidden + nn.functional.silu(block(hidden)) for block in self.blocks], -2)


def medusa_step(head: MedusaHeads, anchor: torch.Tensor, own: torch.Tensor, depth: torch.Tensor,
                known: torch.Tensor) -> torch.Tensor:
    """The hidden states [n, H] the laws read: the target's own (`own` [n, H]) where `known` [n] is set, else
    head depth[n] + 1's at the anchor [H]."""
    return torch.where(known.unsqueeze(1), own, head(anchor).index_select(0, depth))


class MedusaRows(FeatureRows):
    """One row: the positions it was fed (no cache of its own); its laws are read from the target's features."""

    step_function = staticmethod(medusa_step)

    def _laws(self, positions: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] of the token after each position P: head P + 1 - L at the anchor f_{L-1}, or the
        target's own head at f_P where the target has computed f_P (P < L)."""
        features, committed = self.target_features()
        heads = self.head.blocks
        if features is None or committed == 0:  # nothing computed yet: the heads over a zero anchor
            anchor = torch.zeros(heads[0].in_features, dtype=heads[0].weight.dtype, device=positions.device)
            own = anchor.expand(positions.numel(), -1)
        else:
            anchor = features[committed - 1]
            own = features.index_select(0, positions.clamp(max=committed - 1))
        depth = (positions + 1 - committed).clamp(1, len(heads)) - 1
        inputs = [anchor, own, depth, positions < committed]
        return self.logits(self.fixed((positions.numel(), False, 0), inputs, self._step))

    def _step(self, inputs: list) -> torch.Tensor:
        return self.stepper(self.head, *inputs)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            positions = torch.arange(self.length, self.length + tokens.numel(), device=tokens.device)
            self.tokens, self.positions = torch.cat([self.tokens, tokens]), torch.cat([self.positions, positions])
            return self._laws(positions)

    def extend_masked(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            self.tokens, self.positions = torch.cat([self.tokens, tokens]), torch.cat([self.positions, positions])
            return self._laws(positions)


class MedusaDraft(FeatureDraft):
    """Medusa heads on ``target`` (a live transformers decoder-only LM, ``speculant.load`` of one, or of its export:
    feature_draft.py): ``heads`` residual blocks on its last hidden state, sharing its LM head (the module docstring).
    ``compile=True`` runs their decoding steps through torch.compile. Train them with ``speculant.distill``."""

    kind = "medusa"

    def __init__(self, target, heads: int = 4, *, compile: bool = False):
        handle, source = feature_source(target, "MedusaDraft")
        count = integer(heads, "heads", 1)
        hidden = target_shapes(handle, "MedusaDraft")["hidden_size"]
        self._become(handle, source, MedusaRows, MedusaHeads(hidden, count), None, {"heads": count}, compile)

    @classmethod
    def built(cls, target, config: dict, compile: bool = False) -> "MedusaDraft":
        return cls(target, heads=config["heads"], compile=compile)

    def predictions(self, head: MedusaHeads, ids: torch.Tensor, features: torch.Tensor, all_depths: bool) -> tuple:
        """Head j's hidden states from the anchor f_{i-1} at every position i, a law of token i + j (offset
        j - 1); head 1's alone unless `all_depths`. No feature regression."""
        anchors = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)
        hidden = head(anchors)  # [B, T, k, H]
        return [(hidden[:, :, j], j, 0) for j in range(hidden.size(2) if all_depths else 1)], None
