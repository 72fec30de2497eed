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
* ``checked_settings(temperature, top_k, top_p) -> (float, int, float)`` — the three checked, as
  ``standardize`` takes them; ValueError naming a bad one.
"""

import math

import numpy as np

from ._core import acceptance_probability, residual, sample, standardize, verify

__all__ = ["acceptance_probability", "checked_settings", "residual", "sample", "standardize", "verify"]


def checked_settings(temperature, top_k, top_p) -> tuple:
    """(temperature, top_k, top_p) checked, as the engine's standardization takes them."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}")
    return float(temperature), int(top_k), float(top_p)
