"""Exporting Hugging Face transformers models to files the engine runs without Python at call time.

    speculant.export(model_or_dir, out_path, *, format=None, max_length=None, max_source_length=None)
    speculant export MODEL_DIR OUT [--format torchscript|pt2] [--max-length N] [--max-source-length N]

Two formats (`format=None` picks by suffix: `.pt2` is pt2, `.pt` TorchScript; other suffixes are refused):

* **torchscript** (`.pt`): transformers 5 has no torchscript flag, and tracing its generation code freezes
  shapes, so each supported architecture (GPT-2, Llama, T5) is re-expressed as a scripted module of our own
  that holds the model's weights (gpt2.py, llama.py, t5.py); the tests check its logits against transformers'
  at several lengths, with a cache, and after a truncation. The file carries `speculant.json` (architecture,
  vocabulary size, EOS / pad / BOS / decoder-start ids) that `speculant.load` reads back as `Model.metadata`.
* **pt2** (`.pt2`): any decoder-only model that transformers' static cache serves, and T5, through
  torch.export and AOTInductor, with a static KV cache (pt2.py; TorchScript is deprecated since torch 2.11).
  The package holds machine code for one device type and one torch release.
"""
from __future__ import annotations

import copy
import json
import os
import time
from typing import Any, Dict, Optional, Union

import torch

from .. import live
from . import cached, gpt2, llama, pt2, t5

# transformers class name -> (our module, the config.model_type it must have)
SUPPORTED = {
    "GPT2LMHeadModel": (gpt2, "gpt2"),
    "LlamaForCausalLM": (llama, "llama"),
    "T5ForConditionalGeneration": (t5, "t5"),
}
METADATA_FILE = "speculant.json"  # the extra file cpp/models/script_model.cpp reads
FORMAT = 1
FORMATS = ("torchscript", "pt2")
# what a TorchScript refusal offers instead: the pt2 format serves any causal LM with a static cache (Qwen2,
# Mistral, ... are tested in tests/test_pt2_decoding.py and test_live.py), and every model runs live
PT2_HINT = ("the TorchScript format re-expresses each architecture by hand; format='pt2' (an out_path ending in "
            ".pt2; on the command line --format pt2) exports any decoder-only causal LM (a *ForCausalLM) that "
            "transformers' static cache serves, and T5, through torch.export: speculant.export(model_or_dir, "
            "'model.pt2'); or run the model without exporting it: speculant.load(model_or_dir)")

__all__ = ["SUPPORTED", "export", "load_pretrained"]


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("speculant.export needs transformers 5.x: pip install 'transformers>=5,<6' (or, from "
                          "speculant's clone, pip install --no-build-isolation '.[export]')") from None
    return transformers


def load_pretrained(directory: Union[str, os.PathLike]):
    """A supported transformers model from a local `save_pretrained` directory (no downloads)."""
    transformers = _transformers()
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise FileNotFoundError(f"model_or_dir: {directory} is not a save_pretrained directory (no config.json)")
    config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    names = [n for n in (config.architectures or []) if n in SUPPORTED]
    if not names:
        raise ValueError(f"model_or_dir: {directory} holds {config.architectures or config.model_type!r}; "
                         f"supported architectures (TorchScript): {', '.join(SUPPORTED)}; {PT2_HINT}")
    from safetensors import SafetensorError  # a dependency of transformers

    try:
        return getattr(transformers, names[0]).from_pretrained(directory, local_files_only=True).eval()
    except SafetensorError as error:
        raise live.damaged_weights(directory, error) from None


def metadata(model, scripted, max_source_length: Optional[int]) -> Dict[str, Any]:
    # transformers 5 may keep it in generation_config only; the T5 exporter has resolved it
    decoder_start = int(scripted.decoder_start_token_id) if model.config.is_encoder_decoder else None
    return {"format": FORMAT, **live.describe(model, max_length=int(scripted.max_length),
                                               max_source_length=max_source_length,
                                               decoder_start_token_id=decoder_start)}


def _script(model, module, max_length: Optional[int], max_source_length: Optional[int], kernels: str):
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            return module.script(model, max_length=512 if max_length is None else max_length,
                                 max_source_length=512 if max_source_length is None else max_source_length)
        return module.script(model, max_length=max_length, kernels=kernels)


def _export_pt2(model_or_dir, out_path: str, max_length: Optional[int], max_source_length: Optional[int],
                dtype, features) -> Dict[str, Any]:
    if isinstance(model_or_dir, (str, os.PathLike)):
        model = _in_dtype(live.pretrained(os.fspath(model_or_dir), None), dtype)
    else:
        model = model_or_dir
    if not live.is_transformers_model(model):
        raise ValueError(f"model_or_dir must be a transformers model or a save_pretrained directory, got "
                         f"{type(model).__name__}")
    encoder_decoder = bool(model.config.is_encoder_decoder)
    if max_length is None:
        max_length = 512 if encoder_decoder else min(live.max_positions(model.config.get_text_config()) or 4096, 4096)
    if encoder_decoder and max_source_length is None:
        max_source_length = 512
    meta = {"format": FORMAT, **live.describe(model, max_length=max_length, max_source_length=max_source_length,
                                              decoder_start_token_id=live.decoder_start(model)
                                              if encoder_decoder else None),
            "torch_version": torch.__version__.split("+")[0]}
    pt2.export_pt2(model, out_path, max_length=max_length, max_source_length=max_source_length,
                   metadata_json=json.dumps(meta, sort_keys=True), features=features)
    return meta


