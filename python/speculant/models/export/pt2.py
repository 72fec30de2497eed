"""Exporting transformers LMs as AOTInductor packages (`.pt2`): no TorchScript, no Python at run time
(C++: torch::inductor::AOTIModelPackageLoader(path, model_name).run(inputs)).

    export_pt2(model, "out.pt2", max_length=None, max_source_length=None, metadata_json="{...}")

Decoder-only causal LMs: the package holds one model, "model", with a preallocated static KV cache of
`max_length` (M) slots in its own buffers, mutated in place and kept inside the loaded model across calls.
Models whose attention layers are of the types speculant.layer_masks builds masks for (full attention,
sliding windows, attention chunks) get tree calls (metadata "tree_calls" = "1"), as does T5 (below):

    "model": run([input_ids int64 [1, k], cache_position int64 [k], position_ids int64 [k], mask bool [k, M],
                  source int64 [n], dest int64 [n]]) -> [logits float32 [1, k, V]]

First every layer's cache slots source[i] are copied to dest[i] (n >= 1; all read before any is written: how
the engine moves a kept path of tree nodes into place; source = dest = [0] moves nothing). Then the k tokens'
keys and values are written at the slots cache_position = start, start + 1, ..., start + k - 1 (contiguous,
k >= 1, start + k <= M), token j at position position_ids[j] attending to exactly the slots s with mask[j, s].
A chain call has position_ids = cache_position and mask[j, s] = s <= start + j. A sliding window or chunks are
applied inside, on the positions the slots were written at (layer_masks.follows checks first that the model
applies its config's window or chunks as those masks do). Models with other layer types or attention of their
own, and exports asked for it (tree_calls=False), have the chain form, without tree calls:

    "model": run([input_ids int64 [1, k], cache_position int64 [k]]) -> [logits float32 [1, k, V]]

where query j attends to cached slots <= start + j only (and the model's own window). Either way slots past the
newest position are masked: prefill of T tokens is a call at start 0, appending is a call at start = cached
length, and a rollback is simply a later call with a smaller start. Row j of the logits is the next-token
distribution after token j (float32 whatever the model's dtype).

Encoder-decoder (T5ForConditionalGeneration): two models. "encoder" runs the source once and returns what
every decoder call needs; "model" is the decoder in the form above, with the encoder's outputs appended:

    "encoder": run([source int64 [1, S]]) -> [hidden [1, S, d], keys_0, values_0, ..., keys_{L-1}, values_{L-1}]
               (keys_i / values_i [1, H, S, D]: decoder layer i's cross-attention keys and values)
    "model":   run([decoder_ids int64 [1, k], cache_position int64 [k], position_ids int64 [k], mask bool [k, M],
                    source int64 [n], dest int64 [n], hidden, keys_0, ..., values_{L-1}])
               -> [logits float32 [1, k, V]]

(the tree form; the chain form, tree_calls=False, has neither position_ids, mask nor moves) with
1 <= S <= max_source_length; the encoder's outputs are in the model's dtype and are passed back as they are
(the caller keeps them for the generation). T5's relative position bias is computed inside from each attended
key's rank on its query's path, which is what a tree node's position is (transformers computes it from slots).

The package checks neither dtypes nor that the two inputs agree on k; on CPU, positions outside
[0, max_length) raise RuntimeError "index out of bounds" (inductor's indexing checks): the caller checks.

Feature drafts (EagleDraft, MedusaDraft): exported with features=True (the LM head's input) or features=(layers)
(decoder layers' outputs side by side, in layer order), a decoder-only package's model also keeps each slot's
features in its buffer "features" [M, F], written at cache_position and moved by source / dest with the keys and
values, and its metadata holds "features" (the layers, comma-separated; "" for the LM head's input),
"feature_width" (F) and "feature_weights" (the constants holding the input embedding and the LM head's weight,
comma-separated, each as its names joined by "|": a tied weight is one constant under one of its names). The C++ backend reads them from the package's constants.

Metadata of every model in the package (AOTIModelPackageLoader::get_metadata() or the static
load_metadata_from_package(path, model_name), a map<string, string>, filled from the inductor config
"aot_inductor.metadata"): "speculant.json" (the caller's JSON string), "vocab_size", "max_length",
"torch_version" (the release that compiled it, without its local suffix), "tree_calls" ("1" for the tree form
above, "0" otherwise) and, for encoder-decoder packages, "max_source_length" (decimal strings).

The package's library is compiled by speculant.export.compiler's wrapper of Inductor's C++ compiler (GCC on
Linux: -fno-gnu-unique, -Wl,-Bsymbolic), so that it runs its own copies of the inline code it compiles (why: that
module). This module imports only torch, transformers, the standard library, speculant.layer_masks,
speculant.relative_trees and speculant.export.compiler (not speculant's C++ extension).
"""
from __future__ import annotations

