"""Exporting a transformers decoder-only LM as an AOTInductor package (`.pt2`): no TorchScript, no Python at
run time (C++: torch::inductor::AOTIModelPackageLoader(path).run(inputs)).

    export_pt2(model, "out.pt2", max_length=None, metadata_json="{...}")

The package's one model keeps a preallocated static KV cache of `max_length` positions in its own buffers,
mutated in place and kept inside the loaded model across calls:

    run([input_ids int64 [1, k], cache_position int64 [k]]) -> [logits float32 [1, k, V]]

with cache_position = start, start + 1, ..., start + k - 1 (contiguous), 1 <= k and start + k <= max_length.
The call writes the k tokens' keys and values at those positions, and query j attends to cached positions
<= start + j only, so slots past the newest position are masked: prefill of T tokens is a call at start 0,
appending is a call at start = cached length, and a rollback is simply a later call with a smaller start.
Row j of the logits is the next-token distribution after token j (float32 whatever the model's dtype).
Positions outside [0, max_length) are not checked inside the package: the caller must keep to the range.

Metadata (AOTIModelPackageLoader::get_metadata(), a map<string, string>; filled from the inductor config
"aot_inductor.metadata"): "speculant.json" (the caller's JSON string), "vocab_size" and "max_length"
(decimal strings).

This module imports only torch, transformers and the standard library (not speculant's C++ extension).
"""
from __future__ import annotations

import json
import os
import traceback
from typing import Optional, Union

import torch

METADATA_KEY = "speculant.json"

__all__ = ["METADATA_KEY", "export_pt2"]


class _StaticCacheLM(torch.nn.Module):
    """forward(input_ids [1, k], cache_position [k]) -> logits float32 [1, k, V] with a static KV cache whose
    per-layer tensors are buffers of this module: keys_i / values_i [1, H_kv, max_length, D] and length_i
    (int64 scalar, the position the layer's next write starts at)."""

    def __init__(self, model, max_length: int):
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer
        from transformers.configuration_utils import get_head_shapes

        config = model.config.get_text_config(decoder=True)
        self.model = model
        self.cache = StaticCache(max_cache_len=max_length, config=config)
        for i, layer in enumerate(self.cache.layers):
            if isinstance(layer, StaticSlidingWindowLayer):
                # A rolling window cannot be rolled back; a full-length layer with the model's own
                # sliding-window mask gives the same attention (as transformers' executorch wrapper does).
                self.cache.layers[i] = StaticLayer(max_length)
            elif type(layer) is not StaticLayer:
                raise ValueError(f"{type(model).__name__}: cache layer {i} is a {type(layer).__name__}; the .pt2 "
                                 f"export supports attention layers with a static KV cache only")
        num_heads, head_dim = get_head_shapes(config)
        self.cache.early_initialization(1, num_heads, head_dim, model.dtype, model.device)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"keys_{i}", layer.keys, persistent=False)
            self.register_buffer(f"values_{i}", layer.values, persistent=False)
            self.register_buffer(f"length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.cache.layers):
            # Non-strict torch.export traces the module's buffers, not other references to the same tensors:
            # point the cache at the buffers on every call so that its in-place writes land in them.
            layer.keys, layer.values = getattr(self, f"keys_{i}"), getattr(self, f"values_{i}")
            layer.cumulative_length = getattr(self, f"length_{i}")
            # StaticLayer.update writes at length + arange(k) and the mask's query offset is this length.
            layer.cumulative_length.copy_(cache_position[0])
        out = self.model(input_ids=input_ids, position_ids=cache_position.unsqueeze(0),  # [1, k]
                         past_key_values=self.cache, use_cache=True)
        return out.logits.float()  # [1, k, V]


def _describe(error: BaseException) -> str:
    """The error's first line and the innermost frame outside torch that led to it (the failing operation)."""
    text = str(error).strip()
    described = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    torch_dir = os.path.dirname(torch.__file__)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)[1:]  # [0] is export_pt2's own call
              if not frame.filename.startswith(torch_dir)]
    if frames:
        described += f" (at {frames[-1].filename}:{frames[-1].lineno}: {frames[-1].line})"
    return described


def export_pt2(model, out_path: Union[str, os.PathLike], *, max_length: Optional[int] = None,
               metadata_json: str) -> None:
    """Writes `model` (a transformers *ForCausalLM in eval mode) to out_path (ending in .pt2) as an AOTInductor
    package following the contract in this module's docstring.

    max_length: positions the static KV cache holds (default min(config.max_position_embeddings, 4096); at
    most n_positions for GPT-2, whose positions are learned). metadata_json: a JSON string stored under
    "speculant.json". Raises ValueError naming what is wrong (arguments, or the operation torch.export
    could not trace)."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise ValueError(f"model must be a transformers model, got {name}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is an encoder-decoder model; export_pt2 exports decoder-only causal LMs")
    if model.training:
        raise ValueError(f"{name} is in training mode (dropout would be traced): call model.eval() first")
    text = config.get_text_config(decoder=True)
    positions = getattr(text, "max_position_embeddings", None)
    if max_length is None:
        if positions is None:
            raise ValueError(f"{name}: config has no max_position_embeddings; pass max_length")
        max_length = min(positions, 4096)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1 or None, got {max_length!r}")
    if text.model_type == "gpt2" and max_length > positions:
        raise ValueError(f"max_length must be <= n_positions = {positions} for GPT-2 (learned positions), "
                         f"got {max_length}")
    if not isinstance(metadata_json, str):
        raise ValueError(f"metadata_json must be a JSON string, got {type(metadata_json).__name__}")
    try:
        json.loads(metadata_json)
    except json.JSONDecodeError as error:
        raise ValueError(f"metadata_json is not valid JSON: {error}") from None
    out_path = os.fspath(out_path)
    if not out_path.endswith(".pt2"):
        raise ValueError(f"out_path must end in .pt2 (AOTInductor's package suffix), got {out_path!r}")

    from torch._inductor import aoti_compile_and_package

    # Example k = 2: sizes 0 and 1 would be specialised; the range still includes k = 1.
    k = min(2, max_length)
    input_ids = torch.zeros(1, k, dtype=torch.long, device=model.device)
    cache_position = torch.arange(k, device=model.device)
    dynamic_shapes = None
    if max_length > 1:
        tokens = torch.export.Dim("tokens", min=1, max=max_length)
        dynamic_shapes = ({1: tokens}, {0: tokens})
    with torch.no_grad():
        wrapper = _StaticCacheLM(model, max_length)
        try:
            program = torch.export.export(wrapper, (input_ids, cache_position), dynamic_shapes=dynamic_shapes,
                                          strict=False)
        except Exception as error:
            raise ValueError(f"torch.export cannot trace {name}: {_describe(error)}") from error
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        metadata = {METADATA_KEY: metadata_json, "vocab_size": str(text.vocab_size), "max_length": str(max_length)}
        aoti_compile_and_package(program, package_path=out_path, inductor_configs={"aot_inductor.metadata": metadata})
