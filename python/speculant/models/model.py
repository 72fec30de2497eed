"""Model handles: TorchScript files, in-memory ScriptModules and live transformers models (live.py), each checked
against the engine's contract when loaded.

The file contract (also in cpp/models/model.h), in one of two forms (a .pt2 package and a live transformers model are
the other two forms: docs/model-contract.md):

* cached: int attribute ``vocab_size`` (optionally ``max_length``, 0 = unlimited) and exported methods
  ``prefill(input_ids[1, T]) -> logits[1, T, V]`` (clears the cache), ``extend(input_ids[1, k]) ->
  logits[1, k, V]`` (appends), ``truncate(length: int) -> None`` and ``cache_length() -> int``.
* plain: ``forward(input_ids[1, T]) -> logits[1, T, V]``, which any causal LM satisfies; the engine recomputes
  the whole prefix at each call (load warns so). A forward returning a dict with ``logits`` or a tuple with the
  logits first (transformers' models traced by torch.jit.trace) is taken, its logits alone (plain_outputs.py).
* encoder-decoder (T5): the cached form plus ``encode(input_ids[1, S]) -> None``, which runs the encoder on the
  source once and clears the decoder cache; optionally an int attribute ``max_source_length``.

A file may carry metadata in the extra file ``speculant.json`` (speculant.export writes it: architecture,
vocabulary size, EOS / pad / decoder-start ids).
"""

from __future__ import annotations

import io
import json
import os
import sys
import warnings
import zipfile
from typing import List, Optional, Union

import torch

from .. import _core
from . import live, plain_outputs
from .compiled_live import CompiledLiveModel


class Model:
    """A loaded model. Each handle owns its cache: use one handle per role (target, draft)."""

    def __init__(self, core: _core.Model, source: str, module=None, live=None):
        self._core = core
        self.source = source
        self.module = module  # the transformers model behind a live handle, else None
        self.live = live  # and the object the engine calls (live.LiveModel), else None
        self.load_dtype: Optional[str] = None  # the dtype= a .pt file was converted to at load, else None
        raw = core.metadata
        try:
            self.metadata = json.loads(raw) if raw else {}
        except ValueError as error:
            raise ValueError(f"model {source}: its speculant.json metadata is not valid JSON: {error}") from None
        if not isinstance(self.metadata, dict):
            raise ValueError(f"model {source}: its speculant.json metadata must be a JSON object")

    @property
    def engine(self) -> _core.Model:
        """The engine's handle of this model (speculant._core.Model), which decoders and drafters are built on."""
        return self._core

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def max_length(self) -> Optional[int]:
        """The most positions the model can hold, or None when it declares no limit."""
        return self._core.max_length

    @property
    def encoder_decoder(self) -> bool:
        """True for an encoder-decoder model (generate takes encoder_input_ids)."""
        return self._core.encoder_decoder

    @property
    def max_source_length(self) -> Optional[int]:
        return self._core.max_source_length

    @property
    def eos_token_id(self) -> Optional[Union[int, List[int]]]:
        """The EOS id from the file's metadata (None without one; a list for models with several, such as
        Llama 3: generate stops at any of them)."""
        return self.metadata.get("eos_token_id")

    @property
    def decoder_start_token_id(self) -> Optional[int]:
        """The first decoder token of an encoder-decoder model, from the file's metadata."""
        return self.metadata.get("decoder_start_token_id")

    @property
    def device(self) -> torch.device:
        return torch.device(self._core.device)

    @property
    def form(self) -> str:
        """'cached', 'plain', 'live' (a transformers model object; see the module docstring), 'compiled' (one
        loaded with compile=True), or 'feature' (a draft over a live target's hidden states: EagleDraft,
        MedusaDraft)."""
        return self._core.form

    @property
    def tree_obstacle(self) -> str:
        """Why this model cannot verify a token tree in one call (SpeculativeDecoder's tree=), or "" when it can:
        speculant.export's TorchScript files (their masked batched calls) and live decoder-only transformers
        models that honour a 4-D attention mask (probed once, on first use) can."""
        return self._core.tree_obstacle

    @property
    def beam_obstacle(self) -> str:
        """Why this model cannot hold several beams in one cache (beam search, ``num_beams``), or "" when it can:
        models with tree calls, and speculant.export's T5 files (tree calls of one row over the encoded source)."""
        return self._core.beam_obstacle

    def __repr__(self) -> str:
        return (f"speculant.Model({self.source!r}, form={self.form!r}, vocab_size={self.vocab_size}, "
                f"device={str(self.device)!r})")


