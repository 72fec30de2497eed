"""What EAGLE and Medusa drafts share (eagle.py, medusa.py): a draft model over its target's own hidden states.

A feature draft is a ``speculant.Model`` (the live form's contract, cpp/models/python_model.h), so it drafts
wherever a draft model does: chains, ``tree=``, ``DynamicTree``, batches, the bottom level of a hierarchy, sweeps
and ``check_distribution``. Its calls read the hidden states the target recorded at its own calls (features.py):
the target's forward hands them over, and no second target call is made.

Which features it reads. The engine keeps a draft's cache one token behind the sequence, and the target's one
token behind too (cpp/drafting/model_drafter.cpp, cpp/loop): when the draft runs token s_P at position P, the
target has recorded f_i for every committed position i < its length. A draft input at position P takes the
target's f_{P - 1} where the target has it, and the draft's own prediction of it (an earlier entry's output)
where it does not (the positions it drafts ahead of the target). Exactness never depends on this: the engine
verifies the q each call returns, whatever it is.

The target is live (live.py records the features with forward hooks), a TorchScript export or a .pt2 package exported
with features= (exported_features.py: the file keeps them per cache slot). Row r of a batch reads row r of the target
(live.py: its replicas in the order made, as rows.cpp makes them; an export: row r of its native rows). The draft must
run with the target it was built on: SpeculativeDecoder refuses another by name.

With cuda_graphs "fixed", "auto" or "on" (decoding/graphs.py) the head's decoding calls have fixed shapes: their
inputs go through the static buffers of the engine's graph cache, captured into CUDA graphs on a GPU (``fixed``).

Its head is a plain ``torch.nn.Module`` (``draft.head``); the target's embedding and LM head are shared and never
copied. ``draft.save(directory)`` writes the head (safetensors) and a config.json; ``Draft.load(directory,
target)`` reads them back onto a target with the same hidden size and vocabulary.
"""
from __future__ import annotations

import copy
import json
import os
import types
import weakref
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from .. import _core
from . import features
from .compiled_live import inductor_options
from .features import recorded
from .exported_features import exported_features
from .live import damaged_weights, is_transformers_model
from .model import Model, load

CONFIG = "config.json"
WEIGHTS = "head.safetensors"


def feature_source(target, name: str):
    """The target's handle and what hands its hidden states over (live.LiveModel, or an exported file's
    ExportedFeatures), or ValueError saying why it cannot feed a feature draft."""
    handle = target if isinstance(target, Model) else None
    if handle is None:
        if not is_transformers_model(target):
            raise ValueError(f"{name}: target must be a live transformers model, speculant.load of one or of a "
                             f"TorchScript file speculant.export wrote, got {type(target).__name__}")
        handle = load(target)
    if handle.form == "compiled":
        raise ValueError(f"{name}: target {handle.source} was loaded with compile=True; feature drafts read the "
                         "eager live model's hidden states (speculant.load(model) without compile)")
    if handle.form not in ("live", "cached", "pt2"):
        raise ValueError(f"{name}: target {handle.source} is of the {handle.form} form; feature drafts read the "
                         "hidden states of a live transformers model, of a TorchScript file speculant.export "
                         "wrote (.pt) or of a .pt2 package exported with features=")
    if handle.encoder_decoder:
        raise ValueError(f"{name}: {handle.source} is an encoder-decoder model; feature drafts draft decoder-only "
                         "targets")
    if handle.live is not None:
        return handle, handle.live
    return handle, exported_features(handle)


SHAPES = ("hidden_size", "num_hidden_layers", "num_attention_heads")  # what a feature draft reads of its target


def target_shapes(handle: Model, name: str) -> dict:
    """The target's SHAPES: its text config's, or an exported file's metadata (ValueError where it has none)."""
    if handle.module is not None:
        config = handle.module.config.get_text_config()
        return {key: int(getattr(config, key)) for key in SHAPES}
    missing = [key for key in SHAPES if not isinstance(handle.metadata.get(key), int)]
    if missing:
        raise ValueError(f"{name}: the metadata of {handle.source} has no {', '.join(missing)}; re-export it with "
                         "this version of speculant.export, which writes them")
    return {key: handle.metadata[key] for key in SHAPES}


