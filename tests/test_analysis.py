"""The paper's analysis formulas against its printed tables (to the printed precision), their vectorized and
validating forms, and the estimate of alpha from a model pair."""

import numpy as np
import pytest
import torch

from support import markov
import speculant
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
    assert analysis.beta(p, q).item() == pytest.approx(0.9)
    # D_LK = sum |p - M| with M = (p + q) / 2 (Definition 3.2), symmetric, 0 iff equal, 1 iff disjoint.
    assert analysis.lk_divergence(p, q).item() == pytest.approx((p - (p + q) / 2).abs().sum().item())
    assert analysis.lk_divergence(p, p).item() == pytest.approx(0.0)
    assert analysis.lk_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == 1.0
    # A.5: sum min(p / l, q) grows as l shrinks and reaches 1 once p / l >= q everywhere.
    assert analysis.beta(p, q, 0.5).item() == pytest.approx(1.0)
    assert analysis.beta(p, q, 0.9).item() > analysis.beta(p, q).item()


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


def test_beta_is_one_minus_divergence_and_validates_lenience():
    gen = torch.Generator().manual_seed(0)
    p, q = torch.rand(3, 7, generator=gen).softmax(-1), torch.rand(3, 7, generator=gen).softmax(-1)  # [3, 7]
    assert torch.allclose(analysis.beta(p, q), 1 - analysis.lk_divergence(p, q))
    assert analysis.beta(p, q).shape == (3,)
    assert torch.allclose(analysis.lk_divergence(p, q), analysis.lk_divergence(q, p))  # Corollary 3.4
    for bad in (0.0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="lenience"):
            analysis.beta(p, q, bad)


def test_formulas_broadcast_over_arrays():
    alphas, gammas = np.array([0.6, 0.7, 0.8, 0.8, 0.9, 0.9]), np.array([2, 3, 2, 5, 2, 10])
    np.testing.assert_array_equal(np.round(analysis.walltime_improvement(alphas, gammas, 0.0), 2),
                                  [row[3] for row in TABLE_1])
    np.testing.assert_array_equal(np.round(analysis.operations_factor(alphas, gammas, 0.0), 2),
                                  [row[2] for row in TABLE_1])
    grid = analysis.expected_tokens(np.linspace(0, 1, 5)[:, None], np.array([1, 3]))  # [5, 2]
    assert grid.shape == (5, 2)
    assert grid[0].tolist() == [1.0, 1.0] and grid[-1].tolist() == [2.0, 4.0]
    assert analysis.expected_tokens(0.5, 1) == 1.5 and isinstance(analysis.expected_tokens(0.5, 1), float)
    best = analysis.optimal_gamma(np.array([0.6, 0.8, 0.9]), 0.05)
    assert best.tolist() == [analysis.optimal_gamma(a, 0.05) for a in (0.6, 0.8, 0.9)]
    assert analysis.oracle_improvement(np.array([0.5, 1.0]), 0.0).tolist() == [2.0, np.inf]
    assert analysis.improves(np.array([0.3, 0.1]), 0.2).tolist() == [True, False]


@pytest.mark.parametrize("call,name", [
    (lambda: analysis.expected_tokens(-0.1, 2), "alpha"),
    (lambda: analysis.expected_tokens(float("nan"), 2), "alpha"),
    (lambda: analysis.expected_tokens(np.array([0.5, 1.2]), 2), "alpha"),
    (lambda: analysis.expected_tokens(0.5, 2.5), "gamma"),
    (lambda: analysis.expected_tokens(0.5, True), "gamma"),
    (lambda: analysis.walltime_improvement(0.5, 2, -0.1), "c must"),
    (lambda: analysis.operations_factor(0.5, 2, float("nan")), "c_hat"),
    (lambda: analysis.optimal_gamma(0.5, 0.1, max_gamma=0), "gamma"),
    (lambda: analysis.oracle_improvement(0.5, -1.0), "c must"),
])
def test_out_of_range_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_estimate_alpha_on_iid_models():
    """With the same p and q after every prefix, every verified position has beta = sum min(p, q) exactly, so the
    pooled estimate must equal it (up to float32 rounding in the engine), whatever the prompts and seeds."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    target = speculant.load(markov.cached_model(markov.constant_table(p)))
    draft = speculant.load(markov.cached_model(markov.constant_table(q)))
    exact = analysis.beta(p, q).item()
    assert analysis.estimate_alpha(target, draft, [[1, 2], torch.tensor([3])], max_new_tokens=20) == \
        pytest.approx(exact, abs=1e-6)
    # temperature 2 flattens p (q is uniform, unchanged): beta follows the standardized p
    hot = torch.softmax(p.log() / 2, -1)
    assert analysis.estimate_alpha(target, draft, [1], temperature=2.0, max_new_tokens=20) == \
        pytest.approx(analysis.beta(hot, q).item(), abs=1e-6)
    with pytest.raises(ValueError, match="max_new_tokens"):
        analysis.estimate_alpha(target, draft, [1], max_new_tokens=1)


def test_generation_kwargs_accepts_the_prompt_forms():
    assert analysis.generation_kwargs([1, 2]) == [{"prompt_ids": [1, 2]}]
    rows = analysis.generation_kwargs(torch.tensor([[1, 2], [3, 4]]), {"eos_token_id": 0})
    assert [r["prompt_ids"].tolist() for r in rows] == [[1, 2], [3, 4]] and rows[0]["eos_token_id"] == 0
    per_prompt = analysis.generation_kwargs([{"prompt_ids": [0], "encoder_input_ids": [5, 6]}, [7]], {"x": 1})
    assert per_prompt == [{"x": 1, "prompt_ids": [0], "encoder_input_ids": [5, 6]}, {"x": 1, "prompt_ids": [7]}]
    assert analysis.generation_kwargs([{"encoder_input_ids": [1]}]) == [{"encoder_input_ids": [1]}]
    with pytest.raises(ValueError, match="at least one"):
        analysis.generation_kwargs([])
    with pytest.raises(ValueError, match="prompts"):
        analysis.generation_kwargs("text")