EXPORT_HINT = ("export the model first (speculant.export(model_or_dir, 'model.pt')), or load the transformers "
               "model itself: speculant.load(model) or speculant.load('save_pretrained_dir')")


VOCAB_HINT = ("an exported file keeps the vocabulary it was exported with, so load that model from transformers "
              "(the object or its save_pretrained directory) with vocab_size=")


def _device(device) -> Optional[torch.device]:
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):  # ValueError: a byte string that is not UTF-8
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: no CUDA device is available here "
                         "(torch.cuda.is_available() is False)")
    return device


def _dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype or its name ('float32', 'bfloat16', "
                         f"'float16'), got {dtype!r}")
    return value


def _live(module, device, dtype, options: dict, source: str) -> Model:
    """options: vocab_size, and compile / max_length (load's)."""
    if device is not None or dtype is not None:
        module.to(device=device, dtype=dtype)  # in place, as nn.Module.to does
    if options["compile"]:
        impl = CompiledLiveModel(module, vocab_size=options["vocab_size"], name=source,
                                 max_length=options["max_length"])
    else:
        impl = live.LiveModel(module, vocab_size=options["vocab_size"], name=source)
    return Model(_core.python_model(impl, source), source, module=module, live=impl)


def _pretrained(directory: str, device, dtype, options: dict) -> Model:
    return _live(live.pretrained(directory, dtype), device, None, options, directory)


