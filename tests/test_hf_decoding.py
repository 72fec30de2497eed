"""Exported transformers models decode exactly as transformers does.

* Greedy: speculative decoding (γ ∈ {1, 4, 8}) gives the target's own `model.generate(do_sample=False)`
  output token for token, for GPT-2, Llama and T5, several prompts, with and without an EOS stop.
* Sampling: the joint law of the first two generated tokens, sampled through speculative decoding, matches
  the target's law computed from transformers' logits (standardized by the pure-torch reference: temperature,
  then top-k, then top-p). Pearson chi-square with cells of expected count < 5 pooled, at SIGNIFICANCE = 1e-3
  per test: 16 tests, so a correct engine fails one of them by chance with probability at most 1.6% for a
  fresh draw of seeds; the seeds are fixed, so the outcome is deterministic.
* Token trees (decoder-only exports): greedy trees give transformers' greedy output token for token, and the
  first two tokens' law with trees of siblings drawn without replacement and of the draft's top ones (the
  other way, with replacement, runs on tables in test_tree_decoding.py) is the target's (4 of the 16 tests).
* Hierarchical drafts (a bigram table drafting for the draft model, which drafts for the target): greedy output
  token for token and the first two tokens' law, for every architecture (3 of the 16 tests).
"""

import numpy as np
import pytest

from support import hf_models
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.hf_models import MAX_NEW, PROMPTS, SOURCES, hf_greedy, speculant_inputs
from support.live_reference import two_token_law

N_SAMPLES = 3000
ARCHS = ["gpt2", "llama", "t5"]
NOISE = {"gpt2": 0.005, "llama": 0.006, "t5": 0.005}  # the drafts' weight noise: alpha about 0.95 at T = 1


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """arch -> (transformers target, loaded target, loaded draft); the draft is the target with noise on its
    weights, so that it agrees often but not always."""
    out = {}
    root = tmp_path_factory.mktemp("hf_pairs")
    for arch in ARCHS:
        target = hf_models.make(arch, seed=10)
        speculant.export(target, root / f"{arch}_target.pt")
        speculant.export(hf_models.drafted(target, noise=NOISE[arch], seed=11), root / f"{arch}_draft.pt")
        out[arch] = (target, speculant.load(root / f"{arch}_target.pt"), speculant.load(root / f"{arch}_draft.pt"))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_equals_transformers_generate(pairs, arch, index):
    model, target, draft = pairs[arch]
    expected = hf_greedy(model, arch, index, eos=None)
    assert len(expected) == MAX_NEW
    # an EOS that transformers emits mid-way: the stop must happen at the same token
    eos = expected[MAX_NEW // 2]
    expected_eos = hf_greedy(model, arch, index, eos=eos)
    assert expected_eos == expected[:expected.index(eos) + 1]
    plain = speculant.generate(target, max_new_tokens=MAX_NEW, temperature=0, **speculant_inputs(arch, index))
    assert plain.tokens == expected
    for gamma in (1, 4, 8):
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0)
        result = decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(arch, index))
        assert result.tokens == expected, f"gamma={gamma}"
        stopped = decoder.generate(max_new_tokens=MAX_NEW, eos_token_id=eos, **speculant_inputs(arch, index))
        assert stopped.tokens == expected_eos, f"gamma={gamma} with eos"


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_are_both_accepted_and_rejected(pairs, arch):
    """The greedy tests above exercise both paths of Algorithm 1: accepted drafts and corrections."""
    _, target, draft = pairs[arch]
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=4, temperature=0)
    stats = [decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(arch, i)).stats for i in range(len(PROMPTS))]
    accepted = sum(s.accepted_tokens for s in stats)
    assert 0 < accepted < sum(s.drafted_tokens for s in stats)


SETTINGS = [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.0, 0, 0.8)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_two_token_law_matches_transformers(pairs, arch, temperature, top_k, top_p):
    model, target, draft = pairs[arch]
    start = [0] if arch == "t5" else PROMPTS[0]
    source = SOURCES[0]
    law = two_token_law(model, arch, start, temperature, top_k, top_p, source=source)
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=3, temperature=temperature, top_k=top_k,
                                           top_p=top_p)
    extra = {"encoder_input_ids": source} if arch == "t5" else {}
    samples = np.array([decoder.generate(start, max_new_tokens=2, seed=1000 + i, **extra).tokens
                        for i in range(N_SAMPLES)])
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