class FeatureRows:
    """The Python side of a feature draft's calls (cpp/models/python_model.h's contract), one per row: the entries
    it holds (tokens, positions) and the target row it reads. Subclasses compute logits (eagle.py, medusa.py)."""

    form = "feature"
    encoder_decoder = False
    max_source_length = None

    def __init__(self, target, head: torch.nn.Module, view: features.View, name: str):
        self.target = target  # row 0 of the target's batches: a LiveModel or an ExportedFeatures
        self.head = head
        self.view = view
        self.name = name
        self.vocab_size = target.vocab_size
        self.max_length = target.max_length
        self.device = target.device
        self.metadata = target.metadata
        self.embed, self.lm_head = target.shared_layers()
        self._own_vocab = self.lm_head.weight.size(0)
        self._family = [self]
        self._index = 0
        self.use_shapes("dynamic")
        self.use_compile(False)
        target.tap(view)
        self.clear()

    def clear(self) -> None:
        """No entries."""
        device = self.embed.weight.device
        self.tokens = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = torch.zeros(0, dtype=torch.long, device=device)

    @property
    def length(self) -> int:
        return self.tokens.numel()

    def replica(self) -> "FeatureRows":
        other = copy.copy(self)
        other._index = len(self._family)
        self._family.append(other)
        other._unshare()
        other.clear()
        return other

    def _unshare(self) -> None:
        """Gives a replica (a shallow copy) state of its own: its graphs (subclasses add their buffers)."""
        self.use_shapes(self.shapes, again=True)

    # Fixed shapes (cpp/models/python_model.h): the engine tells each row how its calls run. A decoding call's
    # inputs go through the static buffers of a GraphCache (cpp/device/graphs.h) keyed by the call's shapes, and
    # with "graphed" its call replays a CUDA graph captured after three eager calls of the key.
    def fixed_shapes_obstacle(self) -> str:
        return ""

    def use_shapes(self, shapes: str, again: bool = False) -> None:
        """"dynamic", "fixed" or "graphed" from now on (`again`: a fresh graph cache even if unchanged)."""
        if again or shapes != getattr(self, "shapes", None):
            self.shapes = shapes
            row = weakref.ref(self)  # the cache holds no strong reference back: no cycle through C++
            self._graphs = _core.GraphCache(shapes == "graphed", lambda: row()._state() if row() else [])

    def _state(self) -> list:
        """(name, tensor) of what the fixed-shape calls write in place (none here; eagle.py has its cache)."""
        return []

    step_function = None  # a subclass's decoding step: a module function of the head and tensors

    def use_compile(self, on: bool) -> None:
        """Runs the head's decoding steps (step_function) through torch.compile from now on (`on`), fullgraph, in
        a code object of this draft's own (as compiled_live.py does: dynamo keeps at most 8 graphs per code object,
        and a draft compiles 3 to 5, one more each time a size first changes: the width, the bucket, the
        buffers), or eagerly. With compile=True an EAGLE head's calls take the bucketed shapes
        of fixed shapes whatever the mode, so that they compile a few graphs, not one per length."""
        function = type(self).step_function
        self.compiled, self.stepper = on, function
        if on:
            own = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                                     function.__defaults__)
            self.stepper = torch.compile(own, fullgraph=True, **inductor_options(self.device))

    def fixed(self, key: tuple, inputs: list, step) -> torch.Tensor:
        """step(inputs) for a call of shapes `key` (width, tree call, keys read) with the shapes set or the step
        compiled: through the graph cache's static copies of `inputs` (replayed from a CUDA graph with "graphed";
        a compiled step so sees inputs made alike at every call, which its guards check), else as it is."""
        if self.shapes == "dynamic" and not self.compiled:
            return step(inputs)
        interrupted = []

        def call(static: list) -> torch.Tensor:
            try:
                return step(static)
            except KeyboardInterrupt:  # the cache takes a capture's exceptions for its failure: not this one
                interrupted.append(True)
                raise

        out = self._graphs.run(*key, inputs, call)
        if interrupted:
            raise KeyboardInterrupt
        return out

    @property
    def graph_failure(self) -> str:
        """The first failure of a row's capture (row 0 and its replicas: the engine asks row 0's model)."""
        return next((row._graphs.failure for row in self._family if row._graphs.failure), "")

    @property
    def graphs_captured(self) -> int:
        return sum(row._graphs.captured for row in self._family)

    def target_features(self) -> tuple[Optional[torch.Tensor], int]:
        """This row's target's recorded features ([entries, D]) and how many leading entries are committed."""
        return self.target.row(self._index).features(self.view)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head over `hidden` [k, H] -> [k, V] on the target's vocabulary (its padding -inf)."""
        out = self.lm_head(hidden)
        if self.vocab_size > out.size(-1):
            out = F.pad(out, (0, self.vocab_size - out.size(-1)), value=float("-inf"))
        return out

    def tree_obstacle(self) -> str:
        return ""  # the head's attention takes the engine's masks as they are

    def beam_obstacle(self) -> str:
        return "a feature draft drafts; beams are the target's"

    def reset(self, tokens: torch.Tensor) -> None:
        self.clear()
        self.tokens = tokens.clone()
        self.positions = torch.arange(tokens.numel(), device=tokens.device)

    def truncate(self, length: int) -> None:
        self.tokens, self.positions = self.tokens[:length], self.positions[:length]

    def keep(self, entries: torch.Tensor) -> None:
        self.tokens, self.positions = self.tokens.index_select(0, entries), self.positions.index_select(0, entries)


