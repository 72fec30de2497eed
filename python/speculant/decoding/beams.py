"""Beam search, plain and speculative (the paper's Appendix A.4), run by the C++ engine (cpp/loop/beam.h).

``generate(..., num_beams=w)`` and ``SpeculativeDecoder.generate(..., num_beams=w)`` come here: the target's beam
search with transformers' semantics (``length_penalty``, ``early_stopping``, ``eos_token_id``,
``num_return_sequences``; do_sample=False), and with a draft model, the draft's own beam search of width
``draft_beams`` proposes gamma levels of candidates that one target call scores. The result is the target's
beam search alone, whatever the draft proposes (cpp/loop/beam.h says why).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import List, Optional, Union

from .. import _core

EARLY_STOPPING = {False: "false", True: "true", "never": "never"}  # transformers' values -> the engine's


@dataclass(frozen=True)
class BeamResult:
    """What a beam search returns.

    sequences: the best ``num_return_sequences`` finished beams, best first, new tokens only (an EOS that ended
    one included); transformers' ``generate(..., num_return_sequences=n).sequences`` without the prompt and
    the padding.
    scores: transformers' ``sequences_scores`` for them: a beam's summed log-probabilities divided by its
    generated length ** length_penalty.
    stats: counts of the search (speculant._core.BeamSearch): steps, target_calls, draft_calls, target_tokens
    and draft_tokens (tree nodes run after the prompt), steps_per_call (one entry per target call), seconds.
    texts: the sequences decoded, when generate was given a tokenizer.
    """

    sequences: List[List[int]]
    scores: List[float]
    stats: _core.BeamSearch
    texts: Optional[List[str]] = None

    @property
    def tokens(self) -> List[int]:
        """The best sequence."""
        return self.sequences[0]

    @property
    def text(self) -> Optional[str]:
        return None if self.texts is None else self.texts[0]

    @property
    def steps_per_call(self) -> float:
        """Beam search steps per target call after the prompt's: 1 for plain beam search, more when the draft's
        candidates hold the target's beams."""
        return self.stats.steps / max(self.stats.target_calls, 1)


def options(num_beams, draft_beams, length_penalty, early_stopping, num_return_sequences) -> dict:
    """generate's beam search arguments, checked, as the engine takes them."""
    def integer(value, name: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    beams = integer(num_beams, "num_beams", 1)
    if draft_beams is not None and not isinstance(draft_beams, bool) and isinstance(draft_beams, numbers.Integral) \
            and draft_beams < beams:
        raise ValueError(f"draft_beams must be at least num_beams = {beams} (the draft's beam search keeps as many "
                         f"candidates as the target's beams, or more), got {draft_beams!r}")
    out = {"beams": beams, "draft_beams": 0 if draft_beams is None else integer(draft_beams, "draft_beams", beams)}
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real) or \
            not float("-inf") < float(length_penalty) < float("inf"):
        raise ValueError(f"length_penalty must be a finite real number, got {length_penalty!r}")
    out["length_penalty"] = float(length_penalty)
    if not any(early_stopping is key or (isinstance(key, str) and early_stopping == key) for key in EARLY_STOPPING):
        raise ValueError(f"early_stopping must be False, True or 'never' (transformers' values), got {early_stopping!r}")
    out["early_stopping"] = EARLY_STOPPING[early_stopping if isinstance(early_stopping, str) else bool(early_stopping)]
    returned = integer(num_return_sequences, "num_return_sequences", 1)
    if returned > beams:
        raise ValueError(f"num_return_sequences must be <= num_beams = {beams}, got {returned}")
    out["return_sequences"] = returned
    return out


def refuse(name: str, value, allowed=None) -> None:
    """ValueError unless ``value`` is None (or ``allowed``): an argument beam search does not take."""
    if value is not None and value != allowed:
        raise ValueError(f"{name}={value!r} does not apply to beam search (num_beams >= 2), which ranks the raw "
                         "log-probabilities deterministically (transformers' do_sample=False): leave it out")


def search(target: _core.Model, draft: Optional[_core.Model], gamma: int, prompts: List[List[int]],
           sources: Optional[List[List[int]]], batch: bool, max_new_tokens: int, eos: List[int], tokenizer,
           beam: dict) -> Union[BeamResult, List[BeamResult]]:
    """Runs each prompt's beam search (with the draft when gamma > 0; an encoder-decoder's over sources[i]);
    one BeamResult per prompt."""
    results = []
    for i, prompt in enumerate(prompts):
        found = _core.beam_search(target, draft, prompt, [] if sources is None else sources[i], gamma=gamma,
                                  max_new_tokens=max_new_tokens, eos_token_ids=eos, **beam)
        sequences = [list(s) for s in found.sequences]
        texts = None if tokenizer is None else [tokenizer.decode(s) for s in sequences]
        results.append(BeamResult(sequences=sequences, scores=list(found.scores), stats=found, texts=texts))
    return results if batch else results[0]
