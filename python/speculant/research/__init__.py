"""Research tools over the decoder: Theorem 3.8's analysis, timing, sweeps and their workers, distribution tests,
distillation of drafts, plots."""
