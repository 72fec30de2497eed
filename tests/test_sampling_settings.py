"""speculant.SamplingSettings: the one frozen object of a decoding's sampling settings, checked once when made
(the ranges by the engine's own check), and what the decoder holds, overrides and hands to the engine."""

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch

from support import markov
import speculant
from support.engine_checks import load_pair
from speculant import SamplingSettings, sampling, testing


def test_settings_normalize_their_types_and_are_frozen():
    settings = SamplingSettings(temperature=1, top_k=np.int64(3), top_p=0.9)
    assert settings == SamplingSettings(1.0, 3, 0.9, 1.0)
    assert (type(settings.temperature), type(settings.top_k), type(settings.lenience)) == (float, int, float)
    assert settings.standardization() == (1.0, 3, 0.9)
    assert settings.as_dict() == {"temperature": 1.0, "top_k": 3, "top_p": 0.9, "lenience": 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.temperature = 0.5
    colder = settings.replace(temperature=0.0)
    assert colder.temperature == 0.0 and colder.top_k == 3 and settings.temperature == 1.0


@pytest.mark.parametrize("changes, message", [
    (dict(temperature=-1.0), r"temperature must be a finite number >= 0 \(0 selects argmax\), got -1"),
    (dict(temperature=math.nan), r"temperature must be a finite number >= 0"),
    (dict(temperature="hot"), r"temperature must be a real number, got 'hot'"),
    (dict(top_k=-1), r"top_k must be an integer >= 0, got -1"),
    (dict(top_k=1.5), r"top_k must be an integer >= 0, got 1.5"),
    (dict(top_k=True), r"top_k must be an integer >= 0, got True"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\] \(1 turns it off\), got 0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(lenience=0.0), r"lenience must be in \(0, 1\] \(1 is exact\), got 0"),
    (dict(lenience=2.0), r"lenience must be in \(0, 1\]"),
])
def test_bad_settings_are_refused_by_name_when_made_and_replaced(changes, message):
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**changes)
    with pytest.raises(ValueError, match=message):
        SamplingSettings().replace(**changes)


def test_the_decoder_holds_its_settings_and_a_call_overrides_them_for_itself():
    target, draft = load_pair()
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=0.7, top_k=3, lenience=0.5)
    assert decoder.sampling == SamplingSettings(0.7, 3, 1.0, 0.5)
    assert speculant.decoder.check_settings(temperature=0.7, top_k=3, lenience=0.5) == decoder.sampling.as_dict()
    greedy = decoder.generate([1, 2], max_new_tokens=4, do_sample=False)
    alone = speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=0.0, top_k=3, lenience=0.5)
    assert greedy.tokens == alone.generate([1, 2], max_new_tokens=4).tokens  # argmax for this call
    assert decoder.sampling.temperature == 0.7  # and the decoder's own settings unchanged
    assert decoder.with_sampling(0.2).sampling == SamplingSettings(0.2, 0, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        decoder.generate([1, 2], max_new_tokens=4, top_p=0.0)


def test_standardize_takes_the_settings_standardization():
    row = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    settings = SamplingSettings(temperature=0.5, top_k=2)
    assert torch.equal(sampling.standardize(row, *settings.standardization()),
                       sampling.standardize(row, temperature=0.5, top_k=2, top_p=1.0))


# sampling= on the public entry points (issue 68): a SamplingSettings gives the tokens of the same settings as
# keywords, and a keyword given explicitly overrides its field, as transformers' kwargs override generation_config.
SETTINGS = SamplingSettings(temperature=0.7, top_k=3, top_p=0.9, lenience=0.5)
KEYWORDS = SETTINGS.as_dict()
SEEDS = range(6)
NOT_SETTINGS = r"sampling must be a speculant.SamplingSettings \(or None: the keyword arguments alone\), got dict"


def tokens(generate, **kwargs):
    return [generate([1, 2], max_new_tokens=10, seed=seed, **kwargs).tokens for seed in SEEDS]


def test_the_decoder_takes_sampling_as_its_keywords():
    target, draft = load_pair()
    given = speculant.SpeculativeDecoder(target, draft, gamma=2, sampling=SETTINGS)
    keywords = speculant.SpeculativeDecoder(target, draft, gamma=2, **KEYWORDS)
    assert given.sampling == SETTINGS == keywords.sampling
    assert tokens(given.generate) == tokens(keywords.generate)
    assert speculant.SpeculativeDecoder(target, draft, sampling=None).sampling == SamplingSettings()


def test_the_decoders_keywords_override_the_fields_of_sampling():
    target, draft = load_pair()
    overridden = speculant.SpeculativeDecoder(target, draft, gamma=2, sampling=SETTINGS, temperature=1.0, top_k=0)
    assert overridden.sampling == SamplingSettings(1.0, 0, 0.9, 0.5)  # 1.0 and 0 given are kept, not "unset"
    keywords = speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=1.0, top_p=0.9, lenience=0.5)
    assert tokens(overridden.generate) == tokens(keywords.generate)
    assert tokens(overridden.generate) != tokens(speculant.SpeculativeDecoder(target, draft, gamma=2,
                                                                              sampling=SETTINGS).generate)
    assert overridden.with_sampling(0.2).sampling == SamplingSettings(0.2, 0, 1.0, 0.5)


