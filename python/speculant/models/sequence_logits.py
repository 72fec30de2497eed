"""A model's own logits over a whole sequence, recomputed without the engine.

``speculant.testing`` checks the engine's output law against them. ``speculant.distillation`` trains a draft on
them, and ``CrossTokenizer`` samples its intersection mode from them.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, List

import torch

from .model import Model, ModelLike, load

SequenceLogits = Callable[[List[int]], torch.Tensor]  # T token ids -> the logits at every position [T, V]


def sequence_logits(model: ModelLike, name: str, encoder_input_ids=None) -> SequenceLogits:
    """The model's logits [T, V] at every position of a sequence of T token ids (row i: the law of token i + 1),
    from the model itself, recomputed over the whole sequence at every call without gradients: a TorchScript
    module's ``prefill`` (cached form) or ``forward``, a live transformers model's forward without a cache
    (padded with -inf to the handle's vocabulary), a .pt2 package's call at position 0; an encoder-decoder's
    source is encoded first, once, from ``encoder_input_ids``. ``model`` is anything ``speculant.load`` takes
    (a path or a transformers model is loaded with it), or the loaded handle; ``name`` names it in errors."""
    if isinstance(model, torch.jit.ScriptModule):
        return _script_logits(model, None, encoder_input_ids)
    handle = model if isinstance(model, Model) else load(model)
    if handle.module is not None:  # a live transformers model or a save_pretrained directory
        return _live_logits(handle, encoder_input_ids)
    if not os.path.isfile(handle.source):
        raise ValueError(f"{name} was loaded from memory, so its logits cannot be recomputed: pass the "
                         "torch.jit.ScriptModule or the file itself, or target_logits")
    if handle.form == "pt2":
        return _pt2_logits(handle, encoder_input_ids)
    with warnings.catch_warnings():  # TorchScript's deprecation notice (torch >= 2.11), nothing else
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
        module = torch.jit.load(handle.source, map_location=handle.device)
    return _script_logits(module, handle.device, encoder_input_ids)


def _source(encoder_input_ids, device) -> torch.Tensor:
    return torch.as_tensor(encoder_input_ids, dtype=torch.long, device=device).reshape(1, -1)  # [1, S]


def _script_logits(module: torch.jit.ScriptModule, device, encoder_input_ids) -> SequenceLogits:
    method = module.prefill if hasattr(module, "prefill") else module.forward
    if device is None:
        tensors = [*module.parameters(), *module.buffers()]
        device = tensors[0].device if tensors else torch.device("cpu")
    if encoder_input_ids is not None:
        with torch.no_grad():
            module.encode(_source(encoder_input_ids, device))

    def logits(ids: List[int]) -> torch.Tensor:
        with torch.no_grad():
            return method(torch.tensor([ids], dtype=torch.long, device=device))[0]  # [T, V]

    return logits


def _live_logits(handle: Model, encoder_input_ids) -> SequenceLogits:
    """The transformers model's own uncached forward; logits padded with -inf to the handle's vocabulary (a
    ``vocab_size=`` given to load), as the engine sees them."""
    module, vocab = handle.module, handle.vocab_size
    device = module.device
    encoded = None
    if handle.encoder_decoder:
        source = _source(encoder_input_ids, device)
        with torch.inference_mode():
            encoded = module.get_encoder()(input_ids=source, attention_mask=torch.ones_like(source))

    def logits(ids: List[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T]
        with torch.inference_mode():
            if encoded is not None:
                out = module(encoder_outputs=encoded, attention_mask=torch.ones_like(source),
                             decoder_input_ids=tokens, use_cache=False)
            else:  # an explicit mask: a model with a pad id would otherwise look for it in the ids and warn
                out = module(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False)
        rows = out.logits[0].float()  # [T, V_own]
        return torch.nn.functional.pad(rows, (0, vocab - rows.size(-1)), value=float("-inf"))  # [T, V]

    return logits


def _pt2_logits(handle: Model, encoder_input_ids) -> SequenceLogits:
    """A second copy of the .pt2 package, called as the engine's prefill: the whole sequence at position 0
    (export/pt2.py: run(input_ids [1, T], cache_position [T]) -> logits [1, T, V]; the tree form with positions
    equal to the slots, a causal mask and no move)."""
    from torch._inductor.package import load_package

    device = handle.device
    index = -1 if device.index is None else device.index
    decoder = load_package(handle.source, "model", device_index=index)
    encoded = ()
    if handle.encoder_decoder:
        encoded = tuple(load_package(handle.source, "encoder", device_index=index)(
            _source(encoder_input_ids, device)))

    metadata = decoder.get_metadata()
    width = int(metadata["max_length"])

    def logits(ids: List[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T]
        slots = torch.arange(len(ids), device=device)
        tree = ()
        if metadata.get("tree_calls") == "1":
            no_move = slots[:1]
            tree = (slots, slots.unsqueeze(1) >= torch.arange(width, device=device), no_move, no_move)
        with torch.no_grad():
            return decoder(tokens, slots, *tree, *encoded)[0]  # [T, V]

    return logits
