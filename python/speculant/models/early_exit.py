"""Early-exit drafts (self-speculation, as LayerSkip and transformers' ``assistant_early_exit``): the target's
first l layers, its final norm and its LM head, as the draft of the target itself.

``EarlyExitDraft(target, exit_layer=l)`` is a ``speculant.Model`` built on a view of the live transformers target:
the same module objects (so the same parameter tensors: no parameter of its own), with the decoder stack cut to
its first l layers and a config that says so. The view runs transformers' own forward, so its logits are the
target's final norm and LM head applied to the hidden state after layer l. It keeps a cache of its own (l layers);
sharing those layers' cache with the target, as LayerSkip does, is not done.

The engine verifies the draft's real q, as for any draft model, so decoding stays exact at every temperature,
with chains, token trees, batches and as the bottom level of a hierarchy. How often the draft is right depends on
how well the target's middle layers predict its output (LayerSkip trains for it; a model that was not trained for
early exit accepts less).
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from . import live
from .features import decoder_layers
from .model import Model, load


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` sharing its children, parameters and buffers, whose own child table may be changed."""
    out = copy.copy(module)
    out._modules = dict(module._modules)
    out._parameters = dict(module._parameters)
    out._buffers = dict(module._buffers)
    return out


def early_exit_view(module, exit_layer: int):
    """`module` (a transformers decoder-only LM) with only its first `exit_layer` decoder layers, sharing every
    module and parameter with it; `module` itself is left as it was."""
    if not live.is_transformers_model(module):
        raise ValueError(f"EarlyExitDraft: target must be a live transformers model or speculant.load of one, "
                         f"got {type(module).__name__}")
    if getattr(module.config, "is_encoder_decoder", False):
        raise ValueError(f"EarlyExitDraft: {type(module).__name__} is an encoder-decoder model; early exit drafts "
                         "decoder-only models")
    base, name, layers = decoder_layers(module)
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < len(layers):
        raise ValueError(f"exit_layer must be an integer in [1, {len(layers) - 1}] (the target has {len(layers)} "
                         f"layers), got {exit_layer!r}")
    config = copy.deepcopy(module.config)
    config.num_hidden_layers = exit_layer
    if getattr(config, "layer_types", None):  # per-layer attention kinds (sliding windows): the first l
        config.layer_types = list(config.layer_types)[:exit_layer]
    cut = _shallow(base)
    setattr(cut, name, torch.nn.ModuleList(list(layers)[:exit_layer]))
    cut.config = config
    view = _shallow(module)
    setattr(view, module.base_model_prefix, cut)
    view.config = config
    return view


class EarlyExitDraft(Model):
    """The target's first ``exit_layer`` layers, its final norm and its LM head as a draft (see the module
    docstring). ``target``: a live transformers decoder-only LM, or ``speculant.load`` of one. ``compile=True``
    and ``max_length`` as in ``speculant.load``."""

    def __init__(self, target, exit_layer: int, *, compile: bool = False, max_length: Optional[int] = None):
        module = target.module if isinstance(target, Model) else target
        if isinstance(target, Model) and module is None:
            raise ValueError(f"EarlyExitDraft: target {target.source} is an exported file ({target.form} form); "
                             "early exit needs the live transformers model (pass it, or speculant.load of it)")
        view = early_exit_view(module, exit_layer)
        vocab_size = target.vocab_size if isinstance(target, Model) else None
        vars(self).update(vars(load(view, vocab_size=vocab_size, compile=compile, max_length=max_length)))
        self.source = f"{type(module).__name__} exiting after layer {exit_layer}"
        self.exit_layer = exit_layer
        self.target_module = module
