"""Hugging Face T5 (`T5ForConditionalGeneration`) as a TorchScript encoder-decoder with its own caches.

Why our own module: transformers 5 dropped its `torchscript` flag and keeps its caches in Python objects, and
tracing its generate-time code freezes every shape it sees. `script(model, ...)` instead scripts the module
below (torch.jit.script), which holds the HF model's weights and redoes T5's arithmetic, so nothing
shape-dependent is frozen. The math follows the T5 paper (Raffel et al., JMLR 2020, §2.1) and HF's
modeling_t5.py, operation for operation where rounding could matter (the relative position buckets):

- RMS LayerNorm without mean or bias, accumulated in float32; pre-norm residual blocks.
- Attention without the 1/sqrt(D) scale; a learned relative position bias [buckets, H] owned by the first
  block of each stack and shared by all its blocks (bidirectional buckets in the encoder, unidirectional
  in the decoder); cross-attention has neither bias nor mask (batch 1, no padding).
- Feed-forward `relu` (original T5) or gated (`gated-gelu`, v1.1: act(x W0) * (x W1)).
- The LM head reads the decoder output, scaled by d_model**-0.5 first when `scale_decoder_outputs`
  (original T5 with its tied embeddings; transformers 4 called it `tie_word_embeddings`).
- float16: activations are clamped to the finite range after every residual add, like HF does.

Encoder-decoder cached contract of the scripted module (batch 1):

    vocab_size, max_length, max_source_length, decoder_start_token_id: int attributes
    encode(input_ids[1, S]) -> None        runs the encoder once, stores every decoder layer's cross-attention
                                           keys and values, clears the decoder cache
    prefill(input_ids[1, T]) -> [1, T, V]  clears the decoder cache (keeps the encoding), runs T tokens
    extend(input_ids[1, k]) -> [1, k, V]   appends k decoder tokens after the cached ones
    truncate(length) -> None, cache_length() -> int
    forward(input_ids[1, S], decoder_input_ids[1, T]) -> [1, T, V]   stateless, leaves the caches alone

and the tree calls of one row over the encoded source (cpp/models/model.h; beam search holds every beam in them):
start_rows(1), extend_rows, extend_rows_masked and copy_slots as decoder-only exports have them
(export/cached.py), the row's cache [2, L, 1, M + 1, H, D] apart from the batch-1 cache. A tree node's relative
position bias needs each attended key's position, which a slot does not tell (tree nodes sit after the row's
length in the order they came): it is the number of keys the query sees before it, as every query sees exactly
its own path.

Row j of the logits is the next-token distribution after decoder token j; generation starts the decoder
with `decoder_start_token_id`.

Shapes: S = source positions, T = decoder tokens in this call, K = attended key positions, H = heads,
D = d_kv, C = d_model, V = vocab, L = decoder layers, M = max_length, NB = relative attention buckets.
"""
import math
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cached import ACTIVATIONS, Step, activate, cached_kv, check_masked_call, copy_row_slots, gated

__all__ = ["check_config", "script", "T5Cached", "relative_position_bucket"]

def _clamp_half(x: Tensor) -> Tensor:
    # float16 only: clamp to the finite range (1000 below it once an inf appeared), as HF's T5Block does
    if x.dtype != torch.float16:
        return x
    fp16_max = 65504.0  # torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), fp16_max - 1000.0, fp16_max)
    return torch.clamp(x, min=-limit, max=limit)


