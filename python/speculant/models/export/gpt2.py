"""GPT-2 (transformers' GPT2LMHeadModel) as a scripted module with the HF weights: pre-LayerNorm blocks,
learned positions, fused QKV, an LM head tied to the token embedding unless the model unties it. transformers stores GPT-2's projections as Conv1D ([in, out],
y = x W + b); they are transposed into nn.Linear ([out, in]) here. Shapes as in cached.py, C = n_embd,
H = n_head, F = MLP width.
"""
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cached import (CachedDecoder, Step, activation_kind, add_linear, cached_kv, copy_weights, fused_kernels,
                     is_tied, tapped)


class Attention(nn.Module):
    __constants__ = ["fused"]

    def __init__(self, width: int, heads: int, scale: float, fused: bool):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.scale = scale  # 1/sqrt(D), and / (layer + 1) with scale_attn_by_inverse_layer_idx
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, qkv: Tensor, residual: Tensor, cache: Optional[Tensor], step: Step) -> Tensor:
        # qkv [R, T, 3C]: self.qkv of the normalized input (Block); residual [R, T, C]
        B, T, C3 = qkv.shape
        C = C3 // 3
        qkv = qkv.view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # [3, B, H, T, D]
        k, v = cached_kv(qkv[1:], cache, step)  # keys and values written together: [B, H, S, D] each
        q = qkv[0]
        if self.fused:  # cpp/kernels/ops.cpp
            y = torch.ops.speculant.decode_attention(q, k, v, step.mask, self.scale)  # [B, H, T, D]
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=step.mask, scale=self.scale)
        return add_linear(residual, y.transpose(1, 2).reshape(B, T, C), self.proj.weight, self.proj.bias,
                          self.fused)  # [B, T, C]: residual + proj(y)


class Block(nn.Module):
    """A pre-LayerNorm block whose output projections accumulate into the residual stream (add_linear). With
    `fused`, four of speculant's operations around the attention (on CUDA one kernel each at up to 8 tokens): each
    LayerNorm with the projection after it, each output projection with the residual add, the MLP's activation
    inside its second projection."""

    __constants__ = ["fused"]

    def __init__(self, width: int, heads: int, inner: int, eps: float, act: str, scale: float, fused: bool):
        super().__init__()
        self.act, self.eps, self.fused = act, eps, fused
        self.ln_1 = nn.LayerNorm(width, eps=eps)
        self.attn = Attention(width, heads, scale, fused)
        self.ln_2 = nn.LayerNorm(width, eps=eps)
        self.fc = nn.Linear(width, inner)
        self.fc_proj = nn.Linear(inner, width)

    def normed_linear(self, x: Tensor, norm_weight: Tensor, norm_bias: Tensor, weight: Tensor,
                      bias: Tensor) -> Tensor:
        """F.linear(F.layer_norm(x, ...), weight, bias); with `fused` one torch.ops.speculant.linear."""
        if self.fused:
            return torch.ops.speculant.linear(x, weight, bias, "layer_norm", norm_weight, norm_bias, self.eps)
        return F.linear(F.layer_norm(x, [x.size(-1)], norm_weight, norm_bias, self.eps), weight, bias)

    def forward(self, x: Tensor, cache: Optional[Tensor], step: Step) -> Tensor:
        # x [B, T, C], the residual stream, a tensor of this call's own: written in place
        attention = self.attn
        qkv = self.normed_linear(x, self.ln_1.weight, self.ln_1.bias, attention.qkv.weight, attention.qkv.bias)
        x = attention(qkv, x, cache, step)
        h = self.normed_linear(x, self.ln_2.weight, self.ln_2.bias, self.fc.weight, self.fc.bias)  # [B, T, F]
        return add_linear(x, h, self.fc_proj.weight, self.fc_proj.bias, self.fused, self.act)


