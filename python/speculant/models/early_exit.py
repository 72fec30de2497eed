"""Early-exit drafts (self-speculation, as LayerSkip and transformers' ``assistant_early_exit``): the target's
first l layers, its final norm and its LM head, as the draft of the target itself.

``EarlyExitDraft(target, exit_layer=l)`` is a ``speculant.Model`` built on a view of the live transformers target:
the same module objects (so the same parameter tensors: no parameter of its own), with the decoder stack cut to
its first l layers and a config that says so. The view runs transformers' own forward, so its logits are the
target's final norm and LM head applied to the hidden state after layer l. By default it keeps no cache of its own:
its entries live in the target's first l layers, and the target's verification of a drafted chain starts from the
draft's work there, as LayerSkip's self-speculation does (shared_exit.py). ``share_cache=False`` gives it a cache of
its own (l layers), as transformers' ``assistant_early_exit`` keeps.

The engine verifies the draft's real q, as for any draft model, so decoding stays exact at every temperature,
with chains, token trees, batches and as the bottom level of a hierarchy. How often the draft is right depends on
how well the target's middle layers predict its output (LayerSkip trains for it; a model that was not trained for
early exit accepts less).
"""
from __future__ import annotations

import copy
import weakref
from typing import Optional

from .. import _core
from ..arguments import flag
from . import live, shared_exit
from .features import decoder_layers, with_layers
from .model import Model, load


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
    return with_layers(module, list(layers)[:exit_layer], config)


class EarlyExitDraft(Model):
    """The target's first ``exit_layer`` layers, its final norm and its LM head as a draft (see the module
    docstring). ``target``: a live transformers decoder-only LM, or ``speculant.load`` of one. ``share_cache``
    (default True): keep those layers' cache once, in the target's, and let the target's verification start from
    the draft's work (shared_exit.py); False: a cache of its own, as transformers' ``assistant_early_exit`` keeps.
    ``compile=True`` (with ``share_cache=False``) and ``max_length`` as in ``speculant.load``."""

    def __init__(self, target, exit_layer: int, *, share_cache: bool = True, compile: bool = False,
                 max_length: Optional[int] = None):
        module = target.module if isinstance(target, Model) else target
        if isinstance(target, Model) and module is None:
            raise ValueError(f"EarlyExitDraft: target {target.source} is an exported file ({target.form} form); "
                             "early exit needs the live transformers model (pass it, or speculant.load of it)")
        view = early_exit_view(module, exit_layer)
        source = f"{type(module).__name__} exiting after layer {exit_layer}"
        if flag(share_cache, "share_cache"):
            handle = target if isinstance(target, Model) else load(module)
            shared, hub = _sharing(handle, view, exit_layer, source, compile)
            vars(self).update(vars(shared))
            weakref.finalize(self, hub.close)  # the target keeps its cache alone once the draft is gone
        else:
            vocab_size = target.vocab_size if isinstance(target, Model) else None
            vars(self).update(vars(load(view, vocab_size=vocab_size, compile=compile, max_length=max_length)))
            handle = None
        self.source = source
        self.exit_layer = exit_layer
        self.target = handle  # the target it shares a cache with (SpeculativeDecoder decodes with it), or None


def _sharing(handle: Model, view, exit_layer: int, source: str, compile: bool) -> tuple:
    """The draft's handle sharing `handle`'s first layers' cache and what they share (shared_exit.ExitShare), or
    ValueError saying why it cannot."""
    impl = handle.live
    if compile:
        raise ValueError("EarlyExitDraft: compile=True runs the draft with a static cache of its own; pass "
                         "share_cache=False with it")
    if handle.form != "live":
        raise ValueError(f"EarlyExitDraft: share_cache=True needs the eager live target (speculant.load(model)); "
                         f"{handle.source} is of the {handle.form} form (or pass share_cache=False)")
    if impl.sharing is not None:  # one draft shares a target's cache: the newest (the older one refuses calls)
        impl.sharing.hub.close()
    why = impl.tree_obstacle()  # its verification calls take 4-D masks as tree calls do
    if not why and impl.patterned:
        why = "its layers have sliding windows or chunks"
    draft = shared_exit.SharingDraft(view, vocab_size=handle.vocab_size, name=source)
    why = why or draft.tree_obstacle()  # probed now, on its own cache
    if not why:
        hub = shared_exit.ExitShare(impl, view, exit_layer)
        draft.share(impl, hub)
        why = shared_exit.probe(draft, impl)
        if why:
            hub.close()
    if why:
        raise ValueError(f"EarlyExitDraft: {handle.source} cannot share its first layers' cache with the draft: "
                         f"{why}; pass share_cache=False")
    return Model(_core.python_model(draft, source), source, module=view, live=draft), hub
