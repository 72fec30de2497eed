"""The paper's analysis (Leviathan, Kalman & Matias 2023, §3 and A.5) as pure functions.

alpha: expected acceptance rate; gamma: draft length; c: cost coefficient (draft call time / target call time,
Definition 3.7); c_hat: the same ratio for arithmetic operations (Definition 3.10); l: lenience.
"""

from __future__ import annotations

import torch


def _alpha(alpha: float) -> float:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return float(alpha)


def _gamma(gamma: int) -> int:
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0, got {gamma}")
    return int(gamma)


def _cost(c: float, name: str = "c") -> float:
    if not c >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {c}")
    return float(c)


def lk_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Definition 3.2 / Lemma 3.3: D_LK(p, q) = 1 - sum_x min(p(x), q(x)), over the last dimension."""
    return 1.0 - torch.minimum(p, q).sum(-1)


def acceptance(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Theorem 3.5: beta = 1 - D_LK(p, q) = sum_x min(p, q); with lenience l (A.5): sum_x min(p / l, q)."""
    if not 0.0 < lenience <= 1.0:
        raise ValueError(f"lenience must be in (0, 1], got {lenience}")
    return torch.minimum(p / lenience, q).sum(-1)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Equation (1): E[# tokens per run of Algorithm 1] = (1 - alpha^(gamma+1)) / (1 - alpha)."""
    alpha, gamma = _alpha(alpha), _gamma(gamma)
    return float(gamma + 1) if alpha == 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))."""
    return expected_tokens(alpha, gamma) / (_gamma(gamma) * _cost(c) + 1.0)


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 3.11: (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), the increase in operations."""
    gamma = _gamma(gamma)
    return (gamma * _cost(c_hat, "c_hat") + gamma + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """§3.5: the integer gamma in [1, max_gamma] that maximizes Theorem 3.8 (the smallest one on ties)."""
    return max(range(1, _gamma(max_gamma) + 1), key=lambda g: (walltime_improvement(alpha, g, c), -g))


def oracle_improvement(alpha: float, c: float) -> float:
    """§3.5's oracle bound: a draft that always proposes exactly the tokens that will be accepted gives
    1 / (1 - alpha) tokens per target call for c * alpha / (1 - alpha) draft calls, an improvement of
    1 / (1 - alpha + c alpha)."""
    alpha, c = _alpha(alpha), _cost(c)
    return 1.0 / (1.0 - alpha + c * alpha) if alpha < 1.0 or c > 0 else float("inf")


def improves(alpha: float, c: float) -> bool:
    """Corollary 3.9: some gamma improves the walltime iff alpha > c."""
    return _alpha(alpha) > _cost(c)


def minimum_improvement(alpha: float, c: float) -> float:
    """Corollary 3.9: when alpha > c, gamma = 1 already gives (1 + alpha) / (1 + c)."""
    if not improves(alpha, c):
        raise ValueError(f"Corollary 3.9 needs alpha > c, got alpha={alpha}, c={c}")
    return (1.0 + alpha) / (1.0 + c)
