"""The engine's step kernels (cpp/math/step.h, cpp/math/cpu_kernels.h) against tests/support/reference.py.

CPU tensors run fused host kernels, accelerators the tensor path; both are checked here on CPU:
* standardize: host kernel = tensor path = reference, on edge cases (masks, ties, top-k / top-p edges,
  tiny and huge temperatures, every logit dtype);
* one verification with given uniforms: the host kernel returns exactly the n, t and beta values that
  reference.verify implies (uniforms placed away from every decision boundary);
* one verification with a seeded generator, both paths: the law of (n, t) passes a chi-square test against
  the exact law from reference.verify, at significance 1e-3 per case (fixed seeds, so the outcome is fixed).
"""

import itertools

import numpy as np
import pytest
import scipy.stats
import torch

from support import reference
from support.chisquare import pooled
from speculant import _core

F64 = torch.float64
NEG_INF = float("-inf")
CONFIGS = [  # temperature, top_k, top_p, lenience
    (1.0, 0, 1.0, 1.0),
    (0.7, 0, 1.0, 1.0),
    (1.3, 3, 1.0, 1.0),
    (1.0, 0, 0.8, 1.0),
    (0.9, 4, 0.9, 1.0),
    (1.0, 0, 1.0, 0.5),
    (0.0, 0, 1.0, 1.0),
    (0.0, 0, 1.0, 0.3),
]


def logits_case(rows: int, vocab: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=gen, dtype=F64) * 2
    x[:, -1] = NEG_INF  # a masked token in every row
    if vocab > 3:
        x[0, 1] = x[0, 2]  # a tie
    return x.to(dtype)


def draft_rows(gamma: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [gamma, V] (some zeros, including on the target's masked last token) and tokens drawn from it."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(gamma, vocab, generator=gen, dtype=F64) ** 2
    q[:, 0] = 0.0
    q = q / q.sum(1, keepdim=True)
    tokens = torch.multinomial(q, 1, generator=gen)[:, 0]
    return q.to(torch.float32), tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (1e-30, 0, 1.0), (1e6, 0, 1.0), (1.0, 1, 1.0), (1.0, 2, 1.0),
     (1.0, 7, 1.0), (1.0, 100, 1.0), (1.0, 0, 1e-9), (1.0, 0, 0.5), (0.8, 3, 0.7), (0.0, 0, 1.0)],
)
def test_standardize_host_kernel_equals_tensor_path_and_reference(dtype, temperature, top_k, top_p):
    x = logits_case(5, 8, seed=3, dtype=dtype)
    host = _core.standardize(x, temperature, top_k, top_p)
    tensor_path = _core._standardize_as_tensors(x, temperature, top_k, top_p)
    expected = reference.standardize(x, temperature, top_k, top_p)
    atol = 1e-12 if dtype == F64 else 2e-6
    assert host.dtype == tensor_path.dtype
    torch.testing.assert_close(host.to(F64), tensor_path.to(F64), rtol=0, atol=atol)
    torch.testing.assert_close(host.to(F64), expected, rtol=0, atol=atol)


def test_standardize_host_kernel_flags_bad_rows():
    x = torch.zeros(4, 5)
    x[0, 2] = float("nan")
    x[1, 0] = float("inf")
    x[2] = NEG_INF
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.5, 2, 0.9), (0.0, 0, 1.0)]:
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            _core.standardize(x, temperature, top_k, top_p)
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            _core.standardize(x[2:3], temperature, top_k, top_p)
        _core.standardize(x[3:], temperature, top_k, top_p)  # the good row alone is fine


def place_uniform(dist: torch.Tensor, token: int) -> float:
    """A uniform u for which the inverse CDF of `dist` returns `token`: the middle of its CDF interval."""
    cdf = torch.cumsum(dist.to(F64), 0)
    low = 0.0 if token == 0 else float(cdf[token - 1])
    return (low + float(cdf[token])) / 2 / float(cdf[-1])


def verification_cases():
    for (gamma, vocab, seed), config in itertools.product([(1, 3, 0), (2, 5, 1), (4, 8, 2), (3, 1, 3)], CONFIGS):
        if vocab == 1 and (config[1] or config[2] < 1):
            continue
        yield pytest.param(gamma, vocab, seed, config, id=f"g{gamma}-V{vocab}-{config}")