import json
import os
import traceback
from typing import Dict, Optional, Sequence, Union

import torch

from .. import layer_masks, relative_trees
from ..features import Tap, View
from . import compiler

METADATA_KEY = "speculant.json"

__all__ = ["METADATA_KEY", "export_pt2"]


class _StaticKV(torch.nn.Module):
    """A transformers Cache of StaticLayers whose tensors are buffers of this module: keys_i / values_i
    [1, H_kv, max_length, D] and length_i (int64 scalar, where layer i's next write starts)."""

    def __init__(self, cache, num_heads, head_dim, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.cache = cache
        cache.early_initialization(1, num_heads, head_dim, dtype, device)
        for i, layer in enumerate(cache.layers):
            self.register_buffer(f"keys_{i}", layer.keys, persistent=False)
            self.register_buffer(f"values_{i}", layer.values, persistent=False)
            self.register_buffer(f"length_{i}", layer.cumulative_length, persistent=False)

    def _at(self, cache_position: torch.Tensor):
        """The cache, set to write the next k tokens at cache_position [k] (contiguous)."""
        for i, layer in enumerate(self.cache.layers):
            # Non-strict torch.export traces the module's buffers, not other references to the same tensors:
            # point the cache at the buffers on every call so that its in-place writes land in them.
            layer.keys, layer.values = getattr(self, f"keys_{i}"), getattr(self, f"values_{i}")
            layer.cumulative_length = getattr(self, f"length_{i}")
            # StaticLayer.update writes at length + arange(k), and the masks' query offset is this length.
            layer.cumulative_length.copy_(cache_position[0])
        return self.cache

    def _move(self, source: torch.Tensor, dest: torch.Tensor) -> None:
        """Every layer's slots source[i] copied to dest[i], all read before any is written."""
        for i in range(len(self.cache.layers)):
            for kind in ("keys", "values"):
                slots = getattr(self, f"{kind}_{i}")  # [1, H, M, D]
                slots.index_copy_(2, dest, slots.index_select(2, source))


class _DecoderOnly(_StaticKV):
    """forward(input_ids [1, k], cache_position [k]) -> logits float32 [1, k, V]: the chain form."""

    def __init__(self, model, max_length: int):
        from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer
        try:
            from transformers.configuration_utils import get_head_shapes
        except ImportError:  # transformers <= 5.17 keeps it beside its executorch wrappers
            from transformers.integrations.executorch import get_head_shapes

        config = model.config.get_text_config(decoder=True)
        cache = StaticCache(max_cache_len=max_length, config=config)
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, StaticSlidingWindowLayer):
                # A rolling window cannot be rolled back; a full-length layer with the model's own
                # sliding-window mask gives the same attention (as transformers' executorch wrapper does).
                cache.layers[i] = StaticLayer(max_length)
            elif type(layer) is not StaticLayer:
                raise ValueError(f"{type(model).__name__}: cache layer {i} is a {type(layer).__name__}; the .pt2 "
                                 f"export supports attention layers with a static KV cache only")
        super().__init__(cache, *get_head_shapes(config), model.dtype, model.device)
        self.model = model
        self.max_length = max_length
        self.tap: Optional[Tap] = None

    def record(self, view: View) -> int:
        """Keeps `view`'s features (features.py: the LM head's input, or decoder layers side by side) per cache
        slot in the buffer `features` [M, F], written at each call's slots; returns F. Close the tap after
        exporting (its hooks are on the caller's model)."""
        self.tap = Tap(self.model, view)
        self.tap.armed = True
        config = self.model.config.get_text_config(decoder=True)
        width = config.hidden_size * (1 if view is None else len(view))
        self.register_buffer("features", torch.zeros(self.max_length, width, dtype=self.model.dtype,
                                                      device=self.model.device), persistent=False)
        return width

    def _recorded(self, cache_position: torch.Tensor) -> None:
        if self.tap is not None:
            self.features.index_copy_(0, cache_position, self.tap.take()[0].to(self.features.dtype))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, position_ids=cache_position.unsqueeze(0),  # [1, k]
                         past_key_values=self._at(cache_position), use_cache=True)
        self._recorded(cache_position)
        return out.logits.float()  # [1, k, V]


