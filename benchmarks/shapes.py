"""The model shapes the benchmarks time with random weights (a call's time does not depend on the weights).

* `llama-8b`: Llama-3.1-8B's shape (8.03B parameters, vocabulary 128,256, 32 layers, 8 key/value heads), the
  target users run; `llama-1b`: Llama-3.2-1B's (1.24B, tied embeddings), its usual draft. Llama 3.1's rope
  scaling is left out: it changes no operation's cost.
* `llama-1.1b`: TinyLlama's shape (1.1B, vocabulary 32,000), the benchmarks' earlier bf16 Llama.
* `gpt2-target`, `gpt2-draft`: train_pairs.GPT2_CUDA's pair (91.7M and 3.8M parameters, vocabulary 8,192).
* `tiny-llama`, `tiny-llama-draft`: the same code at a few thousand parameters, for the CPU's tests.

`max_length` is the cache's positions an export holds (`positions=` overrides it, for GPT-2 up to its learned
position table, which grows with it).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, NamedTuple, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))
import train_pairs  # noqa: E402


class Shape(NamedTuple):
    kind: str  # "llama" or "gpt2"
    config: Dict
    max_length: int


LLAMA_3 = dict(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
               max_position_embeddings=131072)
SHAPES = {
    "llama-8b": Shape("llama", dict(LLAMA_3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    tie_word_embeddings=False), 4096),
    "llama-1b": Shape("llama", dict(LLAMA_3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                    head_dim=64, tie_word_embeddings=True), 4096),
    "llama-1.1b": Shape("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                      max_position_embeddings=2048, tie_word_embeddings=False), 512),
    "gpt2-target": Shape("gpt2", dict(train_pairs.GPT2_CUDA.target, vocab_size=train_pairs.GPT2_CUDA.vocab_size),
                         train_pairs.GPT2_CUDA.context),
    "gpt2-draft": Shape("gpt2", dict(train_pairs.GPT2_CUDA.draft, vocab_size=train_pairs.GPT2_CUDA.vocab_size),
                        train_pairs.GPT2_CUDA.context),
    "tiny-llama": Shape("llama", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      tie_word_embeddings=False), 1024),
    "tiny-llama-draft": Shape("llama", dict(vocab_size=512, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                            max_position_embeddings=4096, tie_word_embeddings=True), 1024),
}


def dtype_for(device: torch.device, name: Optional[str] = None) -> torch.dtype:
    """The benchmarks' dtype: `name` when given ("bfloat16", "float32", "float16"), else bfloat16 on a GPU (what
    deployments run) and float32 on a CPU."""
    return getattr(torch, name) if name else (torch.bfloat16 if torch.device(device).type == "cuda" else
                                              torch.float32)


def load_dtype(device: torch.device, name: Optional[str] = None) -> Optional[torch.dtype]:
    """speculant.load's dtype= for a float32 export: dtype_for's, None where that is float32 (no conversion)."""
    dtype = dtype_for(device, name)
    return None if dtype == torch.float32 else dtype


DTYPE_CHOICES = ["bfloat16", "float32", "float16"]
DTYPE_HELP = "the models' dtype (default: bfloat16 on a GPU, float32 on a CPU)"


def config(name: str, positions: Optional[int] = None):
    """The transformers config of shape `name`."""
    import transformers

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    shape = SHAPES[name]
    if shape.kind == "gpt2":
        return transformers.GPT2Config(n_positions=positions or shape.max_length, bos_token_id=1, eos_token_id=2,
                                       **shape.config)
    return transformers.LlamaConfig(bos_token_id=1, eos_token_id=2, **shape.config)


def build(name: str, device: torch.device, dtype: torch.dtype, positions: Optional[int] = None, seed: int = 0):
    """Shape `name` with random weights, made on `device` in `dtype` (seconds on a GPU even at 8B: nothing is
    made on the host), in eval mode."""
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config(name, positions), dtype=dtype)
    return model.eval()


def parameters(name: str) -> int:
    """Shape `name`'s parameter count, from a model made on the meta device (no memory)."""
    with torch.device("meta"):
        import transformers

        model = transformers.AutoModelForCausalLM.from_config(config(name))
    return sum(p.numel() for p in model.parameters())


def read_weight_bytes(model) -> int:
    """The weight bytes one decoding call reads: every parameter, except that an input embedding the LM head does
    not share is read only at the call's own rows (counted as none)."""
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total if tied else total - embedding.numel() * embedding.element_size()
