"""Live transformers models (speculant.load(model)): every family of tests/support/hf_families.py decodes as
transformers does, through the C++ engine with the model's forward called back in Python.

* Greedy: plain and speculative decoding (γ ∈ {1, 4}) give transformers' own `generate(do_sample=False)` output
  token for token, and so does transformers' assisted generation with the same draft (checked here too, so that
  the comparison is with both of transformers' paths), with and without an EOS stop; the same for a draft of
  another family than its target, and for token trees of every family but Bloom and BART (sliding windows,
  attention chunks, eager attention and T5 included).
* Sampling: the joint law of the first two tokens, sampled by speculative decoding, against the target's exact
  law from transformers' logits. Pearson chi-square at SIGNIFICANCE = 1e-3 per test: 22 tests (1,000 samples
  each; a bf16 pair, T5 with a token tree and two token trees past a sliding window or an attention chunk among
  them), so a correct engine fails one by chance with probability at most 2.2% for a fresh draw of seeds; the
  seeds are fixed.
* Refusals, each with its message: a recurrent model, a model in training mode, a model without an LM head, a
  vocabulary mismatch (and the exact padding that resolves it), a missing CUDA device.
"""

import numpy as np
import pytest
import torch
import transformers

from support import hf_families
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.live_reference import MAX_NEW, PROMPT, SOURCE, first_tokens, hf_greedy, speculant_inputs, two_token_law

TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2])

N_SAMPLES = 1000
FAMILIES = sorted(hf_families.FAMILIES)
# families with tree calls: all but bloom (ALiBi: its forward takes no positions) and bart (learned positions),
# both refused by name in tests/test_tree_decoding.py
TREE_FAMILIES = [family for family in FAMILIES if family not in ("bloom", "bart")]
LONG_PROMPT = [1, 5, 9, 14, 3, 27, 8, 40, 11, 6, 33, 19]  # longer than hf_families.WINDOW
TREE_LAW_FAMILIES = ["gemma2", "llama4", "t5"]


@pytest.fixture(scope="module")
def zoo():
    """family -> (target, draft): transformers models, the draft a noisy copy of the target."""
    out = {}
    for family in FAMILIES:
        target = hf_families.make(family, seed=10)
        # 4x (T5: 20x) the noise that gives alpha about 0.9 at T = 1: greedy drafts are then kept often, not always
        noise = (20 if family == "t5" else 4) * hf_families.NOISE[family]
        out[family] = (target, hf_families.drafted(target, noise=noise, seed=11))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_transformers_plain_and_assisted(zoo, family):
    model, draft_model = zoo[family]
    expected = hf_greedy(model, family)
    assert len(expected) == MAX_NEW and len(set(expected)) > 3  # a varied continuation
    try:
        assert hf_greedy(model, family, assistant=draft_model) == expected
    except RuntimeError as error:
        # transformers' own assisted generate (the peer checked here, not speculant) breaks on Gemma 3's and Llama
        # 4's sliding / chunked caches up to 5.17 ("The size of tensor a (9) must match the size of tensor b (8)");
        # 5.23 runs them
        if TRANSFORMERS >= (5, 23) or "must match the size of tensor" not in str(error):
            raise
    eos = expected[MAX_NEW // 2]  # a token transformers emits mid-way: the stop must come at the same place
    expected_eos = hf_greedy(model, family, eos=eos)
    assert expected_eos == expected[:expected.index(eos) + 1]

    target, draft = speculant.load(model), speculant.load(draft_model)
    assert target.form == "live" and target.vocab_size == hf_families.VOCAB
    greedy = speculant.generate(target, max_new_tokens=MAX_NEW, temperature=0, **speculant_inputs(family))
    assert greedy.tokens == expected
    accepted = drafted = 0
    for gamma in (1, 4):
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0)
        result = decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(family))
        assert result.tokens == expected, f"gamma={gamma}"
        accepted += result.stats.accepted_tokens
        drafted += result.stats.drafted_tokens
        stopped = decoder.generate(max_new_tokens=MAX_NEW, eos_token_id=eos, **speculant_inputs(family))
        assert stopped.tokens == expected_eos, f"gamma={gamma} with eos"
    assert 0 < accepted < drafted  # both paths of Algorithm 1: kept drafts and corrections


