"""Temperature 0: speculative decoding is token-for-token plain greedy decoding (the paper's exactness,
argmax case), on tiny GPT models (speculant.tiny_gpt) with random weights.

Notation (paper §2): p = target, q = draft, γ = draft length.

Three references must agree: speculative output, speculant.generate (plain greedy, same engine) and a
pure-torch greedy loop over the training-form TinyGPT (no engine, no cache). Every step of the pure-torch
loop asserts a top-2 logit gap of at least MIN_GAP, so a disagreement can only be an engine bug, never a
float32 near-tie between a batched (cached) and a one-token computation.
"""

import itertools

import pytest
import torch

from support import markov
import speculant
from support.decoding_references import MAX_LENGTH, TARGET, VOCAB, perturbed, scripted, tiny_gpt, torch_greedy
from speculant.tiny_gpt import TinyGPTConfig, script_cached, script_plain

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

MAX_NEW_TOKENS = 40
PROMPTS = [[7], [1, 2, 3, 4, 5], [40, 3, 3, 9, 0, 11, 47, 2, 30, 5, 8]]
GAMMAS = [1, 2, 4, 8]

SMALL_CONFIG = TinyGPTConfig(vocab_size=VOCAB, n_layer=1, n_head=1, d_model=16, max_length=MAX_LENGTH, d_ff=32)

DRAFTS = {
    "small": tiny_gpt(SMALL_CONFIG, seed=2),  # different size, unrelated: many rejections
    "near": perturbed(TARGET, seed=3, scale=0.05),  # same size, correlated: long accepted runs
    "same": TARGET,  # identical weights: everything is accepted (bonus tokens, draft re-feed)
}
FORMS = [("cached", "cached"), ("plain", "plain"), ("cached", "plain"), ("plain", "cached")]


@pytest.fixture(scope="module")
def expected() -> dict[int, list[int]]:
    return {i: torch_greedy(TARGET, prompt, MAX_NEW_TOKENS) for i, prompt in enumerate(PROMPTS)}


@pytest.fixture(scope="module")
def handles():
    """speculant.Model handles, loaded once per (role, model, form); each handle owns its cache."""
    cache: dict[tuple, speculant.Model] = {}

    def get(role: str, name: str, form: str) -> speculant.Model:
        key = (role, name, form)
        if key not in cache:
            model = TARGET if role == "target" else DRAFTS[name]
            cache[key] = speculant.load(scripted(model, form))
        return cache[key]

    return get


@pytest.mark.parametrize("form", ["cached", "plain"])
def test_plain_greedy_equals_torch_loop(form, handles, expected):
    target = handles("target", "target", form)
    assert target.form == form
    for i, prompt in enumerate(PROMPTS):
        result = speculant.generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0)
        assert result.tokens == expected[i], f"prompt {i}"


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("draft_name", list(DRAFTS))
@pytest.mark.parametrize("forms", FORMS, ids=[f"{t}-target-{d}-draft" for t, d in FORMS])
def test_speculative_greedy_equals_plain_greedy(forms, draft_name, gamma, handles, expected):
    target_form, draft_form = forms
    target = handles("target", "target", target_form)
    decoder = speculant.SpeculativeDecoder(target, handles("draft", draft_name, draft_form), gamma=gamma, temperature=0.0)
    for i, prompt in enumerate(PROMPTS):
        result = decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, seed=i)
        assert result.tokens == expected[i], f"prompt {i}"
        plain = speculant.generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0)
        assert result.tokens == plain.tokens
        if draft_name == "same":
            # The draft is the target: every drafted token is accepted, each iteration ends with a bonus.
            assert all(it.accepted == len(it.drafted) and it.bonus for it in result.trace[:-1])
            assert result.stats.acceptance_rate == 1.0
            assert result.stats.alpha == pytest.approx(1.0, abs=1e-5)


def test_drafts_exercise_rejection_and_acceptance(handles):
    """The fixtures above are meaningful: the small draft is often rejected, the near one often accepted."""
    target = handles("target", "target", "cached")
    rates, full_accepts = {}, {}
    for name in ("small", "near"):
        decoder = speculant.SpeculativeDecoder(target, handles("draft", name, "cached"), gamma=4, temperature=0.0)
        stats = [decoder.generate(p, max_new_tokens=MAX_NEW_TOKENS).stats for p in PROMPTS]
        rates[name] = sum(s.accepted_per_position[0] for s in stats) / sum(s.drafted_per_position[0] for s in stats)
        full_accepts[name] = sum(s.accepted_per_position[-1] for s in stats)
    assert rates["small"] < 0.3 and rates["near"] > 0.5, rates
    assert full_accepts["near"] >= 5  # bonus tokens and the draft's re-feed after a full accept


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("forms", FORMS[:3], ids=[f"{t}-target-{d}-draft" for t, d in FORMS[:3]])
def test_greedy_eos_stops_and_is_included(forms, gamma, handles, expected):
    target = handles("target", "target", forms[0])
    for draft_name in ("small", "near"):
        decoder = speculant.SpeculativeDecoder(target, handles("draft", draft_name, forms[1]), gamma=gamma, temperature=0.0)
        for i, prompt in enumerate(PROMPTS):
            full = expected[i]
            for position in (0, 5, 17):
                eos = full[position]
                stop = full.index(eos)  # its first occurrence
                result = decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eos)
                assert result.tokens == full[: stop + 1]
                assert result.stats.new_tokens == stop + 1
                plain = speculant.generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0,
                                           eos_token_id=eos)
                assert plain.tokens == full[: stop + 1]


