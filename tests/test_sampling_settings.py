"""speculant.SamplingSettings: the one frozen object of a decoding's sampling settings, checked once when made
(the ranges by the engine's own check), and what the decoder holds, overrides and hands to the engine."""

import dataclasses
import math

import numpy as np
import pytest
import torch

import speculant
from engine_checks import load_pair
from speculant import SamplingSettings, sampling


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
