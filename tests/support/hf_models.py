"""Small transformers models built from configs with fixed seeds (no downloads), for the export tests.

`make(arch, seed)` returns an eval-mode model; `drafted(model, noise, seed)` a copy with Gaussian noise on
every weight, a draft that agrees with its target often but not always (so that both acceptances and
rejections happen). Untrained models tend to repeat one token; a wider initialization (INIT_STD, against
transformers' 0.02), norm gains drawn around 1 and T5 position-bias tables of scale 1 make their greedy
continuations varied and their argmaxes decided by clear margins rather than by rounding.

transformers' own answers for these models (test_hf_decoding.py, test_tree_decoding.py, test_tree_growth.py) are
tests/support/live_reference.py's; `hf_greedy` (greedy generate of MAX_NEW tokens from PROMPTS[index], T5 from
SOURCES[index]) and `speculant_inputs` (speculant's input for the same) index them by prompt.
"""

import torch
import transformers

from . import live_reference
from .hf_families import drafted  # noqa: F401  (the same noisy copy, for the export tests)

VOCAB = 64
EOS = 2  # within the vocabulary (GPT-2's default 50256 is not)
INIT_STD = 0.05


def _config(arch: str, **overrides):
    if arch == "gpt2":
        cfg = dict(vocab_size=VOCAB, n_positions=96, n_embd=48, n_layer=2, n_head=4, bos_token_id=1,
                   eos_token_id=EOS, pad_token_id=0, initializer_range=INIT_STD, tie_word_embeddings=False)
        return transformers.GPT2Config(**{**cfg, **overrides})
    if arch == "llama":
        cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1,
                   eos_token_id=EOS, pad_token_id=0, initializer_range=INIT_STD)
        return transformers.LlamaConfig(**{**cfg, **overrides})
    if arch == "t5":
        cfg = dict(vocab_size=VOCAB, d_model=48, d_kv=12, d_ff=96, num_layers=2, num_decoder_layers=2,
                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                   feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0,
                   pad_token_id=0, eos_token_id=EOS)
        return transformers.T5Config(**{**cfg, **overrides})
    raise ValueError(arch)


CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "t5": "T5ForConditionalGeneration"}


def make(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[arch])(_config(arch, **overrides))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "relative_attention_bias" in name:
                param.normal_(0.0, 1.0)
            elif name == "shared.weight":  # T5's embedding (std 1) would otherwise make it echo its input
                param.normal_(0.0, INIT_STD)
            elif param.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                param.normal_(1.0, 0.5)
    return model.eval().requires_grad_(False)


PROMPTS = [[1, 5, 9], [7], [3, 3, 12, 40, 8, 21, 2, 17]]
SOURCES = [[4, 8, 15, 16, 23, 42], [9], [30, 2, 7, 7, 1]]  # T5's encoder inputs
MAX_NEW = 20


def hf_greedy(model, arch: str, index: int, eos) -> list[int]:
    """transformers' own greedy generation of MAX_NEW tokens from PROMPTS[index] (T5: SOURCES[index]), new tokens
    only (live_reference.hf_greedy)."""
    return live_reference.hf_greedy(model, arch, eos, prompt=PROMPTS[index], source=SOURCES[index], max_new=MAX_NEW)


def speculant_inputs(arch: str, index: int) -> dict:
    """generate's input keyword for the same: encoder_input_ids=SOURCES[index] for T5, else PROMPTS[index]."""
    return live_reference.speculant_inputs(arch, PROMPTS[index], SOURCES[index])


def noisy_medusa(target, heads: int = 2):
    """speculant.MedusaDraft on `target` with its heads' weights drawn from N(0, 0.3^2) (fixed by the caller's seed),
    not the zeros they start from (a zero head proposes the target's own next token), so that a test sees both
    acceptances and rejections."""
    import speculant

    draft = speculant.MedusaDraft(target, heads=heads)
    with torch.no_grad():
        for block in draft.head.blocks:
            block.weight.normal_(0, 0.3)
    return draft
