"""An exported target's hidden states, for the drafts that read them (feature_draft.py), as live.py's LiveModel
hands over a live target's.

A TorchScript file from ``speculant.export`` keeps, on request, each cache slot's features beside its keys and
values (export/cached.py: ``record_features``; the contract in cpp/models/model.h): the same calls write them, tree
commits move them with the keys and values, and CUDA graphs replay the writes. A .pt2 package exported with
``features=`` keeps them always, for the view it was exported with (export/pt2.py). The engine knows each row's
length, so a row's features are its committed entries. A file records one view at a time: every feature draft
reading one exported target reads the same view.
"""
from __future__ import annotations

import json
import weakref
from typing import Optional

import torch

from .features import View


class ExportedRow:
    """Row `index` of an exported target's batches (0: its batch-1 cache too)."""

    def __init__(self, owner: "ExportedFeatures", index: int):
        self.owner, self.index = owner, index

    def features(self, view: View) -> tuple[Optional[torch.Tensor], int]:
        """`view`'s states at the row's committed entries ([entries, F], None before any) and their count."""
        owner = self.owner
        if view != owner.view:
            raise ValueError(f"{owner.source} records the features of {_named(owner.view)}, not {_named(view)}")
        value = owner.core.features(self.index)
        return (value, value.size(0)) if value.size(0) else (None, 0)


class ExportedFeatures:
    """The feature-draft side of an exported target: a speculant.Model of the cached TorchScript form, or a .pt2
    package exported with features=."""

    encoder_decoder = False

    def __init__(self, handle):
        core = handle.engine
        obstacle = core.features_obstacle
        if obstacle:
            raise ValueError(f"feature drafts: target {handle.source} cannot hand its hidden states over: {obstacle}")
        self.core, self.source = core, handle.source
        self.vocab_size, self.max_length = handle.vocab_size, handle.max_length
        self.metadata = json.dumps(handle.metadata)  # a JSON string, as LiveModel's
        self.device = str(handle.device)
        embedding, head = core.feature_weights()
        self._layers = (torch.nn.Embedding.from_pretrained(embedding, freeze=True),
                        _linear(head))
        self.view: View = None
        self.readers = 0

    def shared_layers(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The target's input embedding and LM head (modules over the file's own weights)."""
        return self._layers

    def tap(self, view: View) -> None:
        if self.readers and view != self.view:
            raise ValueError(f"{self.source} already records the features of {_named(self.view)} for another "
                             f"draft; an exported target records one view at a time, not also {_named(view)}")
        if not self.readers:
            self.core.record_features([] if view is None else list(view))
            self.view = view
        self.readers += 1

    def untap(self, view: View) -> None:
        """A reader is gone (a feature draft's finalizer): the last one stops the recording."""
        if self.readers and view == self.view:
            self.readers -= 1
            if not self.readers:
                self.core.record_features(None)

    def row(self, index: int) -> ExportedRow:
        return ExportedRow(self, index)


_SOURCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # handle -> its ExportedFeatures


def exported_features(handle) -> ExportedFeatures:
    """The one ExportedFeatures of the exported target `handle` (ValueError where it keeps no features)."""
    source = _SOURCES.get(handle)
    if source is None:
        source = _SOURCES[handle] = ExportedFeatures(handle)
    return source


def _named(view: View) -> str:
    return "the LM head's input" if view is None else f"layers {', '.join(map(str, view))}"


def _linear(weight: torch.Tensor) -> torch.nn.Linear:
    """A bias-free nn.Linear over `weight` [out, in] (its storage, not a copy)."""
    layer = torch.nn.Linear(weight.size(1), weight.size(0), bias=False, device="meta")
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return layer
