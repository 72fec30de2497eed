"""The paper's analysis formulas against its printed tables (to the printed precision)."""

import pytest
import torch

from speculant import analysis

# Table 1: (alpha, gamma, operations, speed) with c = c_hat = 0.
TABLE_1 = [(0.6, 2, 1.53, 1.96), (0.7, 3, 1.58, 2.53), (0.8, 2, 1.23, 2.44), (0.8, 5, 1.63, 3.69),
           (0.9, 2, 1.11, 2.71), (0.9, 10, 1.60, 6.86)]

# Table 4: (alpha, c, gamma, EXP) for the T5-XXL rows.
TABLE_4 = [(0.75, 0.02, 7, 3.2), (0.8, 0.04, 7, 3.3), (0.82, 0.11, 7, 2.5), (0.62, 0.02, 7, 2.3),
           (0.68, 0.04, 5, 2.4), (0.71, 0.11, 3, 2.0), (0.65, 0.02, 5, 2.4), (0.73, 0.04, 5, 2.6),
           (0.74, 0.11, 3, 2.0), (0.53, 0.02, 5, 1.9), (0.55, 0.04, 3, 1.8), (0.56, 0.11, 3, 1.6)]


@pytest.mark.parametrize("alpha,gamma,operations,speed", TABLE_1)
def test_table_1(alpha, gamma, operations, speed):
    assert round(analysis.walltime_improvement(alpha, gamma, 0.0), 2) == speed
    assert round(analysis.operations_factor(alpha, gamma, 0.0), 2) == operations


@pytest.mark.parametrize("alpha,c,gamma,expected", TABLE_4)
def test_table_4_exp_column(alpha, c, gamma, expected):
    """The paper computed EXP from unrounded alpha and c, and prints both to two decimals. Theorem 3.8 grows
    with alpha and falls with c, so the printed EXP (+-0.05) must meet the range spanned by every alpha, c
    that round to the printed ones; 9 of the 12 rows also match from the rounded values directly."""
    low = analysis.walltime_improvement(alpha - 0.005, gamma, c + 0.005)
    high = analysis.walltime_improvement(alpha + 0.005, gamma, c - 0.005)
    assert low - 0.05 <= expected <= high + 0.05


def test_table_4_direct_rows():
    direct = [row for row in TABLE_4 if round(analysis.walltime_improvement(row[0], row[2], row[1]), 1) == row[3]]
    assert len(direct) == 9


def test_divergence_and_acceptance():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)  # the explainer's example
    q = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    assert analysis.lk_divergence(p, q).item() == pytest.approx(0.1)
    assert analysis.acceptance(p, q).item() == pytest.approx(0.9)
    # D_LK = sum |p - M| with M = (p + q) / 2 (Definition 3.2), symmetric, 0 iff equal, 1 iff disjoint.
    assert analysis.lk_divergence(p, q).item() == pytest.approx((p - (p + q) / 2).abs().sum().item())
    assert analysis.lk_divergence(p, p).item() == pytest.approx(0.0)
    assert analysis.lk_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == 1.0
    # A.5: sum min(p / l, q) grows as l shrinks and reaches 1 once p / l >= q everywhere.
    assert analysis.acceptance(p, q, 0.5).item() == pytest.approx(1.0)
    assert analysis.acceptance(p, q, 0.9).item() > analysis.acceptance(p, q).item()


def test_gamma_choice_and_bounds():
    assert analysis.expected_tokens(0.0, 5) == 1.0
    assert analysis.expected_tokens(1.0, 5) == 6.0
    # Figure 3's trend: the optimal gamma grows with alpha and shrinks with c.
    assert analysis.optimal_gamma(0.9, 0.01) > analysis.optimal_gamma(0.6, 0.01)
    assert analysis.optimal_gamma(0.8, 0.01) >= analysis.optimal_gamma(0.8, 0.1)
    best = analysis.optimal_gamma(0.8, 0.05)
    assert all(analysis.walltime_improvement(0.8, best, 0.05) >= analysis.walltime_improvement(0.8, g, 0.05)
               for g in range(1, 40))
    # The oracle bound exceeds every fixed gamma; with c = 0 it is 1 / (1 - alpha).
    assert analysis.oracle_improvement(0.8, 0.0) == pytest.approx(5.0)
    assert analysis.oracle_improvement(0.8, 0.05) > analysis.walltime_improvement(0.8, best, 0.05)
    assert analysis.improves(0.3, 0.1) and not analysis.improves(0.1, 0.3)
    assert analysis.minimum_improvement(0.5, 0.1) == pytest.approx(1.5 / 1.1)
    with pytest.raises(ValueError, match="alpha > c"):
        analysis.minimum_improvement(0.1, 0.3)
    with pytest.raises(ValueError, match="alpha"):
        analysis.expected_tokens(1.5, 2)
    with pytest.raises(ValueError, match="gamma"):
        analysis.walltime_improvement(0.5, -1, 0.0)
