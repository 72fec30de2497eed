"""Assertions on output laws, shared by the statistical tests (test_distribution.py, test_batch.py, test_graphs.py,
test_tensor_path.py, test_tree_decoding.py, test_tree_growth.py).

`assert_law` compares sampled rows of generated tokens with an exact joint law (tests/support/markov.py's
enumerations) by tests/support/chisquare.py's Pearson test at SIGNIFICANCE, on the two WINDOWS of tokens 1-3 and 4-6;
`check_no_top_p_boundary` is the precondition that keeps a top-p boundary away from float32 rounding. The LAW_*
constants and `batched_samples` draw those rows from a decoder in batches of BATCH rows (row i with seed + i), on
LAW_VOCAB-token Markov tables from the prompt LAW_PROMPT, LAW_NEW tokens each.
"""

import numpy as np
import torch

from . import markov
from .chisquare import SIGNIFICANCE, chi_square_pvalue

WINDOWS = [(0, 1, 2), (3, 4, 5)]  # token indices whose joint law is tested (4-6 need several iterations)


def check_no_top_p_boundary(table: torch.Tensor, temperature: float, top_k: int, top_p: float) -> None:
    """Precondition: no context puts a top-p boundary within 1e-5 of top_p, so the engine's float32
    standardization and the float64 enumeration keep the same tokens."""
    if top_p >= 1.0:
        return
    probs = markov.standardized_table(table, temperature, top_k, 1.0).reshape(-1, table.shape[-1])
    sorted_probs = probs.sort(dim=-1, descending=True).values
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    assert ((mass_before - top_p).abs() > 1e-5).all(), "pick another seed or top_p"


def assert_law(samples: np.ndarray, law: torch.Tensor, label: str) -> None:
    for window in WINDOWS:
        window_law = markov.marginal(law, list(window))
        pvalue = chi_square_pvalue(window_law, samples[:, list(window)])
        assert pvalue > SIGNIFICANCE, f"{label}: tokens {window} reject the exact law, p = {pvalue:.3g}"


LAW_VOCAB = 4
LAW_NEW = 6  # test_distribution's MAX_NEW_TOKENS: WINDOWS are tokens 1-3 and 4-6
LAW_PROMPT = [2, 1, 3]
BATCH = 1000


def batched_samples(decoder, prompts, n: int, seed: int) -> np.ndarray:
    """n rows of LAW_NEW tokens: rows cycle through `prompts`, in batches of BATCH rows, row i with seed + i."""
    out = []
    for start in range(0, n, BATCH):
        rows = [prompts[i % len(prompts)] for i in range(start, min(start + BATCH, n))]
        results = decoder.generate(rows, max_new_tokens=LAW_NEW, seed=seed + start)
        assert [r.stats.seed for r in results] == list(range(seed + start, seed + start + len(rows)))
        out += [r.tokens for r in results]
    samples = np.array(out)
    assert samples.shape == (n, LAW_NEW)
    return samples