def relative_position_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Tensor:
    """T5's bucket of each key - query distance (int64 tensor of any shape -> same shape, in [0, NB)).

    Half of a direction's buckets are exact distances 0 .. e-1 (e = its buckets // 2), the other half are
    log-spaced up to max_distance, beyond which distances share the last bucket. Bidirectional (encoder):
    half the buckets for keys after the query. Unidirectional (decoder): keys after the query count as 0.
    The float steps (divide, log, divide, multiply, truncate) are the ones HF and Mesh TensorFlow use, in
    the same order, so boundary distances land in the same bucket.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets = num_buckets // 2
        buckets = buckets + (relative_position > 0).to(torch.long) * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).to(torch.long)  # garbage at distance 0, not selected
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


def _weight(t: Tensor) -> nn.Parameter:
    # shares the HF tensor's storage (no copy), read-only
    return nn.Parameter(t.detach(), requires_grad=False)


class RMSNorm(nn.Module):
    """T5LayerNorm: x / sqrt(mean(x^2) + eps) * weight, no mean subtraction, no bias; float32 accumulation."""

    def __init__(self, hf_norm: nn.Module):
        super().__init__()
        self.weight = _weight(hf_norm.weight)  # [C]
        self.eps = float(hf_norm.variance_epsilon)

    def forward(self, x: Tensor) -> Tensor:
        # [B, T, C] -> [B, T, C]
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)  # [B, T, 1]
        x = x * torch.rsqrt(variance + self.eps)  # float32 from here on for half inputs
        if self.weight.dtype == torch.float16 or self.weight.dtype == torch.bfloat16:
            x = x.to(self.weight.dtype)
        return self.weight * x


class Attention(nn.Module):
    """Multi-head attention without the 1/sqrt(D) scale (T5 folds it into the initialization)."""

    def __init__(self, hf_attention: nn.Module):
        super().__init__()
        self.n_heads = int(hf_attention.n_heads)
        self.d_kv = int(hf_attention.key_value_proj_dim)
        self.q = _weight(hf_attention.q.weight)  # [H*D, C]
        self.k = _weight(hf_attention.k.weight)  # [H*D, C]
        self.v = _weight(hf_attention.v.weight)  # [H*D, C]
        self.o = _weight(hf_attention.o.weight)  # [C, H*D]

    def keys_values(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        # x [B, K, C] -> keys, values [B, H, K, D]
        B, K = x.size(0), x.size(1)
        k = F.linear(x, self.k).view(B, K, self.n_heads, self.d_kv).transpose(1, 2)
        v = F.linear(x, self.v).view(B, K, self.n_heads, self.d_kv).transpose(1, 2)
        return k, v

    def forward(self, x: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> Tensor:
        # x [B, T, C] queries; k, v [B, H, K, D]; bias [1, H, T, K] additive (-inf = masked) or None
        B, T = x.size(0), x.size(1)
        q = F.linear(x, self.q).view(B, T, self.n_heads, self.d_kv).transpose(1, 2)  # [B, H, T, D]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # [B, H, T, D]
        return F.linear(y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_kv), self.o)  # [B, T, C]


class DenseActDense(nn.Module):
    """Original T5 feed-forward: act(x Wi) Wo."""

    def __init__(self, hf_dense: nn.Module, act: str):
        super().__init__()
        self.act = act
        self.wi = _weight(hf_dense.wi.weight)  # [F, C]
        self.wo = _weight(hf_dense.wo.weight)  # [C, F]; HF may keep it in float32 in a half model

    def forward(self, x: Tensor) -> Tensor:
        h = activate(F.linear(x, self.wi), self.act)  # [B, T, F]
        return F.linear(h.to(self.wo.dtype), self.wo)  # [B, T, C]


class GatedDense(nn.Module):
    """T5 v1.1 feed-forward: (act(x W0) * x W1) Wo."""

    def __init__(self, hf_dense: nn.Module, act: str):
        super().__init__()
        self.act = act
        self.wi_0 = _weight(hf_dense.wi_0.weight)  # [F, C]
        self.wi_1 = _weight(hf_dense.wi_1.weight)  # [F, C]
        self.wo = _weight(hf_dense.wo.weight)  # [C, F]

    def forward(self, x: Tensor) -> Tensor:
        h = gated(F.linear(x, self.wi_0), F.linear(x, self.wi_1), self.act)  # [B, T, F]
        return F.linear(h.to(self.wo.dtype), self.wo)  # [B, T, C]


def _feed_forward(hf_ff: nn.Module, act: str, gated: bool) -> nn.Module:
    # act: transformers' activation name (config.dense_act_fn), checked by check_config
    kind = ACTIVATIONS[act]
    return GatedDense(hf_ff.DenseReluDense, kind) if gated else DenseActDense(hf_ff.DenseReluDense, kind)


class EncoderBlock(nn.Module):
    def __init__(self, hf_block: nn.Module, act: str, gated: bool):
        super().__init__()
        self.attn_norm = RMSNorm(hf_block.layer[0].layer_norm)
        self.attn = Attention(hf_block.layer[0].SelfAttention)
        self.ff_norm = RMSNorm(hf_block.layer[-1].layer_norm)
        self.ff = _feed_forward(hf_block.layer[-1], act, gated)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        # x [1, S, C]; bias [1, H, S, S]
        h = self.attn_norm(x)
        k, v = self.attn.keys_values(h)  # [1, H, S, D]
        x = _clamp_half(x + self.attn(h, k, v, bias))
        return _clamp_half(x + self.ff(self.ff_norm(x)))  # [1, S, C]


class DecoderBlock(nn.Module):
    def __init__(self, hf_block: nn.Module, act: str, gated: bool):
        super().__init__()
        self.self_norm = RMSNorm(hf_block.layer[0].layer_norm)
        self.self_attn = Attention(hf_block.layer[0].SelfAttention)
        self.cross_norm = RMSNorm(hf_block.layer[1].layer_norm)
        self.cross_attn = Attention(hf_block.layer[1].EncDecAttention)
        self.ff_norm = RMSNorm(hf_block.layer[2].layer_norm)
        self.ff = _feed_forward(hf_block.layer[2], act, gated)

    def forward(self, x: Tensor, bias: Tensor, cache: Optional[Tensor], step: Step,
                cross_k: Tensor, cross_v: Tensor) -> Tensor:
        # x [R, T, C] where `step` puts it; bias [R or 1, H, T, K] (-inf = masked); cache: this layer's keys and
        # values, [2, H, M, D] (batch 1) or [2, 1, M + 1, H, D] (the row), or None (stateless); cross_k, cross_v
        # [1, H, S, D]
        h = self.self_norm(x)
        k, v = self.self_attn.keys_values(h)  # [R, H, T, D]
        k, v = cached_kv(torch.stack((k, v)), cache, step)  # the new positions written, all attended: [R, H, K, D]
        x = _clamp_half(x + self.self_attn(h, k, v, bias))
        x = _clamp_half(x + self.cross_attn(self.cross_norm(x), cross_k, cross_v, None))
        return _clamp_half(x + self.ff(self.ff_norm(x)))  # [1, T, C]


class T5Cached(nn.Module):
    """T5ForConditionalGeneration's inference math with a decoder KV cache and stored cross K/V, batch 1."""

    length: int  # cached decoder positions; cache rows at or past it are stale
    source_length: int  # encoded source positions, 0 = nothing encoded yet

    def __init__(self, model: nn.Module, max_length: int, max_source_length: int, decoder_start_token_id: int):
        super().__init__()
        config = model.config
        act, gated = str(config.dense_act_fn), bool(config.is_gated_act)
        self.vocab_size = int(config.vocab_size)
        self.max_length = max_length
        self.max_source_length = max_source_length
        self.decoder_start_token_id = decoder_start_token_id
        self.num_buckets = int(config.relative_attention_num_buckets)
        self.max_distance = int(config.relative_attention_max_distance)
        self.n_heads = int(config.num_heads)
        self.d_kv = int(config.d_kv)
        self.n_decoder_layers = int(config.num_decoder_layers)
        self.scale_output = _scales_decoder_output(config)
        self.output_scale = float(config.d_model) ** -0.5
        self.length = 0
        self.source_length = 0

        encoder, decoder = model.encoder, model.decoder
        self.encoder_embed = _weight(encoder.embed_tokens.weight)  # [V, C], usually the same tensor as
        self.decoder_embed = _weight(decoder.embed_tokens.weight)  # [V, C]  model.shared (stored once)
        self.encoder_bias = _weight(encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight)
        self.decoder_bias = _weight(decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight)
        self.encoder_blocks = nn.ModuleList([EncoderBlock(b, act, gated) for b in encoder.block])
        self.decoder_blocks = nn.ModuleList([DecoderBlock(b, act, gated) for b in decoder.block])
        self.encoder_norm = RMSNorm(encoder.final_layer_norm)
        self.decoder_norm = RMSNorm(decoder.final_layer_norm)
        self.lm_head = _weight(model.lm_head.weight)  # [V, C], model.shared when tied
        # Caches start empty: encode() allocates them on the weights' device, so a saved file carries no
        # zeros and a module moved with .to() allocates where it now lives.
        like = self.decoder_embed
        self.register_buffer("self_kv", like.new_zeros(0), persistent=False)  # [2, L, H, M, D] keys, values
        self.register_buffer("cross_k", like.new_zeros(0), persistent=False)  # [L, H, S, D] of the source
        self.register_buffer("cross_v", like.new_zeros(0), persistent=False)  # [L, H, S, D]
        self.register_buffer("row_kv", like.new_zeros(0), persistent=False)  # [2, L, 1, M + 1, H, D], start_rows

    # -- building blocks --------------------------------------------------------------------------------
    def _position_bias(self, table: Tensor, start: int, T: int, K: int, decoder: bool) -> Tensor:
        # queries at positions [start, start + T), keys at [0, K): -> [1, H, T, K] from table [NB, H]
        device = table.device
        query = torch.arange(start, start + T, dtype=torch.long, device=device)[:, None]  # [T, 1]
        key = torch.arange(0, K, dtype=torch.long, device=device)[None, :]  # [1, K]
        relative = key - query  # [T, K]
        buckets = relative_position_bucket(relative, not decoder, self.num_buckets, self.max_distance)
        bias = F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)  # [1, H, T, K]
        if decoder:  # causal: a query never sees later positions
            bias = bias.masked_fill(relative > 0, float("-inf"))
        return bias.contiguous()  # fused SDPA kernels want a unit-stride last dim in the mask

    def _encode(self, input_ids: Tensor) -> Tuple[Tensor, Tensor]:
        # [1, S] -> every decoder layer's cross-attention keys and values, [L, H, S, D] each
        S = input_ids.size(1)
        x = F.embedding(input_ids, self.encoder_embed)  # [1, S, C]
        bias = self._position_bias(self.encoder_bias, 0, S, S, False)  # [1, H, S, S]
        for block in self.encoder_blocks:
            x = block(x, bias)
        x = self.encoder_norm(x)  # [1, S, C], the encoder output
        keys: List[Tensor] = []
        values: List[Tensor] = []
        for block in self.decoder_blocks:
            k, v = block.cross_attn.keys_values(x)  # [1, H, S, D]
            keys.append(k[0])
            values.append(v[0])
        return torch.stack(keys), torch.stack(values)

    def _decode(self, input_ids: Tensor, start: int, cross_k: Tensor, cross_v: Tensor,
                use_cache: bool) -> Tensor:
        # input_ids [1, T] at decoder positions [start, start + T); cross_k, cross_v [L, H, S, D] -> [1, T, V]
        T = input_ids.size(1)
        x = F.embedding(input_ids, self.decoder_embed)  # [1, T, C]
        bias = self._position_bias(self.decoder_bias, start, T, start + T, True)  # [1, H, T, start + T]
        positions = torch.arange(start, start + T, device=input_ids.device).unsqueeze(0)  # [1, T]
        step = Step(positions, bias, start, None, None, start + T)  # the mask: the additive bias the blocks add
        for i, block in enumerate(self.decoder_blocks):
            cache = self.self_kv[:, i] if use_cache else None  # [2, H, M, D], a view
            x = block(x, bias, cache, step, cross_k[i].unsqueeze(0), cross_v[i].unsqueeze(0))
        return self._head(x)

    def _head(self, x: Tensor) -> Tensor:
        # the decoder's output [R, T, C] -> logits [R, T, V]
        x = self.decoder_norm(x)
        if self.scale_output:
            x = x * self.output_scale
        return F.linear(x, self.lm_head)

    def _check_ids(self, input_ids: Tensor, what: str) -> None:
        if input_ids.dim() != 2 or input_ids.size(0) != 1 or input_ids.size(1) < 1:
            raise ValueError(f"{what}: expected input_ids [1, n] with n >= 1, got {input_ids.shape}")
        if input_ids.dtype != torch.long:
            raise ValueError(f"{what}: expected int64 input_ids, got {input_ids.dtype}")

    # -- the contract -----------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor) -> Tensor:
        # stateless full run, leaves the caches alone: [1, S], [1, T] -> [1, T, V]
        self._check_ids(input_ids, "forward (input_ids)")
        self._check_ids(decoder_input_ids, "forward (decoder_input_ids)")
        cross_k, cross_v = self._encode(input_ids)
        return self._decode(decoder_input_ids, 0, cross_k, cross_v, False)

    @torch.jit.export
    def encode(self, input_ids: Tensor) -> None:
        # [1, S]: runs the encoder, stores the cross-attention K/V, clears the decoder cache
        self._check_ids(input_ids, "encode")
        S = input_ids.size(1)
        if S > self.max_source_length:
            raise ValueError(f"encode: {S} source positions exceed max_source_length={self.max_source_length}")
        cross_k, cross_v = self._encode(input_ids)  # [L, H, S, D]
        self.cross_k = cross_k
        self.cross_v = cross_v
        if self.self_kv.dim() != 5:  # first encode: allocate the decoder cache next to the weights
            # One allocation for keys and values: two identical torch.zeros calls here get merged into one
            # tensor by TorchScript's optimizer (seen in torch 2.11), and keys and values would alias.
            like = self.decoder_embed
            shape = [2, self.n_decoder_layers, self.n_heads, self.max_length, self.d_kv]  # [2, L, H, M, D]
            self.self_kv = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.source_length = S
        self.length = 0

    @torch.jit.export
    def prefill(self, input_ids: Tensor) -> Tensor:
        # [1, T] -> [1, T, V]; clears the decoder cache first, keeps the encoding
        self._check_step(input_ids, 0)
        self.length = 0
        return self._step(input_ids)

    @torch.jit.export
    def extend(self, input_ids: Tensor) -> Tensor:
        # [1, k] -> [1, k, V]: writes decoder positions [length, length + k), attends causally to
        # [0, length + k) and to the whole encoded source
        self._check_step(input_ids, self.length)
        return self._step(input_ids)

    def _check_step(self, input_ids: Tensor, start: int) -> None:
        # before anything changes: a refused call leaves the caches as they were
        if self.source_length == 0:
            raise ValueError("extend/prefill: no source encoded yet, call encode(input_ids) first")
        self._check_ids(input_ids, "extend/prefill")
        k = input_ids.size(1)
        if start + k > self.max_length:
            raise ValueError(
                f"extend/prefill: {start} cached + {k} new positions exceed max_length={self.max_length}"
            )

    def _step(self, input_ids: Tensor) -> Tensor:
        logits = self._decode(input_ids, self.length, self.cross_k, self.cross_v, True)  # [1, k, V]
        self.length += input_ids.size(1)
        return logits

    @torch.jit.export
    def truncate(self, length: int) -> None:
        if length < 0 or length > self.length:
            raise ValueError(f"truncate: length must be in [0, cache_length()={self.length}], got {length}")
        self.length = length

    @torch.jit.export
    def cache_length(self) -> int:
        return self.length

    # -- tree calls of one row over the encoded source ------------------------------------------------------
    @torch.jit.export
    def start_rows(self, batch: int) -> None:
        """One row (its old contents stale): every row would attend to the one source encode() stored."""
        if batch != 1:
            raise ValueError(f"start_rows: a T5 module's rows share the one encoded source, so batch must be 1, "
                             f"got {batch}")
        like = self.decoder_embed
        shape = [2, self.n_decoder_layers, 1, self.max_length + 1, self.n_heads, self.d_kv]
        if list(self.row_kv.shape) != shape:
            self.row_kv = torch.zeros(shape, dtype=like.dtype, device=like.device)

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        """input_ids [1, T] -> logits [1, T, V] as in export/cached.py: each query sees the slots up to its
        position among [0, keys)."""
        if keys < 1 or keys > self.max_length:
            raise ValueError(f"extend_rows: keys must be in [1, max_length={self.max_length}], got {keys}")
        mask = torch.arange(keys, device=input_ids.device) <= positions.unsqueeze(2)  # [1, T, K]
        return self.extend_rows_masked(input_ids, rows, positions, slots, mask)

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        """input_ids [1, T] -> logits [1, T, V]: token j sits at positions[0, j], is written to slot slots[0, j]
        and sees exactly the slots s where mask[0, j, s] (its own path), and the whole encoded source."""
        if self.source_length == 0 or self.row_kv.numel() == 0:
            raise ValueError("extend_rows_masked: call encode and start_rows first")
        check_masked_call(input_ids, rows, positions, slots, mask, self.max_length)
        if input_ids.size(0) != 1:
            raise ValueError(f"extend_rows_masked: a T5 module has one row, got input_ids {input_ids.shape}")
        relative = mask.long().cumsum(2) - 1 - positions.unsqueeze(2)  # [1, T, K]: key position - query's
        buckets = relative_position_bucket(relative, False, self.num_buckets, self.max_distance)
        bias = F.embedding(buckets, self.decoder_bias).permute(0, 3, 1, 2)  # [1, H, T, K]
        bias = bias.masked_fill(~mask.unsqueeze(1), float("-inf")).contiguous()
        step = Step(positions, bias, -1, rows, slots, mask.size(2))  # the mask: the additive bias the blocks add
        x = F.embedding(input_ids, self.decoder_embed)  # [1, T, C]
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, bias, self.row_kv[:, i], step, self.cross_k[i].unsqueeze(0),
                      self.cross_v[i].unsqueeze(0))
        return self._head(x)  # [1, T, V]

    @torch.jit.export
    def copy_slots(self, rows: Tensor, sources: Tensor, targets: Tensor) -> None:
        """As export/cached.py's: the row's slots sources[0, m] copied to targets[0, m], every read first."""
        if self.row_kv.numel() == 0:
            raise ValueError("copy_slots: call start_rows first (the row's cache is allocated there)")
        copy_row_slots(self.row_kv, rows, sources, targets)