def test_generate_takes_sampling_for_the_call_and_its_keywords_override_it():
    target, draft = load_pair()
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=0.3, lenience=0.8)
    at_settings = speculant.SpeculativeDecoder(target, draft, gamma=2, sampling=SETTINGS)
    assert tokens(decoder.generate, sampling=SETTINGS) == tokens(at_settings.generate)  # lenience included
    assert decoder.sampling == SamplingSettings(0.3, 0, 1.0, 0.8)  # the call's, not the decoder's
    colder = speculant.SpeculativeDecoder(target, draft, gamma=2, sampling=SETTINGS.replace(temperature=0.0))
    assert tokens(decoder.generate, sampling=SETTINGS, temperature=0.0) == tokens(colder.generate)
    assert tokens(decoder.generate, sampling=SETTINGS, do_sample=False) == tokens(colder.generate)
    with pytest.raises(ValueError, match="sampling=SamplingSettings.* does not apply to beam search"):
        decoder.generate([1, 2], max_new_tokens=4, num_beams=2, sampling=SETTINGS)


def test_plain_generate_takes_sampling_and_its_keywords_override_it():
    target, _ = load_pair()
    plain = functools.partial(speculant.generate, target)
    assert tokens(plain, sampling=SETTINGS) == tokens(plain, temperature=0.7, top_k=3, top_p=0.9)  # no lenience
    assert tokens(plain, sampling=SETTINGS, top_k=0) == tokens(plain, temperature=0.7, top_p=0.9)
    assert tokens(plain, sampling=SETTINGS, top_k=0) != tokens(plain, sampling=SETTINGS)
    assert tokens(plain) == tokens(plain, temperature=1.0, top_k=0, top_p=1.0) == tokens(plain, sampling=None)
    with pytest.raises(ValueError, match="sampling=SamplingSettings.* does not apply to beam search"):
        speculant.generate(target, [1, 2], max_new_tokens=4, num_beams=2, sampling=SETTINGS)


COUNTS = ["gamma", "temperature", "top_k", "top_p", "lenience", "alpha", "acceptance", "new_tokens", "target_calls",
          "draft_calls"]


def test_sweep_takes_the_fixed_settings_from_sampling_and_a_grid_overrides_its_field():
    target, draft = load_pair()
    run = functools.partial(speculant.sweep, target, draft, [[1, 2], [3]], gammas=[1, 2], max_new_tokens=12,
                            seed=4, repeats=1, progress=False)
    given, keywords = run(sampling=SETTINGS), run(temperatures=0.7, top_k=3, top_p=0.9, lenience=0.5)
    assert given[COUNTS].equals(keywords[COUNTS])
    grids = run(sampling=SETTINGS, temperatures=[0.0, 1.0], lenience=[1.0])
    assert list(zip(grids.temperature, grids.gamma)) == [(0.0, 1), (0.0, 2), (1.0, 1), (1.0, 2)]
    assert (grids.top_k == 3).all() and (grids.top_p == 0.9).all() and (grids.lenience == 1.0).all()
    assert grids[COUNTS].equals(run(temperatures=[0.0, 1.0], top_k=3, top_p=0.9)[COUNTS])
    with pytest.raises(ValueError, match=r"generate_kwargs must not set \['sampling'\]"):
        run(generate_kwargs={"sampling": SETTINGS})


def test_check_distribution_takes_sampling_and_its_keywords_override_it():
    models = [markov.cached_model(table) for table in markov.target_and_draft(5, 1)]  # their logits recomputable
    check = functools.partial(testing.check_distribution, *models, [1, 2], k=2, gamma=2, samples=300,
                              progress=False)
    exact = SETTINGS.replace(lenience=1.0)
    given, keywords = check(sampling=exact), check(temperature=0.7, top_k=3, top_p=0.9)
    assert (given.cells, given.statistic, given.report) == (keywords.cells, keywords.statistic, keywords.report)
    assert given.passed and given.test == "chi-square"
    lenient = check(sampling=exact, lenience=0.5)
    assert lenient.test == "lenience bound" and lenient.cells == check(**KEYWORDS).cells
    assert "gamma=2, temperature=0.7, top_k=3, top_p=0.9, lenience=0.5" in lenient.report


def test_anything_but_settings_as_sampling_is_refused_by_name():
    target, draft = load_pair()
    wrong = dict(KEYWORDS)
    with pytest.raises(ValueError, match=NOT_SETTINGS):
        speculant.SpeculativeDecoder(target, draft, sampling=wrong)
    decoder = speculant.SpeculativeDecoder(target, draft)
    with pytest.raises(ValueError, match=NOT_SETTINGS):
        decoder.generate([1, 2], max_new_tokens=4, sampling=wrong)
    with pytest.raises(ValueError, match=NOT_SETTINGS):
        speculant.generate(target, [1, 2], max_new_tokens=4, sampling=wrong)
    with pytest.raises(ValueError, match=NOT_SETTINGS):
        speculant.sweep(target, draft, [[1, 2]], gammas=2, progress=False, sampling=wrong)
    with pytest.raises(ValueError, match=NOT_SETTINGS):
        testing.check_distribution(target, draft, [1, 2], samples=5, progress=False, sampling=wrong)
    with pytest.raises(ValueError, match="sampling must be a speculant.SamplingSettings .*got tuple"):
        speculant.generate(target, [1, 2], max_new_tokens=4, sampling=SETTINGS.standardization())