class _DecoderOnlyTree(_DecoderOnly):
    """forward(input_ids [1, k], cache_position [k], position_ids [k], mask [k, M], source [n], dest [n]) ->
    logits float32 [1, k, V]: the tree form (the module docstring). Where a layer type's pattern reads positions
    (a sliding window, attention chunks: layer_masks.py), the module keeps each slot's position in a buffer,
    moved with the slots, since a beam search's slots hold several beams' entries (slot s is not position s)."""

    def __init__(self, model, max_length: int):
        super().__init__(model, max_length)
        config = model.config.get_text_config(decoder=True)
        self.layers = layer_masks.attention_layers(config)
        self.attention = config._attn_implementation
        self.positional = layer_masks.positional(self.layers)
        if self.positional:
            self.register_buffer("slot_positions", torch.zeros(max_length, dtype=torch.long, device=model.device),
                                 persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor, source: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        self._move(source, dest)
        if self.tap is not None:
            self.features.index_copy_(0, dest, self.features.index_select(0, source))
        keys = None
        if self.positional:
            keys = self.slot_positions  # [M]
            keys.index_copy_(0, dest, keys.index_select(0, source))
            keys.index_copy_(0, cache_position, position_ids)
        attention_mask = layer_masks.attention_mask(mask, keys, position_ids, self.layers, self.attention,
                                                    self.model.dtype)
        out = self.model(input_ids=input_ids, position_ids=position_ids.unsqueeze(0),  # [1, k]
                         attention_mask=attention_mask, past_key_values=self._at(cache_position), use_cache=True)
        self._recorded(cache_position)
        return out.logits.float()  # [1, k, V]


class _T5Encoder(torch.nn.Module):
    """forward(source [1, S]) -> (hidden [1, S, d], keys_0, values_0, ...): decoder layer i's cross-attention
    keys and values [1, H, S, D], projected once per source instead of at every decoder call."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, source: torch.Tensor):
        hidden = self.model.encoder(input_ids=source).last_hidden_state  # [1, S, d]
        outputs = [hidden]
        for block in self.model.decoder.block:
            attention = block.layer[1].EncDecAttention
            for projection in (attention.k, attention.v):  # [1, S, H * D] -> [1, H, S, D]
                outputs.append(projection(hidden).view(1, -1, attention.n_heads, attention.key_value_proj_dim)
                               .transpose(1, 2))
        return tuple(outputs)


class _T5Decoder(_StaticKV):
    """forward(decoder_ids [1, k], cache_position [k], hidden [1, S, d], keys_0, values_0, ...) -> logits
    float32 [1, k, V]; the self-attention cache is static, the cross-attention keys and values are inputs."""

    def __init__(self, model, max_length: int):
        from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

        blocks = model.decoder.block
        attention = blocks[0].layer[0].SelfAttention
        # T5's decoder may have another depth than its encoder (num_decoder_layers): one layer per block
        super().__init__(Cache(layers=[StaticLayer(max_length) for _ in blocks]), attention.n_heads,
                         attention.key_value_proj_dim, model.dtype, model.device)
        self.model = model
        self.cross = Cache(layers=[DynamicLayer() for _ in blocks])

    def forward(self, decoder_ids: torch.Tensor, cache_position: torch.Tensor, hidden: torch.Tensor, *cross):
        out = self.model(encoder_outputs=(hidden,), decoder_input_ids=decoder_ids,
                         past_key_values=self._caches(cache_position, cross), use_cache=True)
        return out.logits.float()  # [1, k, V]

    def _caches(self, cache_position: torch.Tensor, cross: tuple):
        """The static self-attention cache set to write at cache_position, with the given cross-attention keys
        and values (keys_0, values_0, ...), which the decoder reads and never recomputes."""
        from transformers.cache_utils import EncoderDecoderCache

        for layer, keys, values in zip(self.cross.layers, cross[0::2], cross[1::2]):
            layer.keys, layer.values, layer.is_initialized = keys, values, True
        cache = EncoderDecoderCache(self._at(cache_position), self.cross)
        for i in range(len(self.cross.layers)):
            cache.is_updated[i] = True
        return cache


class _T5DecoderTree(_T5Decoder):
    """forward(decoder_ids [1, k], cache_position [k], position_ids [k], mask [k, M], source [n], dest [n],
    hidden, keys_0, values_0, ...) -> logits float32 [1, k, V]: the tree form of the T5 decoder. transformers
    computes T5's relative position bias from cache slots, which a tree's nodes do not follow, so the decoder's
    blocks run here with each attended key at its rank on its query's path (relative_trees.py, as live models'
    tree calls do)."""

    def forward(self, decoder_ids: torch.Tensor, cache_position: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor, source: torch.Tensor, dest: torch.Tensor, hidden: torch.Tensor, *cross):
        self._move(source, dest)
        cache = self._caches(cache_position, cross)
        return relative_trees.t5_tree_logits(self.model, decoder_ids, position_ids, mask, hidden, cache,
                                             cache_position).float()  # [1, k, V]


def _describe(error: BaseException) -> str:
    """The error's first line and the innermost frame outside torch that led to it (the failing operation)."""
    text = str(error).strip()
    described = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    torch_dir = os.path.dirname(torch.__file__)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)[1:]  # [0] is _export's own call
              if not frame.filename.startswith(torch_dir)]
    if frames:
        described += f" (at {frames[-1].filename}:{frames[-1].lineno}: {frames[-1].line})"
    return described


