"""A zoo of tiny random transformers models, one per architecture family, built from configs with fixed seeds
(no downloads), for tests that compare the engine with transformers' own generate.

Every family has VOCAB = 64 tokens with pad 0, bos 1, EOS 2 (so any two families can pair as target and draft),
2 layers of width 48-64 and untied heads (T5's is tied: transformers 5 always ties it). Untrained models tend to
repeat one token, tied heads most (they echo their input); weight matrices drawn wider than transformers' init
(std 0.1-0.3 per family, against 0.02) and norm gains drawn around 1 make their greedy continuations varied and
their argmaxes decided by clear margins rather than by rounding. The sliding-window families (mistral, gemma2,
gemma3) have a window of WINDOW = 8 positions and llama4 attention chunks of 8 in one of its layers, so that
they matter within 20 generated tokens; gemma2 also softcaps its attention and final logits (caps small enough
to bite), which makes it run eager attention. gemma3_vlm is Gemma 3's vision-language class generating text (its
vocabulary and special ids live in its text config). `STATEFUL` holds a Mamba model, whose recurrent state
cannot be rolled back (transformers marks it `_is_stateful`), for tests that a loader refuses it.

`make(family, seed)` returns an eval-mode model without gradients; `drafted(model, noise, seed)` a copy with
Gaussian noise on every weight, a draft that agrees with its target often but not always (NOISE[family] gives
an acceptance rate about 0.9); `random_ids(length, vocab, seed)` seeded token ids [1, length] for the logits
tests; PT2_FAMILIES, PT2_MAX_LENGTH and PT2_MAX_SOURCE_LENGTH are conftest.py's pt2_zoo (.pt2 exports).
"""

import copy

import torch
import transformers

VOCAB = 64
PAD, BOS, EOS = 0, 1, 2
INIT_STD = 0.2  # of every weight matrix (embeddings, positions, projections, heads): see make()
NORM_GAIN_STD = 0.5
WINDOW = 8

_IDS = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)
_DECODER = dict(_IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
_LLAMA = dict(_DECODER, intermediate_size=96, num_key_value_heads=2)
_GEMMA = dict(_LLAMA, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
              layer_types=["sliding_attention", "full_attention"])

# family -> (model class, config class, config fields, std of the weight matrices)
_SPECS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(_IDS, n_positions=96, n_embd=48, n_layer=2, n_head=4), 0.1),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _LLAMA, INIT_STD),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", _LLAMA, INIT_STD),  # q/k/v biases
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(_LLAMA, head_dim=16), 0.3),  # q/k norms
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(_LLAMA, head_dim=16, sliding_window=WINDOW), INIT_STD),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",  # alternating sliding and full layers, softcapped logits
               dict(_GEMMA, attn_logit_softcapping=10.0, final_logit_softcapping=5.0), 0.1),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", _GEMMA, INIT_STD),  # q/k norms, a rope per layer type
    "phi3": ("Phi3ForCausalLM", "Phi3Config", _LLAMA, INIT_STD),  # fused qkv and gate/up projections
    # a vision-language model generating text: the vocabulary and ids in its text config, Gemma 3's layers
    "gemma3_vlm": ("Gemma3ForConditionalGeneration", "Gemma3Config",
                   dict(text_config=dict(_GEMMA, tie_word_embeddings=False), image_token_index=VOCAB - 1,
                        boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2, mm_tokens_per_image=4,
                        tie_word_embeddings=False,
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14)), INIT_STD),
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig",  # a chunked-attention layer (no rope in the full one), MoE
               dict(_LLAMA, head_dim=16, intermediate_size_mlp=96, num_local_experts=2, attention_chunk_size=WINDOW,
                    no_rope_layers=[1, 0]), INIT_STD),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_DECODER, intermediate_size=96), 0.3),  # partial rotary
    "opt": ("OPTForCausalLM", "OPTConfig",  # learned positions (offset 2)
            dict(_IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                 word_embed_proj_dim=64, max_position_embeddings=128), 0.3),
    "falcon": ("FalconForCausalLM", "FalconConfig", _DECODER, INIT_STD),  # multi-query, parallel attn/MLP
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(_IDS, hidden_size=64, n_layer=2, n_head=4), INIT_STD),  # ALiBi
    "t5": ("T5ForConditionalGeneration", "T5Config",  # transformers 5 always ties T5's head to its embedding
           dict(_IDS, d_model=48, d_kv=12, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20,
                feed_forward_proj="gated-gelu", decoder_start_token_id=PAD), 0.3),
    "bart": ("BartForConditionalGeneration", "BartConfig",  # BART starts its decoder at EOS; no forced EOS / BOS
             dict(_IDS, d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=128,
                  decoder_start_token_id=EOS, forced_eos_token_id=None, forced_bos_token_id=None), 0.1),
}
_STATEFUL_SPECS = {
    "mamba": ("MambaForCausalLM", "MambaConfig",
              dict(_IDS, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4), None),
}

