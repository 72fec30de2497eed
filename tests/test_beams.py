"""Beam search, plain and speculative (A.4; cpp/loop/beam.h), equals transformers' beam search.

* Exports (GPT-2, Llama, T5: a prompt is its source, the decoder starting at decoder_start_token_id) and live
  transformers objects of every decoder-only family with tree calls: the
  sequences and scores of ``generate(num_beams=w)``, with a draft (several w, draft_beams u and gamma) and
  without, equal transformers' ``generate(num_beams=w, do_sample=False, num_return_sequences=w)`` token for
  token (its padding aside) and score for score (to 1e-4), over length penalties, every early_stopping value,
  EOS sets that end beams early, and prompts.
* The draft decides how many steps a target call serves, never the result: the target as its own draft keeps
  every level (gamma + 1 steps per call), and the counts add up.
* Batches, the model's max_length, and every refusal by name.
"""

import itertools

import pytest

from support import hf_families
from support import hf_models
import speculant
from support.decoding_references import MAX_NEW, OPTIONS, TARGET, assert_equal_beams, run, transformers_beams
from speculant.tiny_gpt import script_plain

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

PROMPTS = [[1, 5, 9], [7], [3, 3, 12, 40, 8, 21, 2, 17]]
# (num_beams w, draft_beams u, gamma): gamma 0 is plain beam search (speculant.generate)
SEARCHES = [(2, None, 0), (2, None, 3), (2, 4, 2), (4, None, 4), (3, 5, 1)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """arch -> (transformers target, exported target, exported draft: the target with noise on its weights,
    the exported target loaded again: a perfect draft)."""
    root = tmp_path_factory.mktemp("beams")
    out = {}
    for arch in ("gpt2", "llama", "t5"):
        model = hf_models.make(arch, seed=10)
        speculant.export(model, root / f"{arch}_target.pt", max_length=96)
        speculant.export(hf_models.drafted(model, noise=0.005, seed=11), root / f"{arch}_draft.pt", max_length=96)
        out[arch] = (model, speculant.load(root / f"{arch}_target.pt"), speculant.load(root / f"{arch}_draft.pt"),
                     speculant.load(root / f"{arch}_target.pt"))
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5"])
@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: f"w{s[0]}-u{s[1]}-g{s[2]}")
def test_exports_equal_transformers_beam_search(exports, arch, search):
    model, target, draft, _ = exports[arch]
    w, u, gamma = search
    finished_early = 0
    for prompt, (length_penalty, early_stopping, eos) in itertools.product(PROMPTS, OPTIONS):
        expected = transformers_beams(model, prompt, w, length_penalty, early_stopping, eos)
        result = run(target, draft, prompt, w, u, gamma, length_penalty, early_stopping, eos)
        assert_equal_beams(result, expected, eos, f"{arch} {prompt} {length_penalty} {early_stopping} {eos}")
        finished_early += any(len(s) < MAX_NEW for s in result.sequences)
        assert result.stats.steps == sum(result.stats.steps_per_call) <= MAX_NEW
        assert result.stats.target_calls == len(result.stats.steps_per_call)
        assert min(result.stats.steps_per_call) >= 1
        if gamma == 0:
            assert result.stats.draft_calls == 0 and max(result.stats.steps_per_call) == 1
    assert finished_early >= 3, "the EOS sets must end some beams early, or EOS handling goes untested"


def test_drafts_serve_several_steps_per_call(exports):
    """The target as its own draft (draft_beams = num_beams): every level holds the target's beams, so each
    call but the last serves gamma + 1 steps. A noisy draft serves more than one step per call on average."""
    _, target, draft, same = exports["gpt2"]
    for gamma in (2, 4):
        result = speculant.SpeculativeDecoder(target, same, gamma=gamma).generate(
            PROMPTS[0], max_new_tokens=MAX_NEW, num_beams=3)
        calls = result.stats.steps_per_call
        assert list(calls[:-1]) == [gamma + 1] * (len(calls) - 1), calls
        assert result.sequences == speculant.generate(target, PROMPTS[0], max_new_tokens=MAX_NEW,
                                                      num_beams=3).sequences
        assert result.stats.target_tokens < 3 * MAX_NEW + 3 * gamma * len(calls)
    noisy = speculant.SpeculativeDecoder(target, draft, gamma=3).generate(PROMPTS, max_new_tokens=MAX_NEW,
                                                                          num_beams=2)
    assert sum(r.stats.steps for r in noisy) / sum(r.stats.target_calls for r in noisy) > 1.2


