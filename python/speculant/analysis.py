"""The paper's analysis formulas (Leviathan, Kalman & Matias 2023, §3), as pure functions."""

from __future__ import annotations


def _check(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Equation (1): E[# tokens per run of Algorithm 1] = (1 - alpha^(gamma+1)) / (1 - alpha)."""
    _check(alpha, gamma)
    return float(gamma + 1) if alpha == 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), c = draft call time / target call time."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)