def archive_problem(path: str) -> Optional[str]:
    """What is wrong with the zip archive at `path` (.pt, .pt2 and torch.save files are zip archives), or None.
    Reads the whole file once: every member's CRC-32 is checked, which a truncated or corrupted file fails."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as error:  # noqa: BLE001 - BadZipFile, zlib.error, EOFError, ...: all say "damaged"
        return f"{type(error).__name__}: {error}"
    return None if bad is None else f"its member {bad} fails its CRC-32 check"


def _file_kind(path: str) -> str:
    """'torchscript', 'pt2', 'state_dict' or 'safetensors', from the file's contents; raises ValueError naming
    the file when it is a damaged zip archive or none of these."""
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) >= 9 and head[8:9] == b"{" and not head.startswith(b"PK"):
        return "safetensors"  # an 8-byte little-endian header length, then the JSON header
    if not head.startswith(b"PK") and not zipfile.is_zipfile(path):
        raise ValueError(f"model: {path} is neither a TorchScript file (.pt), an AOTInductor package (.pt2) nor "
                         f"a save_pretrained directory: it is not a zip archive (it starts with {head[:8]!r}); "
                         f"{EXPORT_HINT}")
    problem = archive_problem(path)
    if problem:
        raise ValueError(f"model: {path} is a damaged zip archive, truncated or corrupted ({problem}); copy or "
                         "export it again")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any("/aotinductor/" in n or n.endswith("/archive_format") for n in names):
        return "pt2"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/data.pkl") for n in names):
        return "state_dict"
    raise ValueError(f"model: {path} is a zip archive but neither a TorchScript file (.pt) nor an AOTInductor "
                     f"package (.pt2): it holds {', '.join(names[:3]) or 'nothing'}"
                     f"{', ...' if len(names) > 3 else ''}; {EXPORT_HINT}")


def _path(path: str, device, dtype, options: dict) -> Model:
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return _pretrained(path, device, dtype, options)
        files = sorted(f for f in os.listdir(path) if f.endswith((".pt", ".pt2")))
        if files:
            raise ValueError(f"model: {path} is a directory; pass one of its model files: {', '.join(files)}")
        raise ValueError(f"model: {path} is a directory without a config.json (not a save_pretrained "
                         "directory) and holds no .pt or .pt2 file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model: no such file or directory: {path}")
    kind = _file_kind(path)
    if kind == "safetensors":
        raise ValueError(f"model: {path} is a safetensors file, weights without the model's code: "
                         f"{EXPORT_HINT}")
    if kind == "state_dict":
        raise ValueError(f"model: {path} was written by torch.save (a state dict or pickled object), not a "
                         f"model speculant can run: {EXPORT_HINT}")
    if kind == "pt2":
        if dtype is not None:
            raise ValueError(f"dtype: {path} is an AOTInductor package, compiled for one dtype; export it again "
                             "from the model in the dtype you want")
        return Model(_core.load_pt2(path, None if device is None else str(device)), path)
    if dtype is not None:
        extra = {"speculant.json": ""}
        module = torch.jit.load(path, map_location=device or "cpu", _extra_files=extra)
        model = _script(module.to(dtype), path, extra=extra)
        model.load_dtype = str(dtype).removeprefix("torch.")  # a sweep's workers load the file so again
        return model
    try:
        return _plain_warned(Model(_core.load_file(path, None if device is None else str(device)), path))
    except ValueError as error:
        module, extra = _plain_module(path, device)
        if module is None:
            raise error from None
        module, note = plain_outputs.logits_only(module, path)  # ValueError naming what its forward returns
        if note is None:
            raise error from None
    return _saved(module, path, device, extra, note)  # a traced model's dict or tuple of logits: the logits


def _plain_module(path: str, device) -> tuple:
    """(the TorchScript module at `path`, its extra files) when it loads and is of the plain form, else (None,
    None)."""
    extra = {"speculant.json": ""}
    try:
        with warnings.catch_warnings():  # TorchScript's deprecation notice (torch >= 2.11), nothing else
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
            module = torch.jit.load(path, map_location=device or "cpu", _extra_files=extra)
    except Exception:  # noqa: BLE001 - the engine's own error says why the file does not load
        return None, None
    return (module, extra) if plain_outputs.is_plain(module) else (None, None)


PLAIN_FORM = ("is in the plain form (forward only), which recomputes the whole prefix at every call; "
              "speculant.export(model, 'model.pt') writes the cached form, which keeps a KV cache")


def _plain_warned(model: Model, note: Optional[str] = None) -> Model:
    """`model`, with a UserWarning when it is of the plain form (`note`: what was taken of its forward's output),
    pointing at the first caller outside speculant."""
    if model.form == "plain":
        frame, level, package = sys._getframe(1), 2, os.path.dirname(os.path.dirname(__file__)) + os.sep
        while frame is not None and frame.f_code.co_filename.startswith(package):
            frame, level = frame.f_back, level + 1
        warnings.warn(f"model {model.source}{f' ({note})' if note else ''} {PLAIN_FORM}", UserWarning,
                      stacklevel=level)
    return model


def _script(module: torch.jit.ScriptModule, source: str, device=None, extra=None) -> Model:
    module, note = plain_outputs.logits_only(module, source)
    return _saved(module, source, device, extra, note)


def _saved(module: torch.jit.ScriptModule, source: str, device, extra, note: Optional[str]) -> Model:
    """`module` loaded by the engine (through a saved copy); `note`: what was taken of its forward's output."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer, _extra_files=extra or {})
    core = _core.load_bytes(buffer.getvalue(), source, None if device is None else str(device))
    return _plain_warned(Model(core, source), note)


ModelLike = Union[str, os.PathLike, torch.jit.ScriptModule, torch.nn.Module, Model]


def load(model: ModelLike, device: Optional[Union[str, torch.device]] = None, dtype=None, *,
         vocab_size: Optional[int] = None, compile: bool = False, max_length: Optional[int] = None) -> Model:
    """A model the engine runs, from any of:

    * a transformers model object: any ``*ForCausalLM`` or encoder-decoder ``*ForConditionalGeneration``, in
      eval mode, in its own dtype and on its own device (``device`` / ``dtype`` move it, in place, as
      ``Module.to`` does). The engine calls its forward with a cache it owns and crops to roll back.
    * a local ``save_pretrained`` directory (loaded with transformers, no downloads), likewise;
    * a TorchScript file (``speculant.export`` writes them) or an in-memory ``torch.jit.ScriptModule``. One of
      the plain form (forward only) warns (UserWarning) that every call recomputes the whole prefix. A
      transformers model traced by ``torch.jit.trace`` (``use_cache=False``, ``strict=False``), whose forward
      returns a dict holding ``logits`` or a tuple holding them first, is taken so: its logits alone, said in that
      warning (docs/loading-models.md, "Coming from transformers' TorchScript tutorial");
    * a ``speculant.Model``, returned as it is.

    ``vocab_size`` (live models and save_pretrained directories only): pads the logits with -inf up to that
    size, for a target and draft whose LM heads are padded differently beyond one tokenizer (the padded ids get
    probability 0: exact). An exported file keeps the vocabulary it was exported with and is refused with it.

    ``compile=True`` (live decoder-only models and save_pretrained directories only): the fast route for a model
    object, transformers' static cache of ``max_length`` positions (default: the model's context, at most 4096)
    with the decoding calls compiled by ``torch.compile`` (CUDA graphs on a GPU): two graphs per model for chains
    (width 1, and widths 2 .. 32) and up to two for token trees and beams, each compiled at its first call
    (seconds). Exact as the eager route is; no encoder-decoders or sliding-window layers (compiled_live.py says
    why).

    Raises FileNotFoundError for a missing path, ValueError saying what is wrong (and what to do) for
    anything that does not follow the contract: a safetensors file or a torch.save state dict (export the
    model), a directory of model files, a model in training mode, a recurrent model whose state cannot be
    rolled back, a device that is not available.
    """
    device = _device(device)
    dtype = _dtype(dtype)
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    if max_length is not None and not compile:
        raise ValueError("max_length= is the static cache's length of compile=True; pass compile=True with it")
    options = {"vocab_size": vocab_size, "compile": compile, "max_length": max_length}
    if isinstance(model, Model):
        if device is not None or dtype is not None or vocab_size is not None or compile:
            raise ValueError("model is already a speculant.Model: pass device / dtype / vocab_size / compile when "
                             "loading it")
        return model
    if not (live.is_transformers_model(model) or isinstance(model, (str, os.PathLike))):
        _live_options_refused(options, f"a {type(model).__name__}")
    if live.is_transformers_model(model):
        return _live(model, device, dtype, options, type(model).__name__)
    if isinstance(model, torch.jit.ScriptModule):
        if dtype is not None:
            model = model.to(dtype)
        return _script(model, f"<{type(model).__name__} in memory>", device)
    if isinstance(model, torch.nn.Module):
        raise ValueError(f"model: a plain {type(model).__name__} (torch.nn.Module) does not follow the engine's "
                         "contract; pass a transformers model, or a torch.jit.ScriptModule with the cached or "
                         f"plain form (docs/model-contract.md), or {EXPORT_HINT}")
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError("model must be a path, a transformers model, a torch.jit.ScriptModule or a "
                         f"speculant.Model, got {type(model).__name__}")
    path = os.fspath(model)
    if not os.path.isdir(path):
        _live_options_refused(options, f"a file ({path})")
    return _path(path, device, dtype, options)


def as_model(value, name: str, device=None, dtype=None) -> Model:
    """A speculant.Model as it is, or anything speculant.load takes, loaded. Load errors name the argument."""
    if isinstance(value, Model):
        return value
    try:
        return load(value, device=device, dtype=dtype)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def second_load(given, handle: Model) -> str:
    """Why `given` (a path, or a speculant.Model) is not `handle` when it names the file or directory `handle` was
    loaded from ("" otherwise): each load of a file is another model, with weights and a cache of its own."""
    if isinstance(given, Model):
        path, said = given.source, f"the target given is a second load of {given.source}"
    elif isinstance(given, (str, os.PathLike)):
        path = os.fspath(given)
        said = f"the target given, {path}, is the path of that file, and would be loaded again"
    else:
        return ""
    if path != handle.source or not os.path.exists(path):
        return ""
    return (f"{said}: a second load of the same file is another model (weights and a cache of its own), not the one "
            "the draft was built on; pass that first load itself (draft.target, the speculant.Model the draft was "
            "given), or build the draft on the second")


def _live_options_refused(options: dict, what: str) -> None:
    """ValueError for load's options that only live models take, passed with `what` (an export, a module)."""
    if options["vocab_size"] is not None:
        raise ValueError(f"vocab_size= is for transformers models and save_pretrained directories (live), whose "
                         f"logits speculant pads, not {what}: {VOCAB_HINT}")
    if options["compile"]:
        raise ValueError(f"compile=True is for transformers models and save_pretrained directories (live), not "
                         f"{what}: a .pt2 package is compiled already (AOTInductor), and a TorchScript export "
                         "replays CUDA graphs with SpeculativeDecoder(..., cuda_graphs='auto')")