@pytest.fixture(scope="module")
def live_families():
    """family -> (transformers model, live target, live draft) for every decoder-only family with tree calls."""
    out = {}
    for family in hf_families.FAMILIES:
        if family in hf_families.ENCODER_DECODER:
            continue
        model = hf_families.make(family, seed=10)
        target = speculant.load(model)
        if target.tree_obstacle:
            continue
        out[family] = model, target, speculant.load(hf_families.drafted(model, hf_families.NOISE[family], seed=11))
    assert {"gpt2", "llama", "qwen2"} <= set(out), sorted(out)
    return out


def test_live_models_equal_transformers_beam_search(live_families):
    for family, (model, target, draft) in live_families.items():
        for prompt, (w, u, gamma), (length_penalty, early_stopping, eos) in [
                (PROMPTS[0], (2, None, 3), OPTIONS[0]), (PROMPTS[2], (3, 4, 2), OPTIONS[1]),
                (PROMPTS[1], (2, None, 0), OPTIONS[2])]:
            expected = transformers_beams(model, prompt, w, length_penalty, early_stopping, eos)
            result = run(target, draft, prompt, w, u, gamma, length_penalty, early_stopping, eos)
            assert_equal_beams(result, expected, eos, f"{family} w={w} u={u} gamma={gamma}")


def test_live_encoder_decoder_equals_transformers_beam_search():
    """A live T5 pair: its tree calls carry the relative position bias of each node's own path
    (relative_trees.py); every search and option set against transformers' beam search."""
    model = hf_models.make("t5", seed=10)
    target = speculant.load(model)
    draft = speculant.load(hf_models.drafted(model, noise=0.005, seed=11))
    assert target.beam_obstacle == draft.beam_obstacle == ""
    for (w, u, gamma), prompt, (length_penalty, early_stopping, eos) in zip(
            SEARCHES, itertools.cycle(PROMPTS), [OPTIONS[0], OPTIONS[1], OPTIONS[2], OPTIONS[3], OPTIONS[5]]):
        expected = transformers_beams(model, prompt, w, length_penalty, early_stopping, eos)
        result = run(target, draft, prompt, w, u, gamma, length_penalty, early_stopping, eos)
        assert_equal_beams(result, expected, eos, f"live t5 w={w} u={u} gamma={gamma}")
        if gamma:
            assert result.stats.draft_calls > 0


def test_batches_are_rows_searched_alone(exports):
    _, target, draft, _ = exports["llama"]
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2)
    batch = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW, num_beams=2, num_return_sequences=2, eos_token_id=9)
    assert isinstance(batch, list) and len(batch) == len(PROMPTS)
    for prompt, result in zip(PROMPTS, batch):
        alone = decoder.generate(prompt, max_new_tokens=MAX_NEW, num_beams=2, num_return_sequences=2,
                                 eos_token_id=9)
        assert (result.sequences, result.scores) == (alone.sequences, alone.scores)
        assert result.tokens == result.sequences[0] and result.text is None


def test_a_search_beyond_max_length_is_refused(tmp_path):
    speculant.export(hf_models.make("gpt2", seed=10), tmp_path / "short.pt", max_length=16)
    short = speculant.load(tmp_path / "short.pt")
    with pytest.raises(ValueError, match="max_length = 16"):
        speculant.generate(short, PROMPTS[0], max_new_tokens=12, num_beams=4)


