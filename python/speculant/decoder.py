"""The public decoding API: speculative decoding (Algorithm 1 in a loop) and plain decoding, both run by the
C++ engine with the GIL released."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch

from . import _core
from .drafters import Drafter
from .model import Model, load
from .trace import Trace

PromptIds = Union[Sequence[int], torch.Tensor]


@dataclass(frozen=True)
class Result:
    """What a generation returns.

    tokens: the new token ids (an EOS that stopped the run is included).
    stats: counts, acceptance, alpha (Corollary 3.6) and the time split (speculant.Stats).
    trace: the per-iteration record, the paper's Figure 1 (speculant.Trace).
    """

    tokens: List[int]
    stats: _core.Stats
    trace: Trace


def _integer(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _ids(value: PromptIds, name: str) -> List[int]:
    if isinstance(value, torch.Tensor):
        if value.dim() == 2 and value.size(0) == 1:
            value = value[0]
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must be a sequence of token ids, a 1-D or [1, T] integer tensor; got "
                             f"a {value.dtype} tensor of shape {list(value.shape)}")
        return value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence of token ids, got {type(value).__name__}")
    ids = list(value)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise ValueError(f"{name}[{i}] must be an integer token id, got {token!r}")
    return [int(t) for t in ids]


def _model(value, name: str) -> Model:
    """A speculant.Model, or anything speculant.load takes (a transformers model, a path, a ScriptModule)."""
    if isinstance(value, Model):
        return value
    try:
        return load(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _draft(value) -> Union[Model, Drafter]:
    """A drafter, or a speculant.Model from anything speculant.load takes."""
    if isinstance(value, (Drafter, Model)):
        return value
    if isinstance(value, (str, os.PathLike, torch.nn.Module)):
        return _model(value, "draft")
    raise ValueError("draft must be a model (a speculant.Model, a transformers model, a model path) or a drafter "
                     f"from speculant.drafters, got {type(value).__name__}")


def _drafter(value: Union[Model, Drafter]) -> _core.Drafter:
    return value._core if isinstance(value, Drafter) else _core.model_drafter(value._core)


GAMMA_POLICIES = ("fixed", "heuristic", "alpha")


def _schedule(gamma_policy, max_gamma, cost) -> dict:
    if gamma_policy not in GAMMA_POLICIES:
        raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {gamma_policy!r}")
    if max_gamma is not None:
        max_gamma = _integer(max_gamma, "max_gamma", 1)
    if gamma_policy == "alpha" and cost is None:
        raise ValueError("gamma_policy='alpha' needs cost, the draft-to-target time ratio c (Theorem 3.8)")
    return {"gamma_policy": gamma_policy, "max_gamma": max_gamma, "cost": 0.0 if cost is None else
            _real(cost, "cost")}


def _run(decoder: _core.Decoder, target: Model, prompt_ids, encoder_input_ids, max_new_tokens, eos_token_id,
         seed, profile, schedule=None) -> Result:
    source = None if encoder_input_ids is None else _ids(encoder_input_ids, "encoder_input_ids")
    if prompt_ids is None:
        start = target.decoder_start_token_id
        if start is None:
            raise ValueError("prompt_ids is required (only an encoder-decoder model with a "
                             "decoder_start_token_id in its metadata starts by itself)")
        prompt_ids = [start]
    prompt = _ids(prompt_ids, "prompt_ids")
    max_new_tokens = _integer(max_new_tokens, "max_new_tokens", 0)
    eos = None if eos_token_id is None else _integer(eos_token_id, "eos_token_id", 0)
    seed = None if seed is None else _integer(seed, "seed", 0)
    generation = decoder.generate(prompt, source, max_new_tokens, eos, seed, bool(profile), **(schedule or {}))
    return Result(tokens=list(generation.tokens), stats=generation.stats, trace=Trace(generation.trace))


class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``draft`` proposing ``gamma`` tokens per iteration.

    One sampling configuration standardizes both models (§2.2): temperature (0 = argmax), top_k (0 = off),
    top_p (1 = off). lenience in (0, 1] (A.5): 1 is exact; below 1 no token is sampled with probability above
    p(x) / lenience (argmax: a draft token is kept when p(x) >= lenience * max p).
    """

    def __init__(self, target: Model, draft: Union[Model, Drafter], *, gamma: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, lenience: float = 1.0):
        self.target = _model(target, "target")
        self.draft = _draft(draft)
        self._gamma = _integer(gamma, "gamma", 1)
        self._core = _core.Decoder(self.target._core, _drafter(self.draft), self._gamma,
                                   _real(temperature, "temperature"), _integer(top_k, "top_k", 0),
                                   _real(top_p, "top_p"), _real(lenience, "lenience"))

    @property
    def gamma(self) -> int:
        return self._gamma

    def generate(self, prompt_ids: Optional[PromptIds] = None, *, max_new_tokens: int,
                 encoder_input_ids: Optional[PromptIds] = None, eos_token_id: Optional[int] = None,
                 seed: Optional[int] = None, profile: bool = False, gamma_policy: str = "fixed",
                 max_gamma: Optional[int] = None, cost: Optional[float] = None) -> Result:
        """Generates up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after ``eos_token_id``.

        Encoder-decoder pairs (T5) take the source as ``encoder_input_ids``, encoded once per model and
        generation; ``prompt_ids`` is then the decoder's start and defaults to the target's
        ``decoder_start_token_id``.

        The same seed and inputs give the same tokens; without a seed one is drawn and reported in
        ``result.stats.seed``. ``profile=True`` synchronizes a GPU around model calls so that the draft /
        target / other time split is exact (it adds synchronizations; on CPU it changes nothing).

        Adaptive gamma (the decoder's gamma is then the start): ``gamma_policy="heuristic"`` adds 2 after an
        iteration that kept every draft and removes 1 otherwise, within [1, max_gamma]; ``"alpha"`` tracks
        alpha by a moving average of beta and drafts the gamma <= max_gamma that maximizes Theorem 3.8's
        improvement for the given ``cost`` c. max_gamma defaults to 2 * gamma. A policy sees only earlier
        iterations, so the output law stays exact.
        """
        return _run(self._core, self.target, prompt_ids, encoder_input_ids, max_new_tokens, eos_token_id, seed,
                    profile, _schedule(gamma_policy, max_gamma, cost))


def generate(target: Model, prompt_ids: Optional[PromptIds] = None, *, max_new_tokens: int,
             encoder_input_ids: Optional[PromptIds] = None, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, eos_token_id: Optional[int] = None, seed: Optional[int] = None,
             profile: bool = False) -> Result:
    """Plain autoregressive decoding of ``target`` through the same engine (gamma = 0): the baseline.
    Arguments as in SpeculativeDecoder.generate."""
    target = _model(target, "target")
    decoder = _core.Decoder(target._core, None, 0, _real(temperature, "temperature"), _integer(top_k, "top_k", 0),
                            _real(top_p, "top_p"), 1.0)
    return _run(decoder, target, prompt_ids, encoder_input_ids, max_new_tokens, eos_token_id, seed, profile)
