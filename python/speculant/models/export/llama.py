"""Llama-architecture decoders (transformers' LlamaForCausalLM) as a scripted module with the HF weights:
RMSNorm, rotary position embeddings, grouped-query attention, a gated MLP. Shapes as in cached.py,
C = hidden_size, H = query heads, H_kv = key/value heads (H_kv divides H), F = intermediate_size.

The rotary tables are precomputed for the cache's M positions from the model's own inverse frequencies and
attention scaling, which transformers derives from config.rope_parameters for each static RoPE type
(default, linear, llama3, yarn, ...); the types that change with the sequence length are refused.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cached import (CachedDecoder, Step, activation_kind, add_linear, cached_kv, copy_weights, fused_kernels,
                     is_tied, seen_kv, tapped)

# RoPE types whose frequencies depend on the current sequence length: one precomputed table cannot hold them.
DYNAMIC_ROPE = ("dynamic", "longrope")


class RMSNorm(nn.Module):
    """torch.rms_norm: one kernel on CUDA (its fused implementation, computed in float32 whatever the working
    dtype), where transformers' float32 steps make five (cast, square, mean, rsqrt and scale, cast back, the
    weight's multiply). It rounds to the working dtype once, after the weight, where transformers rounds before
    it too: the two differ by at most that rounding in bf16, not at all in float32 beyond reordering."""

    __constants__ = ["fused"]

    def __init__(self, width: int, eps: float, fused: bool):
        super().__init__()
        self.eps, self.width, self.fused = eps, width, fused
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        if self.fused:  # on CUDA one block per row (cpp/kernels/rms_norm.cu); on the CPU torch.rms_norm
            return torch.ops.speculant.rms_norm(x, self.weight, self.eps)
        return torch.rms_norm(x, [self.width], self.weight, self.eps)

    def project(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """F.linear(self(x), weight, bias): with `fused`, one torch.ops.speculant.linear (the norm inside the
        matrix product's kernel on CUDA: cpp/kernels/linear.cu)."""
        if self.fused:
            return torch.ops.speculant.linear(x, weight, bias, "rms_norm", self.weight, None, self.eps)
        return F.linear(self.forward(x), weight, bias)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x [B, n, T, D]; cos, sin broadcast to it: the rotation of pairs (i, i + D/2), transformers' rotate_half
    # layout, with sin's first half negated beforehand (_rotary_tables): x2 * -s is -(x2 * s) bit for bit, so
    # this is transformers' x * cos + cat(-x2, x1) * sin without the negation's pass
    half = x.size(-1) // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


def head_tables(cos: Tensor, sin: Tensor, rotated: int, kept: int) -> Tuple[Tensor, Tensor]:
    """cos, sin [R, 1, T, D] -> [R, rotated + kept, T, D]: the tables for `rotated` heads, then the identity
    (cos 1, sin 0) for `kept` heads, so that one rotation passes the values through with the queries and keys
    (v * 1 + v' * 0 is v exactly) and its output holds the keys and values side by side, ready for the cache."""
    R, _, T, D = cos.shape
    ones, zeros = torch.ones_like(cos).expand(R, kept, T, D), torch.zeros_like(sin).expand(R, kept, T, D)
    return (torch.cat((cos.expand(R, rotated, T, D), ones), dim=1),
            torch.cat((sin.expand(R, rotated, T, D), zeros), dim=1))


class Attention(nn.Module):
    """Queries, keys and values from one fused projection, all rotated in one pass (the values by the identity:
    head_tables) whose output holds the keys and values as the cache takes them, and each key/value head attended
    by its H / H_kv query heads stacked along the query axis (the mask stacked to match in Llama.run), so the
    cached keys and values are never copied per query head. The output projection accumulates into the
    residual stream. With `fused`, the rotation and the cache write are one torch.ops.speculant.rotate_and_cache
    (the tables broadcast over the heads, not head_tables; the values copied as they are), and the attention is
    torch.ops.speculant.decode_attention, which reads the mask unstacked (cpp/kernels/)."""

    __constants__ = ["fused"]

    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int, bias: bool, fused: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.fused = heads, kv_heads, head_dim, fused
        self.qkv = nn.Linear(width, (heads + 2 * kv_heads) * head_dim, bias=bias)  # [q | k | v] rows
        self.o_proj = nn.Linear(heads * head_dim, width, bias=bias)

    def forward(self, qkv: Tensor, residual: Tensor, cos: Tensor, sin: Tensor, cache: Optional[Tensor],
                step: Step) -> Tensor:
        # qkv [R, T, (H + 2 H_kv) D]: self.qkv of the normalized input (Block); residual [R, T, C]; cos, sin
        # [1 | R, H + 2 H_kv, T, D] (head_tables), or [1 | R, 1, T, D] when fused
        B, T, _ = qkv.shape
        H, H_kv, D = self.heads, self.kv_heads, self.head_dim
        if self.fused and cache is not None:
            q = torch.ops.speculant.rotate_and_cache(qkv, cos, sin, cache, step.rows, step.slots, step.start, H,
                                                     H_kv)  # [B, H, T, D]
            k, v = seen_kv(cache, step, T)  # [B, H_kv, S, D] each
        elif self.fused:  # stateless: the same rotation, keys and values the call's own
            heads = qkv.view(B, T, H + 2 * H_kv, D).transpose(1, 2)
            rotated = rotate(heads[:, :H + H_kv], cos, sin)
            q, k, v = rotated[:, :H], rotated[:, H:], heads[:, H + H_kv:]
        else:
            qkv = rotate(qkv.view(B, T, H + 2 * H_kv, D).transpose(1, 2), cos, sin)  # [B, H + 2 H_kv, T, D]
            k, v = cached_kv(qkv[:, H:].view(B, 2, H_kv, T, D).transpose(0, 1), cache, step)  # [B, H_kv, S, D]
            q = qkv[:, :H]
        # query head h reads key/value head h // (H / H_kv), as repeat_interleave would pair them: each key/value
        # head's H / H_kv query heads stacked along the query axis, [B, H_kv, H / H_kv * T, D]
        q = q.reshape(B, H_kv, H // H_kv * T, D)
        if self.fused:
            y = torch.ops.speculant.decode_attention(q, k, v, step.mask, D ** -0.5)  # [B, H_kv, H/H_kv T, D]
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=step.mask, scale=D ** -0.5)
        y = y.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        return add_linear(residual, y, self.o_proj.weight, self.o_proj.bias, self.fused)  # residual + o_proj(y)


class Block(nn.Module):
    """A decoder layer: with `fused`, speculant's operations throughout (on CUDA 7 kernels at up to 8 tokens): the
    input norm with the qkv projection, the rotation with the cache write, the attention (two kernels), the output
    projection accumulating into the residual stream, the second norm with the gate and up projection, the gated
    product with the down projection accumulating likewise."""

    __constants__ = ["fused"]

    def __init__(self, config, head_dim: int, act: str, fused: bool):
        super().__init__()
        width, inner = config.hidden_size, config.intermediate_size
        self.act, self.inner, self.fused = act, inner, fused
        self.input_layernorm = RMSNorm(width, config.rms_norm_eps, fused)
        self.self_attn = Attention(width, config.num_attention_heads, config.num_key_value_heads, head_dim,
                                   config.attention_bias, fused)
        self.post_attention_layernorm = RMSNorm(width, config.rms_norm_eps, fused)
        self.gate_up = nn.Linear(width, 2 * inner, bias=config.mlp_bias)  # [gate | up] rows, one projection
        self.down_proj = nn.Linear(inner, width, bias=config.mlp_bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Optional[Tensor], step: Step) -> Tensor:
        # x [B, T, C], the residual stream: each sublayer's output projection accumulates into it (add_linear)
        attention = self.self_attn
        x = attention(self.input_layernorm.project(x, attention.qkv.weight, attention.qkv.bias), x, cos, sin, cache,
                      step)
        h = self.post_attention_layernorm.project(x, self.gate_up.weight, self.gate_up.bias)  # [B, T, 2F]
        return add_linear(x, h, self.down_proj.weight, self.down_proj.bias, self.fused, "gated_" + self.act)


class Llama(nn.Module):
    __constants__ = ["fused"]

    def __init__(self, config, head_dim: int, tied: bool, cos: Tensor, sin: Tensor, fused: bool):
        super().__init__()
        act = activation_kind(config.hidden_act, "hidden_act")
        self.heads, self.kv_heads, self.fused = config.num_attention_heads, config.num_key_value_heads, fused
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)  # [V, C]
        self.layers = nn.ModuleList([Block(config, head_dim, act, fused) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused)
        # [V, C]: the same Parameter as the embedding's when tied (stored once), else its own
        self.head = self.embed_tokens.weight if tied else nn.Parameter(torch.empty(config.vocab_size,
                                                                                   config.hidden_size))
        self.register_buffer("cos", cos)  # [M, D] in the working dtype
        self.register_buffer("sin", sin)  # [M, D]

    def run(self, input_ids: Tensor, caches: List[Tensor], step: Step) -> Tensor:
        return self.logits(self.states(input_ids, caches, step, torch.jit.annotate(List[int], []))[0])

    def logits(self, h: Tensor) -> Tensor:
        return F.linear(h, self.head)  # [R, T, V]

    def weights(self) -> Tuple[Tensor, Tensor]:
        return self.embed_tokens.weight, self.head

    def states(self, input_ids: Tensor, caches: List[Tensor], step: Step, taps: List[int]) -> Tuple[Tensor, Tensor]:
        """The LM head's input [R, T, C] and the outputs of the layers `taps` side by side (cached.tapped)."""
        T = input_ids.size(1)
        if step.rows is None:  # batch 1: positions [start, start + T), a slice of the tables
            if step.start + T > self.cos.size(0):
                raise ValueError(f"run: positions up to {step.start + T} exceed the {self.cos.size(0)} rotary "
                                 "positions")
            end = step.start + T
            cos, sin = self.cos[step.start:end][None, None], self.sin[step.start:end][None, None]  # [1, 1, T, D]
        else:
            cos, sin = self.cos[step.positions].unsqueeze(1), self.sin[step.positions].unsqueeze(1)  # [R, 1, T, D]
        if not self.fused:  # fused: one rotation per layer broadcasts [1 | R, 1, T, D] over the heads it rotates
            cos, sin = head_tables(cos, sin, self.heads + self.kv_heads, self.kv_heads)  # [1 | R, H + 2 H_kv, T, D]
        group = self.heads // self.kv_heads
        if group > 1 and not self.fused:  # each query's mask row once per query head sharing its key/value head
            shape = step.mask.shape  # [.., T, S]
            mask = step.mask.unsqueeze(-3).expand(shape[:-2] + [group] + shape[-2:]).reshape(
                shape[:-2] + [group * shape[-2], shape[-1]])  # [.., H / H_kv * T, S]: a copy at most
            step = Step(step.positions, mask, step.start, step.rows, step.slots, step.keys)
        x = self.embed_tokens(input_ids)  # [R, T, C], a new tensor: the layers accumulate into it
        taken: List[Tensor] = []
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, caches[i] if len(caches) > 0 else None, step)
            if i in taps:
                taken.append(x.clone())  # the next layer accumulates into x
        h = self.norm(x)
        return h, tapped(h, taken)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_config(config) -> None:
    """Refuses, naming the field, what this module does not compute as transformers does."""
    activation_kind(config.hidden_act, "hidden_act")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(f"config.num_key_value_heads = {config.num_key_value_heads} does not divide "
                         f"num_attention_heads = {config.num_attention_heads}")
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type in DYNAMIC_ROPE:
        raise ValueError(f"config.rope_parameters rope_type = {rope_type!r} changes with the sequence length and "
                         f"is not supported; static types (default, linear, llama3, yarn, ...) are")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError(f"config.pretraining_tp = {config.pretraining_tp} is not supported (only 1)")