def _in_dtype(model, dtype):
    """The model in `dtype` (a converted copy: the caller's model is left as it is)."""
    if dtype is None:
        return model
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError("dtype must be a floating-point torch.dtype or its name ('float32', 'bfloat16', "
                         "'float16')")
    return model if model.dtype == dtype else copy.deepcopy(model).to(dtype)


SUFFIXES = {"torchscript": ".pt", "pt2": ".pt2"}  # the file each format writes


def _format(format: Optional[str], out_path) -> str:
    """The format to write: ``format``, or out_path's suffix's; ValueError for a suffix that is not the one the
    format writes (a file named .onnx would otherwise be TorchScript under another name)."""
    suffix = os.path.splitext(os.fspath(out_path))[1]
    if format is None:
        format = next((name for name, known in SUFFIXES.items() if known == suffix), None)
    elif format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} (or None: from out_path's suffix), got {format!r}")
    if format is None or SUFFIXES[format] != suffix:
        writes = " or ".join(f"{known} ({name})" for name, known in SUFFIXES.items())
        raise ValueError(f"out_path: speculant writes {writes} files; {os.fspath(out_path)!r} ends in "
                         f"{suffix or 'no suffix'!r}" + (f" (format={format!r} writes {SUFFIXES[format]})"
                                                         if format else ""))
    return format


def export(model_or_dir, out_path: Union[str, os.PathLike], *, format: Optional[str] = None,
           max_length: Optional[int] = None, max_source_length: Optional[int] = None,
           dtype=None, kernels: str = "aten", features=False) -> Dict[str, Any]:
    """Writes `model_or_dir` (a transformers model object or a local save_pretrained directory) to out_path
    and returns the metadata written with it.

    format: "torchscript" (the engine's cached contract; GPT-2, Llama, T5; out_path ends in .pt) or "pt2"
    (torch.export + AOTInductor with a static KV cache; decoder-only models and T5; out_path ends in .pt2), by
    default from out_path's suffix; any other suffix is refused.
    max_length: decoder positions the preallocated KV cache holds (GPT-2: n_positions, the most there are;
    others: min(max_position_embeddings, 4096); T5: 512). max_source_length: T5's longest encoder input
    (default 512). dtype: export in this dtype (e.g. "bfloat16"; default: the model's own); the engine's
    sampling math is float32 whatever the model's dtype. kernels: "aten" (torch's operations) or "speculant"
    (TorchScript GPT-2 and Llama: the norms and attention as speculant's own operations, CUDA kernels on a GPU and
    the same ATen composites on the CPU; docs/cuda-graphs.md). features (pt2, decoder-only): True (the LM head's
    input) or decoder layer indices (EAGLE-3) makes the package keep them per cache slot for EagleDraft and
    MedusaDraft (TorchScript exports keep them on request: docs/feature-drafts.md). Raises ValueError for an
    unsupported architecture or configuration, naming what is."""
    started = time.perf_counter()
    for name, value in (("max_length", max_length), ("max_source_length", max_source_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    if isinstance(model_or_dir, (str, os.PathLike)) and not os.path.exists(model_or_dir):
        raise FileNotFoundError(f"model_or_dir: {os.fspath(model_or_dir)} does not exist (a save_pretrained "
                                "directory or a transformers model object is exported)")
    format = _format(format, out_path)
    cached.fused_kernels(kernels)
    if features is not False and features is not None and format != "pt2":
        raise ValueError(f"features={features!r} is for .pt2 packages, whose calls are compiled once; TorchScript "
                         "exports keep the features a feature draft asks for on their own")
    if kernels != "aten" and format == "pt2":
        raise ValueError(f"kernels={kernels!r} is for TorchScript exports (.pt); pt2 files run AOTInductor's own")
    if format == "pt2":
        if not isinstance(model_or_dir, (str, os.PathLike)):
            model_or_dir = _in_dtype(model_or_dir, dtype)
        meta = _export_pt2(model_or_dir, os.fspath(out_path), max_length, max_source_length, dtype, features)
        meta["export_seconds"] = time.perf_counter() - started
        return meta
    model = load_pretrained(model_or_dir) if isinstance(model_or_dir, (str, os.PathLike)) else model_or_dir
    model = _in_dtype(model, dtype)
    name = type(model).__name__
    if name not in SUPPORTED:
        raise ValueError(f"model_or_dir: {name} is not supported; supported architectures (TorchScript): "
                         f"{', '.join(SUPPORTED)}; {PT2_HINT}")
    module, model_type = SUPPORTED[name]
    if model.config.model_type != model_type:
        raise ValueError(f"model_or_dir: a {name} with config.model_type = {model.config.model_type!r} is not "
                         f"supported (expected {model_type!r}); {PT2_HINT}")
    if max_source_length is not None and not model.config.is_encoder_decoder:
        raise ValueError("max_source_length is only for encoder-decoder models (T5)")
    if kernels != "aten" and model.config.is_encoder_decoder:
        raise ValueError(f"kernels={kernels!r} is for decoder-only exports (GPT-2, Llama), not {name}")
    was_training = model.training
    model.eval()
    try:
        scripted = _script(model, module, max_length, max_source_length, kernels)
    finally:
        model.train(was_training)
    meta = metadata(model, scripted, max_source_length)
    out_path = os.fspath(out_path)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    torch.jit.save(scripted, out_path, _extra_files={METADATA_FILE: json.dumps(meta, sort_keys=True)})
    meta["export_seconds"] = time.perf_counter() - started
    return meta