def test_refusals_name_the_parameter(exports, tmp_path):
    _, target, draft, _ = exports["gpt2"]
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2)
    cases = [
        (dict(num_beams=2, do_sample=True), "do_sample=True does not apply to beam search"),
        (dict(num_beams=2, temperature=0.5), "temperature=0.5 does not apply"),
        (dict(num_beams=2, seed=3), "seed=3 does not apply"),
        (dict(num_beams=2, gamma_policy="heuristic"), "gamma_policy='heuristic' does not apply"),
        (dict(draft_beams=3), "draft_beams=3 applies to beam search: pass num_beams >= 2"),
        (dict(length_penalty=2.0), "length_penalty=2.0 applies to beam search"),
        (dict(num_beams=3, draft_beams=2), r"draft_beams must be at least num_beams = 3 .*got 2"),
        (dict(num_beams=3, draft_beams=2.5), "draft_beams must be an integer >= 3"),
        (dict(num_beams=2, max_length=2), r"max_length counts the prompt.* length 3 \+ 1, got 2"),
        (dict(num_beams=2, early_stopping="sometimes"), "early_stopping must be False, True or 'never'"),
        (dict(num_beams=2, num_return_sequences=3), "num_return_sequences must be <= num_beams = 2"),
        (dict(num_beams=2, length_penalty=float("inf")), "length_penalty must be a finite real number"),
        (dict(num_beams=True), "num_beams must be an integer >= 1"),
        (dict(num_beams=2, max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    ]
    for kwargs, message in cases:
        kwargs = {**({} if "max_length" in kwargs else {"max_new_tokens": 4}), **kwargs}
        with pytest.raises(ValueError, match=message):
            decoder.generate(PROMPTS[0], **kwargs)
    found = decoder.generate(PROMPTS[0], max_length=len(PROMPTS[0]) + 4, num_beams=2)
    assert found.sequences == decoder.generate(PROMPTS[0], max_new_tokens=4, num_beams=2).sequences
    assert repr(found.stats).startswith(f"BeamSearch(steps={found.stats.steps}, target_calls=")  # not <... at 0x>
    with pytest.raises(ValueError, match="needs a draft model, not a Bigram"):
        speculant.SpeculativeDecoder(target, speculant.drafters.Bigram.fit([PROMPTS[2]], vocab_size=64)).generate(
            PROMPTS[0], max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="neither tree= nor lenience below 1"):
        speculant.SpeculativeDecoder(target, draft, tree=[2, 1]).generate(PROMPTS[0], max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="neither tree= nor lenience below 1"):
        speculant.SpeculativeDecoder(target, draft, lenience=0.5).generate(PROMPTS[0], max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="encoder_input_ids is only for encoder-decoder models"):
        decoder.generate(PROMPTS[0], encoder_input_ids=[4, 8], max_new_tokens=4, num_beams=2)
    _, t5, t5_draft, _ = exports["t5"]
    with pytest.raises(ValueError, match="the target is an encoder-decoder model: pass encoder_input_ids"):
        speculant.generate(t5, [0], max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="tree calls hold one row over one encoded source: they serve beam search"):
        speculant.SpeculativeDecoder(t5, t5_draft, tree=[2])  # one row, one source: beam search only
    t5_model = hf_models.make("t5", seed=0)
    live_t5 = speculant.load(t5_model)
    assert target.beam_obstacle == t5.beam_obstacle == live_t5.beam_obstacle == live_t5.tree_obstacle == ""
    bart = speculant.load(hf_families.make("bart", seed=0))  # learned absolute positions: no tree calls built
    assert "verifies trees only with T5's decoder" in bart.beam_obstacle
    with pytest.raises(ValueError, match="the target \\(live form\\): an encoder-decoder live model verifies trees"):
        speculant.generate(bart, encoder_input_ids=[4, 8], max_new_tokens=4, num_beams=2)
    plain = speculant.load(script_plain(TARGET))  # the forward-only form: no cache to hold beams in
    with pytest.raises(ValueError, match="beam search needs tree calls .* the target \\(plain form\\)"):
        speculant.generate(plain, [1, 2], max_new_tokens=4, num_beams=2)
    other = hf_models.make("gpt2", seed=12, vocab_size=80)
    with pytest.raises(ValueError, match="vocabularies differ"):  # refused when the decoder is built
        speculant.SpeculativeDecoder(target, speculant.load(other), gamma=2)
