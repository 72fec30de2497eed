"""T5's decoder on a token tree, for the live backend (live.py) and the .pt2 packages (export/pt2.py).

transformers computes T5's relative position bias from cache slots, but a tree node's ancestors are not the
slots before it: an attended key's position is its rank among the keys its query attends (each query sees
exactly its own path, as export/t5.py's tree calls do). So the decoder's blocks run here, with that bias and an
additive mask, over the model's own cache. It imports torch only.
"""
from __future__ import annotations

from typing import Optional

import torch


def t5_tree_logits(model, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, source: torch.Tensor,
                   cache, cache_position: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ids [1, T] at positions [T], attending where mask [T, K] (K: the cache's entries, then the T new ones),
    over the encoded source [1, S, d] -> logits [1, T, V]; the new keys and values go into `cache` (at
    cache_position where the cache is static)."""
    decoder = model.get_decoder()
    attention = decoder.block[0].layer[0].SelfAttention
    ranks = mask.to(torch.long).cumsum(-1) - 1  # [T, K]: an attended key's position on its query's path
    buckets = attention._relative_position_bucket(
        ranks - positions.view(-1, 1), bidirectional=False, num_buckets=attention.relative_attention_num_buckets,
        max_distance=attention.relative_attention_max_distance)  # [T, K]
    bias = attention.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # [1, H, T, K]
    hidden = decoder.embed_tokens(ids)  # [1, T, d]
    blocked = torch.zeros(mask.shape, dtype=hidden.dtype, device=hidden.device)
    blocked = blocked.masked_fill(~mask, torch.finfo(hidden.dtype).min).view(1, 1, *mask.shape)  # additive
    for block in decoder.block:
        hidden = block(hidden, attention_mask=blocked, position_bias=bias, encoder_hidden_states=source,
                       past_key_values=cache, cache_position=cache_position)[0]
    hidden = decoder.final_layer_norm(hidden)
    if getattr(model.config, "scale_decoder_outputs", True):
        hidden = hidden * model.model_dim ** -0.5
    return model.lm_head(hidden)