class GPT2(nn.Module):
    def __init__(self, config, tied: bool, fused: bool):
        super().__init__()
        width, heads = config.n_embd, config.n_head
        inner = config.n_inner if config.n_inner is not None else 4 * width
        act = activation_kind(config.activation_function, "activation_function")
        self.wte = nn.Embedding(config.vocab_size, width)  # [V, C]
        # [V, C]: the same Parameter as wte's when tied (stored once), else its own
        self.head = self.wte.weight if tied else nn.Parameter(torch.empty(config.vocab_size, width))
        self.wpe = nn.Embedding(config.n_positions, width)  # [P, C]
        scales = []
        for layer in range(config.n_layer):
            scale = 1.0 / math.sqrt(width // heads) if config.scale_attn_weights else 1.0
            if config.scale_attn_by_inverse_layer_idx:
                scale /= layer + 1
            scales.append(scale)
        eps = config.layer_norm_epsilon
        self.blocks = nn.ModuleList([Block(width, heads, inner, eps, act, s, fused) for s in scales])
        self.ln_f = nn.LayerNorm(width, eps=config.layer_norm_epsilon)

    def run(self, input_ids: Tensor, caches: List[Tensor], step: Step) -> Tensor:
        return self.logits(self.states(input_ids, caches, step, torch.jit.annotate(List[int], []))[0])

    def states(self, input_ids: Tensor, caches: List[Tensor], step: Step, taps: List[int]) -> Tuple[Tensor, Tensor]:
        """The LM head's input [R, T, C] and the outputs of the blocks `taps` side by side (cached.tapped)."""
        x = self.wte(input_ids) + self.wpe(step.positions)  # [R, T, C]
        taken: List[Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if len(caches) > 0 else None, step)
            if i in taps:
                taken.append(x.clone())  # the next block accumulates into x
        h = self.ln_f(x)
        return h, tapped(h, taken)

    def logits(self, h: Tensor) -> Tensor:
        return F.linear(h, self.head)  # [R, T, V]

    def weights(self) -> Tuple[Tensor, Tensor]:
        return self.wte.weight, self.head


def check_config(config) -> None:
    """Refuses, naming the field, what this module does not compute as transformers does."""
    if getattr(config, "add_cross_attention", False):
        raise ValueError("config.add_cross_attention = True (GPT-2 with cross-attention) is not supported")
    activation_kind(config.activation_function, "activation_function")
    if config.n_embd % config.n_head:
        raise ValueError(f"config.n_head = {config.n_head} does not divide n_embd = {config.n_embd}")


def _weights(model) -> Dict[str, Tensor]:
    """Our parameter names -> transformers' tensors (Conv1D weights transposed)."""
    sd = model.state_dict()
    out = {"wte.weight": sd["transformer.wte.weight"], "wpe.weight": sd["transformer.wpe.weight"],
           "ln_f.weight": sd["transformer.ln_f.weight"], "ln_f.bias": sd["transformer.ln_f.bias"]}
    out["head"] = model.get_output_embeddings().weight  # the embedding itself when tied
    for i in range(model.config.n_layer):
        hf, ours = f"transformer.h.{i}.", f"blocks.{i}."
        for a, b in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
            out[ours + a + ".weight"] = sd[hf + b + ".weight"]
            out[ours + a + ".bias"] = sd[hf + b + ".bias"]
        for a, b in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("fc", "mlp.c_fc"),
                     ("fc_proj", "mlp.c_proj")):
            out[ours + a + ".weight"] = sd[hf + b + ".weight"].t()
            out[ours + a + ".bias"] = sd[hf + b + ".bias"]
    return out


def script(model, *, max_length: Optional[int] = None, kernels: str = "aten") -> torch.jit.ScriptModule:
    """The cached contract form of a GPT2LMHeadModel. max_length defaults to (and may not exceed)
    config.n_positions, the learned positions there are. kernels: "aten", or "speculant" for the LayerNorms
    with their projections, the output projections with the residual adds, the activation with the MLP's second
    projection and the attention as torch.ops.speculant.* (llama.script)."""
    config = model.config
    check_config(config)
    fused = fused_kernels(kernels)
    if max_length is None:
        max_length = config.n_positions
    if not 1 <= max_length <= config.n_positions:
        raise ValueError(f"max_length must be in [1, n_positions = {config.n_positions}] for GPT-2 (learned "
                         f"positions), got {max_length}")
    like = model.transformer.wte.weight
    tied = is_tied(model)
    with torch.device(like.device):  # initialized where the weights are, then overwritten (llama.py)
        core = GPT2(config, tied, fused).to(dtype=like.dtype).eval()
    copy_weights(core, _weights(model))
    wrapper = CachedDecoder(core, vocab_size=config.vocab_size, max_length=max_length, layers=config.n_layer,
                            kv_heads=config.n_head, head_dim=config.n_embd // config.n_head, like=like)
    return torch.jit.script(wrapper.eval())
