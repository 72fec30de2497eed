"""Pearson's chi-square goodness-of-fit test of sampled token sequences against an exact joint law, shared by
the statistical tests (test_distribution.py, test_hf_decoding.py)."""

import numpy as np
import scipy.stats
import torch

from speculant.testing import pool_cells

# The significance level of every statistical test of the suite: each test fails a correct engine with probability
# at most this (their seeds are fixed, so a run that passes passes again).
SIGNIFICANCE = 1e-3


def pooled(expected: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """speculant.testing's grouping of cells expected fewer than MIN_EXPECTED times into bins (in order of
    expected count, each bin expected at least MIN_EXPECTED times). Zero-probability cells must be dropped
    before."""
    e, o, _ = pool_cells(expected, observed)
    return e, o


def chi_square_pvalue(law: torch.Tensor, samples: np.ndarray) -> float:
    """Pearson chi-square p-value of samples [n, k] (token ids) against the exact joint law [V] * k.

    Asserts first that no sample falls in a cell of probability zero.
    """
    n, k = samples.shape
    vocab = law.shape[0]
    cells = np.ravel_multi_index(tuple(samples.T), (vocab,) * k)
    observed = np.bincount(cells, minlength=vocab**k).astype(np.float64)
    probs = law.reshape(-1).numpy()
    impossible = probs == 0
    assert observed[impossible].sum() == 0, (
        f"{int(observed[impossible].sum())} samples in zero-probability cells "
        f"{np.nonzero(impossible & (observed > 0))[0].tolist()}"
    )
    expected, observed = pooled(probs[~impossible] * n, observed[~impossible])
    expected *= observed.sum() / expected.sum()  # float64 rounding only
    if len(expected) < 2:
        return 1.0
    return float(scipy.stats.chisquare(observed, expected).pvalue)