def _scales_decoder_output(config: Any) -> bool:
    # transformers 5: `scale_decoder_outputs` (tie_word_embeddings is forced True there); transformers 4:
    # original T5 (tied) scales, v1.1 (tie_word_embeddings=False) does not.
    if hasattr(config, "scale_decoder_outputs"):
        return bool(config.scale_decoder_outputs)
    return bool(getattr(config, "tie_word_embeddings", True))


def _positive_int(config: Any, field: str) -> int:
    value = getattr(config, field, None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"T5 export: config.{field} must be an int >= 1, got {value!r}")
    return value


def check_config(config: Any) -> None:
    """Raises ValueError naming the first field of a T5Config whose value this module does not implement."""
    if getattr(config, "model_type", None) != "t5":
        raise ValueError(f"T5 export: config.model_type must be 't5', got {getattr(config, 'model_type', None)!r}")
    if getattr(config, "is_encoder_decoder", True) is not True:
        raise ValueError("T5 export: config.is_encoder_decoder must be True (an encoder and a decoder)")
    for field in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers", "num_decoder_layers"):
        _positive_int(config, field)
    act = getattr(config, "dense_act_fn", None)
    if act not in ACTIVATIONS:
        raise ValueError(
            f"T5 export: config.feed_forward_proj={getattr(config, 'feed_forward_proj', None)!r} "
            f"(dense_act_fn={act!r}) is not implemented; supported activations: {', '.join(sorted(ACTIVATIONS))}, "
            "optionally 'gated-'"
        )
    if not isinstance(getattr(config, "is_gated_act", None), bool):
        raise ValueError(f"T5 export: config.is_gated_act must be a bool, got {config.is_gated_act!r}")
    # The encoder's buckets per direction are num_buckets // 2, half of them exact: it needs >= 1 exact one.
    buckets = _positive_int(config, "relative_attention_num_buckets")
    if buckets < 4:
        raise ValueError(
            f"T5 export: config.relative_attention_num_buckets must be >= 4 (1 exact bucket per direction in "
            f"the encoder), got {buckets}"
        )
    # The log-spaced buckets divide by log(max_distance / exact), exact = num_buckets // 2 in the decoder:
    # 0 there (or a negative log) makes HF's buckets meaningless.
    distance = _positive_int(config, "relative_attention_max_distance")
    if distance <= buckets // 2:
        raise ValueError(
            f"T5 export: config.relative_attention_max_distance={distance} must exceed "
            f"relative_attention_num_buckets // 2 = {buckets // 2} (the exact buckets)"
        )
    eps = getattr(config, "layer_norm_epsilon", None)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"T5 export: config.layer_norm_epsilon must be a finite float >= 0, got {eps!r}")
    scale = getattr(config, "scale_decoder_outputs", getattr(config, "tie_word_embeddings", True))
    if not isinstance(scale, bool):
        raise ValueError(f"T5 export: config.scale_decoder_outputs must be a bool, got {scale!r}")


