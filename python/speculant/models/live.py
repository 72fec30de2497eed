"""Live transformers models behind the engine's Model interface (cpp/models/python_model.h).

``speculant.load(model)`` wraps a transformers ``*ForCausalLM`` or encoder-decoder
``*ForConditionalGeneration`` object as it is (its dtype, its device). The Algorithm 1 loop stays in C++; each
model call re-enters Python here and runs the model's own forward with a cache this wrapper owns:

* decoder-only: a ``DynamicCache()`` built without the config, so that every layer keeps every position.
  Sliding-window layers then never evict: their window is applied by the attention mask, which transformers
  computes from absolute positions, so the logits are the model's own and a rollback (``crop``) is exact. A
  tree call's 4-D mask, which transformers takes as it is, gets the window there (layer_masks.py).
* encoder-decoder: an ``EncoderDecoderCache`` of two such caches; the encoder runs once per source
  (``encode``), and rollback crops the self-attention cache only.

Rollback is ``cache.crop(-removed)``. A model whose state cannot be cut back to an earlier position (recurrent
or state-space layers: Mamba, RWKV, Jamba, ...) is refused at load with the reason, never recomputed. At load a
probe also checks that a crop followed by new tokens gives the logits of an uncached forward over the same
sequence, so a model whose cache does not roll back exactly fails there, not in the middle of a generation.
"""
from __future__ import annotations

import copy
import functools
import inspect
import json
import os
from typing import Optional

import torch
import torch.nn.functional as F

from . import features, layer_masks, relative_trees


def is_transformers_model(value) -> bool:
    """Whether `value` is a transformers PreTrainedModel (without importing transformers when it is absent)."""
    for cls in type(value).__mro__:
        if cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers"):
            return True
    return False


def require_transformers():
    """The transformers package, or ImportError saying which version to install."""
    try:
        import transformers
    except ImportError:
        raise ImportError("live transformers models need transformers 5.x: pip install 'transformers>=5,<6'") from None
    return transformers


def pretrained(directory: str, dtype: Optional[torch.dtype]):
    """The causal or sequence-to-sequence LM in a local save_pretrained directory (no downloads), in eval mode."""
    transformers = require_transformers()
    config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
    from safetensors import SafetensorError  # a dependency of transformers

    try:
        model = auto.from_pretrained(directory, local_files_only=True, dtype=dtype)
    except SafetensorError as error:
        raise damaged_weights(directory, error) from None
    except ValueError as error:  # transformers: "Unrecognized configuration class ..."
        raise ValueError(f"model: {directory} holds a {config.model_type!r} model that has no causal or "
                         f"sequence-to-sequence LM class in transformers: {error}") from None
    return model.eval()


def damaged_weights(directory: str, error: Exception) -> ValueError:
    """The error to raise for safetensors' SafetensorError while loading `directory` (a file cut short by an
    interrupted copy or download, or corrupted): it names the file, which safetensors' own message does not."""
    problem = safetensors_problem(directory) or f"a .safetensors file in {directory} could not be read"
    return ValueError(f"model: {problem} (safetensors: {error}); copy or save the model again (save_pretrained)")


