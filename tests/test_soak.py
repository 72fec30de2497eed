"""No leaks: benchmarks/soak.py at a CI size, and a user's scripted model whose parameters require grad.

The full soak (10,000 generations, figures in BENCHMARKS.md) is not a test. Here 300 generations after a warm-up
of 150 go through every case of the soak (every drafter x sampling mode x gamma policy, plain decoding, and the
four error cases raised mid-run); resident memory may grow by at most GROWTH_PERCENT. That bound is loose for
allocator noise at this size (the process holds ~570 MiB, so 3% is ~17 MiB) and tight for what a leak per
generation would add: a retained KV cache, autograd graph or trace per generation grows RSS linearly.
"""

import os
import sys

import pytest
import torch

import speculant

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import soak  # noqa: E402

# The soak loads a plain-form model (forward only) on purpose: load's warning that the form recomputes the prefix at
# every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

GROWTH_PERCENT = 3.0


def test_reduced_soak_does_not_grow():
    figures = soak.main(["--generations", "300", "--warmup", "150", "--report-every", "0"])
    assert figures["generations"] == 300 and figures["new_tokens"] > 0
    assert set(figures["by_kind"]) == {"ok", "plain", "nan_target", "nan_draft", "raising_drafter", "nan_drafter"}
    # every error case raised its error (and no other case raised: soak.run re-raises those)
    assert figures["error_cases_that_raised"] == figures["error_cases"] > 0
    assert set(figures["errors"]) == {"nan_target: ValueError", "nan_draft: ValueError",
                                      "raising_drafter: DrafterError", "nan_drafter: ValueError"}
    assert figures["rss_growth_percent"] < GROWTH_PERCENT, figures


class InPlaceCache(torch.nn.Module):
    """A user's own model in the cached contract whose parameters require grad and whose cache is written in
    place: with autograd on, every extend would add the cache write to a graph that outlives the call and grows
    with each one. It raises if it sees autograd (or a graph on its cache or logits)."""

    vocab_size: int
    max_length: int
    length: int

    def __init__(self, vocab: int = 32, width: int = 16, max_length: int = 64):
        super().__init__()
        self.vocab_size, self.max_length, self.length = vocab, max_length, 0
        self.embed = torch.nn.Parameter(torch.randn(vocab, width))
        self.head = torch.nn.Parameter(torch.randn(width, vocab))
        self.register_buffer("cache", torch.zeros(max_length, width))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return (self.embed[input_ids[0]].cumsum(0) @ self.head).unsqueeze(0)

    @torch.jit.export
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.length = 0
        return self.extend(input_ids)

    @torch.jit.export
    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        k = input_ids.size(1)
        self.cache[self.length:self.length + k] = self.embed[input_ids[0]]  # [k, width], in place
        logits = (self.cache[:self.length + k].cumsum(0)[self.length:] @ self.head).unsqueeze(0)  # [1, k, V]
        if torch.is_grad_enabled() or logits.requires_grad or self.cache.requires_grad:
            raise RuntimeError("autograd is recording a graph of this call")
        self.length += k
        return logits

    @torch.jit.export
    def truncate(self, length: int) -> None:
        self.length = length

    @torch.jit.export
    def cache_length(self) -> int:
        return self.length


def test_scripted_model_with_grad_parameters_records_no_graph_and_does_not_grow():
    torch.manual_seed(0)
    target, draft = torch.jit.script(InPlaceCache()), torch.jit.script(InPlaceCache())
    assert target.embed.requires_grad and target.head.requires_grad
    with torch.enable_grad():  # the caller's autograd state must not matter
        decoder = speculant.SpeculativeDecoder(speculant.load(target), speculant.load(draft), gamma=3)
        run = lambda seed: decoder.generate([1, 2, 3], max_new_tokens=40, seed=seed)  # noqa: E731
        for seed in range(50):  # warm-up (the model raises on the first call that records a graph)
            run(seed)
        before = soak.rss_bytes()
        for seed in range(50, 550):
            assert len(run(seed).tokens) == 40
        growth = 100.0 * (soak.rss_bytes() - before) / before
    assert growth < GROWTH_PERCENT, f"RSS grew {growth:.2f}% over 500 generations"
