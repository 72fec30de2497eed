"""Pure-torch float64 reference implementations of speculant's sampling math.

Notation follows Leviathan, Kalman & Matias 2023 (../shared/paper): p = target M_p, q = draft M_q,
γ = draft length, β/α = acceptance, l = lenience.

These functions are deliberately written for clarity, not speed; every C++ op in
``speculant.sampling`` is compared against them (tests/test_sampling.py) and the exact
enumerations in tests/test_exact.py and tests/support/markov.py are built on them.
"""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64


def one_hot(tokens, vocab: int) -> torch.Tensor:
    """The point mass on each of `tokens` (an int: [V]; a list of k: [k, V]), float64: a law that is certain."""
    return torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), vocab).to(DTYPE)


def standardize(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """§2.2 standardized sampling: logits [..., V] -> probabilities [..., V] (float64).

    Order: temperature, then top-k (keeps every token whose value ties the k-th largest), then top-p
    (keeps the smallest set of most-probable tokens whose mass reaches top_p, at least one; ties at the
    boundary are broken towards the lower index), renormalised. temperature == 0 is argmax (one-hot at
    the first maximal index).
    """
    x = logits.to(DTYPE)
    if torch.isnan(x).any() or (x == math.inf).any():
        raise ValueError("logits contain NaN or +inf")
    if (x == -math.inf).all(dim=-1).any():
        raise ValueError("a logits row is entirely -inf")
    vocab = x.shape[-1]
    if temperature == 0:
        # torch.argmax returns the first maximal index on ties.
        return torch.nn.functional.one_hot(x.argmax(dim=-1), vocab).to(DTYPE)
    # Subtracting the row maximum first leaves the law unchanged and keeps a tiny temperature from
    # overflowing to +inf (which would turn the softmax into NaN): the limit is argmax, ties shared.
    x = (x - x.max(dim=-1, keepdim=True).values) / temperature
    if 0 < top_k < vocab:
        kth = x.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, -math.inf)
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        # Stable descending sort: among equal probabilities the lower index comes first.
        order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
        sorted_probs = probs.gather(-1, order)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly better tokens
        keep_sorted = mass_before < top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def acceptance_probability(
    p_x: torch.Tensor, q_x: torch.Tensor, lenience: float = 1.0
) -> torch.Tensor:
    """§2.3 / A.5: min(1, p(x) / (l q(x))); 0 where p(x) = 0, 1 where q(x) = 0 < p(x)."""
    p_x = torch.as_tensor(p_x, dtype=DTYPE)
    q_x = torch.as_tensor(q_x, dtype=DTYPE)
    safe_q = torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    ratio = torch.clamp(p_x / (lenience * safe_q), max=1.0)
    out = torch.where(q_x > 0, ratio, torch.ones_like(ratio))
    return torch.where(p_x > 0, out, torch.zeros_like(out))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """§2.3 p'(x) = norm(max(0, p(x) - q(x))); a row with zero residual mass returns p itself."""
    p = p.to(DTYPE)
    q = q.to(DTYPE)
    diff = torch.clamp(p - q, min=0.0)
    mass = diff.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, diff / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def one_position_law(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Output law of one speculative-sampling step (§2.3, A.1), [V] -> [V].

    P(y) = Σ_x q(x) [a(x) 1{y = x} + (1 - a(x)) r(y)], with a = acceptance_probability, r = residual.
    """
    p = p.to(DTYPE)
    q = q.to(DTYPE)
    accept = acceptance_probability(p, q, lenience)  # a(x) for every x, [V]
    rejected_mass = (q * (1.0 - accept)).sum()
    return q * accept + rejected_mass * residual(p, q)


def verify(
    target_logits: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: list[int],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    lenience: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's verification step for one draft block, the spec's speculant.sampling.verify.

    target_logits [γ+1, V], q [γ, V] (the draft's standardized distributions), draft_tokens [γ] ->
    (accept_prob [γ], next_dist [γ+1, V]).
    """
    gamma = len(draft_tokens)
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long)
    if temperature == 0:
        # A.5, argmax variant: accept x iff softmax(logits)(x) >= l * max softmax(logits).
        soft = torch.softmax(target_logits.to(DTYPE), dim=-1)  # [γ+1, V]
        p_x = soft[:gamma].gather(-1, tokens[:, None])[:, 0]
        accept = (p_x >= lenience * soft[:gamma].max(dim=-1).values).to(DTYPE)
        if lenience == 1.0:
            accept = (tokens == target_logits[:gamma].argmax(dim=-1)).to(DTYPE)
        return accept, standardize(target_logits, 0.0)
    p = standardize(target_logits, temperature, top_k, top_p)  # [γ+1, V]
    q = q.to(DTYPE)
    p_x = p[:gamma].gather(-1, tokens[:, None])[:, 0]
    q_x = q.gather(-1, tokens[:, None])[:, 0]
    accept = acceptance_probability(p_x, q_x, lenience)
    next_dist = torch.cat([residual(p[:gamma], q), p[gamma:]], dim=0)
    return accept, next_dist
