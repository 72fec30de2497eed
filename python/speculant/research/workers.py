"""What a sweep sends to an executor's workers (``speculant.sweep(..., executor=)``): models as files, drafters as
plain data, never a pickled module. Each worker rebuilds them, and keeps its models from one task to the next.

* A ``speculant.Model`` travels as a ``ModelFile``: the path it was loaded from (a .pt TorchScript file, a .pt2
  package, a save_pretrained directory) and what loads it the same way again (its device; for a
  save_pretrained directory also its dtype and vocab_size, the padded one when it was padded). A model with no
  file behind it (a transformers object passed to ``speculant.load``, a ScriptModule in memory) cannot travel:
  ``ValueError`` naming the parameter and how to give it a file.
* A drafter travels as a ``DrafterArgs``: its class and constructor arguments (the tables of ``Unigram`` and
  ``Bigram`` as tensors, ``PromptLookup``'s n-gram lengths, ``PythonDrafter``'s propose function, which must
  pickle: a function defined at module level), sent with every task.

Paths go as absolute paths and must be readable on the workers (on a cluster: shared storage). A worker thread
keeps the model it built last for each role (target, draft, sibling_draft: each role needs its own handle,
since a handle owns its cache) and reuses it while the spec and the file (sizes and modification times) are
unchanged, so a sweep loads each model once per worker, and a model file exported anew is loaded anew.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

from ..decoding import drafters
from ..decoding.drafters import Drafter
from ..models.feature_draft import FeatureDraft
from ..models.model import Model, load


@dataclass(frozen=True)
class ModelFile:
    """A model as a worker loads it: ``speculant.load(path, device, dtype, vocab_size=vocab_size)``."""

    path: str
    device: str
    dtype: Optional[str] = None  # a save_pretrained directory's, or the dtype= a .pt file was converted to
    vocab_size: Optional[int] = None  # save_pretrained directories only (live models pad their logits)

    def build(self) -> Model:
        return load(self.path, self.device, self.dtype, vocab_size=self.vocab_size)


@dataclass(frozen=True)
class DrafterArgs:
    """A drafter as a worker builds it: ``speculant.drafters.<kind>(**arguments)``."""

    kind: str
    arguments: Dict[str, Any] = field(hash=False)

    def build(self) -> Drafter:
        return getattr(drafters, self.kind)(**self.arguments)


Spec = Union[ModelFile, DrafterArgs]
FILE_HINT = ("export it to a file (speculant.export(model, 'model.pt')), or save_pretrained it to a directory, "
             "and pass speculant.load(path)")


def _pretrained_directory(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def model_file(model: Model, name: str) -> ModelFile:
    """The ModelFile that loads `model` again in a worker; ValueError naming `name` when it has no file."""
    source = model.source
    if isinstance(model, FeatureDraft):
        raise ValueError(f"{name}: {type(model).__name__} reads the hidden states of its target in this process, "
                         "and an executor's workers load models from files; sweep it without executor")
    if model.module is not None:  # a live transformers model: from a save_pretrained directory, or an object
        if not _pretrained_directory(source):
            raise ValueError(f"{name}: a transformers model object ({source}) has no file behind it, and an "
                             f"executor's workers load models from files; {FILE_HINT}")
        dtype = str(model.module.dtype).removeprefix("torch.")
        return ModelFile(os.path.abspath(source), str(model.device), dtype, model.vocab_size)
    if not os.path.isfile(source):
        raise ValueError(f"{name}: the model {source} has no file behind it (a TorchScript module loaded from "
                         f"memory, or a file since removed), and an executor's workers load models from files; "
                         f"{FILE_HINT}")
    return ModelFile(os.path.abspath(source), str(model.device), model.load_dtype)


def drafter_args(drafter: Drafter, name: str) -> DrafterArgs:
    """The DrafterArgs that build `drafter` again in a worker; ValueError naming `name` when nothing can."""
    device = str(drafter.device)
    kind = type(drafter)
    if kind is drafters.Unigram:
        return DrafterArgs("Unigram", {"probabilities": drafter.probabilities.cpu(), "device": device})
    if kind is drafters.Bigram:
        tables = {key: getattr(drafter, key).cpu() for key in ("unigram", "row_ptr", "followers", "counts")}
        return DrafterArgs("Bigram", {**tables, "device": device})
    if kind is drafters.PromptLookup:
        return DrafterArgs("PromptLookup", {"vocab_size": drafter.vocab_size, "min_ngram": drafter.min_ngram,
                                            "max_ngram": drafter.max_ngram, "device": device})
    if kind is drafters.PythonDrafter:
        for role, function in (("propose", drafter.propose), ("score", drafter.score)):
            try:
                pickle.dumps(function)
            except Exception as error:  # noqa: BLE001 - PicklingError, AttributeError, TypeError: all "cannot"
                raise ValueError(f"{name}: the PythonDrafter's {role} function cannot be sent to an executor's "
                                 f"workers ({type(error).__name__}: {error}); define it at module level in a module "
                                 "the workers can import (a lambda or a closure does not pickle), or sweep without "
                                 "executor") from None
        return DrafterArgs("PythonDrafter", {"propose": drafter.propose, "vocab_size": drafter.vocab_size,
                                             "device": device, "score": drafter.score})
    raise ValueError(f"{name}: a {kind.__name__} cannot be rebuilt in an executor's workers (speculant rebuilds "
                     "its own Unigram, Bigram, PromptLookup and PythonDrafter from their arguments); sweep without "
                     "executor, or use a PythonDrafter")


def spec(value: Union[Model, Drafter], name: str) -> Spec:
    """What travels to the workers for a target or draft (a speculant.Model or a drafter)."""
    if isinstance(value, Model):
        return model_file(value, name)
    if isinstance(value, Drafter):
        return drafter_args(value, name)
    raise ValueError(f"{name} must be a speculant.Model or a drafter, got {type(value).__name__}")


def _stamp(path: str) -> Optional[Tuple]:
    """The sizes and modification times of the file, or of the files directly in the directory (None when the
    path is missing: loading it then raises FileNotFoundError)."""
    try:
        if os.path.isdir(path):
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                                for e in os.scandir(path) if e.is_file()))
        info = os.stat(path)
        return info.st_size, info.st_mtime_ns
    except OSError:
        return None


_held = threading.local()  # .models: role -> ((spec, stamp), Model), one per worker thread


def rebuild(value: Spec, role: str) -> Union[Model, Drafter]:
    """The model or drafter `value` describes, in this worker. A model is loaded once per worker thread and
    role, and again only when its spec or its file changes; a drafter is built anew (cheap: tables and code)."""
    if isinstance(value, DrafterArgs):
        return value.build()
    models = _held.__dict__.setdefault("models", {})
    key = (value, _stamp(value.path))
    if role not in models or models[role][0] != key:
        models.pop(role, None)  # the old model's memory goes before the new one is loaded
        try:
            model = value.build()
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{role}: {error} (on worker {socket.gethostname()}, pid {os.getpid()}: a "
                                    "sweep's model paths must be readable on every worker)") from None
        models[role] = (key, model)
    return models[role][1]

