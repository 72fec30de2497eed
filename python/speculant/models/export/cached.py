"""What every exported decoder-only model shares: the cached contract around an architecture's `run`, the
activations transformers configs name, and the causal mask over cached positions.

An architecture module (gpt2.py, llama.py, tiny_gpt.py) provides
`run(input_ids[R, T], caches, step) -> logits[R, T, V]`, where `caches` is [] (stateless) or one view per layer
into the preallocated cache (keys and values together), and `step` (a Step) says where the tokens sit and what
they attend to; the attention hands its new keys and values to `cached_kv`. Batch 1 caches are [2, H_kv, M, D]
views written at slots [start, start + T); a batch's rows (cpp/models/rows.h) share [2, B, M + 1, H_kv, D] views, each
row written at its own slots, slot M being scratch for padding. For feature drafts (EAGLE, Medusa) it also
provides `states(input_ids, caches, step, taps) -> (h, features)` (the LM head's input, and `tapped`'s features),
`logits(h)` and `weights()` (its embedding and LM head); CachedDecoder keeps the features per slot on request
(record_features). Shapes: R = rows in the call, T = new tokens,
S = attended positions, H_kv = key/value heads, D = head_dim, L = layers, M = max_length, V = vocab.
"""
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# transformers' activation names -> the function each computes (transformers/activations.py). "gelu_new",
# "gelu_fast" and "gelu_pytorch_tanh" are all the tanh approximation of GELU.
ACTIVATIONS: Dict[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def activation_kind(name: str, field: str) -> str:
    """The scripted kind for transformers' activation `name` (config field `field`), or a ValueError."""
    if name not in ACTIVATIONS:
        raise ValueError(f"config.{field} = {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def activate(x: Tensor, kind: str) -> Tensor:
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    return F.silu(x)


def gated(gate: Tensor, up: Tensor, kind: str) -> Tensor:
    """A gated MLP's activate(gate) * up. SiLU as gate * sigmoid(gate): elementwise operations TorchScript's CUDA
    fuser joins into one kernel with the product (aten::silu it leaves alone: two kernels), rounding once."""
    if kind == "silu":
        return gate * torch.sigmoid(gate) * up
    return activate(gate, kind) * up


def add_linear(x: Tensor, y: Tensor, weight: Tensor, bias: Optional[Tensor], fused: bool,
               input: str = "none") -> Tensor:
    """x + F.linear(u, weight, bias) written into x [.., C] (the residual stream, a layer's own tensor), u being y,
    activate(y, input), or with input "gated_" + kind the gated product of y's halves [gate | up]: one matrix
    product that accumulates into its output (addmm_, cuBLAS's beta = 1) where an add would be a kernel of its
    own, rounding once. With `fused`, one torch.ops.speculant.add_linear_ (cpp/kernels/linear.cpp), the input's
    activation inside it on CUDA."""
    if fused:
        return torch.ops.speculant.add_linear_(x, y, weight, bias, input)
    if input.startswith("gated_"):
        half = y.size(-1) // 2
        y = gated(y[..., :half], y[..., half:], input[len("gated_"):])
    elif input != "none":
        y = activate(y, input)
    flat = x.view(-1, x.size(-1))
    flat.addmm_(y.reshape(-1, y.size(-1)), weight.t())
    if bias is not None:
        flat.add_(bias)
    return x


KERNELS = ("aten", "speculant")  # the exports' kernels: torch's own, or torch.ops.speculant.* (cpp/kernels)


def fused_kernels(kernels: str) -> bool:
    """Whether `kernels` (an export's argument) names the fused operations of cpp/kernels/ops.cpp."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    return kernels == "speculant"


def causal_mask(new: int, start: int, device: torch.device) -> Tensor:
    """[T, S] bool, S = start + T: query i sits at position start + i and sees keys 0 .. start + i."""
    return torch.ones(new, start + new, dtype=torch.bool, device=device).tril(start)


def additive(seen: Tensor, dtype: torch.dtype) -> Tensor:
    """The attention mask every layer adds to its scores: 0 where `seen` (bool) is true, -inf elsewhere, in the
    working dtype; what scaled_dot_product_attention makes of a bool mask itself, made once per call instead of
    once per layer (one operation in the default dtype, float32, two in another)."""
    mask = torch.where(seen, 0.0, float("-inf"))  # the default dtype
    return mask if mask.dtype == dtype else mask.to(dtype)


class Step(NamedTuple):
    """Where one call's tokens go. positions [R, T]: each token's position; mask [T, S] (batch 1) or
    [R, 1, T, S], additive in the working dtype (`additive`): the keys each query sees. Batch 1: the tokens
    fill cache slots [start, start + T) and rows, slots are None. A batch: row r's tokens go to cache row rows[r]
    at slots[r] and the call reads cache slots [0, keys)."""
    positions: Tensor
    mask: Tensor
    start: int
    rows: Optional[Tensor]
    slots: Optional[Tensor]
    keys: int


def single_step(new: int, start: int, device: torch.device, dtype: torch.dtype) -> Step:
    """Batch 1, tokens at positions [start, start + new); the mask in `dtype`."""
    positions = torch.arange(start, start + new, device=device).unsqueeze(0)  # [1, T]
    return Step(positions, additive(causal_mask(new, start, device), dtype), start, None, None, start + new)


def cached_kv(kv: Tensor, cache: Optional[Tensor], step: Step) -> Tuple[Tensor, Tensor]:
    """Stores a call's keys and values kv [2, R, H_kv, T, D] (keys, then values: where one projection makes both, a
    view of its output, so that one operation writes them) in a layer's cache and returns every key and value the
    call attends to, [R, H_kv, S, D] each (kv's own when stateless)."""
    if cache is None:
        return kv[0], kv[1]
    rows, slots = step.rows, step.slots
    if rows is None or slots is None:  # batch 1: the cache [2, H_kv, M, D], written at [start, start + T)
        cache[:, :, step.start:step.start + kv.size(3)] = kv[:, 0]
    else:  # a batch: the cache [2, B, M + 1, H_kv, D]; token (r, j)'s key and value at (rows[r], slots[r, j])
        index = torch.jit.annotate(List[Optional[Tensor]], [None, rows.unsqueeze(1).expand_as(slots), slots])
        cache.index_put_(index, kv.transpose(2, 3))  # [2, R, T, H_kv, D]
    return seen_kv(cache, step, kv.size(3))


def seen_kv(cache: Tensor, step: Step, new: int) -> Tuple[Tensor, Tensor]:
    """Every key and value a call of `new` tokens attends to, [R, H_kv, S, D] each, its own among them (views of a
    layer's cache, gathered for a batch's rows out of order)."""
    rows = step.rows
    if rows is None or step.slots is None:  # batch 1: slots [0, start + T)
        end = step.start + new
        return cache[0, :, :end].unsqueeze(0), cache[1, :, :end].unsqueeze(0)
    seen = cache[:, :, :step.keys]  # [2, B, S, H_kv, D]
    if rows.size(0) != cache.size(1):  # not every row in order: gathered
        seen = seen.index_select(1, rows)
    return seen[0].transpose(1, 2), seen[1].transpose(1, 2)  # [R, H_kv, S, D]


def tapped(h: Tensor, taken: List[Tensor]) -> Tensor:
    """An architecture's recorded features: the layers' outputs `taken` side by side (in layer order), or the LM
    head's input `h` when none was taken (what feature drafts read: models/features.py)."""
    return torch.cat(taken, -1) if len(taken) > 0 else h


CACHE_BUFFERS = ("cache", "row_cache", "feature_cache", "row_feature_cache")  # CachedDecoder's state, no weights


class CachedDecoder(nn.Module):
    """The engine's cached contract (cpp/models/model.h) around a decoder-only `core`, batch 1: a KV cache of
    `max_length` positions with prefill / extend / truncate / cache_length, and a stateless
    forward(input_ids[1, T]) -> logits[1, T, V] that leaves the cache alone.

    The cache is allocated at the first prefill, not here, so that saved files hold no cache zeros. Keys and
    values share one allocation: TorchScript may merge two identical `torch.zeros` calls into one tensor."""

    length: int
    cache_shape: List[int]
    row_cache_shape: List[int]
    feature_layers: Optional[List[int]]

    def __init__(self, core: nn.Module, *, vocab_size: int, max_length: int, layers: int, kv_heads: int,
                 head_dim: int, like: Tensor):
        super().__init__()
        self.core = core
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.hidden_size = like.size(1)
        self.length = 0  # cached positions; cache rows at or past it are stale
        self.feature_layers = None  # what record_features keeps per cache slot (None: nothing)
        self.cache_shape = [2, layers, kv_heads, max_length, head_dim]  # [keys | values, L, H_kv, M, D]
        # a batch's rows: [keys | values, L, B, M + 1, H_kv, D], B set by start_rows
        self.row_cache_shape = [2, layers, 0, max_length + 1, kv_heads, head_dim]
        # empty until the first prefill; its dtype and device are the model's (and follow .to / map_location)
        self.register_buffer("cache", torch.empty(0, dtype=like.dtype, device=like.device), persistent=False)
        self.register_buffer("row_cache", torch.empty(0, dtype=like.dtype, device=like.device), persistent=False)
        # the recorded features per slot: [M, F] beside `cache`, [B, M + 1, F] beside `row_cache`
        self.register_buffer("feature_cache", torch.empty(0, dtype=like.dtype, device=like.device),
                             persistent=False)
        self.register_buffer("row_feature_cache", torch.empty(0, dtype=like.dtype, device=like.device),
                             persistent=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        if input_ids.dim() != 2 or input_ids.size(1) < 1 or input_ids.size(1) > self.max_length:
            raise ValueError(f"forward: expected input_ids [B, T] with 1 <= T <= {self.max_length}, "
                             f"got {input_ids.shape}")
        return self.core.run(input_ids, torch.jit.annotate(List[Tensor], []),
                             single_step(input_ids.size(1), 0, input_ids.device, self.cache.dtype))

    def _run(self, input_ids: Tensor, caches: List[Tensor], step: Step) -> Tuple[Tensor, Optional[Tensor]]:
        """The core's logits, and its features while record_features keeps some (else None)."""
        layers = self.feature_layers
        if layers is None:
            return self.core.run(input_ids, caches, step), None
        h, features = self.core.states(input_ids, caches, step, layers)
        return self.core.logits(h), features

    def _feature_width(self) -> int:
        layers = self.feature_layers
        if layers is None:
            return 0
        return self.hidden_size * max(1, len(layers))

    def _allocate_features(self) -> None:
        """Feature caches beside the KV caches allocated so far (empty ones while nothing is recorded)."""
        width = self._feature_width()
        like = self.feature_cache
        if width == 0:
            self.feature_cache = torch.empty(0, dtype=like.dtype, device=like.device)
            self.row_feature_cache = torch.empty(0, dtype=like.dtype, device=like.device)
            return
        if self.cache.numel() > 0 and list(self.feature_cache.shape) != [self.max_length, width]:
            self.feature_cache = torch.zeros([self.max_length, width], dtype=like.dtype, device=like.device)
        if self.row_cache.numel() > 0:
            shape = [self.row_cache.size(2), self.max_length + 1, width]
            if list(self.row_feature_cache.shape) != shape:
                self.row_feature_cache = torch.zeros(shape, dtype=like.dtype, device=like.device)

    @torch.jit.export
    def record_features(self, layers: Optional[List[int]]) -> int:
        """From now on keeps each cache slot's features (model.h): the LM head's input (`layers` empty) or the
        outputs of decoder layers `layers` side by side, in layer order; None stops. Returns the width F (0)."""
        if layers is not None:
            count = self.cache_shape[1]
            for i in layers:
                if i < 0 or i >= count or layers.count(i) != 1:
                    raise ValueError(f"record_features: layers must be distinct indices in [0, {count - 1}], got "
                                     f"{layers}")
            layers = sorted(layers)
        self.feature_layers = layers
        self._allocate_features()
        return self._feature_width()

    @torch.jit.export
    def features(self, row: int, length: int) -> Tensor:
        """[length, F]: the recorded features of slots [0, length) of batch row `row` (-1: the batch-1 cache)."""
        cache = self.feature_cache if row < 0 else self.row_feature_cache
        if length == 0 and self.feature_layers is not None:  # nothing cached yet (maybe nothing allocated)
            return torch.zeros([0, self._feature_width()], dtype=cache.dtype, device=cache.device)
        if cache.numel() == 0:
            raise ValueError("features: call record_features first (and prefill or start_rows)")
        if row >= 0 and row >= cache.size(0):
            raise ValueError(f"features: row must be in [-1, {cache.size(0) - 1}], got {row}")
        if length < 0 or length > self.max_length:
            raise ValueError(f"features: length must be in [0, max_length={self.max_length}], got {length}")
        return cache[:length] if row < 0 else cache[row, :length]

    @torch.jit.export
    def feature_weights(self) -> Tuple[Tensor, Tensor]:
        """The input embedding and the LM head's weight, [V, C] each (what feature drafts share)."""
        return self.core.weights()

    @torch.jit.export
    def prefill(self, input_ids: Tensor) -> Tensor:
        # [1, T] -> [1, T, V]; clears the cache first
        if self.cache.numel() == 0:
            self.cache = torch.zeros(self.cache_shape, dtype=self.cache.dtype, device=self.cache.device)
            self._allocate_features()
        self.length = 0
        return self.extend(input_ids)

    @torch.jit.export
    def extend(self, input_ids: Tensor) -> Tensor:
        # [1, k] -> [1, k, V]: writes positions [length, length + k), attends causally to [0, length + k)
        if input_ids.dim() != 2 or input_ids.size(0) != 1 or input_ids.size(1) < 1:
            raise ValueError(f"extend/prefill: expected input_ids [1, k] with k >= 1, got {input_ids.shape}")
        if input_ids.dtype != torch.long:
            raise ValueError(f"extend/prefill: expected int64 input_ids, got {input_ids.dtype}")
        k = input_ids.size(1)
        if self.cache.numel() == 0:
            raise ValueError("extend: call prefill first (the cache is allocated there)")
        if self.length + k > self.max_length:
            raise ValueError(f"extend/prefill: {self.length} cached + {k} new positions exceed "
                             f"max_length={self.max_length}")
        caches = [self.cache[:, i] for i in range(self.cache.size(1))]  # [2, H_kv, M, D] each
        logits, features = self._run(input_ids, caches, single_step(k, self.length, input_ids.device,
                                                                    self.cache.dtype))
        if features is not None:
            self.feature_cache[self.length:self.length + k] = features[0]
        self.length += k
        return logits

    @torch.jit.export
    def start_rows(self, batch: int) -> None:
        """A batch of `batch` rows (cpp/models/script_model.cpp keeps each row's length); their old contents are stale."""
        if batch < 1:
            raise ValueError(f"start_rows: batch must be >= 1, got {batch}")
        shape = self.row_cache_shape[:2] + [batch] + self.row_cache_shape[3:]
        if list(self.row_cache.shape) != shape:
            self.row_cache = torch.zeros(shape, dtype=self.row_cache.dtype, device=self.row_cache.device)
        self._allocate_features()

    def _rows_run(self, input_ids: Tensor, caches: List[Tensor], step: Step) -> Tensor:
        """A batch call: the core's logits, its features written to each token's slot while recording."""
        logits, features = self._run(input_ids, caches, step)
        rows, slots = step.rows, step.slots
        if features is not None and rows is not None and slots is not None:
            index = torch.jit.annotate(List[Optional[Tensor]], [rows.unsqueeze(1).expand_as(slots), slots])
            self.row_feature_cache.index_put_(index, features)
        return logits

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        """input_ids [R, T] -> logits [R, T, V] for rows `rows` [R] (ascending) of the batch. positions [R, T]:
        each token's position (< max_length); slots [R, T]: the cache slot it is written to (its position, or
        max_length for padding); every query sees the keys at positions up to its own among [0, keys)."""
        if self.row_cache.numel() == 0:
            raise ValueError("extend_rows: call start_rows first (the batch's cache is allocated there)")
        if input_ids.dim() != 2 or positions.shape != input_ids.shape or slots.shape != input_ids.shape or \
                rows.dim() != 1 or rows.size(0) != input_ids.size(0):
            raise ValueError(f"extend_rows: expected input_ids, positions, slots [R, T] and rows [R], got "
                             f"{input_ids.shape}, {positions.shape}, {slots.shape}, {rows.shape}")
        if keys < 1 or keys > self.max_length:
            raise ValueError(f"extend_rows: keys must be in [1, max_length={self.max_length}], got {keys}")
        seen = torch.arange(keys, device=input_ids.device) <= positions.unsqueeze(2)  # [R, T, S]
        caches = [self.row_cache[:, i] for i in range(self.row_cache.size(1))]  # [2, B, M + 1, H_kv, D] each
        step = Step(positions, additive(seen.unsqueeze(1), self.row_cache.dtype), -1, rows, slots, keys)
        return self._rows_run(input_ids, caches, step)  # [R, T, V]

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        """extend_rows with an explicit mask [R, T, S] bool (token trees, cpp/models/model.h): query (r, j) attends to
        exactly the slots s < S of row rows[r] where mask[r, j, s]; its own slot must be among them."""
        if self.row_cache.numel() == 0:
            raise ValueError("extend_rows_masked: call start_rows first (the batch's cache is allocated there)")
        check_masked_call(input_ids, rows, positions, slots, mask, self.max_length)
        caches = [self.row_cache[:, i] for i in range(self.row_cache.size(1))]  # [2, B, M + 1, H_kv, D] each
        step = Step(positions, additive(mask.unsqueeze(1), self.row_cache.dtype), -1, rows, slots, mask.size(2))
        return self._rows_run(input_ids, caches, step)  # [R, T, V]

    @torch.jit.export
    def copy_slots(self, rows: Tensor, sources: Tensor, targets: Tensor) -> None:
        """Copies row rows[r]'s keys and values at slot sources[r, m] to slot targets[r, m], in place, every read
        before any write (token trees: the accepted path moves into consecutive slots)."""
        if self.row_cache.numel() == 0:
            raise ValueError("copy_slots: call start_rows first (the batch's cache is allocated there)")
        copy_row_slots(self.row_cache, rows, sources, targets)
        if self.row_feature_cache.numel() > 0:  # [B, M + 1, F]: the features move with their slots
            index = rows.unsqueeze(1).expand_as(sources)
            self.row_feature_cache[index, targets] = self.row_feature_cache[index, sources]

    @torch.jit.export
    def truncate(self, length: int) -> None:
        if length < 0 or length > self.length:
            raise ValueError(f"truncate: length must be in [0, cache_length()={self.length}], got {length}")
        self.length = length

    @torch.jit.export
    def cache_length(self) -> int:
        return self.length


def check_masked_call(input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, mask: Tensor,
                      max_length: int) -> None:
    """ValueError unless extend_rows_masked's arguments have their shapes: input_ids, positions, slots [R, T],
    rows [R] and mask [R, T, S] bool with 1 <= S <= max_length."""
    if input_ids.dim() != 2 or positions.shape != input_ids.shape or slots.shape != input_ids.shape or \
            rows.dim() != 1 or rows.size(0) != input_ids.size(0) or mask.dim() != 3 or \
            mask.shape[:2] != input_ids.shape:
        raise ValueError(f"extend_rows_masked: expected input_ids, positions, slots [R, T], rows [R] and mask "
                         f"[R, T, S], got {input_ids.shape}, {positions.shape}, {slots.shape}, {rows.shape}, "
                         f"{mask.shape}")
    if mask.dtype != torch.bool or mask.size(2) < 1 or mask.size(2) > max_length:
        raise ValueError(f"extend_rows_masked: mask must be bool with 1 <= S <= max_length={max_length}, "
                         f"got {mask.dtype} with S = {mask.size(2)}")


def copy_row_slots(row_cache: Tensor, rows: Tensor, sources: Tensor, targets: Tensor) -> None:
    """copy_slots on a rows cache [2, L, B, M + 1, H_kv, D]: row rows[r]'s slot sources[r, m] to targets[r, m]."""
    if rows.dim() != 1 or sources.dim() != 2 or targets.shape != sources.shape or sources.size(0) != rows.size(0):
        raise ValueError(f"copy_slots: expected rows [R] and sources, targets [R, M], got {rows.shape}, "
                         f"{sources.shape}, {targets.shape}")
    index = rows.unsqueeze(1).expand_as(sources)  # [R, M]
    moved = row_cache[:, :, index, sources]  # [2, L, R, M, H_kv, D], a copy
    row_cache[:, :, index, targets] = moved


def is_tied(model) -> bool:
    """Whether a transformers model's LM head is its input embedding (the same storage)."""
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def copy_weights(module: nn.Module, weights: Dict[str, Tensor]) -> None:
    """Copies `weights` (name -> tensor) into `module`'s parameters, requiring an exact one-to-one match of
    names and shapes so that nothing is silently left at its initial value. A Parameter shared under two
    names (a tied LM head) is listed, and copied, under both."""
    own = dict(module.named_parameters(remove_duplicate=False))
    missing = sorted(set(own) - set(weights))
    extra = sorted(set(weights) - set(own))
    if missing or extra:
        raise ValueError(f"export: weight mapping mismatch (missing {missing}, unexpected {extra})")
    with torch.no_grad():
        for name, param in own.items():
            source = weights[name]
            if source.shape != param.shape:
                raise ValueError(f"export: weight {name} has shape {list(source.shape)}, expected "
                                 f"{list(param.shape)}")
            param.copy_(source)
    module.requires_grad_(False)