@pytest.mark.parametrize("family", TREE_FAMILIES)
def test_greedy_trees_equal_transformers(zoo, family):
    """Token trees (one target call per tree: a 4-D ancestor mask, positions by depth; speculant/models/layer_masks.py)
    for every family but Bloom and BART: transformers' greedy output token for token, alone and in a batch (T5:
    each row over its own source, its keys at their ranks on each query's path). Sliding windows (mistral; gemma2
    and gemma3 beside full layers, a mask per layer type; gemma2's eager attention an additive mask) and
    llama4's attention chunks bite within MAX_NEW tokens, so a tree mask without them fails."""
    model, draft_model = zoo[family]
    expected = hf_greedy(model, family)
    target, draft = speculant.load(model), speculant.load(draft_model)
    assert target.tree_obstacle == "" and draft.tree_obstacle == ""
    if hf_families.is_encoder_decoder(family):
        batch = {"encoder_input_ids": [SOURCE, SOURCE[:2]]}
    else:
        batch = {"prompt_ids": [PROMPT, PROMPT[:1]]}
    for shape in ([2, 2], [3, 1, 1]):
        decoder = speculant.SpeculativeDecoder(target, draft, tree=shape, temperature=0)
        result = decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(family))
        assert result.tokens == expected and result.stats.accepted_tokens > 0, f"tree {shape}"
        rows = decoder.generate(max_new_tokens=MAX_NEW, **batch)
        assert rows[0].tokens == expected, f"tree {shape} in a batch"


@pytest.mark.parametrize("family", TREE_LAW_FAMILIES)
def test_tree_law_matches_transformers(zoo, family):
    """The first two tokens' law with a tree of drafts: for gemma2 and llama4 after a prompt longer than the
    window or chunk, so that both tokens' tree calls depend on it being applied (gemma2: eager, a mask per layer
    type); for T5 over its source, from the decoder's start."""
    model, _ = zoo[family]
    size = N_SAMPLES // 4
    if hf_families.is_encoder_decoder(family):
        start, batch = first_tokens(model, family), {"encoder_input_ids": [SOURCE] * size}
    else:
        start = LONG_PROMPT
        batch = {"prompt_ids": [LONG_PROMPT] * size}
    law = two_token_law(model, family, start, 1.0, 0)
    draft = speculant.load(hf_families.drafted(model, noise=5 * hf_families.NOISE[family], seed=12))
    decoder = speculant.SpeculativeDecoder(speculant.load(model), draft, tree=[3, 2], temperature=1.0)
    samples = np.array([r.tokens for b in range(4)
                        for r in decoder.generate(max_new_tokens=2, seed=3000 + b * size, **batch)])
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_hierarchical_draft_of_live_models_is_greedy_exact(zoo, family):
    """Live models at two levels with a bigram table under the draft (cpp/drafting/hierarchy.h): transformers' greedy
    output token for token, in a batch with a row of its own too."""
    model, draft_model = zoo[family]
    expected = hf_greedy(model, family)
    bigram = speculant.drafters.Bigram.fit(np.random.default_rng(4).integers(0, hf_families.VOCAB, 3000),
                                           hf_families.VOCAB)
    level = speculant.SpeculativeDecoder(draft_model, bigram, gamma=2, temperature=0)
    decoder = speculant.SpeculativeDecoder(model, level, gamma=3, temperature=0)
    result = decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(family))
    assert result.tokens == expected and result.levels[0].target_calls > 0


@pytest.mark.parametrize("target_family, draft_family", hf_families.CROSS_FAMILY)
def test_draft_of_another_family(zoo, target_family, draft_family):
    """A target and a draft of different architectures that share the vocabulary, passed as transformers
    objects straight to the decoder."""
    model, _ = zoo[target_family]
    other, _ = zoo[draft_family]
    expected = hf_greedy(model, target_family)
    decoder = speculant.SpeculativeDecoder(model, other, gamma=3, temperature=0)
    assert decoder.generate(max_new_tokens=MAX_NEW, **speculant_inputs(target_family)).tokens == expected


def _law_pvalue(model, family, target, draft, temperature=1.0, top_k=0) -> float:
    start = first_tokens(model, family)
    law = two_token_law(model, family, start, temperature, top_k)
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=temperature, top_k=top_k)
    extra = {"encoder_input_ids": SOURCE} if hf_families.is_encoder_decoder(family) else {}
    samples = np.array([decoder.generate(start, max_new_tokens=2, seed=2000 + i, **extra).tokens
                        for i in range(N_SAMPLES)])
    return chi_square_pvalue(law, samples)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_token_law_matches_transformers(zoo, family):
    model, draft_model = zoo[family]
    # the draft's noise is larger here so that rejections (the residual) carry real mass
    draft = speculant.load(hf_families.drafted(model, noise=5 * hf_families.NOISE[family], seed=12))
    pvalue = _law_pvalue(model, family, speculant.load(model), draft, temperature=1.0)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