def safetensors_problem(directory: str) -> Optional[str]:
    """What is wrong with the first damaged .safetensors file in `directory`, naming it, or None. Checks the
    format's layout: an 8-byte little-endian header length N, N bytes of JSON header, then exactly the bytes
    that the header's largest data offset needs."""
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(directory, name)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else None
            if length is None or 8 + length > size:
                return (f"{path} is truncated: {size} bytes, fewer than its header needs"
                        + ("" if length is None else f" ({8 + length})"))
            try:
                header = json.loads(f.read(length))
                end = max((int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"),
                          default=0)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
                return f"{path} is corrupt: its header is not a valid safetensors header ({error})"
        if 8 + length + end > size:
            return f"{path} is truncated: {size} bytes, its tensors need {8 + length + end}"
        if 8 + length + end < size:
            return f"{path} is corrupt: {size} bytes, its tensors cover {8 + length + end}"
    return None


def max_positions(config) -> Optional[int]:
    """The positions a model has (learned absolute positions or the trained context), or None."""
    for field in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def describe(model, *, max_length: Optional[int], max_source_length: Optional[int],
             decoder_start_token_id: Optional[int]) -> dict:
    """The metadata speculant keeps about a transformers model (what speculant.export writes as
    speculant.json, and what Model.metadata returns for a live model)."""
    config, text = model.config, model.config.get_text_config()  # a multimodal model's language part: text
    generation = getattr(model, "generation_config", None)

    def field(name, *holders):  # the first holder's that has it
        for holder in holders:
            value = getattr(holder, name, None)
            if value is not None:
                return list(value) if isinstance(value, (list, tuple)) else value
        return None

    return {
        "architecture": type(model).__name__,
        "model_type": config.model_type,
        "vocab_size": text.vocab_size,
        "max_length": max_length,
        "max_source_length": max_source_length,
        "encoder_decoder": bool(config.is_encoder_decoder),
        "eos_token_id": field("eos_token_id", generation, config, text),  # generation's: what generate stops at
        "pad_token_id": field("pad_token_id", config, text),
        "bos_token_id": field("bos_token_id", config, text),
        **{key: getattr(text, key, None) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads")},
        "decoder_start_token_id": decoder_start_token_id,
        "dtype": str(model.dtype).removeprefix("torch."),
        "transformers_version": require_transformers().__version__,
    }


def decoder_start(model) -> Optional[int]:
    """An encoder-decoder model's first decoder token (transformers 5 may keep it in generation_config only)."""
    for holder in (getattr(model, "generation_config", None), model.config):
        value = getattr(holder, "decoder_start_token_id", None)
        if value is not None:
            return int(value)
    return None


class LiveModel:
    """The object cpp/models/python_model.cpp calls: a transformers model and the cache this wrapper owns."""

    form = "live"  # what speculant.Model.form reports (compiled_live.py: "compiled")
    cache_kind = "a DynamicCache it crops to roll back"  # for messages
    tree_layer = "DynamicLayer"  # the cache layers whose entries keep() can select (transformers' class name)

    def __init__(self, model, *, vocab_size: Optional[int] = None, name: str = ""):
        transformers = require_transformers()
        self.name = name or type(model).__name__
        config = model.config
        text = config.get_text_config()  # the config itself, or a multimodal model's language part
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        cls = type(model).__name__
        if self.encoder_decoder:
            if not (hasattr(model, "get_encoder") and model.get_output_embeddings() is not None):
                raise ValueError(f"model: {cls} is an encoder-decoder without an LM head; pass its "
                                 "*ForConditionalGeneration class")
        elif model.get_output_embeddings() is None:
            raise ValueError(f"model: {cls} has no LM head (no next-token logits); pass a *ForCausalLM model")
        if model.training:
            raise ValueError(f"model: {cls} is in training mode (dropout would make every call random); call "
                             "model.eval() first")
        if getattr(model, "_is_stateful", False):
            raise ValueError(f"model: {cls} keeps recurrent or state-space state (transformers marks it "
                             "stateful), which cannot be rolled back to an earlier position after a rejected "
                             "draft; speculant refuses it rather than recompute the sequence")
        self.model = model
        self.device = str(model.device)
        self._params = inspect.signature(model.forward).parameters
        self._cache_class = transformers.DynamicCache
        self._pair_class = transformers.EncoderDecoderCache
        # T5's positions are relative buckets: no limit; learned or rotary positions: the trained context
        relative = getattr(text, "relative_attention_num_buckets", None) is not None
        self.max_length = None if relative else max_positions(text)
        self.max_source_length = self.max_length if self.encoder_decoder else None
        self._cache = None
        self._length = 0
        self._encoder_outputs = None
        self._source_mask = None
        self._positions = torch.arange(0, device=model.device)  # grown on demand: [0, 1, ...]
        self._ones = torch.ones(1, 0, dtype=torch.long, device=model.device)
        self.pad_to = None
        # Batch 1 has no padding: without a mask transformers skips checking an all-ones one at every call. A
        # model with a pad id gets the mask anyway, or it would inspect its inputs for that id and warn.
        self._mask_needed = any(getattr(holder, "pad_token_id", None) is not None for holder in (config, text))
        self._tree_obstacle: Optional[str] = None  # probed on first use
        self._layers = layer_masks.attention_layers(text)  # layer type -> window or chunk size
        # where a layer type's pattern reads positions (a window, chunks), tree masks need each cache entry's
        # position: a beam search's cache holds several beams' entries, so entry i is not position i there
        self._patterned = layer_masks.positional(self._layers)
        self._attention = text._attn_implementation  # eager takes additive masks
        self._entry_positions = torch.zeros(0, dtype=torch.long, device=model.device)  # [length] when patterned
        self._ids = text.vocab_size  # the probes' token ids are taken modulo it
        # feature drafts (features.py): the hidden states they read, once one asks (tap); and this model with its
        # replicas in the order made, so that a feature draft's row r reads the target's row r (rows.cpp)
        self._features: Optional[features.Features] = None
        self._family = [self]
        # an early-exit draft sharing this model's first layers' cache (shared_exit.py): this row's records
        self._share = None
        own = self._own_vocab = self._probe()
        if vocab_size is not None:
            if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < own:
                raise ValueError(f"vocab_size must be an int >= the model's own vocabulary ({own}), got "
                                 f"{vocab_size!r}: padding adds ids with -inf logits, it never removes any")
            self.pad_to = vocab_size
        self.vocab_size = vocab_size or own
        start = decoder_start(model) if self.encoder_decoder else None
        self.metadata = json.dumps(describe(model, max_length=self.max_length, max_source_length=
                                            self.max_source_length, decoder_start_token_id=start))

    # -- the Model contract ------------------------------------------------------------------------------------
    def encode(self, source: torch.Tensor) -> None:
        """source: int64 [S]. Runs the encoder once and starts an empty decoder cache."""
        ids = source.view(1, -1)  # [1, S]
        self._source_mask = torch.ones_like(ids)
        with torch.inference_mode():
            self._encoder_outputs = self.model.get_encoder()(input_ids=ids, attention_mask=self._source_mask)
        self._cache = self._new_cache()
        self._length = 0

    def reset(self, tokens: torch.Tensor) -> None:
        """tokens: int64 [T >= 0]. A new cache holding them."""
        self._cache = self._new_cache()
        self._length = 0
        if self._features is not None:
            self._features.reset()
        if self._share is not None:
            self._share.clear()
        if tokens.numel() > 0:
            self._run(tokens, logits=False)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [k >= 1] -> logits [k, V] for them."""
        return self._run(tokens, logits=True)

    def replica(self) -> "LiveModel":
        """The same module object with a cache of its own: another row of a batch (cpp/models/rows.h)."""
        other = copy.copy(self)
        other._cache, other._length, other._encoder_outputs, other._source_mask = None, 0, None, None
        other._tree_obstacle = self._tree_obstacle
        other._features = None if self._features is None else self._features.fresh()
        other._share = None if self._share is None else self._share.fresh()
        self._family.append(other)
        return other

    def positions(self, start: int, count: int) -> torch.Tensor:
        """Positions start .. start + count - 1 [count] (a chain's)."""
        if start + count > self._positions.numel():
            self._grow(start + count)
        return self._positions[start:start + count]

    def family(self) -> list:
        """This model and its replicas, in the order made (row r: family()[r])."""
        return list(self._family)

    # -- feature drafts (features.py) ------------------------------------------------------------------------------
    def tap(self, view: features.View) -> None:
        """Records `view`'s hidden states at every cache entry from the next call on, here and in every replica."""
        if self.encoder_decoder:
            raise ValueError(f"{self.name} is an encoder-decoder model; feature drafts read decoder-only targets")
        family = self._family
        if self._features is None:
            taps: dict = {}
            for member in family:
                member._features = features.Features(taps)
        if view not in self._features.taps:
            self._features.taps[view] = features.Tap(self.model, view)
        self._features.taps[view].readers += 1

    def untap(self, view: features.View) -> None:
        """A reader of `view` is gone (a feature draft's finalizer): the last one drops its tap."""
        if self._features is not None and self._features.drop(view):
            for member in self._family:
                member._features.values.pop(view, None)

    def shared_layers(self) -> tuple:
        """The input embedding and the LM head feature drafts share with this model."""
        return self.model.get_input_embeddings(), self.model.get_output_embeddings()

    def row(self, index: int) -> "LiveModel":
        """Row `index` of this model's batches: itself (0) or its replica made index-th."""
        return self._family[index]

    def features(self, view: features.View) -> tuple:
        """`view`'s hidden states at each cache entry ([entries, D], or None before any call) and how many
        leading entries are the committed sequence."""
        return self._features.read(view)

    def truncate(self, length: int) -> None:
        if self._share is not None:  # its first layers may hold a sharing draft's entries past this model's
            self._share.crop_cache(self._cache, length)
        elif length < self._length:
            self._cache.crop(length - self._length)  # transformers 5: a negative count removes that many
        self._length = length
        if self._features is not None:
            self._features.truncate(length)

    # -- token trees (cpp/models/model.h: extend_masked, keep) --------------------------------------------------------
    def extend_masked(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens, positions: int64 [T]; mask: bool [T, S], S = the cache's entries + T. Appends the tokens as
        cache entries, token j at positions[j] attending to exactly the entries where mask[j]; logits [T, V]."""
        return self._run(tokens, logits=True, positions=positions, mask=mask)

    def keep(self, entries: torch.Tensor) -> None:
        """Keeps the cache entries at `entries` (int64 [M], ascending), in that order, as entries 0 .. M - 1."""
        cache = self._cache.self_attention_cache if self.encoder_decoder else self._cache
        for layer in cache.layers:  # an encoder-decoder's cross-attention entries stay: they are the source's
            layer.keys = layer.keys.index_select(-2, entries)
            layer.values = layer.values.index_select(-2, entries)
        self._length = entries.numel()
        if self._patterned:
            self._entry_positions = self._entry_positions.index_select(0, entries)
        if self._features is not None:
            self._features.keep(entries)
        if self._share is not None:
            self._share.keep(entries)

    def tree_obstacle(self) -> str:
        """Why this model cannot verify a token tree in one call (tree= drafts, beam search), or "" (probed once:
        a tree call against uncached forwards of each node's path, then a kept path against a forward of the
        whole sequence). An encoder-decoder's rows each hold their own encoded source."""
        if self._tree_obstacle is None:
            self._tree_obstacle = self._tree_probe()
        return self._tree_obstacle

    beam_obstacle = tree_obstacle  # beams are token trees in one cache too

    def _tree_probe(self) -> str:
        if self.encoder_decoder:
            why = self._relative_obstacle()
            if why:
                return why
        elif "position_ids" not in self._params:
            return f"{type(self.model).__name__}.forward takes no position_ids (a tree's nodes share positions)"
        why = layer_masks.obstacle(self._layers)
        if why:
            return why
        if self.encoder_decoder:
            self.encode(torch.tensor([1 % self._ids], device=self.model.device))
        self.reset(torch.tensor([1 % self._ids], device=self.model.device))
        cache = self._cache.self_attention_cache if self.encoder_decoder else self._cache
        kinds = {type(layer).__name__ for layer in getattr(cache, "layers", [])}
        if kinds != {self.tree_layer}:
            return (f"its cache layers ({', '.join(sorted(kinds)) or 'none'}) are not plain {self.tree_layer}s "
                    "(sliding windows and other kinds cannot keep an arbitrary path of entries)")
        device = self.model.device
        try:
            worst, dtype = self._tree_call_error()
            tolerance = layer_masks.TOLERANCE.get(dtype, 1e-2)
            if not worst <= tolerance:
                return (f"it does not honour a 4-D attention mask: a tree node's logits differ from its path's by "
                        f"{worst:.3g} (relative; allowed {tolerance:g})")
            if self._patterned:  # the windows / chunks in play, shrunk until they bite within the probe
                layers = self._layers
                with layer_masks.shrunk(self.model.config.get_text_config(), layers) as (small, fields):
                    self._layers = small
                    try:
                        worst, _ = self._tree_call_error()
                    finally:
                        self._layers = layers
                if not worst <= tolerance:
                    return (f"its attention does not apply {', '.join(fields)} as transformers' masks do (tree "
                            f"masks follow masking_utils): with it set to {layer_masks.SMALL} for a probe, a tree "
                            f"node's logits differ from its path's by {worst:.3g} (relative; allowed "
                            f"{tolerance:g})")
        except Exception as error:  # noqa: BLE001 - the model refused the call: say so
            return (f"a tree call (4-D attention mask, position_ids) failed: {type(error).__name__}: {error}")
        finally:
            self.reset(torch.tensor([], dtype=torch.long, device=device))
        return ""

    def _tree_call_error(self) -> tuple[float, torch.dtype]:
        """A tree call (prefix a b, root c with children d and e, then the path c e kept and x appended) against
        uncached forwards of each node's path: the largest difference relative to the logits' scale, and their
        dtype."""
        a, b, c, d, e, x = (i % self._ids for i in (1, 2, 3, 4, 5, 6))
        ids = functools.partial(torch.tensor, device=self.model.device)
        if self.encoder_decoder:
            self.encode(ids([d, e, x]))
        self.reset(ids([a, b]))
        mask = ids([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], dtype=torch.bool)  # root c: d, e
        logits = self.extend_masked(ids([c, d, e]), ids([2, 3, 3]), mask)
        self.keep(ids([0, 1, 2, 4]))  # the path c, e
        after = self._run(ids([x]), logits=True)
        worst = 0.0
        for got, path in ((logits[1], [a, b, c, d]), (logits[2], [a, b, c, e]), (after[0], [a, b, c, e, x])):
            reference = self.uncached_logits(path).float()
            worst = max(worst, (got.float()[:reference.numel()] - reference).abs().max().item()
                        / max(1.0, reference.abs().max().item()))
        return worst, logits.dtype

    def _relative_obstacle(self) -> str:
        """Why this encoder-decoder's decoder is not T5's (relative position buckets in block 0's self-attention,
        shared by every block), or "": only that decoder's tree calls are built (relative_trees.py)."""
        decoder = self.model.get_decoder()
        blocks = getattr(decoder, "block", None)
        cls = type(self.model).__name__
        try:
            attentions = [block.layer[0].SelfAttention for block in blocks]
        except (TypeError, AttributeError, IndexError):
            return (f"an encoder-decoder live model verifies trees only with T5's decoder (relative position buckets);"
                    f" {cls}'s decoder is not built that way")
        first = attentions[0]
        if not (getattr(first, "has_relative_attention_bias", False) and hasattr(first, "_relative_position_bucket")
                and not any(getattr(a, "has_relative_attention_bias", False) for a in attentions[1:])):
            return (f"{cls}'s decoder does not share one relative position bias from its first block, as T5's does: "
                    "its tree calls are not built")
        return ""

    # -- what shares its cache (shared_exit.py, early_exit.py) ------------------------------------------------------
    # An early-exit draft may keep its first layers' entries in this model's cache; this model's calls then go
    # through that draft's records of them (shared_exit.SharedRows.run), which run the forward themselves where they
    # reuse the draft's work. What they read and call is here; subclasses override the hooks _run, _new_cache and
    # _probe (compiled_live.py, shared_exit.SharingDraft).
    @property
    def length(self) -> int:
        """The entries in its cache: the sequence's, then a tree call's nodes until keep()."""
        return self._length

    @property
    def cache(self):
        """The transformers cache its calls run in (None before the first reset or encode)."""
        return self._cache

    @property
    def patterned(self) -> bool:
        """Whether some of its layers' attention pattern reads positions (sliding windows, chunks)."""
        return self._patterned

    @property
    def records_features(self) -> bool:
        """Whether it records hidden states for a feature draft (tap): their hooks want each whole forward."""
        return self._features is not None

    @property
    def sharing(self):
        """The records of an early-exit draft sharing its cache (shared_exit.SharedRows), or None."""
        return self._share

    def start_sharing(self, rows) -> None:
        """From now on its calls go through `rows` (shared_exit.SharedRows), this row's records of a sharing
        draft's entries."""
        self._share = rows

    def stop_sharing(self) -> None:
        """Keeps its cache alone again: the entries a sharing draft left past its own are dropped."""
        if self._share is not None:
            self._share.crop_cache(self._cache, self._length)
            self._share = None

    def attention_mask(self, visible: torch.Tensor, positions: torch.Tensor,
                       keys: Optional[torch.Tensor] = None):
        """The attention_mask its forward takes for a call of k tokens at `positions` [k] attending where `visible`
        (bool [k, S]); `keys`: the S entries' positions, read where patterned (layer_masks.attention_mask)."""
        return layer_masks.attention_mask(visible, keys, positions, self._layers, self._attention, self.model.dtype)

    def own_forward(self, tokens: torch.Tensor, logits: bool, positions: Optional[torch.Tensor] = None,
                    mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The model's own forward over `tokens` appended to its cache (at `positions` attending where `mask`, as
        extend_masked; None: a chain's) -> logits [k, V], or None where not `logits`. The contract's calls come
        here, or through a sharing draft's records, which call it where they reuse nothing of the draft's."""
        k, start = tokens.numel(), self._length
        if self.pad_to is not None:
            # ids past the model's own vocabulary (its padding) reach it only as another model's tokens; any
            # valid id may stand in: as a target, such a draft has p = 0 and is rejected, so no kept logit
            # depends on it; as a draft, its input only shapes q, which it reports as it is
            tokens = tokens.clamp(max=self._own_vocab - 1)
        if start + k > self._positions.numel():
            self._grow(start + k)
        ids = tokens.view(1, k)  # [1, k]
        if positions is None:
            positions = self._positions[start:start + k]  # [k]
        if self._patterned:
            self._entry_positions = torch.cat([self._entry_positions[:start], positions])
        kwargs = {"past_key_values": self._cache, "use_cache": True}
        if self.encoder_decoder and mask is not None:
            with torch.inference_mode():
                tree = relative_trees.t5_tree_logits(self.model, ids, positions, mask, self._encoder_outputs[0],
                                                     self._cache)
            return self.end_call(tree, start + k)
        if self.encoder_decoder:
            kwargs.update(decoder_input_ids=ids, encoder_outputs=self._encoder_outputs,
                          attention_mask=self._source_mask)
        else:
            kwargs["input_ids"] = ids
            if mask is not None:  # a tree call: the mask and positions the engine gives
                keys = self._entry_positions if self._patterned else None
                kwargs["attention_mask"] = self.attention_mask(mask, positions, keys)
            elif self._mask_needed:
                kwargs["attention_mask"] = self._ones[:, :start + k]
            if "position_ids" in self._params:
                kwargs["position_ids"] = positions.view(1, k)
        if not logits and "logits_to_keep" in self._params:
            kwargs["logits_to_keep"] = 1
        recording = self._features  # features.py: what feature drafts read, when one does
        if recording is not None:
            recording.arm(True)
        try:
            with torch.inference_mode():
                out = self.model(**kwargs)
            if recording is not None:
                recording.record(start, linear=mask is None)
        finally:
            if recording is not None:
                recording.arm(False)
        return self.end_call(out.logits if logits else None, start + k)

    def end_call(self, logits: Optional[torch.Tensor], length: int) -> Optional[torch.Tensor]:
        """Ends a call that left `length` cache entries: its logits [1, k, V] (None: not wanted) -> [k, V], padded
        to vocab_size (own_forward's end, and that of a sharing draft's records' own forward)."""
        self._length = length
        if logits is None:
            return None
        result = logits[0]  # [k, V]
        if self.pad_to is not None and self.pad_to > result.size(-1):
            result = F.pad(result, (0, self.pad_to - result.size(-1)), value=float("-inf"))
        return result

    def uncached_logits(self, tokens: list[int]) -> torch.Tensor:
        """The last position's logits [V] of a forward over `tokens` with no cache (the probes' reference)."""
        ids = torch.tensor([tokens], device=self.model.device)
        with torch.inference_mode():
            if self.encoder_decoder:
                out = self.model(encoder_outputs=self._encoder_outputs, attention_mask=self._source_mask,
                                 decoder_input_ids=ids, use_cache=False)
            else:
                out = self.model(input_ids=ids, use_cache=False)
        return out.logits[0, -1]

    # -- internals ---------------------------------------------------------------------------------------------
    def _new_cache(self):
        if self.encoder_decoder:
            return self._pair_class(self._cache_class(), self._cache_class())
        return self._cache_class()

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._positions.numel(), 64)
        self._positions = torch.arange(size, device=self._positions.device)  # [size]
        self._ones = torch.ones(1, size, dtype=torch.long, device=self._ones.device)  # [1, size]

    def _run(self, tokens: torch.Tensor, logits: bool, positions: Optional[torch.Tensor] = None,
             mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        if self._share is not None:  # shared_exit.py: reuses what a sharing draft computed where it can
            return self._share.run(self, tokens, logits, positions, mask)
        return self.own_forward(tokens, logits, positions, mask)

    def _probe(self) -> int:
        """Runs 3 tokens, rolls back to 1 and runs 2 others; checks the result against an uncached forward.
        Returns the model's vocabulary size (its logits' last dimension)."""
        device = self.model.device
        a, b, c, d, e = (i % self._ids for i in (1, 2, 3, 4, 5))
        if self.encoder_decoder:
            self.encode(torch.tensor([a, b, c], device=device))
        try:
            self.reset(torch.tensor([], dtype=torch.long, device=device))
            first = self._run(torch.tensor([a, b, c], device=device), logits=True)  # [3, V]
            self.truncate(1)
            second = self._run(torch.tensor([d, e], device=device), logits=True)  # [2, V]
        except Exception as error:
            raise ValueError(f"model {self.name}: a cached call failed ({type(error).__name__}: {error}); "
                             f"speculant runs this model with {self.cache_kind}, and it does not support "
                             "that") from error
        if first.dim() != 2 or second.shape != (2, first.size(-1)):
            raise ValueError(f"model {self.name}: expected logits [k, V] from its forward, got "
                             f"{list(first.shape)} and {list(second.shape)}")
        if self._cache.get_seq_length() != 3:
            raise ValueError(f"model {self.name}: its cache holds {self._cache.get_seq_length()} positions after "
                             "a crop to 1 and 2 new tokens, not 3: it cannot be rolled back")
        reference = self.uncached_logits([a, d, e]).float()
        scale = max(1.0, reference.abs().max().item())
        error = (second[-1].float() - reference).abs().max().item() / scale
        tolerance = layer_masks.TOLERANCE.get(second.dtype, 1e-2)
        if not error <= tolerance:
            raise ValueError(f"model {self.name}: its cache does not roll back exactly: after a crop, logits "
                             f"differ from an uncached forward by {error:.3g} (relative; allowed {tolerance:g})")
        self.reset(torch.tensor([], dtype=torch.long, device=device))
        return first.size(-1)
