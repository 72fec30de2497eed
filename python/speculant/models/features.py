"""A live target's own hidden states at each cache entry, for the drafts that read them (eagle.py, medusa.py).

A feature draft asks its target for a *view*: the LM head's input (the base model's output, after the final
norm: EAGLE-1/2 and Medusa), or the outputs of some decoder layers side by side (EAGLE-3's low, middle and high
layers). Forward hooks on those modules take the hidden states of every call the live model makes while armed,
and the model keeps them beside its cache: they are appended, truncated and kept exactly as its cache entries are.
No second target call is made: the verification's own forward hands them over. The hooks exist only while armed:
live.py arms them around its own forward, so calls made outside speculant record nothing and the user's model
holds none of speculant's state between calls (copy.deepcopy, pickle and torch.save of it work as before). Each
view counts its readers; the last one gone (a draft's finalizer) drops its tap.

`decoder_layers` finds a transformers LM's decoder layers (for these views and for early_exit.py), and
`with_layers` makes a view of a model with another list of them (early_exit.py, shared_exit.py).
`Features.committed` counts the leading entries that are the committed sequence (entry i at position i): a tree
call appends tentative entries after them, and only keep() (which keeps a path) makes entries committed again.
"""
from __future__ import annotations

import copy
from typing import Dict, Optional, Tuple

import torch

def decoder_layers(module) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """The base model of a transformers decoder-only LM, the name of its decoder-layer list and the list: the
    base model's nn.ModuleList child with one entry per hidden layer (Llama's ``layers``, GPT-2's ``h``, ...)."""
    base = getattr(module, getattr(module, "base_model_prefix", ""), None)
    count = getattr(module.config, "num_hidden_layers", None)
    if base is None or count is None:
        raise ValueError(f"{type(module).__name__} has no base model with a num_hidden_layers config; early exit "
                         "and EAGLE-3's layer features need a transformers decoder-only LM")
    found = [(name, child) for name, child in base.named_children()
             if isinstance(child, torch.nn.ModuleList) and len(child) == count]
    if len(found) != 1:
        raise ValueError(f"{type(module).__name__}'s base model has {len(found)} module lists of "
                         f"{count} layers (one is needed: its decoder layers)")
    return base, found[0][0], found[0][1]


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` sharing its children, parameters and buffers, whose own child table may be changed."""
    out = copy.copy(module)
    out._modules = dict(module._modules)
    out._parameters = dict(module._parameters)
    out._buffers = dict(module._buffers)
    return out


def with_layers(module, layers: list, config=None):
    """`module` (a transformers decoder-only LM) running `layers` in place of its decoder layers, sharing every
    other module and parameter with it (`config`: the view's, default the module's); `module` is left as it was."""
    base, name, _ = decoder_layers(module)
    cut = _shallow(base)
    setattr(cut, name, torch.nn.ModuleList(layers))
    view = _shallow(module)
    setattr(view, module.base_model_prefix, cut)
    if config is not None:
        cut.config = view.config = config
    return view


View = Optional[Tuple[int, ...]]  # None: the LM head's input; else decoder layer indices, side by side


class Tap:
    """Forward hooks on one transformers model for one view, shared by the live model and its replicas. They are
    registered while armed only (armed = True registers them, False or close() removes them), so that the model
    carries no hook of speculant's between calls."""

    def __init__(self, module, view: View):
        self.view = view
        self.readers = 0  # the feature drafts reading it (live.py drops the tap when none is left)
        self._taken: list = []
        if view is None:
            self._hooked = [module.base_model]
        else:
            _, _, layers = decoder_layers(module)
            self._hooked = [layers[i] for i in view]
        self._handles: list = []

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    @armed.setter
    def armed(self, armed: bool) -> None:
        if armed and not self._handles:
            self._handles = [m.register_forward_hook(self._hook) for m in self._hooked]
        elif not armed:
            self.close()

    def _hook(self, module, args, output) -> None:
        self._taken.append(output if isinstance(output, torch.Tensor) else output[0])

    def take(self) -> Optional[torch.Tensor]:
        """[B, k, D]: the states the last armed call recorded (side by side in view order), or None."""
        taken, self._taken = self._taken, []
        return torch.cat(taken, -1) if taken else None

    def close(self) -> None:
        """Removes the hooks (the tap may be armed again)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def recorded(module, view: View, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`view`'s states [B, T, D] over ids [B, T], and the logits [B, T, V], from one forward of `module` without a
    cache (training)."""
    tap = Tap(module, view)
    tap.armed = True
    try:
        with torch.no_grad():
            logits = module(input_ids=ids, use_cache=False).logits
        return tap.take(), logits
    finally:
        tap.close()


class Features:
    """One live model's recorded states, per view, aligned with its cache entries."""

    def __init__(self, taps: Dict[View, Tap]):
        self.taps = taps  # shared with the replicas: one hook per module and view
        self.values: Dict[View, torch.Tensor] = {}
        self.committed = 0

    def fresh(self) -> "Features":
        return Features(self.taps)

    def arm(self, armed: bool) -> None:
        for tap in self.taps.values():
            tap.armed = armed
            if not armed:
                tap.take()  # a failed call leaves nothing behind

    def drop(self, view: View) -> bool:
        """One reader of `view` fewer; the last one drops the tap (shared with the replicas). Returns whether it
        was the last."""
        tap = self.taps.get(view)
        if tap is None:
            return False
        tap.readers -= 1
        if tap.readers > 0:
            return False
        tap.close()
        del self.taps[view]
        return True

    def record(self, start: int, linear: bool) -> None:
        """After a call that appended entries from `start`: keeps what each tap took. `linear`: the entries are
        the committed sequence's next positions (a plain extend), not a tree's tentative nodes."""
        count = 0
        for view, tap in self.taps.items():
            taken = tap.take()
            if taken is None:
                continue
            taken = taken[0]
            count = taken.size(0)
            old = self.values.get(view)
            if start == 0:
                self.values[view] = taken
            elif old is not None and old.size(0) >= start:
                self.values[view] = torch.cat([old[:start], taken])
            else:  # tapped after this cache's first entries: nothing to align with until the next reset
                self.values.pop(view, None)
        if linear and self.committed == start:
            self.committed = start + count

    def truncate(self, length: int) -> None:
        self.values = {view: value[:length] for view, value in self.values.items()}
        self.committed = min(self.committed, length)

    def keep(self, entries: torch.Tensor) -> None:
        """The engine keeps a path (the committed entries, then the accepted nodes at the next positions)."""
        self.values = {view: value.index_select(0, entries) for view, value in self.values.items()}
        self.committed = entries.numel()

    def reset(self) -> None:
        self.values = {}
        self.committed = 0

    def read(self, view: View) -> tuple[Optional[torch.Tensor], int]:
        """The states of `view` at every entry ([entries, D]; None before the first call) and how many leading
        entries are committed."""
        value = self.values.get(view)
        return value, (0 if value is None else self.committed)