@pytest.mark.parametrize("gamma,vocab,seed,config", list(verification_cases()))
def test_host_verification_with_given_uniforms_matches_reference(gamma, vocab, seed, config):
    temperature, top_k, top_p, lenience = config
    logits = logits_case(gamma + 1, vocab, seed) if vocab > 1 else torch.zeros(gamma + 1, 1)
    q, tokens = draft_rows(gamma, vocab, seed) if vocab > 1 else (torch.ones(gamma, 1), torch.zeros(gamma, dtype=torch.long))
    accept, next_dist = reference.verify(logits, q, tokens.tolist(), temperature, top_k, top_p, lenience)
    p = reference.standardize(logits, temperature, top_k, top_p)
    betas = torch.minimum(p[:gamma], q.to(F64)).sum(1)
    greedy = temperature == 0
    checked = 0
    for n in range(gamma + 1):  # force every reachable n: accept the first n, reject the next
        if any(float(a) == 0 for a in accept[:n]) or (n < gamma and float(accept[n]) == 1):
            continue
        uniforms = [float(a) / 2 for a in accept[:n]] + ([(float(accept[n]) + 1) / 2] if n < gamma else [])
        for t in torch.nonzero(next_dist[n] > 0)[:, 0].tolist():
            if greedy and t != int(next_dist[n].argmax()):
                continue
            given = [] if greedy else uniforms + [place_uniform(next_dist[n], t)]
            got_n, got_t, got_betas, used = _core._verify_step(logits, q, tokens, *config, given + [0.5] * 3)
            assert (got_n, got_t) == (n, t), f"forced n={n}, t={t}, got n={got_n}, t={got_t}"
            assert used == len(given), "the kernel drew a different number of uniforms than Algorithm 1 needs"
            np.testing.assert_allclose(got_betas, betas[: min(n + 1, gamma)].numpy(), rtol=0, atol=2e-6)
            checked += 1
    assert checked > 0


def exact_law(logits, q, tokens, config) -> np.ndarray:
    """P(n, t) [gamma + 1, V] from reference.verify: n leading acceptances, then t ~ next_dist[n]."""
    accept, next_dist = reference.verify(logits, q, tokens.tolist(), *config)
    gamma = len(tokens)
    law = torch.zeros(gamma + 1, logits.shape[1], dtype=F64)
    reach = 1.0
    for n in range(gamma + 1):
        stop = 1.0 - float(accept[n]) if n < gamma else 1.0
        law[n] = reach * stop * next_dist[n]
        if n < gamma:
            reach *= float(accept[n])
    return law.numpy()


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensor"])
@pytest.mark.parametrize("config", [c for c in CONFIGS if c[0] > 0], ids=str)
def test_seeded_verification_law_is_exact(as_tensors, config):
    """Chi-square at significance 1e-3 (false-failure rate 1e-3 per case; seeds fixed, so deterministic)."""
    gamma, vocab, draws = 2, 5, 3000
    logits = logits_case(gamma + 1, vocab, seed=11) * 0.3  # flat enough that top-p keeps several tokens
    q, tokens = draft_rows(gamma, vocab, seed=12)
    law = exact_law(logits, q, tokens, config).ravel()
    assert (law > 0).sum() >= 4
    counts = np.zeros_like(law)
    # one batch of `draws` rows, row i seeded with i: what verifying the rows one by one gives (tested below)
    for n, t, _, finite, _ in _core._verify_rows_seeded([(logits, q, tokens)] * draws, *config, seeds=list(range(draws)),
                                                     as_tensors=as_tensors):
        assert finite
        counts[n * vocab + t] += 1
    assert counts[law == 0].sum() == 0, "an outcome of probability zero was drawn"
    expected, observed = pooled(law[law > 0] * draws, counts[law > 0])
    assert scipy.stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


def verify_one(logits, q, tokens, config, seed, as_tensors):
    return _core._verify_rows_seeded([(logits, q, tokens)], *config, seeds=[seed], as_tensors=as_tensors)[0]