def _export(name: str, module: torch.nn.Module, inputs: tuple, dynamic_shapes) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as error:
        raise ValueError(f"torch.export cannot trace {name}: {_describe(error)}") from error


def _check_length(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")


def _tokens(name: str, max_length: int, example: int, device: torch.device):
    """Example (ids [1, k], positions [k]) and the dynamic dimension of k in [1, max_length]. The example has
    k >= 2: sizes 0 and 1 would be specialised (the range still includes k = 1)."""
    k = min(example, max_length)
    dim = torch.export.Dim(name, min=1, max=max_length) if max_length > 1 else torch.export.Dim.STATIC
    return torch.zeros(1, k, dtype=torch.long, device=device), torch.arange(k, device=device), dim


def _feature_view(features, text, encoder_decoder: bool):
    """export_pt2's `features` as a features.View (None: the LM head's input), or False for none (False, None)."""
    if features is False or features is None:
        return False
    if encoder_decoder:
        raise ValueError("features: feature drafts draft decoder-only models; an encoder-decoder package keeps none")
    if features is True:
        return None
    layers = text.num_hidden_layers
    try:
        view = tuple(sorted(features))
    except TypeError:
        view = ()
    if not view or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in view) or \
            len(set(view)) != len(view):
        raise ValueError(f"features must be False, True (the LM head's input) or distinct decoder layer indices "
                         f"in [0, {layers - 1}], got {features!r}")
    return view


def _feature_metadata(module: "_DecoderOnly", view: View) -> Dict[str, str]:
    """Records `view` in `module` and returns the package metadata that describes it: the layers (comma-separated;
    "": the LM head's input), the width, and the names of the constants holding the input embedding and the LM
    head's weight (comma-separated; each as its names joined by "|": the package keeps one of a tied weight's)."""
    model = module.model
    names: Dict[int, list] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):  # a tied weight has two names
        names.setdefault(id(parameter), []).append(name)
    weights = ["|".join(names.get(id(m.weight), [])) for m in (model.get_input_embeddings(),
                                                                model.get_output_embeddings())]
    if "" in weights or getattr(model.get_output_embeddings(), "bias", None) is not None:
        raise ValueError(f"features: {type(model).__name__}'s embedding or LM head is not a plain weight that "
                         "feature drafts can share")
    width = module.record(view)  # hooks on the caller's model from here: export_pt2 closes them
    return {"features": ",".join(str(i) for i in (view or ())), "feature_width": str(width),
            "feature_weights": ",".join(weights)}


