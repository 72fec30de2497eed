"""Pearson's chi-square goodness-of-fit test of sampled token sequences against an exact joint law, shared by
the statistical tests (test_distribution.py, test_hf_decoding.py)."""

import numpy as np
import scipy.stats
import torch

MIN_EXPECTED = 5.0


def pooled(expected: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups the cells with expected count < MIN_EXPECTED, in order of expected count, into consecutive bins
    of expected count >= MIN_EXPECTED (a remainder below it joins the last bin, or the smallest large cell
    when there is no bin). Binning rather than one pool keeps the test's power when most cells are small
    (a near-uniform law over many cells). The partition depends on `expected` only, so the statistic is a
    valid chi-square goodness-of-fit test. Zero-probability cells must be dropped before."""
    order = np.argsort(expected, kind="stable")
    e, o = expected[order], observed[order]
    split = int(np.searchsorted(e, MIN_EXPECTED))  # e[:split] < MIN_EXPECTED <= e[split:]
    bins_e, bins_o = list(e[split:]), list(o[split:])
    run_e = run_o = 0.0
    closed = 0  # bins closed from small cells
    for cell_e, cell_o in zip(e[:split], o[:split]):
        run_e, run_o = run_e + cell_e, run_o + cell_o
        if run_e >= MIN_EXPECTED:
            bins_e.append(run_e)
            bins_o.append(run_o)
            run_e = run_o = 0.0
            closed += 1
    if run_e > 0 or run_o > 0:  # the remainder: into the last small-cell bin, else the smallest large cell
        target = len(bins_e) - 1 if closed else 0
        if not bins_e:
            return np.array([run_e]), np.array([run_o])
        bins_e[target] += run_e
        bins_o[target] += run_o
    return np.array(bins_e), np.array(bins_o)


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
