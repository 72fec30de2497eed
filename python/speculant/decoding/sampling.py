"""The sampling math of the C++ core, exposed for tests and experiments (the engine calls the same code).

* ``standardize(logits[n, V], temperature=1.0, top_k=0, top_p=1.0) -> probs[n, V]`` — §2.2: temperature,
  then top-k (ties with the k-th value kept), then top-p (smallest most-probable set reaching top_p),
  renormalized; temperature 0 is argmax (one-hot, first index on ties). float64 in, float64 out; otherwise
  float32. -inf logits are masked tokens; NaN, +inf or an all -inf row raise ValueError.
* ``acceptance_probability(p_x, q_x, lenience=1.0)`` — §2.3 / A.5: min(1, p(x) / (l q(x))).
* ``residual(p, q)`` — norm(max(0, p - q)); a row with zero residual mass returns p (reachable only with
  probability zero).
* ``verify(target_logits[g+1, V], q[g, V], draft_tokens[g], temperature=1.0, top_k=0, top_p=1.0,
  lenience=1.0) -> (accept_prob[g], next_dist[g+1, V])`` — Algorithm 1's decision: accept_prob[i] is the
  probability that draft token i is kept given the earlier ones were; next_dist[n] is the law of the token
  emitted after n acceptances (the residual for n < g, p_{g+1} for n = g). With temperature 0 and
  lenience l < 1, x is also kept when softmax(logits)(x) >= l * max softmax(logits) (A.5, argmax variant).
* ``sample(probs[n, V], seed) -> int64[n]`` — the engine's sampler (inverse CDF in float64).
* ``beta(p, q, lenience=1.0)`` — Theorem 3.5's β = Σ_x min(p(x), q(x)) (with lenience l, Σ_x min(p(x) / l,
  q(x))): the library's one Python computation of it.
* ``SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, lenience=1.0)`` — one decoding's settings, frozen,
  checked once when made (ValueError naming a bad one); the decoder, ``distill``, ``sweep`` and
  ``check_distribution`` all take their settings through it. ``SpeculativeDecoder(...)``, its ``generate``,
  ``speculant.generate``, ``sweep`` and ``check_distribution`` take one as ``sampling=`` beside their keyword
  arguments, as transformers' generate takes a generation_config: a keyword given explicitly overrides its field
  (``overridden``).
"""

import dataclasses
from typing import Dict, Optional, Tuple

import torch

from .._core import acceptance_probability, check_sampling, residual, sample, standardize, verify
from ..arguments import integer, real

__all__ = ["SamplingSettings", "acceptance_probability", "beta", "residual", "sample", "standardize", "verify"]


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How logits become a law (§2.2) and how lenient verification is (A.5), as transformers' GenerationConfig
    is one object: temperature >= 0 (0 selects argmax), top_k >= 0 (0 turns it off), top_p in (0, 1] (1 turns it
    off), lenience in (0, 1] (1 is exact). Checked once when made: the types here, the ranges by the engine's own
    SamplingConfig::validate (cpp/math/sampling.cpp), so that what Python accepts the engine accepts."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    lenience: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "temperature", real(self.temperature, "temperature"))
        object.__setattr__(self, "top_k", integer(self.top_k, "top_k", 0))
        object.__setattr__(self, "top_p", real(self.top_p, "top_p"))
        object.__setattr__(self, "lenience", real(self.lenience, "lenience"))
        check_sampling(self.temperature, self.top_k, self.top_p, self.lenience)

    def standardization(self) -> Tuple[float, int, float]:
        """(temperature, top_k, top_p): ``standardize``'s arguments after the logits, in its order."""
        return self.temperature, self.top_k, self.top_p

    def as_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "SamplingSettings":
        """These settings with `changes`, checked as new ones are."""
        return dataclasses.replace(self, **changes)


def overridden(sampling: Optional[SamplingSettings], **explicit) -> SamplingSettings:
    """``sampling`` (None: SamplingSettings()) with each of ``explicit`` (temperature, top_k, top_p, lenience)
    that is not None in place of its field, as transformers' keyword arguments override generation_config.
    ValueError naming ``sampling`` when it is not a SamplingSettings."""
    if sampling is None:
        sampling = SamplingSettings()
    elif not isinstance(sampling, SamplingSettings):
        raise ValueError("sampling must be a speculant.SamplingSettings (or None: the keyword arguments alone), "
                         f"got {type(sampling).__name__}")
    changes = {name: value for name, value in explicit.items() if value is not None}
    return sampling.replace(**changes) if changes else sampling


def beta(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Theorem 3.5: the probability that speculative sampling keeps x ~ q, beta = 1 - D_LK(p, q) =
    sum_x min(p(x), q(x)), over the last dimension. With lenience l (A.5): sum_x min(p(x) / l, q(x)).

    p and q are standardized distributions (``standardize``), any leading shape (broadcast)."""
    lenience = SamplingSettings(lenience=lenience).lenience
    p, q = torch.as_tensor(p), torch.as_tensor(q)
    return torch.minimum(p / lenience, q).sum(-1)