def export_pt2(model, out_path: Union[str, os.PathLike], *, max_length: Optional[int] = None,
               max_source_length: Optional[int] = None, metadata_json: str, tree_calls: bool = True,
               features: Union[bool, Sequence[int]] = False) -> None:
    """Writes `model` (a transformers *ForCausalLM, or a T5ForConditionalGeneration, in eval mode) to out_path
    (ending in .pt2) as an AOTInductor package following the contract in this module's docstring.

    max_length: decoder positions the static KV cache holds (default min(config.max_position_embeddings,
    4096), T5: 512; at most n_positions for GPT-2, whose positions are learned). max_source_length: T5's
    longest source (default 512). metadata_json: a JSON string stored under "speculant.json". tree_calls=False
    exports a decoder-only model in the chain form (fewer inputs; no token trees, no beam search), which
    benchmarks/pt2_forms.py measures against the tree form. features: True (the LM head's input) or decoder
    layer indices (EAGLE-3's, side by side) makes a decoder-only package keep them per cache slot for feature
    drafts (the module docstring). Raises ValueError naming what is wrong (arguments, or the operation
    torch.export could not trace)."""
    import transformers
    from torch._inductor import aot_compile
    from torch._inductor.package import package_aoti

    name = type(model).__name__
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise ValueError(f"model must be a transformers model, got {name}")
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and not isinstance(model, transformers.T5ForConditionalGeneration):
        raise ValueError(f"{name} is an encoder-decoder model other than T5; export_pt2 exports decoder-only "
                         f"causal LMs and T5ForConditionalGeneration")
    if model.training:
        raise ValueError(f"{name} is in training mode (dropout would be traced): call model.eval() first")
    text = config.get_text_config(decoder=True)
    positions = getattr(text, "max_position_embeddings", None)
    if max_length is None:
        if encoder_decoder:
            max_length = 512
        elif positions is None:
            raise ValueError(f"{name}: config has no max_position_embeddings; pass max_length")
        else:
            max_length = min(positions, 4096)
    _check_length("max_length", max_length)
    if text.model_type == "gpt2" and max_length > positions:
        raise ValueError(f"max_length must be <= n_positions = {positions} for GPT-2 (learned positions), "
                         f"got {max_length}")
    if encoder_decoder:
        max_source_length = 512 if max_source_length is None else max_source_length
        _check_length("max_source_length", max_source_length)
    elif max_source_length is not None:
        raise ValueError("max_source_length is only for encoder-decoder models (T5)")
    if not isinstance(metadata_json, str):
        raise ValueError(f"metadata_json must be a JSON string, got {type(metadata_json).__name__}")
    try:
        json.loads(metadata_json)
    except json.JSONDecodeError as error:
        raise ValueError(f"metadata_json is not valid JSON: {error}") from None
    out_path = os.fspath(out_path)
    if not out_path.endswith(".pt2"):
        raise ValueError(f"out_path must end in .pt2 (AOTInductor's package suffix), got {out_path!r}")

    # torch_version: the package holds machine code for this torch; the C++ loader refuses another one
    metadata = {METADATA_KEY: metadata_json, "vocab_size": str(text.vocab_size), "max_length": str(max_length),
                "torch_version": torch.__version__.split("+")[0]}
    ids, positions_example, tokens = _tokens("tokens", max_length, 2, model.device)
    programs: Dict[str, torch.export.ExportedProgram] = {}
    layers = layer_masks.attention_layers(text)
    trees = tree_calls and max_length >= 2 and (encoder_decoder or not layer_masks.obstacle(layers))
    if trees and not encoder_decoder and layer_masks.positional(layers):  # a window the model does not apply:
        trees = not layer_masks.follows(model, layers)                     # its own masks, the chain form
    metadata["tree_calls"] = "1" if trees else "0"
    view = _feature_view(features, text, encoder_decoder)
    with torch.no_grad():
        tree_inputs, tree_shapes = (), ()
        if trees:
            k = ids.size(1)
            mask = torch.ones(k, max_length, dtype=torch.bool, device=model.device).tril()
            moves, move_dim = torch.tensor([0, 1], device=model.device), torch.export.Dim("moves", min=1,
                                                                                           max=max_length)
            # distinct example tensors: torch.export traces inputs given as one tensor as one input
            tree_inputs = (positions_example.clone(), mask, moves, moves.clone())
            tree_shapes = ({0: tokens}, {0: tokens}, {0: move_dim}, {0: move_dim})
        if not encoder_decoder:
            module = (_DecoderOnlyTree if trees else _DecoderOnly)(model, max_length)
            try:
                if view is not False:
                    metadata.update(_feature_metadata(module, view))
                programs["model"] = _export(name, module, (ids, positions_example, *tree_inputs),
                                            ({1: tokens}, {0: tokens}, *tree_shapes))
            finally:
                if module.tap is not None:
                    module.tap.close()  # its hooks are on the caller's model
        else:
            metadata["max_source_length"] = str(max_source_length)
            source, _, source_dim = _tokens("source", max_source_length, 3, model.device)
            encoder = _T5Encoder(model)
            programs["encoder"] = _export(name, encoder, (source,), ({1: source_dim},))
            encoded = encoder(source)  # (hidden [1, S, d], keys_0 [1, H, S, D], ...)
            module = (_T5DecoderTree if trees else _T5Decoder)(model, max_length)
            programs["model"] = _export(name, module, (ids, positions_example, *tree_inputs, *encoded),
                                        ({1: tokens}, {0: tokens}, *tree_shapes, {1: source_dim},  # *cross: a tuple
                                         tuple({2: source_dim} for _ in encoded[1:])))
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        files = {}
        for model_name, program in programs.items():
            args, kwargs = program.example_inputs
            files[model_name] = aot_compile(program.module(check_guards=False), args, kwargs, options={
                **compiler.inductor_options(), "aot_inductor.package": True, "aot_inductor.metadata": dict(metadata)})
        package_aoti(out_path, files)
