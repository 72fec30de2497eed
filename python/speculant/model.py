"""Model handles: TorchScript files or in-memory ScriptModules checked against the engine's contract.

The contract (also in cpp/model.h), in one of two forms:

* cached: int attribute ``vocab_size`` (optionally ``max_length``, 0 = unlimited) and exported methods
  ``prefill(input_ids[1, T]) -> logits[1, T, V]`` (clears the cache), ``extend(input_ids[1, k]) ->
  logits[1, k, V]`` (appends), ``truncate(length: int) -> None`` and ``cache_length() -> int``.
* plain: ``forward(input_ids[1, T]) -> logits[1, T, V]``, which any causal LM satisfies; the engine recomputes
  the whole prefix at each call.
* encoder-decoder (T5): the cached form plus ``encode(input_ids[1, S]) -> None``, which runs the encoder on the
  source once and clears the decoder cache; optionally an int attribute ``max_source_length``.

A file may carry metadata in the extra file ``speculant.json`` (speculant.export writes it: architecture,
vocabulary size, EOS / pad / decoder-start ids).
"""

from __future__ import annotations

import io
import json
import os
from typing import List, Optional, Union

import torch

from . import _core


class Model:
    """A loaded model. Each handle owns its cache: use one handle per role (target, draft)."""

    def __init__(self, core: _core.Model, source: str):
        self._core = core
        self.source = source
        raw = core.metadata
        try:
            self.metadata = json.loads(raw) if raw else {}
        except ValueError as error:
            raise ValueError(f"model {source}: its speculant.json metadata is not valid JSON: {error}") from None
        if not isinstance(self.metadata, dict):
            raise ValueError(f"model {source}: its speculant.json metadata must be a JSON object")

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
        Llama 3: generate takes one of them)."""
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
        """'cached' or 'plain' (see the module docstring)."""
        return self._core.form

    def __repr__(self) -> str:
        return (f"speculant.Model({self.source!r}, form={self.form!r}, vocab_size={self.vocab_size}, "
                f"device={str(self.device)!r})")


def load(path_or_module: Union[str, os.PathLike, torch.jit.ScriptModule],
         device: Optional[Union[str, torch.device]] = None) -> Model:
    """Loads a TorchScript model file, or takes an in-memory ``torch.jit.ScriptModule``, moves it to
    ``device`` if given, and checks it against the contract with a one-token probe.

    Raises FileNotFoundError for a missing file and ValueError, saying what is wrong, for a file or module
    that does not follow the contract.
    """
    device_str = None if device is None else str(torch.device(device))
    if isinstance(path_or_module, torch.jit.ScriptModule):
        buffer = io.BytesIO()
        torch.jit.save(path_or_module, buffer)
        source = f"<{type(path_or_module).__name__} in memory>"
        return Model(_core.load_bytes(buffer.getvalue(), source, device_str), source)
    if isinstance(path_or_module, torch.nn.Module):
        raise ValueError("path_or_module must be a file path or a torch.jit.ScriptModule; script or trace "
                         f"the {type(path_or_module).__name__} first (torch.jit.script(module))")
    if not isinstance(path_or_module, (str, os.PathLike)):
        raise ValueError("path_or_module must be a file path or a torch.jit.ScriptModule, got "
                         f"{type(path_or_module).__name__}")
    path = os.fspath(path_or_module)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    return Model(_core.load_file(path, device_str), path)