def _decoder_start_token_id(model: nn.Module) -> int:
    # where HF's generate looks: the generation config, then the model config
    generation_config = getattr(model, "generation_config", None)
    for source, where in ((generation_config, "generation_config"), (model.config, "config")):
        value = getattr(source, "decoder_start_token_id", None) if source is not None else None
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < model.config.vocab_size:
                raise ValueError(
                    f"T5 export: {where}.decoder_start_token_id must be a token id in [0, vocab_size), got {value!r}"
                )
            return value
    raise ValueError(
        "T5 export: decoder_start_token_id is not set in model.generation_config nor model.config "
        "(T5 checkpoints use the pad token, 0); the engine needs it as the decoder's first token"
    )


def script(model: nn.Module, *, max_length: int, max_source_length: int) -> torch.jit.ScriptModule:
    """The encoder-decoder cached contract form of a T5ForConditionalGeneration (see the module docstring).

    max_length: decoder positions the self-attention cache holds; max_source_length: longest source encode()
    accepts. The scripted module shares the model's weight storage (no copy; requires_grad False), in the
    model's dtype and on its device. Raises ValueError for configs or weights it does not implement.
    """
    from transformers import T5ForConditionalGeneration

    if not isinstance(model, T5ForConditionalGeneration):
        raise ValueError(f"T5 export: expected a T5ForConditionalGeneration, got {type(model).__name__}")
    for name, value in (("max_length", max_length), ("max_source_length", max_source_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"T5 export: {name} must be an int >= 1, got {value!r}")
    check_config(model.config)
    for name, p in model.named_parameters():
        if not p.is_floating_point():
            raise ValueError(f"T5 export: weight {name} is {p.dtype}; only floating-point weights are implemented")
    for stack in ("encoder", "decoder"):
        attention = getattr(model, stack).block[0].layer[0].SelfAttention
        if not attention.has_relative_attention_bias:
            raise ValueError(f"T5 export: {stack}.block[0] has no relative_attention_bias")
    module = T5Cached(model, max_length, max_source_length, _decoder_start_token_id(model))
    return torch.jit.script(module.eval())
