"""speculant.sampling (C++) against the pure-torch float64 reference in tests/support/reference.py.

Notation (paper §2): p = target, q = draft, l = lenience. Every C++ op is compared with the reference
on random inputs (fixed seeds) and on hand-made edge cases with exact expected values.
"""

import math

import pytest
import scipy.stats
import torch

from support import reference
import speculant
from speculant import sampling

NEG_INF = float("-inf")


def tol(dtype: torch.dtype) -> dict:
    """Comparison tolerance for results computed in float64 (from float64 logits) or float32."""
    return dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=0, atol=2e-6)


def random_logits(n: int, vocab: int, seed: int, dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, vocab, generator=gen, dtype=torch.float64) * scale).to(dtype)


def random_dist(n: int, vocab: int, seed: int, zero_prob: float = 0.0) -> torch.Tensor:
    """Random probability rows [n, V] (float64), some entries exactly zero, never a zero row."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, vocab, generator=gen, dtype=torch.float64) ** 3
    if zero_prob:
        zero = torch.rand(n, vocab, generator=gen) < zero_prob
        zero[:, 0] &= ~zero.all(dim=1)  # keep at least one positive entry per row
        x = x.masked_fill(zero, 0.0)
    return x / x.sum(dim=1, keepdim=True)


# ------------------------------------------------------------------------------------------------
# standardize (§2.2)
# ------------------------------------------------------------------------------------------------

CONFIGS = [
    # temperature, top_k, top_p
    (1.0, 0, 1.0),
    (0.5, 0, 1.0),
    (2.0, 0, 1.0),
    (0.0, 0, 1.0),
    (1.0, 1, 1.0),
    (0.7, 3, 1.0),
    (1.0, 0, 0.9),
    (1.0, 0, 0.5),
    (1.3, 0, 0.3),
    (0.8, 4, 0.7),
    (1.0, 0, 1e-6),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("vocab", [2, 5, 17, 100])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"T{c[0]}-k{c[1]}-p{c[2]}")
def test_standardize_matches_reference(dtype, vocab, config):
    temperature, top_k, top_p = config
    logits = random_logits(4, vocab, seed=vocab * 1000 + CONFIGS.index(config), dtype=dtype)
    got = sampling.standardize(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    want = reference.standardize(logits, temperature, top_k, top_p)
    assert got.shape == logits.shape
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    # Same support exactly, then same values.
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got.to(torch.float64), want, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_standardize_half_precision_logits(dtype):
    """Half-precision logits are standardized in float32 (the spec): equal to the float64 reference."""
    logits = random_logits(3, 11, seed=5, dtype=dtype)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 4, 0.8), (0.0, 0, 1.0)]:
        got = sampling.standardize(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        want = reference.standardize(logits, temperature, top_k, top_p)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.to(torch.float64), want, rtol=0, atol=2e-6)


def _std(values, **kwargs) -> torch.Tensor:
    logits = torch.tensor([values], dtype=torch.float64)
    return sampling.standardize(logits, **kwargs)[0]


def _exact(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_standardize_top_k_keeps_all_ties_of_kth_value():
    got = _std([1.0, 2.0, 2.0, 2.0, 0.0], top_k=2)
    torch.testing.assert_close(got, _exact([0, 1 / 3, 1 / 3, 1 / 3, 0]), rtol=0, atol=1e-15)


def test_standardize_argmax_picks_first_of_tied_maxima():
    got = _std([1.0, 3.0, 0.5, 3.0], temperature=0.0)
    assert torch.equal(got, _exact([0, 1, 0, 0]))
    # Temperature 0 ignores top-k / top-p (argmax survives both anyway).
    assert torch.equal(_std([1.0, 3.0, 0.5, 3.0], temperature=0.0, top_k=1, top_p=0.1), got)


def test_standardize_masked_logits():
    got = _std([NEG_INF, 0.0, 0.0, NEG_INF])
    assert torch.equal(got, _exact([0, 0.5, 0.5, 0]))
    # The 3rd largest is -inf: top_k=3 keeps everything finite and cannot produce NaN.
    got = _std([NEG_INF, 0.0, math.log(3.0), NEG_INF], top_k=3)
    torch.testing.assert_close(got, _exact([0, 0.25, 0.75, 0]), rtol=0, atol=1e-15)
    # Argmax with -inf entries.
    assert torch.equal(_std([NEG_INF, -5.0, NEG_INF], temperature=0.0), _exact([0, 1, 0]))


@pytest.mark.parametrize("top_k", [5, 6, 1000])
def test_standardize_top_k_at_least_vocab_is_off(top_k):
    logits = random_logits(2, 5, seed=11, dtype=torch.float64)
    got = sampling.standardize(logits, top_k=top_k)
    torch.testing.assert_close(got, torch.softmax(logits, dim=-1), rtol=0, atol=1e-15)


def test_standardize_top_p_boundary():
    """The smallest most-probable set whose mass reaches top_p: probabilities 0.5, 0.3, 0.2."""
    values = [math.log(0.2), math.log(0.5), math.log(0.3)]
    assert torch.equal(_std(values, top_p=0.49) > 0, torch.tensor([False, True, False]))
    torch.testing.assert_close(_std(values, top_p=0.79), _exact([0, 0.625, 0.375]), rtol=0, atol=1e-12)
    torch.testing.assert_close(_std(values, top_p=0.81), _exact([0.2, 0.5, 0.3]), rtol=0, atol=1e-12)


def test_standardize_top_p_tiny_keeps_only_the_mode():
    logits = random_logits(6, 9, seed=3, dtype=torch.float64)
    got = sampling.standardize(logits, top_p=1e-9)
    assert torch.equal(got, torch.nn.functional.one_hot(logits.argmax(-1), 9).to(torch.float64))


def test_standardize_top_k_then_top_p():
    """Top-k is applied first and top-p renormalises within it: 0.4, 0.3, 0.2, 0.1 with k=3, p=0.5.

    After top-k the kept masses are 4/9, 3/9, 2/9; 4/9 < 0.5 so top-p keeps two tokens.
    """
    values = [math.log(v) for v in (0.1, 0.4, 0.2, 0.3)]
    torch.testing.assert_close(_std(values, top_k=3, top_p=0.5), _exact([0, 4 / 7, 0, 3 / 7]), rtol=0, atol=1e-12)


def test_standardize_one_hot_and_extreme_logits():
    assert torch.equal(_std([0.0, NEG_INF, NEG_INF]), _exact([1, 0, 0]))
    assert torch.equal(_std([1000.0, 0.0, 0.0]), _exact([1, 0, 0]))
    got = _std([1e4, 1e4 - math.log(3.0)])  # large but finite: no overflow
    torch.testing.assert_close(got, _exact([0.75, 0.25]), rtol=0, atol=1e-12)
    got = _std([1.0, 1.0 - 1e-3, 0.0], temperature=1e-3)  # tiny temperature: nearly argmax, no NaN
    assert torch.isfinite(got).all() and got[0] > got[1] > got[2] >= 0
    torch.testing.assert_close(got.sum(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize("dtype,temperature", [(torch.float32, 1e-40), (torch.float64, 1e-310), (torch.float32, 1e-30)])
def test_standardize_tiny_temperature_tends_to_argmax(dtype, temperature):
    """A positive temperature is valid however small: logits / T may overflow, but the law is the
    limit, argmax with tied maxima sharing the mass, never NaN."""
    logits = torch.tensor([[1.0, 3.0, -2.0, NEG_INF], [5.0, -1.0, 5.0, 4.0], [-30.0, -40.0, -35.0, -31.0]], dtype=dtype)
    want = torch.tensor([[0, 1, 0, 0], [0.5, 0, 0.5, 0], [1, 0, 0, 0]], dtype=torch.float64)
    got = sampling.standardize(logits, temperature=temperature)
    torch.testing.assert_close(got.to(torch.float64), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(reference.standardize(logits, temperature), want, rtol=0, atol=1e-12)


def test_standardize_huge_finite_logits():
    """Finite float32 logits near the float32 limit overflow once divided by T = 0.5: still no NaN."""
    huge = torch.tensor([[3e38, 1e38, -3e38]], dtype=torch.float32)
    want = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(sampling.standardize(huge, temperature=0.5).to(torch.float64), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(reference.standardize(huge, 0.5), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "values",
    [[0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0], [NEG_INF, NEG_INF, NEG_INF]],
    ids=["nan", "pos-inf", "all-neg-inf"],
)
def test_standardize_rejects_invalid_logits(values):
    logits = torch.tensor([[0.0, 1.0, 2.0], values], dtype=torch.float32)
    with pytest.raises(ValueError):
        sampling.standardize(logits)


# ------------------------------------------------------------------------------------------------
# acceptance probability (§2.3, A.5) and residual (§2.3)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lenience", [1.0, 0.9, 0.5, 0.1])
def test_acceptance_probability_matches_reference(lenience):
    p = random_dist(64, 6, seed=1, zero_prob=0.3).flatten()
    q = random_dist(64, 6, seed=2, zero_prob=0.3).flatten()
    got = sampling.acceptance_probability(p, q, lenience=lenience)
    torch.testing.assert_close(got.to(torch.float64), reference.acceptance_probability(p, q, lenience), rtol=0, atol=1e-15)
    assert ((got >= 0) & (got <= 1)).all()


def test_acceptance_probability_edge_cases():
    p = _exact([0.0, 0.0, 0.3, 0.2, 0.5, 0.1, 0.1])
    q = _exact([0.0, 0.4, 0.0, 0.2, 0.25, 0.5, 0.5])
    want = _exact([0.0, 0.0, 1.0, 1.0, 1.0, 0.2, 0.2])
    torch.testing.assert_close(sampling.acceptance_probability(p, q), want, rtol=0, atol=1e-15)
    # Lenience divides q: min(1, p / (l q)).
    want_l = _exact([0.0, 0.0, 1.0, 1.0, 1.0, 0.4, 0.4])
    torch.testing.assert_close(sampling.acceptance_probability(p, q, lenience=0.5), want_l, rtol=0, atol=1e-15)


def test_residual_matches_reference():
    p = random_dist(200, 7, seed=3, zero_prob=0.3)
    q = random_dist(200, 7, seed=4, zero_prob=0.3)
    q[:20] = p[:20]  # rows with zero residual mass return p
    got = sampling.residual(p, q)
    torch.testing.assert_close(got.to(torch.float64), reference.residual(p, q), rtol=0, atol=1e-14)
    torch.testing.assert_close(got[:20], p[:20], rtol=0, atol=0)
    assert (got >= 0).all()
    torch.testing.assert_close(got.sum(-1), torch.ones(200, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,eps", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_residual_with_tiny_mass_is_still_exact(dtype, eps):
    """p and q differ by eps: the residual is the exact norm(max(0, p - q)), here one-hot at token 0, not
    p (only a row with zero residual mass may fall back to p)."""
    p = torch.tensor([0.3, 0.2, 0.5], dtype=dtype)
    q = p + torch.tensor([-eps, eps, 0.0], dtype=dtype)
    got = sampling.residual(p, q)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.0], dtype=dtype), rtol=0, atol=1e-6)


def test_residual_edge_cases():
    p = _exact([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    q = _exact([[0.25, 0.25, 0.5], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    want = _exact([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    torch.testing.assert_close(sampling.residual(p, q), want, rtol=0, atol=1e-15)
    # One-dimensional input works like a single row.
    torch.testing.assert_close(sampling.residual(p[0], q[0]), want[0], rtol=0, atol=1e-15)


# ------------------------------------------------------------------------------------------------
# verify (Algorithm 1's acceptance step)
# ------------------------------------------------------------------------------------------------

VERIFY_CONFIGS = [
    # temperature, top_k, top_p, lenience
    (1.0, 0, 1.0, 1.0),
    (0.7, 0, 1.0, 1.0),
    (1.0, 3, 1.0, 1.0),
    (1.0, 0, 0.8, 1.0),
    (1.2, 4, 0.9, 1.0),
    (1.0, 0, 1.0, 0.5),
    (0.7, 3, 1.0, 0.2),
]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("config", VERIFY_CONFIGS, ids=lambda c: f"T{c[0]}-k{c[1]}-p{c[2]}-l{c[3]}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_verify_matches_reference(gamma, config, dtype):
    temperature, top_k, top_p, lenience = config
    vocab = 7
    seed = 100 * gamma + VERIFY_CONFIGS.index(config)
    target_logits = random_logits(gamma + 1, vocab, seed, dtype)
    draft_logits = random_logits(gamma, vocab, seed + 50, dtype)
    q = sampling.standardize(draft_logits, temperature=temperature, top_k=top_k, top_p=top_p)
    gen = torch.Generator().manual_seed(seed)
    draft_tokens = torch.multinomial(q.to(torch.float64), 1, generator=gen)[:, 0]
    draft_tokens[0] = int(torch.argmin(q[0]))  # also a token the draft gives (nearly) no mass
    accept, next_dist = sampling.verify(
        target_logits, q, draft_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, lenience=lenience,
    )
    want_accept, want_next = reference.verify(
        target_logits, q, draft_tokens.tolist(), temperature, top_k, top_p, lenience
    )
    assert accept.shape == (gamma,) and next_dist.shape == (gamma + 1, vocab)
    torch.testing.assert_close(accept.to(torch.float64), want_accept, **tol(dtype))
    torch.testing.assert_close(next_dist.to(torch.float64), want_next, **tol(dtype))
    torch.testing.assert_close(
        next_dist.sum(-1).to(torch.float64), torch.ones(gamma + 1, dtype=torch.float64), rtol=0, atol=1e-5
    )


def _verify_greedy(target_logits, tokens, lenience):
    gamma = len(tokens)
    q = torch.nn.functional.one_hot(torch.tensor(tokens), target_logits.shape[-1]).to(target_logits.dtype)
    return sampling.verify(target_logits, q, torch.tensor(tokens), temperature=0.0, lenience=lenience)


def test_verify_greedy_exact_and_lenient():
    """Temperature 0 (A.5 argmax variant): l = 1 accepts exactly the argmax; l < 1 accepts x iff
    softmax(logits)(x) >= l * max softmax(logits); the emitted token is always argmax p."""
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5], [0.2, 0.2, 0.6]], dtype=torch.float64)
    logits = probs.log()
    one_hot_argmax = torch.nn.functional.one_hot(probs.argmax(-1), 3).to(torch.float64)
    cases = [
        # draft tokens, lenience, expected accept
        ([0, 1, 2], 1.0, [1, 1, 1]),
        ([1, 1, 2], 1.0, [0, 1, 1]),
        ([0, 2, 0], 1.0, [1, 0, 0]),
        ([1, 2, 0], 0.55, [1, 0, 0]),  # 0.3 >= 0.275; 0.3 < 0.33; 0.25 < 0.275
        ([1, 2, 0], 0.45, [1, 1, 1]),  # 0.3 >= 0.225; 0.3 >= 0.27; 0.25 >= 0.225
        ([2, 0, 1], 0.45, [0, 0, 1]),  # 0.2 < 0.225; 0.1 < 0.27; 0.25 >= 0.225
        ([0, 0, 1], 0.2, [1, 0, 1]),  # 0.5 is the max; 0.1 < 0.12; 0.25 >= 0.1
        ([0, 0, 1], 0.1, [1, 1, 1]),  # 0.1 >= 0.06
    ]
    for tokens, lenience, want in cases:
        accept, next_dist = _verify_greedy(logits, tokens, lenience)
        assert accept.tolist() == want, (tokens, lenience)
        torch.testing.assert_close(next_dist.to(torch.float64), one_hot_argmax, rtol=0, atol=0)


def test_verify_identical_draft_accepts_everything():
    logits = random_logits(5, 8, seed=9, dtype=torch.float64)
    q = sampling.standardize(logits, temperature=0.9, top_k=5)[:4]  # bit-identical to the p rows
    accept, next_dist = sampling.verify(logits, q, torch.tensor([0, 1, 2, 3]), temperature=0.9, top_k=5)
    p = reference.standardize(logits, 0.9, 5)
    assert accept.tolist() == [1.0 if p[i, i] > 0 else 0.0 for i in range(4)]
    # Zero residual mass: the rows fall back to p (never reached, but must be a distribution).
    torch.testing.assert_close(next_dist, p, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# sample (the engine's sampler)
# ------------------------------------------------------------------------------------------------


def test_sample_never_draws_zero_probability_and_fits():
    """20000 draws from a distribution with zeros and a 1e-30 entry: zero-probability tokens are
    never drawn, and a chi-square goodness-of-fit test at significance 1e-3 passes (fixed seed)."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.35, 1e-30, 0.25, 0.3, 0.0], dtype=torch.float64)
    n = 20000
    draws = sampling.sample(probs.expand(n, -1).contiguous(), 1234)
    assert draws.shape == (n,) and draws.dtype == torch.long
    counts = torch.bincount(draws, minlength=8)
    assert counts[probs == 0].sum() == 0
    support = probs > 1e-20
    assert counts[~support].sum() == 0  # 1e-30 would need ~1e30 draws
    result = scipy.stats.chisquare(counts[support].numpy(), (probs[support] * n).numpy())
    assert result.pvalue > 1e-3, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sample_is_deterministic_for_a_seed(dtype):
    probs = random_dist(500, 9, seed=6, zero_prob=0.4).to(dtype)
    a = sampling.sample(probs, 42)
    assert torch.equal(a, sampling.sample(probs, 42))
    assert not torch.equal(a, sampling.sample(probs, 43))  # 500 high-entropy rows: equal w.p. ~0
    assert (probs.gather(1, a[:, None]) > 0).all()


def test_sample_one_hot_rows():
    idx = torch.tensor([3, 0, 6, 6, 1])
    probs = torch.nn.functional.one_hot(idx, 7).to(torch.float32)
    for seed in range(5):
        assert torch.equal(sampling.sample(probs, seed), idx)


def test_package_exports():
    for name in ("load", "SpeculativeDecoder", "generate", "sampling"):
        assert hasattr(speculant, name), name
