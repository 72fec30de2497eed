"""CUDA graphs: which shapes each model's calls take (cpp/models/rows.h, cpp/device/graphs.h), from a decoder's
``cuda_graphs`` option, and the warnings when a model cannot be captured.

``cuda_graphs``:

* ``"off"`` (the default): no capture.
* ``"auto"``: capture the models on CUDA whose backend can be (speculant.export's decoder-only TorchScript
  exports, any cached module with the batched methods, decoder-only .pt2 packages); any other CUDA model runs
  uncaptured with a warning that says why. Models on CPU run as always.
* ``"on"``: as ``"auto"``, but a model that cannot be captured (or is not on CUDA) is a ValueError.
  A live model loaded with ``compile=True`` replays CUDA graphs of its own (torch.compile's "reduce-overhead")
  under every mode but ``"fixed"``, which it has no calls for: ``"auto"`` and ``"on"`` take it as it is.
* ``"fixed"``: the fixed-shape calls that a graph replays, run without capturing, on any device: to check that
  graph mode changes no output, or to separate the shapes' cost from the launches' on a GPU. Decoder-only .pt2
  packages have fixed shapes as they are (batch 1 per replica), run by AOTInductor's single-threaded runner so
  that a capture holds no event of a previous run (their capture has not run on a GPU yet). A feature draft
  (EagleDraft, MedusaDraft) has fixed-shape calls of its own (feature_draft.py): its head's decoding calls run
  through static buffers, an EAGLE head's attention over a power-of-two bucket of its entries, and "auto" and
  "on" capture them on CUDA whatever its target's form.

A capture that fails at run time (an operation that CUDA graphs cannot record) leaves that model's calls
uncaptured from then on, with a warning naming the reason.

"auto" and "on" are opt-in. The capture ran on an H200 (torch 2.11, 2026-11-26: tests/test_graphs.py -m cuda,
benchmarks/graphs.py); the default stays "off" because "auto" warns for each model it cannot capture and graphs
run other kernels than dynamic shapes, so seeded tokens may differ from uncaptured runs in the last bits.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Iterable, Optional, Tuple

from .. import _core

# what was told already: the decoders (or models, for plain decoding) whose verification capture failed, and the
# models whose own capture failed
_TOLD_VERIFICATION: "weakref.WeakSet" = weakref.WeakSet()
_TOLD_MODEL: "weakref.WeakSet" = weakref.WeakSet()

CUDA_GRAPHS = ("auto", "on", "off", "fixed")


def check_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs must be one of {CUDA_GRAPHS}, got {mode!r}")
    return mode


def shapes(model: _core.Model, mode: str, role: str) -> Tuple[str, Optional[str]]:
    """The shapes of `model`'s calls, "dynamic", "fixed" or "graphed", for cuda_graphs=`mode`, and the warning
    to give when a CUDA model cannot be captured (the caller gives it once the decoder is built, so that a
    wrong pair is an error first); `role` names the model ("target", "draft") in messages."""
    if mode == "off":
        return "dynamic", None
    if mode == "fixed":
        why = model.fixed_shapes_obstacle
        if why:
            raise ValueError(f"cuda_graphs='fixed': the {role} ({model.form} form) has no fixed-shape calls: {why}")
        return "fixed", None
    if not model.device.startswith("cuda"):
        if mode == "on":
            raise ValueError(f"cuda_graphs='on' needs models on CUDA; the {role} is on {model.device}")
        return "dynamic", None
    if model.form == "compiled":  # compiled_live.py: torch.compile replays the model's own CUDA graphs
        return "dynamic", None
    why = model.capture_obstacle
    if why:
        if mode == "on":
            raise ValueError(f"cuda_graphs='on': the {role} ({model.form} form) cannot be captured: {why}")
        return "dynamic", f"CUDA graphs are off for the {role} ({model.form} form): {why}"
    return "graphed", None


def warn(messages: Iterable[Optional[str]]) -> None:
    for message in messages:
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def warn_verification_failure(core, decoder) -> None:
    """Warns once per SpeculativeDecoder (or model, for plain decoding) whose verification's capture has failed
    (cpp/device/verification_graphs.h): it runs uncaptured from then on."""
    failure = core.verification_graphs[2]
    if failure and decoder not in _TOLD_VERIFICATION:
        _TOLD_VERIFICATION.add(decoder)
        warnings.warn(f"CUDA graphs are off for the verification from now on: {failure}", RuntimeWarning,
                      stacklevel=4)


def warn_failures(models: Iterable) -> None:
    """Warns once per model handle (speculant.Model) whose capture has failed."""
    for model in models:
        failure = model.engine.graph_failure
        if failure and model not in _TOLD_MODEL:
            _TOLD_MODEL.add(model)
            warnings.warn(f"CUDA graphs are off for {model.source} from now on: {failure}", RuntimeWarning,
                          stacklevel=4)
