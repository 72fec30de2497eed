"""A small GPT-style decoder and its two TorchScript contract forms.

`TinyGPT` is the training form: forward(ids[B, T]) -> logits[B, T, V]. `script_cached` and `script_plain`
turn trained weights into the model contract the engine loads (docs/model-contract.md):

- cached form: export.cached.CachedDecoder around the model: its own KV cache, prefill / extend / truncate /
  cache_length;
- plain form: forward(input_ids[1, T]) -> logits[1, T, V], recomputing the whole prefix on every call.

Both forms run the same `TinyGPT.run` code as training does, so their logits agree with the training form
up to floating-point summation order. Shapes use B = batch, T = new tokens, S = attended positions,
H = heads, D = head_dim, C = d_model, V = vocab, L = n_layer, M = max_length.
"""
import copy
import math
import warnings
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .export.cached import CACHE_BUFFERS, CachedDecoder, Step, cached_kv, single_step, tapped

__all__ = ["TinyGPTConfig", "TinyGPT", "script_cached", "script_plain", "unscript"]


@dataclass(frozen=True)
class TinyGPTConfig:
    vocab_size: int  # 256 for the byte-level demo models: every string encodes, no tokenizer file to ship
    n_layer: int
    n_head: int  # must divide d_model
    d_model: int
    max_length: int  # learned position embeddings: the model has no positions beyond this, nor does its cache
    d_ff: Optional[int] = None  # MLP width; None = 4 * d_model, the GPT-2 ratio

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.n_layer, self.n_head, self.d_model, self.max_length) < 1:
            raise ValueError(f"TinyGPTConfig: every size must be >= 1, got {self}")
        if self.d_model % self.n_head:
            raise ValueError(f"TinyGPTConfig: n_head={self.n_head} does not divide d_model={self.d_model}")

    @property
    def ff_width(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TinyGPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor, cache: Optional[Tensor], step: Step) -> Tensor:
        # x [B, T, C] at step.positions; cache: keys and values (export/cached.py), or None (stateless)
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # [3, B, H, T, D]
        k, v = cached_kv(qkv[1:], cache, step)  # write the new positions, then attend to all cached: [B, H, S, D]
        q = qkv[0]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=step.mask)  # [B, H, T, D]
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # [B, T, C]


class Block(nn.Module):
    def __init__(self, cfg: TinyGPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.ff_width), nn.GELU(),
                                 nn.Linear(cfg.ff_width, cfg.d_model))

    def forward(self, x: Tensor, cache: Optional[Tensor], step: Step) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache, step)  # [B, T, C], pre-LayerNorm residual
        return x + self.mlp(self.ln_2(x))  # [B, T, C]


class TinyGPT(nn.Module):
    """Training form: forward(ids[B, T]) -> logits[B, T, V], T <= max_length."""

    def __init__(self, config: TinyGPTConfig):
        super().__init__()
        self.config = config  # not scripted (TorchScript skips attributes it cannot type)
        self.vocab_size = config.vocab_size
        self.max_length = config.max_length
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)  # [V, C], also the LM head (tied)
        self.pos_emb = nn.Embedding(config.max_length, config.d_model)  # [M, C]
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.d_model)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by 1/sqrt(2 L)
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: Tensor) -> Tensor:
        if ids.dim() != 2 or ids.size(1) < 1 or ids.size(1) > self.max_length:
            raise ValueError(
                f"forward: expected input_ids [B, T] with 1 <= T <= {self.max_length}, got {ids.shape}"
            )
        return self.run(ids, torch.jit.annotate(List[Tensor], []),
                        single_step(ids.size(1), 0, ids.device, self.tok_emb.weight.dtype))

    def run(self, ids: Tensor, caches: List[Tensor], step: Step) -> Tensor:
        # ids [B, T] at step.positions; caches: [] or one (keys and values) view per layer (export/cached.py)
        return self.logits(self.states(ids, caches, step, torch.jit.annotate(List[int], []))[0])

    def states(self, ids: Tensor, caches: List[Tensor], step: Step, taps: List[int]) -> Tuple[Tensor, Tensor]:
        """The LM head's input [B, T, C] and the outputs of the blocks `taps` side by side (cached.tapped)."""
        x = self.tok_emb(ids) + self.pos_emb(step.positions)  # [B, T, C]
        taken: List[Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if len(caches) > 0 else None, step)  # [B, T, C]
            if i in taps:
                taken.append(x)
        h = self.ln_f(x)
        return h, tapped(h, taken)

    def logits(self, h: Tensor) -> Tensor:
        return F.linear(h, self.tok_emb.weight)  # [B, T, V]

    def weights(self) -> Tuple[Tensor, Tensor]:
        return self.tok_emb.weight, self.tok_emb.weight


def _frozen_copy(model: TinyGPT) -> TinyGPT:
    # a fresh module with the trained weights, eval mode, no grad: never aliases the trainer's tensors
    clone = TinyGPT(model.config)
    clone.load_state_dict(copy.deepcopy(model.state_dict()))
    like = model.tok_emb.weight
    return clone.to(device=like.device, dtype=like.dtype).eval().requires_grad_(False)


def script_cached(model: TinyGPT) -> torch.jit.ScriptModule:
    """The cached contract form (prefill / extend / truncate / cache_length) with `model`'s weights."""
    cfg = model.config
    frozen = _frozen_copy(model)
    wrapper = CachedDecoder(frozen, vocab_size=cfg.vocab_size, max_length=cfg.max_length, layers=cfg.n_layer,
                            kv_heads=cfg.n_head, head_dim=cfg.d_model // cfg.n_head, like=frozen.tok_emb.weight)
    return torch.jit.script(wrapper.eval())


def script_plain(model: TinyGPT) -> torch.jit.ScriptModule:
    """The plain contract form, forward(input_ids[1, T]) -> [1, T, V], with `model`'s weights."""
    return torch.jit.script(_frozen_copy(model))


def unscript(scripted, config: TinyGPTConfig) -> TinyGPT:
    """The training form back from either contract form (a TorchScript module, or the path of its saved file),
    with a copy of its weights: what `speculant.distill` trains. ValueError when the weights do not fit
    `config`."""
    if not isinstance(scripted, torch.jit.ScriptModule):
        with warnings.catch_warnings():  # TorchScript's deprecation notice (torch >= 2.11), nothing else
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
            scripted = torch.jit.load(str(scripted), map_location="cpu")
    model = TinyGPT(config)
    state = {key.removeprefix("core."): value.detach().clone() for key, value in scripted.state_dict().items()
             if key not in CACHE_BUFFERS}  # the cached form's cache buffers are no weights
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"unscript: the module's weights do not fit {config}: {error}") from None
    like = next(iter(state.values()))
    return model.to(device=like.device, dtype=like.dtype)
