"""References that decoding must equal token for token: tiny GPT models with a pure-torch greedy loop, and
transformers' beam search.

Greedy: `tiny_gpt` (a TinyGPT with sharpened logits, speculant.tiny_gpt), `perturbed` (a noisy copy: a draft that
agrees often), TARGET (the greedy tests' target, built at import), `scripted` (either TorchScript form) and
`torch_greedy` (greedy decoding with the training-form forward, asserting a top-2 gap of MIN_GAP at every step), with
the token-tree tests' PROMPTS, NEW tokens and GIVEN tree. Beams: `transformers_beams` (transformers'
generate(num_beams=w)), `run` (speculant's plain or speculative beam search with the same settings, MAX_NEW tokens),
`assert_equal_beams` (sequences token for token, scores to 1e-4) and the OPTIONS they are compared over.
"""

import pytest
import torch

import speculant
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached, script_plain

VOCAB = 48
MAX_LENGTH = 64
MIN_GAP = 1e-3
TARGET_CONFIG = TinyGPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=32, max_length=MAX_LENGTH)


def tiny_gpt(config: TinyGPTConfig, seed: int) -> TinyGPT:
    """A randomly initialised TinyGPT with sharpened, context-dependent logits.

    GPT-2 initialisation (std 0.02, tied embeddings) makes a random model repeat its last token with
    nearly uniform logits. Scaling the blocks' weights (x30), the embeddings (x10) and the final
    LayerNorm gain (x3) lets the context drive the output and spreads the logits (top-2 gaps of a few
    1e-2), so greedy decoding is varied and well defined in float32.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyGPT(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "emb" not in name:
                p.mul_(30.0)
        model.tok_emb.weight.mul_(10.0)
        model.pos_emb.weight.mul_(10.0)
        model.ln_f.weight.mul_(3.0)
    return model.eval()


def perturbed(model: TinyGPT, seed: int, scale: float) -> TinyGPT:
    """Same architecture and weights plus Gaussian noise: a draft that agrees with the target often."""
    with torch.random.fork_rng(devices=[]):  # TinyGPT's own initialisation draws from the global RNG
        clone = TinyGPT(model.config)
    clone.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp_min(1e-3))
    return clone.eval()


TARGET = tiny_gpt(TARGET_CONFIG, seed=1)


def scripted(model: TinyGPT, form: str):
    return script_cached(model) if form == "cached" else script_plain(model)


def torch_greedy(model: TinyGPT, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with the training-form forward over the whole sequence at every step."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]))[0, -1]  # [V]
            top2 = logits.topk(2).values
            assert top2[0] - top2[1] >= MIN_GAP, "near-tie in the reference: pick another seed"
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


PROMPTS = [[7], [1, 2, 3, 4, 5], [40, 3, 3, 9, 0, 11, 47, 2, 30, 5, 8]]
NEW = 30
# a given tree (breadth-first parents, Sequoia-like: the root's first child has 3 children and a chain below it)
GIVEN = [-1, 0, 0, 0, 1, 1, 1, 2, 4, 8]
MAX_NEW = 12
# (length_penalty, early_stopping, eos_token_id): EOS sets with tokens that the tiny GPT-2, Llama and T5 emit
# within MAX_NEW tokens, several per set (Llama 3 style), and one that never comes
OPTIONS = [(1.0, False, [37, 28, 58]), (-0.5, True, [44, 62, 19, 52]), (2.0, "never", [51, 23, 12]),
           (1.0, True, [38, 29, 17]), (0.0, False, None), (1.0, False, [2])]


def transformers_beams(model, prompt, w, length_penalty, early_stopping, eos):
    skip = 1 if model.config.is_encoder_decoder else len(prompt)  # the decoder start, or the prompt
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, num_beams=w, num_return_sequences=w, max_new_tokens=MAX_NEW,
                             eos_token_id=eos, pad_token_id=0, length_penalty=length_penalty,
                             early_stopping=early_stopping, return_dict_in_generate=True, output_scores=True,
                             top_k=None, top_p=None, temperature=None)
    return [row[skip:].tolist() for row in out.sequences], out.sequences_scores.tolist()


def assert_equal_beams(result, expected, eos, label):
    sequences, scores = expected
    assert len(result.sequences) == len(sequences), label
    # transformers pads a shorter finished beam with pad_token_id, or eos_token_id[0] where the pad id is 0
    fill = {0} | ({eos[0]} if eos else set())
    for i, (ours, theirs) in enumerate(zip(result.sequences, sequences)):
        assert ours == theirs[:len(ours)] and set(theirs[len(ours):]) <= fill, f"{label}: beam {i}"
        assert result.scores[i] == pytest.approx(scores[i], abs=1e-4), f"{label}: score {i}"


def run(target, draft, prompt, w, u, gamma, length_penalty, early_stopping, eos):
    options = dict(max_new_tokens=MAX_NEW, num_beams=w, num_return_sequences=w, length_penalty=length_penalty,
                   early_stopping=early_stopping, eos_token_id=eos)
    options["encoder_input_ids" if target.encoder_decoder else "prompt_ids"] = prompt
    if gamma == 0:
        return speculant.generate(target, **options)
    return speculant.SpeculativeDecoder(target, draft, gamma=gamma).generate(draft_beams=u, **options)