@pytest.mark.parametrize("config", [c for c in CONFIGS if c[0] == 0], ids=str)
def test_greedy_verification_is_the_same_on_both_paths(config):
    """At temperature 0 a verdict is a function of the logits (no draw): the tensor path's acceptance test (r l q(x) <
    p(x) in float64, and A.5's argmax variant with lenience) gives the host kernel's n and t on every case: drafts
    that are the target's argmax, its runner-up (kept by lenience when close enough) or any other token."""
    vocab, gamma = 6, 3
    gen = torch.Generator().manual_seed(5)
    for case in range(200):
        logits = logits_case(gamma + 1, vocab, seed=100 + case)
        ranked = logits.argsort(1, descending=True)
        choice = torch.randint(0, 3, (gamma,), generator=gen)  # the argmax, the runner-up or a random token
        anything = torch.randint(0, vocab, (gamma,), generator=gen)
        tokens = torch.where(choice == 0, ranked[:gamma, 0], torch.where(choice == 1, ranked[:gamma, 1], anything))
        q = torch.nn.functional.one_hot(tokens, vocab).float()  # the draft's greedy q: the point mass at its token
        host, tensor = (verify_one(logits, q, tokens, config, case, as_tensors) for as_tensors in (False, True))
        assert tensor[:2] == host[:2], f"case {case}: tensor path (n, t) {tensor[:2]} != host kernel's {host[:2]}"


def test_seeded_verification_flags_non_finite_target_rows():
    logits = logits_case(3, 5, seed=1)
    logits[2, 0] = float("nan")  # the bonus row: never read unless both drafts are kept, still checked
    q, tokens = draft_rows(2, 5, seed=2)
    clean = logits_case(2, 5, seed=3)
    q1, tokens1 = draft_rows(1, 5, seed=4)
    config = (1.0, 0, 1.0, 1.0)
    for as_tensors in (False, True):
        assert verify_one(logits, q, tokens, config, 0, as_tensors)[3] is False
        batch = _core._verify_rows_seeded([(clean, q1, tokens1), (logits, q, tokens)], *config, seeds=[0, 1],
                                          as_tensors=as_tensors)
        assert [v[3] for v in batch] == [True, False], "only the row with the NaN is flagged"


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensor"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_a_batch_verifies_each_row_as_alone(as_tensors, config):
    """Rows of different gamma (0 to 3) in one batched verification: each gets exactly the verdict it gets alone
    with its seed (the tensor path pads the rows to the longest draft and reads them back at once)."""
    vocab = 7
    rows = []
    for i, gamma in enumerate([2, 0, 3, 1, 3, 0]):
        q, tokens = draft_rows(gamma, vocab, seed=20 + i) if gamma else (torch.empty(0, vocab), torch.empty(0).long())
        rows.append((logits_case(gamma + 1, vocab, seed=40 + i) * 0.5, q, tokens))
    for draw in range(20):
        seeds = [1000 * draw + i for i in range(len(rows))]
        batch = _core._verify_rows_seeded(rows, *config, seeds=seeds, as_tensors=as_tensors)
        for row, seed, got in zip(rows, seeds, batch):
            n, t, betas, finite, _ = verify_one(*row, config, seed, as_tensors)
            assert got[:2] == (n, t) and got[3] == finite
            np.testing.assert_array_equal(got[2], betas)


def test_inverse_cdf_never_returns_a_zero_probability_token():
    """Uniforms at the edges of [0, 1) with zero-mass tokens on both sides of the support."""
    logits = torch.tensor([[NEG_INF, 0.0, NEG_INF, 0.0, NEG_INF]] * 2)
    q = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
    for u in [0.0, 1e-300, 0.5, 1.0 - 2**-53]:
        n, t, betas, _ = _core._verify_step(logits, q, torch.tensor([2]), 1.0, 0, 1.0, 1.0, [u, u])
        assert n == 0 and t in (1, 3) and betas == [0.0]


@pytest.mark.parametrize("as_tensors", [False, True], ids=["host", "tensor"])
def test_a_draft_its_law_gives_no_mass_is_kept_as_algorithm_1_keeps_it(as_tensors):
    """The chain's test is min(1, p(x) / q(x)), 1 where q(x) = 0 < p(x) (reference.acceptance_probability), on
    both paths: the host verifies a chain as the tree [1] * gamma, whose later children alone (a tree's fillers)
    are never kept where their law gives them no mass."""
    logits = torch.tensor([[0.0, 0.0, 0.0, NEG_INF], [0.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # the draft token 2 has q = 0 < p
    row = (logits, q, torch.tensor([2]))
    for seed in range(5):
        n, *_ = _core._verify_rows_seeded([row], 1.0, 0, 1.0, 1.0, seeds=[seed], as_tensors=as_tensors)[0]
        assert n == 1
    assert reference.acceptance_probability(torch.tensor(1 / 3), torch.tensor(0.0)).item() == 1.0
