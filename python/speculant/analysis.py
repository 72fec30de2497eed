"""The paper's analysis (Leviathan, Kalman & Matias 2023, §3 and A.5).

p is the target M_p's distribution, q the draft M_q's; beta: acceptance rate at one prefix (Definition 3.1);
alpha = E[beta] (Corollary 3.6); gamma: draft length; c: cost coefficient (draft call time / target call time,
Definition 3.7); c_hat: the same ratio for arithmetic operations (Definition 3.10); l: lenience (A.5).

The formulas of §3 take scalars or numpy arrays (broadcast together; an array in gives an array out, scalars
give a Python float) and raise ValueError naming the parameter for out-of-range input. ``estimate_alpha`` is the
one function here that runs models.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

ArrayLike = Union[float, Sequence[float], np.ndarray]


def _out(value: np.ndarray):
    """A 0-d result as a Python scalar, anything else as the array."""
    return value.item() if value.ndim == 0 else value


def _alpha(alpha: ArrayLike) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all((a >= 0.0) & (a <= 1.0)):  # also rejects NaN
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return a


def _gamma(gamma: ArrayLike, minimum: int = 0) -> np.ndarray:
    g = np.asarray(gamma)
    if g.dtype == bool or not np.issubdtype(g.dtype, np.number) or not np.all(np.isfinite(g)) \
            or not np.all(g == np.round(g)) or not np.all(g >= minimum):
        raise ValueError(f"gamma must be an integer >= {minimum}, got {gamma}")
    return g.astype(np.int64)


def _cost(c: ArrayLike, name: str = "c") -> np.ndarray:
    value = np.asarray(c, dtype=np.float64)
    if not np.all(value >= 0.0):  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {c}")
    return value


def _lenience(lenience: float) -> float:
    if isinstance(lenience, bool) or not isinstance(lenience, numbers.Real) or not 0.0 < lenience <= 1.0:
        raise ValueError(f"lenience must be in (0, 1], got {lenience!r}")
    return float(lenience)


# --------------------------------------------------------------------------------------------------
# §3.2: the acceptance rate of one pair of distributions
# --------------------------------------------------------------------------------------------------


def lk_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Definition 3.2 / Lemma 3.3: D_LK(p, q) = sum_x |p(x) - M(x)| = 1 - sum_x min(p(x), q(x)), over the last
    dimension (M = (p + q) / 2). Symmetric, in [0, 1] (Corollary 3.4): 0 iff p = q, 1 iff disjoint supports."""
    p, q = torch.as_tensor(p), torch.as_tensor(q)
    return 1.0 - torch.minimum(p, q).sum(-1)


