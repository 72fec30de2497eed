"""transformers' own answers, for the live models of tests/support/hf_families.py (test_live.py,
test_pt2_decoding.py, test_compiled_live.py) and the export tests' models of tests/support/hf_models.py (which
indexes these by its PROMPTS).

`hf_greedy` is transformers' greedy generate (plain or assisted) of MAX_NEW tokens from PROMPT (an
encoder-decoder: from SOURCE), `speculant_inputs` the same input for speculant, `first_tokens` the decoder's first
tokens, `hf_logits` transformers' logits of a whole sequence, and `two_token_law` the exact joint law of the first
two generated tokens from transformers' logits (`hf_next_logits`), standardized by tests/support/reference.py.
"""

import torch

from . import hf_families
from . import reference

PROMPT = [1, 5, 9]
SOURCE = [4, 8, 15, 16, 23, 42]  # the encoder-decoders' input
MAX_NEW = 20


def speculant_inputs(family: str, prompt=PROMPT, source=SOURCE) -> dict:
    """generate's input keyword: encoder_input_ids=source for an encoder-decoder, else prompt_ids=prompt."""
    return {"encoder_input_ids": source} if hf_families.is_encoder_decoder(family) else {"prompt_ids": prompt}


def hf_greedy(model, family: str, eos=None, assistant=None, prompt=PROMPT, source=SOURCE,
              max_new: int = MAX_NEW) -> list[int]:
    """transformers' own greedy generation (plain, or assisted by `assistant`), new tokens only."""
    kwargs = dict(do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0, num_beams=1,
                  top_k=None, top_p=None, temperature=None, assistant_model=assistant)
    if assistant is not None:  # a fixed draft length: transformers' default schedule changes it as it goes
        kwargs["num_assistant_tokens"] = 4
        kwargs["num_assistant_tokens_schedule"] = "constant"
    ids = torch.tensor([source if hf_families.is_encoder_decoder(family) else prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    start = 1 if hf_families.is_encoder_decoder(family) else ids.size(1)  # after the decoder's start token
    return out[0, start:].tolist()


def hf_logits(model, ids: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' logits [N, T, V] for every position of ids [N, T]: an encoder-decoder's decoder tokens after
    the encoder input `source` [N, S] (without a cache)."""
    with torch.no_grad():
        if source is None:
            return model(ids).logits
        return model(input_ids=source, decoder_input_ids=ids, use_cache=False).logits


def hf_next_logits(model, family: str, prefixes: torch.Tensor, source=SOURCE) -> torch.Tensor:
    """transformers' next-token logits [N, V] after each row of prefixes [N, T] (decoder tokens for
    encoder-decoders, after `source`)."""
    if hf_families.is_encoder_decoder(family):
        return hf_logits(model, prefixes, torch.tensor([source]).expand(prefixes.size(0), -1))[:, -1]
    return hf_logits(model, prefixes)[:, -1]


def two_token_law(model, family: str, start: list[int], temperature: float, top_k: int, top_p: float = 1.0,
                  source=SOURCE) -> torch.Tensor:
    """The target's exact joint law of the first two generated tokens [V, V], from transformers' logits."""
    def law(logits):
        return reference.standardize(logits.double(), temperature=temperature, top_k=top_k, top_p=top_p)

    prefix = torch.tensor([start])
    first = law(hf_next_logits(model, family, prefix, source))[0]  # [V]
    vocab = first.numel()
    extended = torch.cat([prefix.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # [V, T + 1]
    return first[:, None] * law(hf_next_logits(model, family, extended, source))  # [V, V]


def first_tokens(model, family: str) -> list[int]:
    """The decoder's first tokens: an encoder-decoder's decoder start token, else PROMPT."""
    return [model.generation_config.decoder_start_token_id] if hf_families.is_encoder_decoder(family) else PROMPT