def parents_from_mask(positions: torch.Tensor, new_positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each new entry's parent: among the entries its mask row shows (itself excluded), the one at the highest
    position; -1 where it sees none. positions [S - T] of the old entries, new_positions [T], mask bool [T, S]."""
    T, S = mask.shape
    every = torch.cat([positions, new_positions])  # [S]
    seen = mask.clone()
    seen[torch.arange(T, device=mask.device), torch.arange(S - T, S, device=mask.device)] = False
    score = torch.where(seen, every.unsqueeze(0), torch.full_like(every, -1).unsqueeze(0))  # [T, S]
    best, parent = score.max(1)
    return torch.where(best >= 0, parent, torch.full_like(parent, -1))


class FeatureDraft(Model):
    """A draft model over its target's hidden states (the module docstring). Subclasses set `kind` and build."""

    kind = ""

    def _become(self, handle: Model, source, rows: type, head: torch.nn.Module, view: features.View,
                shapes: dict, compile: bool) -> None:
        """Makes this handle the draft: `head` on the target's device and dtype, called through `rows` (a
        FeatureRows class) reading `view` of `source` (feature_source's), its steps compiled with `compile`;
        `shapes` join its config (what save writes)."""
        name = type(self).__name__
        if not isinstance(compile, bool):
            raise ValueError(f"{name}: compile must be True or False, got {compile!r}")
        like = source.shared_layers()[0].weight
        head = head.to(device=like.device, dtype=like.dtype).eval().requires_grad_(False)
        calls = rows(source, head, view, name)
        calls.use_compile(compile)
        label = f"{name} of {handle.source}"
        vars(self).update(vars(Model(_core.python_model(calls, label), label, live=calls)))
        self.target, self.head, self.feature_layers = handle, head, view
        weakref.finalize(self, source.untap, view)  # the target stops recording once no draft reads it
        architecture = type(handle.module).__name__ if handle.module is not None else handle.metadata.get(
            "architecture")
        self.config = {"hidden_size": target_shapes(handle, name)["hidden_size"], "vocab_size": handle.vocab_size,
                       "target": architecture, **shapes}

    def parameters(self) -> int:
        """How many parameters the draft has of its own (the target's embedding and LM head excluded)."""
        return sum(p.numel() for p in self.head.parameters())

    def save(self, directory) -> str:
        """Writes the head (head.safetensors) and its config (config.json) to `directory`; returns its path. The
        target's weights are not written."""
        from safetensors.torch import save_file

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}, path / WEIGHTS)
        (path / CONFIG).write_text(json.dumps({"speculant_draft": self.kind, **self.config}, indent=1))
        return str(path)

    def training_laws(self, head: torch.nn.Module, ids: torch.Tensor, all_depths: bool) -> tuple:
        """distill's teacher-forced outputs of `head` (its trained copy) over ids [B, T], from one target forward:
        [(logits [B, T, V], offset, first)] (logits at position i are a law of token i + 1 + offset, meant for
        positions from `first` on; the first draft position's law first, the deeper ones with `all_depths`), the
        feature regression's (predicted, target) pair or None, and the target's own logits [B, T, V]."""
        module = self.target.module
        features, target_logits = recorded(module, self.feature_layers, ids)
        predicted, regression = self.predictions(head, ids, features, all_depths)
        lm_head = module.get_output_embeddings()
        return [(lm_head(h), offset, first) for h, offset, first in predicted], regression, target_logits

    def predictions(self, head: torch.nn.Module, ids: torch.Tensor, features: torch.Tensor,
                    all_depths: bool) -> tuple:
        """training_laws' hidden states in place of logits, and the regression pair (each kind its own)."""
        raise NotImplementedError

    @property
    def compiled(self) -> bool:
        """Whether the head's decoding steps run through torch.compile (``compile=True``)."""
        return self.live.compiled

    @classmethod
    def built(cls, target, config: dict, compile: bool = False) -> "FeatureDraft":
        """A fresh draft of this kind on `target` with the shapes `config` records (what save writes)."""
        raise NotImplementedError

    @classmethod
    def load(cls, directory, target, *, compile: bool = False) -> "FeatureDraft":
        """A draft `save` wrote, on `target`, its steps compiled with `compile` (ValueError where its hidden size or
        vocabulary differ, or its files are damaged or do not fit the head its config describes)."""
        handle, _ = feature_source(target, f"{cls.__name__}.load")
        config, state = cls._read(directory, handle)
        draft = cls.built(handle, config, compile)
        try:
            draft.head.load_state_dict(state)
        except RuntimeError as error:  # missing, unexpected or misshapen tensors
            raise ValueError(f"{cls.__name__}.load: {Path(directory) / WEIGHTS} does not fit the head its "
                             f"{CONFIG} describes: {error}") from None
        return draft

    def with_head(self, head: torch.nn.Module) -> "FeatureDraft":
        """The same draft with a copy of `head`'s weights (distill's trained head)."""
        other = type(self).built(self.target, self.config, self.compiled)
        other.head.load_state_dict(head.state_dict())
        return other

    @classmethod
    def _read(cls, directory, handle: Model) -> tuple[dict, dict]:
        """(config, state dict) of a saved draft of this kind, checked against the target's hidden size and
        vocabulary; ValueError naming what differs."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(directory)
        if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
            raise ValueError(f"{cls.__name__}.load: {os.fspath(directory)} holds no {CONFIG} and {WEIGHTS} (what "
                             f"{cls.__name__}.save writes)")
        config = json.loads((path / CONFIG).read_text())
        kind = config.pop("speculant_draft", None)
        if kind != cls.kind:
            raise ValueError(f"{cls.__name__}.load: {os.fspath(directory)} holds a {kind!r} draft, not {cls.kind!r}")
        for key, actual in (("hidden_size", target_shapes(handle, f"{cls.__name__}.load")["hidden_size"]),
                            ("vocab_size", handle.vocab_size)):
            if config.get(key) != actual:
                raise ValueError(f"{cls.__name__}.load: the head in {os.fspath(directory)} was built on a target "
                                 f"with {key} {config.get(key)}, this target has {actual}")
        try:
            return config, load_file(str(path / WEIGHTS))
        except SafetensorError as error:
            raise damaged_weights(os.fspath(directory), error) from None