def beta(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Theorem 3.5: the probability that speculative sampling keeps x ~ q, beta = 1 - D_LK(p, q) =
    sum_x min(p(x), q(x)), over the last dimension. With lenience l (A.5): sum_x min(p(x) / l, q(x)).

    p and q are standardized distributions (``speculant.sampling.standardize``), any leading shape."""
    lenience = _lenience(lenience)
    p, q = torch.as_tensor(p), torch.as_tensor(q)
    return torch.minimum(p / lenience, q).sum(-1)


# --------------------------------------------------------------------------------------------------
# §3.1, §3.3 - §3.5: tokens, walltime, operations, the choice of gamma
# --------------------------------------------------------------------------------------------------


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike):
    """Equation (1): E[# tokens per run of Algorithm 1] = (1 - alpha^(gamma+1)) / (1 - alpha), and gamma + 1 at
    alpha = 1 (a capped geometric variable, assuming i.i.d. betas)."""
    a, g = _alpha(alpha), _gamma(gamma)
    denominator = np.where(a == 1.0, 1.0, 1.0 - a)
    return _out(np.where(a == 1.0, g + 1.0, (1.0 - a ** (g + 1)) / denominator))


def walltime_improvement(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike):
    """Theorem 3.8: the expected walltime improvement factor (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)),
    assuming the gamma + 1 parallel target evaluations take the time of one and long enough generations."""
    g = _gamma(gamma)
    return _out(np.asarray(expected_tokens(alpha, g)) / (g * _cost(c) + 1.0))


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike):
    """Theorem 3.11: the expected factor of increase in arithmetic operations,
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))."""
    g = _gamma(gamma)
    return _out((g * _cost(c_hat, "c_hat") + g + 1.0) / np.asarray(expected_tokens(alpha, g)))


def optimal_gamma(alpha: ArrayLike, c: ArrayLike, max_gamma: int = 64):
    """§3.5 (Figure 3): the integer gamma in [1, max_gamma] that maximizes Theorem 3.8, the smallest on ties."""
    a, cost = np.broadcast_arrays(_alpha(alpha), _cost(c))
    gammas = np.arange(1, int(_gamma(max_gamma, minimum=1)) + 1)  # [G]
    improvement = np.asarray(walltime_improvement(a[..., None], gammas, cost[..., None]))  # [..., G]
    return _out(gammas[np.argmax(improvement, axis=-1)])


def oracle_improvement(alpha: ArrayLike, c: ArrayLike):
    """§3.5's oracle bound: with an oracle choosing gamma per iteration, Algorithm 1 yields 1 / (1 - alpha) tokens
    per target call for c * alpha / (1 - alpha) draft calls, an improvement of 1 / (1 - alpha + c alpha)
    (inf at alpha = 1, c = 0)."""
    a, cost = _alpha(alpha), _cost(c)
    denominator = 1.0 - a + cost * a
    return _out(np.where(denominator > 0, 1.0 / np.where(denominator > 0, denominator, 1.0), np.inf))


def improves(alpha: ArrayLike, c: ArrayLike):
    """Corollary 3.9: some gamma improves the walltime iff alpha > c."""
    return _out(_alpha(alpha) > _cost(c))


def minimum_improvement(alpha: ArrayLike, c: ArrayLike):
    """Corollary 3.9: when alpha > c, gamma = 1 already gives (1 + alpha) / (1 + c)."""
    a, cost = _alpha(alpha), _cost(c)
    if not np.all(a > cost):
        raise ValueError(f"Corollary 3.9 needs alpha > c, got alpha={alpha}, c={c}")
    return _out((1.0 + a) / (1.0 + cost))


# --------------------------------------------------------------------------------------------------
# Corollary 3.6: alpha of a model pair, measured through the engine
# --------------------------------------------------------------------------------------------------


def generation_kwargs(prompts, generate_kwargs: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """The keyword arguments of one ``generate`` call per prompt.

    ``prompts`` is one prompt (token ids, or a 1-D tensor) or a sequence of prompts (a 2-D tensor is one per
    row). A prompt may also be a mapping of ``generate`` keyword arguments, for arguments that change with the
    prompt (an encoder-decoder's ``encoder_input_ids``, its ``prompt_ids`` defaulting to the decoder start).
    ``generate_kwargs`` are added to every call.
    """
    common = dict(generate_kwargs or {})
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2):
            raise ValueError(f"prompts as a tensor must be 1-D (one prompt) or 2-D (one per row), got shape "
                             f"{list(prompts.shape)}")
        prompts = [prompts] if prompts.dim() == 1 else list(prompts)
    elif isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be token ids or a sequence of prompts, got {type(prompts).__name__}")
    elif len(prompts) > 0 and isinstance(prompts[0], numbers.Integral):
        prompts = [prompts]
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt")
    calls = []
    for prompt in prompts:
        if isinstance(prompt, Mapping):
            calls.append({**common, **prompt})
        else:
            calls.append({**common, "prompt_ids": prompt})
    return calls


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # tensors and arrays of several values have no single truth
        return False


def batch_kwargs(calls: Sequence[Mapping[str, Any]]) -> Tuple[Dict[str, Any], bool]:
    """One ``generate`` call for consecutive prompts' calls (``generation_kwargs``) and whether it is a batch:
    their prompt_ids (and encoder_input_ids) as lists, every other argument the same in all of them."""
    if len(calls) == 1:
        return dict(calls[0]), False
    rowwise = ("prompt_ids", "encoder_input_ids")
    merged = {key: [call[key] for call in calls] for key in rowwise if key in calls[0]}
    for i, call in enumerate(calls):
        if set(call).intersection(rowwise) != set(merged):
            raise ValueError(f"prompts in one batch must all give {sorted(merged)}; prompt {i} of the batch gives "
                             f"{sorted(set(call).intersection(rowwise))}")
        shared = {k: v for k, v in call.items() if k not in rowwise}
        common = {k: v for k, v in calls[0].items() if k not in rowwise}
        if shared.keys() != common.keys() or not all(_same(shared[k], common[k]) for k in common):
            raise ValueError("prompts in one batch must share every generate argument besides prompt_ids and "
                             f"encoder_input_ids; prompt {i} of the batch differs: use batch_size=1")
    merged.update({k: v for k, v in calls[0].items() if k not in rowwise})
    return merged, True


def verified_positions(trace) -> int:
    """The draft positions Algorithm 1 decided on in a generation's trace: up to and including the first
    rejection of each iteration (the positions over which the engine averages beta, Corollary 3.6)."""
    return sum(min(it.accepted + 1, len(it.drafted)) for it in trace)


def estimate_alpha(target, draft, prompts, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   gamma: int = 4, max_new_tokens: int = 128, seed: int = 0,
                   generate_kwargs: Optional[Mapping[str, Any]] = None) -> float:
    """Corollary 3.6: alpha = E[beta] = E[sum_x min(p, q)] for a target / draft pair (speculant.Model) under
    one sampling configuration, estimated as the paper's §4.2 does, over sequences generated by the target.

    Runs exact speculative decoding (lenience 1) from each prompt (see ``generation_kwargs``; prompt i uses
    seed + i) and pools the engine's per-position beta = sum_x min(p, q) over every verified position (each
    generated token whose position had a draft: all but the bonus tokens). Because the engine's output follows
    the target's law, those prefixes are the target's own samples. The exact per-position beta (not the 0/1
    accept outcomes) is averaged, so the estimate has the variance of the prefixes only. gamma changes how
    many positions are verified, not what is averaged.
    """
    from .decoder import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p)
    total, count = 0.0, 0
    for i, kwargs in enumerate(generation_kwargs(prompts, generate_kwargs)):
        result = decoder.generate(**kwargs, max_new_tokens=max_new_tokens, seed=seed + i)
        n = verified_positions(result.trace)
        if n:
            total += result.stats.alpha * n
            count += n
    if count == 0:
        raise ValueError("no position was verified: max_new_tokens must be >= 2 (or the prompts hit EOS at once)")
    return total / count