@pytest.mark.parametrize("target_family, draft_family", hf_families.CROSS_FAMILY[:2])
def test_two_token_law_with_a_draft_of_another_family(zoo, target_family, draft_family):
    model, _ = zoo[target_family]
    pvalue = _law_pvalue(model, target_family, speculant.load(model), speculant.load(zoo[draft_family][0]),
                         temperature=0.8, top_k=10)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_two_token_law_detects_a_different_model(zoo):
    """Power: plain sampling from a model whose weights differ (noise 0.05) is rejected by the same test."""
    model, _ = zoo["qwen2"]
    other = speculant.load(hf_families.drafted(model, noise=0.05, seed=13))
    law = two_token_law(model, "qwen2", PROMPT, 1.0, 0)
    samples = np.array([speculant.generate(other, PROMPT, max_new_tokens=2, seed=2000 + i).tokens
                        for i in range(N_SAMPLES)])
    assert chi_square_pvalue(law, samples) < SIGNIFICANCE


@pytest.mark.parametrize("family", ["qwen3", "gemma3_vlm"])
def test_save_pretrained_directory_loads_live(zoo, tmp_path, family):
    """A save_pretrained directory loads as its transformers class (a vision-language one for gemma3_vlm, its
    vocabulary, positions and EOS read from the text config)."""
    model, _ = zoo[family]
    model.save_pretrained(tmp_path / family)
    loaded = speculant.load(tmp_path / family)
    assert loaded.form == "live" and loaded.metadata["architecture"] == hf_families.CLASSES[family]
    assert loaded.eos_token_id == hf_families.EOS and loaded.vocab_size == hf_families.VOCAB
    assert loaded.metadata["max_length"] == model.config.get_text_config().max_position_embeddings
    same = speculant.generate(loaded, PROMPT, max_new_tokens=MAX_NEW, temperature=0).tokens
    assert same == hf_greedy(model, family)


def test_bfloat16_model_decodes_as_transformers(zoo):
    """A model in bf16, as it is: plain greedy equals transformers' (both feed one token per call); speculative
    greedy runs and its sampling math is float32."""
    model = hf_families.make("llama", seed=10).to(torch.bfloat16)
    target = speculant.load(model)
    assert target.metadata["dtype"] == "bfloat16"
    expected = hf_greedy(model, "llama")
    assert speculant.generate(target, PROMPT, max_new_tokens=MAX_NEW, temperature=0).tokens == expected
    decoder = speculant.SpeculativeDecoder(target, speculant.load(hf_families.drafted(model, 0.003, 11)),
                                           gamma=3, temperature=1.0)
    assert len(decoder.generate(PROMPT, max_new_tokens=MAX_NEW, seed=0).tokens) == MAX_NEW


def test_two_token_law_of_a_bfloat16_pair(zoo):
    """Half precision keeps the law exact: a bf16 target and draft, the sampling math in float32, against the
    law computed from the bf16 target's own logits."""
    model = hf_families.make("qwen2", seed=10).to(torch.bfloat16)
    draft = hf_families.drafted(model, noise=5 * hf_families.NOISE["qwen2"], seed=12)
    pvalue = _law_pvalue(model, "qwen2", speculant.load(model), speculant.load(draft), temperature=1.0)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_recurrent_model_is_refused():
    with pytest.raises(ValueError, match="MambaForCausalLM keeps recurrent or state-space state .* cannot be "
                                         "rolled back"):
        speculant.load(hf_families.make("mamba"))


def test_training_mode_is_refused():
    model = hf_families.make("gpt2").train()
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel is in training mode .* call model.eval\(\)"):
        speculant.load(model)


def test_model_without_lm_head_is_refused():
    model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1,
                                                           n_head=2)).eval()
    with pytest.raises(ValueError, match="GPT2Model has no LM head"):
        speculant.load(model)
    with pytest.raises(ValueError, match="^target: model: GPT2Model has no LM head"):
        speculant.SpeculativeDecoder(model, model, gamma=2)


def test_vocabulary_mismatch_names_sizes_and_the_padding_fix(zoo):
    target_model, _ = zoo["llama"]
    wide = hf_families.make("qwen2", seed=3, vocab_size=80)
    with pytest.raises(ValueError, match=r"target vocab_size = 64, draft vocab_size = 80\. .*pad their LM heads "
                                         r".*vocab_size=<the larger size>"):
        speculant.SpeculativeDecoder(target_model, wide, gamma=2)
    # padded with -inf up to 80, the target's law is unchanged: its ids 64..79 get probability 0 and any draft
    # of them is rejected. Greedy output equals the target's own.
    target = speculant.load(target_model, vocab_size=80)
    assert target.vocab_size == 80
    decoder = speculant.SpeculativeDecoder(target, wide, gamma=3, temperature=0)
    assert decoder.generate(PROMPT, max_new_tokens=MAX_NEW).tokens == hf_greedy(target_model, "llama")
    with pytest.raises(ValueError, match="vocab_size must be an int >= the model's own vocabulary"):
        speculant.load(target_model, vocab_size=32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_cuda_without_a_gpu_says_so(zoo):
    with pytest.raises(ValueError, match="device='cuda': no CUDA device is available"):
        speculant.load(zoo["gpt2"][0], device="cuda")
