"""transformers' own answers for live models of tests/hf_families.py (test_live.py, test_pt2_decoding.py).

`hf_greedy` is transformers' greedy generate (plain or assisted) of MAX_NEW tokens from PROMPT (an encoder-decoder:
from SOURCE), `_inputs` the same input for speculant, `_start` the decoder's first tokens, and `two_token_law` the
exact joint law of the first two generated tokens from transformers' logits (`hf_next_logits`), standardized by
tests/reference.py.
"""

import torch

import hf_families
import reference

PROMPT = [1, 5, 9]
SOURCE = [4, 8, 15, 16, 23, 42]  # the encoder-decoders' input
MAX_NEW = 20


def _inputs(family: str) -> dict:
    return {"encoder_input_ids": SOURCE} if hf_families.is_encoder_decoder(family) else {"prompt_ids": PROMPT}


def hf_greedy(model, family: str, eos=None, assistant=None) -> list[int]:
    """transformers' own greedy generation (plain, or assisted by `assistant`), new tokens only."""
    kwargs = dict(do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=0, num_beams=1,
                  top_k=None, top_p=None, temperature=None, assistant_model=assistant)
    if assistant is not None:  # a fixed draft length: transformers' default schedule changes it as it goes
        kwargs["num_assistant_tokens"] = 4
        kwargs["num_assistant_tokens_schedule"] = "constant"
    ids = torch.tensor([SOURCE if hf_families.is_encoder_decoder(family) else PROMPT])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    start = 1 if hf_families.is_encoder_decoder(family) else ids.size(1)  # after the decoder's start token
    return out[0, start:].tolist()


def hf_next_logits(model, family: str, prefixes: torch.Tensor) -> torch.Tensor:
    """transformers' next-token logits [N, V] after each row of prefixes [N, T] (decoder tokens for
    encoder-decoders)."""
    with torch.no_grad():
        if hf_families.is_encoder_decoder(family):
            source = torch.tensor([SOURCE]).expand(prefixes.size(0), -1)
            return model(input_ids=source, decoder_input_ids=prefixes).logits[:, -1]
        return model(prefixes).logits[:, -1]


def two_token_law(model, family: str, start: list[int], temperature: float, top_k: int) -> torch.Tensor:
    """The target's exact joint law of the first two generated tokens [V, V], from transformers' logits."""
    def law(logits):
        return reference.standardize(logits.double(), temperature=temperature, top_k=top_k, top_p=1.0)

    prefix = torch.tensor([start])
    first = law(hf_next_logits(model, family, prefix))[0]  # [V]
    vocab = first.numel()
    extended = torch.cat([prefix.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # [V, T + 1]
    return first[:, None] * law(hf_next_logits(model, family, extended))  # [V, V]


def _start(model, family: str) -> list[int]:
    return [model.generation_config.decoder_start_token_id] if hf_families.is_encoder_decoder(family) else PROMPT
