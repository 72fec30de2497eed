"""Live transformers models compiled: transformers' static cache and torch.compile behind the engine's Model
interface (cpp/models/python_model.h), the fast route for a model object (``speculant.load(model, compile=True)``).

live.py runs a model's forward eagerly with a DynamicCache: every call re-enters transformers' Python, which
costs more than a small model's arithmetic. Here:

* The cache is transformers' ``StaticCache`` of ``max_length`` positions, allocated once per row (one eager
  token fills its layers in, so that their tensors exist before any compiled call) and kept across generations.
  Every layer writes a call's keys and values at its ``cumulative_length`` (a tensor on the model's device) and
  advances it; a rollback (``truncate``) sets it back. The entries of rejected drafts stay in the slots past that
  position, where no query sees them: a static cache's causal mask shows a query at position t the slots
  0 .. t only, and every one of those was written on the kept path before the query runs (slot t by its own
  call). So a rollback is exact without touching the keys and values.
* Calls of at most COMPILED_WIDTH tokens (every decoding step) run the forward through ``torch.compile`` with
  ``fullgraph=True``: a graph break is an error, never a silent slow path. A model compiles two graphs, one for
  width 1 and one with a dynamic width for 2 .. COMPILED_WIDTH (seconds each, at their first calls), far below
  dynamo's limit of 8 per function (each model compiles a function of its own, so other models in the process
  do not count); to keep it at two, every input is made the same way whoever calls (inference tensors of their
  own). On CUDA the mode is "reduce-overhead": Inductor's fused kernels replayed as CUDA graphs, and each call's
  logits are copied out of the graphs' memory before a later replay can overwrite them.
  Longer calls (prefills) run the same forward eagerly into the same cache.
* The attention mask of a chain's call is all ones over the whole static cache, one tensor for every call (its
  shape never changes, so it never recompiles): the causal part does the masking, as above.
* Token trees and beams (extend_masked, keep): a tree call writes its nodes' entries at the next slots, each
  query at its node's depth (position_ids), and its 4-D mask [1, 1, k, max_length] shows a node the kept
  entries, its ancestors and itself, nothing past them (transformers takes a 4-D mask as it is, in place of
  the causal one: the stale slots past the write position are hidden by the mask here). keep() gathers the
  kept entries to the front of every layer's buffers in place (the buffers keep their addresses, which CUDA
  graphs replay) and sets the write position after them. Masked calls compile as two more graphs (width 1,
  dynamic width), so a model compiles at most four; the tree probe (live.py, on first use) checks a tree call
  and a kept path against uncached forwards through these calls.

Refused at load, by name: encoder-decoders (the encoder's cross-attention cache has no compiled route here),
sliding-window or chunked layers (their static layers keep a rolling buffer, which a rollback cannot restore),
and everything live.py refuses. Whatever a call returns is checked at load as live.py's probe checks it: a crop
and new tokens against an uncached forward, here through the compiled calls.
"""
from __future__ import annotations

import json
import types
import warnings
from typing import Optional

import torch

from . import layer_masks, live

COMPILED_WIDTH = 32  # calls of up to this many tokens are compiled: chains up to gamma 31, trees up to 31 drafts
DEFAULT_LENGTH = 4096  # the static cache's positions when the model's context is longer (memory: one per row)


def _forward(model, cache, ids: torch.Tensor, positions: Optional[torch.Tensor], mask: torch.Tensor,
             logits_to_keep: int = 0) -> torch.Tensor:
    """The model's logits [1, k, V] for ids [1, k] at positions [1, k] (None: a model that takes none, such as
    Bloom's ALiBi), written into `cache`; logits_to_keep = 1: the last token's only (a prefill)."""
    extra = {} if positions is None else {"position_ids": positions}
    if logits_to_keep:
        extra["logits_to_keep"] = logits_to_keep
    return model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, **extra).logits