def _rotary_tables(model, max_length: int, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """cos, sin [M, D] for positions 0 .. M - 1 (sin's first half negated, for rotate), from the model's own
    inverse frequencies and scaling, computed in float32 as transformers does per call, then cast to the working
    dtype."""
    rotary = model.model.rotary_emb
    inv_freq = rotary.inv_freq.to(torch.float32)  # [D / 2]
    positions = torch.arange(max_length, dtype=torch.float32, device=inv_freq.device)  # [M]
    freqs = positions[:, None] * inv_freq[None, :]  # [M, D / 2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [M, D]
    scaling = float(rotary.attention_scaling)
    sin = (angles.sin() * scaling).to(dtype)
    half = sin.size(-1) // 2
    return (angles.cos() * scaling).to(dtype), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def _weights(model, config) -> Dict[str, Tensor]:
    """Our parameter names -> transformers' tensors: the same layout, shorter names, the q/k/v projections
    stacked into one (qkv) and gate/up into one (gate_up)."""
    sd = model.state_dict()
    out = {"embed_tokens.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    out["head"] = model.get_output_embeddings().weight  # the embedding itself when tied
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[ours + norm + ".weight"] = sd[hf + norm + ".weight"]
        for w in ("weight", "bias") if config.attention_bias else ("weight",):
            out[ours + "self_attn.qkv." + w] = torch.cat([sd[hf + f"self_attn.{p}_proj.{w}"] for p in "qkv"])
            out[ours + "self_attn.o_proj." + w] = sd[hf + "self_attn.o_proj." + w]
        for w in ("weight", "bias") if config.mlp_bias else ("weight",):
            out[ours + "gate_up." + w] = torch.cat([sd[hf + f"mlp.{p}_proj.{w}"] for p in ("gate", "up")])
            out[ours + "down_proj." + w] = sd[hf + "mlp.down_proj." + w]
    return out


def script(model, *, max_length: Optional[int] = None, kernels: str = "aten") -> torch.jit.ScriptModule:
    """The cached contract form of a LlamaForCausalLM. max_length (the preallocated cache's positions)
    defaults to min(config.max_position_embeddings, 4096). kernels: "aten" (torch's own operations) or
    "speculant" (the norms with the projections after them, the residual adds with the projections before them,
    the gated product with the down projection and the attention as torch.ops.speculant.*: CUDA kernels of this
    package, the same ATen composites on the CPU)."""
    config = model.config
    check_config(config)
    fused = fused_kernels(kernels)
    if max_length is None:
        max_length = min(config.max_position_embeddings, 4096)
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    like = model.model.embed_tokens.weight
    head_dim, tied = _head_dim(config), is_tied(model)
    cos, sin = _rotary_tables(model, max_length, like.dtype)
    with torch.device(like.device):  # initialized where the weights are (an 8B model's init: ms on a GPU, not a
        # minute of float32 on the host), then overwritten
        core = Llama(config, head_dim, tied, cos, sin, fused).to(dtype=like.dtype).eval()
    copy_weights(core, _weights(model, config))
    wrapper = CachedDecoder(core, vocab_size=config.vocab_size, max_length=max_length,
                            layers=config.num_hidden_layers, kv_heads=config.num_key_value_heads,
                            head_dim=head_dim, like=like)
    return torch.jit.script(wrapper.eval())
