"""Tree masks for transformers' attention layer types: each type's pattern applied to a given mask, on positions.

A tree call hands a transformers model a 4-D mask, which the model uses as it is: whatever pattern a layer type
adds to plain causal attention (masking_utils' overlays) must be in that mask already. This module knows the
patterns the engine's tree calls support and builds their masks from each query's and each key's position, for
the live models (live.py) and the .pt2 packages (export/pt2.py) alike. It imports torch only.

    layers = attention_layers(config)            # {"sliding_attention": 4096, "full_attention": None}
    obstacle(layers)                              # "" or why trees cannot be built for these layers
    attention_mask(mask, keys, queries, layers, attn_implementation, dtype)
    follows(model, layers)                        # "" or how the model's attention departs from these masks

A config is only what the model says of itself: `shrunk` sets every window and chunk to SMALL for a check whose
few positions then cross them, so a model whose attention does not apply its config's window as these masks do
(a stray field, an attention of its own) is found at load or export, not past the window in a generation.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch

# a layer type -> the config field its pattern reads (None: plain causal attention, the given mask as it is)
PATTERNS = {"full_attention": None, "sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}
SMALL = 2  # the window / chunk the checks run at (their sequences: 5 positions)
# how far a check's logits may differ from the model's own, relative to their scale: the same attention with
# another mask differs by rounding only (about 1e-6 in float32; bf16 / fp16 keep 8 / 11 bits of mantissa)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def attention_layers(config) -> dict[str, Optional[int]]:
    """The model's attention layer types, each with the size its pattern reads (sliding window, chunk; None for
    full attention or where the config lacks it), as transformers' masks read them: config.layer_types where the
    model has it; otherwise every layer slides when config.sliding_window is set (Mistral), else none (Qwen2
    keeps a sliding_window in its config beside full layers)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ("sliding_attention" if window else "full_attention",)
    return {kind: getattr(config, PATTERNS.get(kind) or "", None) for kind in dict.fromkeys(types)}


def positional(layers: dict[str, Optional[int]]) -> bool:
    """Whether some layer's pattern reads positions (a window, chunks): its mask needs each key's position."""
    return any(PATTERNS.get(kind) for kind in layers)


def obstacle(layers: dict[str, Optional[int]]) -> str:
    """Why tree masks cannot be built for these layers, or ""."""
    unknown = [kind for kind in layers if kind not in PATTERNS]
    if unknown:
        return (f"its layers of type {', '.join(map(repr, unknown))} have no tree mask here (tree calls build "
                f"masks for {', '.join(map(repr, PATTERNS))} layers)")
    unsized = [kind for kind, size in layers.items() if PATTERNS[kind] and not size]
    if unsized:
        return f"its config has {unsized[0]} layers but no {PATTERNS[unsized[0]]}"
    return ""


def attention_mask(mask: torch.Tensor, keys: Optional[torch.Tensor], queries: torch.Tensor,
                   layers: dict[str, Optional[int]], attn_implementation: Optional[str],
                   dtype: torch.dtype) -> Union[torch.Tensor, dict]:
    """The attention_mask argument of a call of k queries at positions `queries` [k] over S keys (cache entries
    and the new tokens) at positions `keys` [S] (read only where positional(layers)), attending where `mask`
    (bool [k, S]): [1, 1, k, S] for a model whose layers are all of one type, else the mapping from layer type to
    mask that transformers' models accept in place of one. Each type's pattern is masking_utils' overlay: a
    sliding window of w keeps keys at t - w < position <= t for a query at t, a chunk of c keys with
    position // c == t // c. Eager attention adds its mask to the scores: there it is 0 where attended and the
    dtype's lowest value elsewhere (eager_mask)."""
    k, size = mask.shape
    masks = {}
    for kind, span in layers.items():
        if kind == "sliding_attention":
            kept = mask & (keys.view(1, size) > queries.view(k, 1) - span)
        elif kind == "chunked_attention":
            kept = mask & (torch.div(keys.view(1, size), span, rounding_mode="floor")
                           == torch.div(queries.view(k, 1), span, rounding_mode="floor"))
        else:
            kept = mask
        kept = kept.view(1, 1, k, size)
        if attn_implementation == "eager":
            kept = torch.zeros(kept.shape, dtype=dtype, device=kept.device).masked_fill(~kept, torch.finfo(dtype).min)
        masks[kind] = kept
    return next(iter(masks.values())) if len(masks) == 1 else masks


@contextlib.contextmanager
def shrunk(config, layers: dict[str, Optional[int]]):
    """Every window and chunk field of `config` that `layers` reads set to SMALL for the duration (put back
    after, whatever happens). Yields (the layers at SMALL, the fields changed)."""
    fields = sorted({PATTERNS[kind] for kind, size in layers.items() if PATTERNS.get(kind) and size})
    saved = {field: getattr(config, field) for field in fields}
    try:
        for field in fields:
            setattr(config, field, SMALL)
        yield {kind: SMALL if PATTERNS.get(kind) and size else size for kind, size in layers.items()}, fields
    finally:
        for field, value in saved.items():
            setattr(config, field, value)


def follows(model, layers: dict[str, Optional[int]]) -> str:
    """Whether a decoder-only transformers model's attention applies its config's windows and chunks as
    attention_mask builds them: "" if it does, else what differs (with them at SMALL, the logits of 5 tokens
    under these masks against the model's own forward)."""
    config = model.config.get_text_config()
    count = 5
    ids = (torch.arange(1, count + 1, device=model.device) % config.vocab_size).view(1, count)
    positions = torch.arange(count, device=model.device)
    causal = torch.ones(count, count, dtype=torch.bool, device=model.device).tril()
    with shrunk(config, layers) as (small, fields), torch.no_grad():
        own = model(input_ids=ids).logits[0].float()
        masked = model(input_ids=ids, position_ids=positions.view(1, count), attention_mask=attention_mask(
            causal, positions, positions, small, config._attn_implementation, model.dtype)).logits[0].float()
    worst = ((masked - own).abs().max() / own.abs().max().clamp(min=1.0)).item()
    tolerance = TOLERANCE.get(model.dtype, 1e-2)
    if worst <= tolerance:
        return ""
    return (f"its attention does not apply {', '.join(fields)} as transformers' masks do: with it set to {SMALL}, "
            f"logits under the tree mask differ from the model's own by {worst:.3g} (relative; allowed "
            f"{tolerance:g})")