def _how(device: torch.device) -> dict:
    """torch.compile's mode or options for `device`. On CUDA, "reduce-overhead" (CUDA graphs); on the CPU,
    inductor_options'. The indices they check are in range by construction: positions below max_length (_run
    refuses a call past it), token ids below the vocabulary (the engine's, and live.py's clamp of another model's
    ids)."""
    return {"mode": "reduce-overhead"} if device.type == "cuda" else inductor_options(device)


def inductor_options(device: torch.device) -> dict:
    """torch.compile's options for code whose indirect indices are in range by construction. On the CPU below
    torch 2.15 Inductor's bounds checks on them are left out: torch 2.11's C++ code for them in a dynamic-width
    graph does not compile (a vectorized check names a variable it never declared), 2.15's does."""
    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    cpu = torch.device(device).type == "cpu"
    return {"options": {"assert_indirect_indexing": False}} if cpu and release < (2, 15) else {}


class CompiledLiveModel(live.LiveModel):
    """A transformers model with a static cache, its decoding calls compiled (the module docstring)."""

    form = "compiled"
    cache_kind = "a StaticCache whose write position it sets back to roll back, its decoding calls compiled"
    tree_layer = "StaticLayer"

    def __init__(self, model, *, vocab_size: Optional[int] = None, name: str = "",
                 max_length: Optional[int] = None):
        cls = type(model).__name__
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"compile=True: {cls} is an encoder-decoder model; the compiled route runs decoder-only "
                             "models (load it without compile=)")
        layers = layer_masks.attention_layers(config.get_text_config())
        windowed = sorted(kind for kind in layers if kind != "full_attention")
        if windowed:
            raise ValueError(f"compile=True: {cls} has {', '.join(windowed)} layers, whose static cache keeps only "
                             "the last window or chunk of positions, which a rollback cannot restore; load it without "
                             "compile=")
        context = live.max_positions(config.get_text_config())
        if max_length is None:
            if context is None:
                raise ValueError(f"max_length: {cls} states no context length; pass max_length= (the static "
                                 "cache's positions)")
            max_length = min(context, DEFAULT_LENGTH)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2 (the static cache's positions), got {max_length!r}")
        if context is not None and max_length > context:
            raise ValueError(f"max_length must be at most {cls}'s context of {context} positions, got {max_length}")
        self._static_length = max_length
        self._static = None  # the StaticCache, made by the first reset
        self._graphs = model.device.type == "cuda"
        # a code object of its own: dynamo keeps a function's graphs on its code object and allows 8 there, so
        # models of other shapes in the same process (each compiles its own) would otherwise count against it
        self._function = types.FunctionType(_forward.__code__.replace(), _forward.__globals__, _forward.__name__,
                                            _forward.__defaults__)
        self._compiled = torch.compile(self._function, fullgraph=True, **_how(model.device))
        with torch.inference_mode():  # as every input of a compiled call (_run)
            self._full_mask = torch.ones(1, max_length, dtype=torch.long, device=model.device)
        super().__init__(model, vocab_size=vocab_size, name=name)  # probes the compiled calls
        self.max_length = max_length
        metadata = json.loads(self.metadata)
        metadata["max_length"] = max_length
        self.metadata = json.dumps(metadata)

    def _probe(self) -> int:
        # The first compiled call on CUDA makes the thread's CUDAGraphTreeManager, which captures an empty graph on
        # purpose (it holds the graphs' memory pool); torch below 2.15 warns of it as of a failed capture ("The CUDA
        # Graph is empty ... wrong device or stream"), 2.15 hides the warning itself. That call is the probe's.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
            return super()._probe()

    def replica(self) -> "CompiledLiveModel":
        """The same module and compiled calls with a static cache of its own: another row of a batch."""
        other = super().replica()
        other._static = None
        return other

    def truncate(self, length: int) -> None:
        if length < self._length:
            with torch.inference_mode():  # the cache's tensors are inference tensors (_new_cache)
                for layer in self._cache.layers:
                    layer.cumulative_length.fill_(length)
        self._length = length

    def keep(self, entries: torch.Tensor) -> None:
        """Keeps the cache entries at `entries` (int64 [M], ascending) as entries 0 .. M - 1: gathered to the front
        of each layer's buffers in place; the slots past M are stale, hidden as a rollback's are."""
        count = entries.numel()
        with torch.inference_mode():
            # ascending distinct entries have entries[i] >= i, and once one is past its index all after it are:
            # the matches are the prefix that stays where it is (the committed tokens), so only the rest moves
            settled = int((entries == self._positions[:count]).sum())
            moved = entries[settled:]
            for layer in self._cache.layers:
                for buffer in (layer.keys, layer.values):  # [1, heads, max_length, head_dim]
                    buffer[:, :, settled:count].copy_(buffer.index_select(-2, moved))
                layer.cumulative_length.fill_(count)
        self._length = count

    def _new_cache(self):
        """The static cache, emptied: every layer's write position back to 0 (its old entries unseen)."""
        # every cache tensor an inference tensor, whoever calls (the engine runs in inference mode, the load's
        # check does not): dynamo guards on the kind and would compile again for the other
        with torch.inference_mode():
            if self._static is None:
                transformers = live.require_transformers()
                self._static = transformers.StaticCache(config=self.model.config,
                                                        max_cache_len=self._static_length)
                # fills the layers in eagerly: a compiled call must find their tensors
                self.model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.model.device),
                           past_key_values=self._static, use_cache=True)
            for layer in self._static.layers:
                layer.cumulative_length.fill_(0)
        return self._static

    def _run(self, tokens: torch.Tensor, logits: bool, positions: Optional[torch.Tensor] = None,
             mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        k, start = tokens.numel(), self._length
        if start + k > self._static_length:
            raise ValueError(f"model {self.name}: {start + k} positions exceed its static cache's max_length = "
                             f"{self._static_length}; load it with a larger max_length=")
        if start + k > self._positions.numel():
            self._grow(start + k)
        with torch.inference_mode():
            if self.pad_to is not None:  # as live.py: ids past the model's own vocabulary reach it only as drafts
                tokens = tokens.clamp(max=self._own_vocab - 1)
            # inputs of one kind whoever made them (the engine's inference tensors, the load's check): tensors of
            # their own (no storage offset into another), made in inference mode, or dynamo would guard on the
            # difference and compile the same width again
            ids = tokens.reshape(1, k).clone()
            if positions is None:
                positions = self._positions[start:start + k]
            at = positions.reshape(1, k).clone() if "position_ids" in self._params else None
            attention = self._full_mask if mask is None else self._tree_mask(mask, positions)
            if k > COMPILED_WIDTH:  # a prefill: eagerly, into the same cache
                keep = 0 if logits or "logits_to_keep" not in self._params else 1
                out = _forward(self.model, self._cache, ids, at, attention, keep)
            else:
                if k > 1:  # one graph for widths 2 .. COMPILED_WIDTH, one for width 1 (the decoding step)
                    # "maybe": without a stated range dynamo cannot refuse a guard that narrows it, as a graph
                    # from Inductor's on-disk cache compiled with other bounds (another version's) would give
                    for tensor, dim in ((ids, 1), (at, 1), (None if mask is None else attention, 2)):
                        if tensor is not None:
                            torch._dynamo.maybe_mark_dynamic(tensor, dim)
                if self._graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                out = self._compiled(self.model, self._cache, ids, at, attention)
                if self._graphs:
                    out = out.clone()  # the graphs' output memory is reused by the next replay
        return self.end_call(out if logits else None, start + k)

    def _tree_mask(self, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A tree call's mask over the static cache: bool [k, S] (S = the kept entries + k) -> the model's
        [1, 1, k, max_length], the slots past S masked (layer_masks: additive for eager attention)."""
        k, size = mask.shape
        full = torch.zeros(k, self._static_length, dtype=torch.bool, device=mask.device)
        full[:, :size] = mask
        return self.attention_mask(full, positions)