def test_greedy_with_sampling_filters_is_still_argmax(handles, expected):
    """top_k / top_p never remove the argmax, so they cannot change greedy output."""
    target = handles("target", "target", "cached")
    decoder = speculant.SpeculativeDecoder(target, handles("draft", "near", "cached"), gamma=3, temperature=0.0,
                                           top_k=2, top_p=0.5)
    for i, prompt in enumerate(PROMPTS):
        assert decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS).tokens == expected[i]


def test_greedy_prompt_as_tensor(handles, expected):
    target = handles("target", "target", "cached")
    decoder = speculant.SpeculativeDecoder(target, handles("draft", "small", "cached"), gamma=2, temperature=0.0)
    prompt = PROMPTS[1]
    for ids in (torch.tensor(prompt), torch.tensor([prompt])):
        assert decoder.generate(ids, max_new_tokens=MAX_NEW_TOKENS).tokens == expected[1]


def test_greedy_from_file(tmp_path, expected):
    """Models saved with torch.jit.save and loaded by path behave like the in-memory ones."""
    target_path, draft_path = tmp_path / "target.pt", tmp_path / "draft.pt"
    torch.jit.save(script_cached(TARGET), str(target_path))
    torch.jit.save(script_plain(DRAFTS["near"]), str(draft_path))
    target, draft = speculant.load(target_path), speculant.load(str(draft_path))
    assert (target.form, draft.form) == ("cached", "plain")
    assert target.vocab_size == VOCAB and target.max_length == MAX_LENGTH
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=4, temperature=0.0)
    for i, prompt in enumerate(PROMPTS):
        assert decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS).tokens == expected[i]


@pytest.mark.cuda
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_on_cuda(gamma, expected):
    target = speculant.load(script_cached(TARGET), device="cuda")
    draft = speculant.load(script_plain(DRAFTS["near"]), device="cuda")
    assert target.device.type == "cuda"
    with pytest.warns(RuntimeWarning, match=r"CUDA graphs are off for the draft \(plain form\)"):
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0.0, cuda_graphs="auto")
    assert decoder.shapes == ("graphed", "dynamic")
    for i, prompt in enumerate(PROMPTS):
        assert decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS).tokens == expected[i]
        assert speculant.generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0).tokens == expected[i]


@pytest.mark.parametrize("prompt", [[3, 1], [2]], ids=["prompt2", "prompt1"])
@pytest.mark.parametrize("lenience", [1.0, 0.5, 0.2])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_lenient_greedy_matches_enumeration(gamma, lenience, prompt):
    """Temperature 0 with lenience (A.5, argmax variant: keep draft x when p(x) >= l max p) is
    deterministic; its tokens equal the one-hot law enumerated by tests/support/markov.py with the reference
    verify. Markov tables, V = 4; every context's ratios p(x) / max p stay 1e-4 away from l."""
    for seed in itertools.count(30 + gamma):  # the first table that keeps p(x) / max p away from l
        target, draft = markov.target_and_draft(4, seed, draft_scale=1.5)
        ratios = torch.softmax(target, -1)
        ratios = ratios / ratios.max(-1, keepdim=True).values
        if lenience == 1.0 or ((ratios - lenience).abs() > 1e-4).all():
            break
    n = 9
    law = markov.speculative_law(target, draft, prompt, n, gamma, 0.0, lenience=lenience)
    assert law.max() == 1.0
    want = list(torch.nonzero(law == 1.0)[0].tolist())
    spec = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(target)), speculant.load(markov.cached_model(draft)),
        gamma=gamma, temperature=0.0, lenience=lenience,
    )
    result = spec.generate(prompt, max_new_tokens=n)
    assert result.tokens == want
    plain = speculant.generate(speculant.load(markov.plain_model(target)), prompt, max_new_tokens=n, temperature=0.0)
    # l = 1 is exact greedy; with these tables l < 1 visibly changes the output (the test is not vacuous).
    assert (result.tokens == plain.tokens) == (lenience == 1.0)