TREE_ARCHS = ["gpt2", "llama"]  # the decoder-only exports have the tree calls (export/cached.py)


@pytest.mark.parametrize("arch", TREE_ARCHS)
def test_greedy_trees_equal_transformers_generate(pairs, arch):
    model, target, draft = pairs[arch]
    expected = [hf_greedy(model, arch, index, eos=None) for index in range(len(PROMPTS))]
    for shape in ([2, 2], [3, 1, 1], [1, 4]):
        decoder = speculant.SpeculativeDecoder(target, draft, tree=shape, temperature=0)
        for index, prompt in enumerate(PROMPTS):
            assert decoder.generate(prompt, max_new_tokens=MAX_NEW).tokens == expected[index], f"tree {shape}"
        batch = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
        assert [r.tokens for r in batch] == expected, f"tree {shape}, one batch"


@pytest.mark.parametrize("arch", TREE_ARCHS)
@pytest.mark.parametrize("siblings", ["without_replacement", "top"])
def test_tree_two_token_law_matches_transformers(pairs, arch, siblings):
    """Three tokens are generated, so that the first iteration verifies the whole tree [3, 2]; the first two
    are tested (rows of one batch, each with its own seed)."""
    model, target, draft = pairs[arch]
    law = two_token_law(model, arch, PROMPTS[0], 1.0, 0, source=SOURCES[0])
    decoder = speculant.SpeculativeDecoder(target, draft, tree=[3, 2], siblings=siblings, temperature=1.0)
    batch = 500
    samples = np.array([r.tokens[:2] for b in range(N_SAMPLES // batch)
                        for r in decoder.generate([PROMPTS[0]] * batch, max_new_tokens=3, seed=5000 + b * batch)])
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


@pytest.mark.parametrize("arch", ARCHS)
def test_hierarchical_draft_is_greedy_exact_and_keeps_the_law(pairs, arch):
    """A three-level stack on the exports: the target, its draft model, and a bigram table drafting for the draft
    model (cpp/drafting/hierarchy.h). Greedy: transformers' output token for token; T = 1: the first two tokens' law."""
    model, target, draft = pairs[arch]
    vocab = target.vocab_size
    bigram = speculant.drafters.Bigram.fit(np.random.default_rng(3).integers(0, vocab, 4000), vocab)
    decoder = speculant.SpeculativeDecoder(target, speculant.SpeculativeDecoder(draft, bigram, gamma=2,
                                                                                temperature=0), gamma=3, temperature=0)
    for index in range(len(PROMPTS)):
        assert decoder.generate(**speculant_inputs(arch, index), max_new_tokens=MAX_NEW).tokens == hf_greedy(
            model, arch, index, eos=None)
    start = [0] if arch == "t5" else PROMPTS[0]
    law = two_token_law(model, arch, start, 1.0, 0, source=SOURCES[0])
    sampled = decoder.with_sampling(1.0)
    batch = 500
    extra = {"encoder_input_ids": [SOURCES[0]] * batch} if arch == "t5" else {}
    samples = np.array([r.tokens for b in range(N_SAMPLES // batch)
                        for r in sampled.generate([start] * batch, max_new_tokens=2, seed=7000 + b * batch, **extra)])
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_two_token_law_detects_a_different_model(pairs, tmp_path):
    """Power: tokens from a model whose weights differ a little more (noise 0.05, alpha about 0.7) are
    rejected by the same test against the target's law."""
    model, _, _ = pairs["gpt2"]
    speculant.export(hf_models.drafted(model, noise=0.05, seed=12), tmp_path / "other.pt")
    other = speculant.load(tmp_path / "other.pt")
    law = two_token_law(model, "gpt2", PROMPTS[0], 1.0, 0)
    samples = np.array([speculant.generate(other, PROMPTS[0], max_new_tokens=2, seed=1000 + i).tokens
                        for i in range(N_SAMPLES)])
    assert chi_square_pvalue(law, samples) < SIGNIFICANCE