# a draft weight noise per family for drafted(): acceptance about 0.9 at temperature 1 (seeds 0 and 10); T5's
# saturated attention (no 1/sqrt(d) scaling) makes it far more sensitive than the others
NOISE = {"gpt2": 0.01, "llama": 0.003, "qwen2": 0.004, "qwen3": 0.005, "mistral": 0.005, "gemma2": 0.009,
         "gemma3": 0.008, "gemma3_vlm": 0.005, "phi3": 0.005, "llama4": 0.002, "gpt_neox": 0.007, "opt": 0.004,
         "falcon": 0.01, "bloom": 0.007, "t5": 0.0001, "bart": 0.01}

CLASSES = {family: spec[0] for family, spec in {**_SPECS, **_STATEFUL_SPECS}.items()}
ENCODER_DECODER = {"t5", "bart"}
# (target, draft) pairs of different families; any two share the vocabulary and the special ids
CROSS_FAMILY = [("llama", "gpt2"), ("qwen2", "opt"), ("mistral", "gemma2"), ("bart", "t5")]


def _builder(model_class: str, config_class: str, fields: dict, std=None):
    def build(**overrides):
        config = getattr(transformers, config_class)(**{**fields, **overrides})
        return getattr(transformers, model_class)(config)
    build.std = std
    return build


# family -> builder(**config overrides) -> a model with transformers' initialization (make() redraws it)
FAMILIES = {family: _builder(*spec) for family, spec in _SPECS.items()}
STATEFUL = {family: _builder(*spec) for family, spec in _STATEFUL_SPECS.items()}


def is_encoder_decoder(family: str) -> bool:
    return family in ENCODER_DECODER


def make(family: str, seed: int = 0, **overrides):
    """An eval-mode model of `family` without gradients, the same for the same seed and overrides. Every weight
    matrix is drawn from N(0, std^2) (std per family, 0.1-0.3), norm gains around their initial value (1, or 0 for
    Gemma's 1 + weight) and T5's position-bias tables from N(0, 1); biases keep transformers' init. STATEFUL
    models keep transformers' init."""
    torch.manual_seed(seed)
    build = FAMILIES.get(family) or STATEFUL[family]
    model = build(**overrides)
    if build.std is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "relative_attention_bias" in name:
                    param.normal_(0.0, 1.0)
                elif param.dim() >= 2:
                    param.normal_(0.0, build.std)
                elif ("norm" in name or "ln_" in name) and name.endswith("weight"):
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


def random_ids(length: int, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    """Token ids [1, length], uniform over the vocabulary, the same for the same seed (the logits tests' inputs)."""
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


# conftest.py's pt2_zoo: these families exported as .pt2 packages of these sizes, once per session
PT2_FAMILIES = ("gpt2", "llama", "qwen2", "t5")
PT2_MAX_LENGTH = 64
PT2_MAX_SOURCE_LENGTH = 24
