"""What a plain-form TorchScript module's forward returns, and the logits taken from a transformers model traced by
``torch.jit.trace`` (transformers' TorchScript tutorial).

The plain form's contract is ``forward(input_ids[1, T]) -> logits[1, T, V]`` (model.py). A transformers model
traced with ``use_cache=False`` and ``strict=False`` returns its ModelOutput as a dict holding ``logits``, and one
traced to return tuples (``return_dict=False``) returns them first in a tuple. `logits_only` wraps such a module
in a scripted one whose forward returns those logits alone, and says what it took; anything else that is not a
logits tensor is refused with what it returned and the fixes.
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch

CACHED_METHODS = ("prefill", "extend", "truncate", "cache_length", "encode")

FIXES = ("export the model with speculant.export(model, 'model.pt') (the cached form, with a KV cache), or trace "
         "a wrapper module whose forward returns model(input_ids).logits")


class _Logits(torch.nn.Module):
    """A traced module's forward with its logits alone (its int attributes vocab_size / max_length kept)."""

    def __init__(self, inner: torch.jit.ScriptModule):
        super().__init__()
        self.inner = inner
        for name in ("vocab_size", "max_length"):
            value = getattr(inner, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, value)


class _DictLogits(_Logits):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids)["logits"]


class _FirstLogits(_Logits):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids)[0]


def is_plain(module: torch.jit.ScriptModule) -> bool:
    """Whether `module` has the plain form's forward and none of the cached form's methods."""
    methods = {name for name in CACHED_METHODS if _has_method(module, name)}
    return not methods and _has_method(module, "forward")


def _has_method(module: torch.jit.ScriptModule, name: str) -> bool:
    try:
        return module._c._has_method(name)
    except AttributeError:
        return hasattr(module, name)


def _is_logits(value) -> bool:
    """Whether `value` is a floating-point [1, 1, V] tensor (the probe's one token)."""
    return (isinstance(value, torch.Tensor) and value.dim() == 3 and tuple(value.shape[:2]) == (1, 1)
            and value.is_floating_point())


def describe(value) -> str:
    """What a forward returned, for messages: its type with its keys, length or shape."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} Tensor of shape [{', '.join(map(str, value.shape))}]"
    if isinstance(value, dict):
        items = ", ".join(f"{key!r}: {describe(item)}" for key, item in list(value.items())[:4])
        return f"a dict of {len(value)} ({items}{', ...' if len(value) > 4 else ''})"
    if isinstance(value, (tuple, list)):
        items = ", ".join(describe(item) for item in value[:3])
        return f"a {type(value).__name__} of {len(value)} ({items}{', ...' if len(value) > 3 else ''})"
    return f"a {type(value).__name__}"


def _device(module: torch.jit.ScriptModule) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def logits_only(module: torch.jit.ScriptModule, source: str) -> Tuple[torch.jit.ScriptModule, Optional[str]]:
    """`module` as it is when its forward returns logits (or it is not of the plain form: the engine judges it),
    else (a scripted wrapper returning its logits, what was taken: "its forward returns a dict: speculant takes its
    'logits'"). ValueError naming what forward(input_ids[1, 1]) returned when it holds no logits."""
    if not is_plain(module):
        return module, None
    probe = torch.zeros(1, 1, dtype=torch.long, device=_device(module))  # [1, 1]
    try:
        with torch.inference_mode():
            out = module(probe)
    except Exception as error:  # noqa: BLE001 - any failure of the user's forward, reported as the contract's
        raise ValueError(f"model {source}: forward(input_ids[1, 1]) failed ({type(error).__name__}: "
                         f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''}); the plain form "
                         f"calls forward(input_ids[1, T]) -> logits[1, T, V] with one argument; {FIXES}") from None
    if _is_logits(out):
        return module, None
    if isinstance(out, dict) and _is_logits(out.get("logits")):
        wrapper, note = _DictLogits(module), "its forward returns a dict: speculant takes its 'logits'"
    elif isinstance(out, (tuple, list)) and out and _is_logits(out[0]):
        wrapper = _FirstLogits(module)
        note = f"its forward returns a {type(out).__name__}: speculant takes its first element, the logits"
    else:
        raise ValueError(f"model {source}: forward(input_ids[1, T]) must return logits [1, T, V] (a floating-point "
                         "Tensor, or a dict holding them under 'logits' or a tuple holding them first, as "
                         f"transformers' traced models return), got {describe(out)} for input_ids [1, 1]; {FIXES}")
    try:
        with warnings.catch_warnings():  # TorchScript's deprecation notice (torch >= 2.11), nothing else
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
            return torch.jit.script(wrapper.eval()), note
    except RuntimeError as error:  # the output's static type holds no Tensor there (a dict of mixed values)
        typed = module.forward.schema.returns[0].type
        raise ValueError(f"model {source}: its forward returns {typed}, whose logits are not typed as a Tensor, so "
                         f"speculant cannot take them ({str(error).strip().splitlines()[0]}); {FIXES}") from None
