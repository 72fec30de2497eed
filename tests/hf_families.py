"""A zoo of tiny random transformers models, one per architecture family, built from configs with fixed seeds
(no downloads), for tests that compare the engine with transformers' own generate.

Like hf_models.py: VOCAB = 64 with pad 0, bos 1, EOS 2 in every family (so any two families can pair as target
and draft), 2 layers of width 32-64, a wider initialization (INIT_STD against transformers' 0.02) and norm gains
drawn around 1, so that greedy continuations are varied and argmaxes are decided by clear margins rather than by
rounding. The sliding-window families (mistral, gemma2, gemma3) have a window of WINDOW = 8 positions, so that
it matters within 20 generated tokens; gemma2 also softcaps its attention and final logits (caps small enough
to bite). `STATEFUL` holds a Mamba model, whose recurrent state cannot be rolled back (transformers marks it
`_is_stateful`), for tests that a loader refuses it.

`make(family, seed)` returns an eval-mode model without gradients; `drafted(model, noise, seed)` a copy with
Gaussian noise on every weight, a draft that agrees with its target often but not always.
"""

import copy

import torch
import transformers

VOCAB = 64
PAD, BOS, EOS = 0, 1, 2
INIT_STD = 0.05
WINDOW = 8
NORM_GAIN_STD = 0.5

_IDS = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
_DECODER = dict(_IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                initializer_range=INIT_STD)  # the common fields of the Llama-like configs
_LLAMA = dict(_DECODER, intermediate_size=96, num_key_value_heads=2)
_GEMMA = dict(_LLAMA, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
              layer_types=["sliding_attention", "full_attention"])

# family -> (model class, config class, config fields)
_SPECS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(_IDS, n_positions=96, n_embd=48, n_layer=2, n_head=4, initializer_range=INIT_STD,
                  tie_word_embeddings=False)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _LLAMA),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(_LLAMA, tie_word_embeddings=True)),  # q/k/v biases
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(_LLAMA, head_dim=16, tie_word_embeddings=True)),  # q/k norms
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(_LLAMA, head_dim=16, sliding_window=WINDOW)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",
               dict(_GEMMA, attn_logit_softcapping=10.0, final_logit_softcapping=5.0)),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", _GEMMA),  # q/k norms, a rope per layer type
    "phi3": ("Phi3ForCausalLM", "Phi3Config", _LLAMA),  # fused qkv and gate/up projections
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_DECODER, intermediate_size=128)),  # partial rotary
    "opt": ("OPTForCausalLM", "OPTConfig",
            dict(_IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                 word_embed_proj_dim=64, max_position_embeddings=128, init_std=INIT_STD)),  # learned positions
    "falcon": ("FalconForCausalLM", "FalconConfig",
               dict(_IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                    initializer_range=INIT_STD)),  # multi-query, parallel attention and MLP, rotary
    "bloom": ("BloomForCausalLM", "BloomConfig",
              dict(_IDS, hidden_size=64, n_layer=2, n_head=4, initializer_range=INIT_STD)),  # ALiBi, no positions
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(_IDS, d_model=48, d_kv=12, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=PAD)),
    "bart": ("BartForConditionalGeneration", "BartConfig",
             dict(_IDS, d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=128,
                  init_std=INIT_STD, dropout=0.0, decoder_start_token_id=EOS, forced_eos_token_id=None,
                  forced_bos_token_id=None)),  # BART starts its decoder at EOS; no forced EOS at max length
}
_STATEFUL_SPECS = {
    "mamba": ("MambaForCausalLM", "MambaConfig",
              dict(_IDS, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
}

CLASSES = {family: spec[0] for family, spec in {**_SPECS, **_STATEFUL_SPECS}.items()}
ENCODER_DECODER = {"t5", "bart"}
# (target, draft) pairs of different families; any two share the vocabulary and special ids
CROSS_FAMILY = [("llama", "gpt2"), ("qwen2", "opt"), ("mistral", "gemma2"), ("bart", "t5")]


def _builder(model_class: str, config_class: str, fields: dict):
    def build(**overrides):
        config = getattr(transformers, config_class)(**{**fields, **overrides})
        return getattr(transformers, model_class)(config)
    return build


# family -> builder(**config overrides) -> a model with transformers' initialization (make() widens it)
FAMILIES = {family: _builder(*spec) for family, spec in _SPECS.items()}
STATEFUL = {family: _builder(*spec) for family, spec in _STATEFUL_SPECS.items()}


def is_encoder_decoder(family: str) -> bool:
    return family in ENCODER_DECODER


def make(family: str, seed: int = 0, **overrides):
    """An eval-mode model of `family` without gradients, the same for the same seed and overrides."""
    torch.manual_seed(seed)
    model = {**FAMILIES, **STATEFUL}[family](**overrides)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "relative_attention_bias" in name:  # T5's position-bias tables
                param.normal_(0.0, 1.0)
            elif name == "shared.weight" and family == "t5":  # T5's embedding (std 1) would make it echo its input
                param.normal_(0.0, INIT_STD)
            elif param.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                # around the norm's own initial gain: 1, or 0 for Gemma's (1 + weight)
                param.add_(torch.randn(param.shape) * NORM_GAIN_STD)
    return model.eval().requires_grad_(False)


def drafted(model, noise: float, seed: int):
    """A copy of `model` with N(0, noise^2) added to every weight."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise)
    return draft
