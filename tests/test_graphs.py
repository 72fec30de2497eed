"""Fixed-shape calls and CUDA graphs: the decoders' ``cuda_graphs`` option (python/speculant/decoding/graphs.py,
cpp/models/native_rows.h, cpp/device/graphs.h).

The contract: graphs change no output. ``cuda_graphs="fixed"`` runs exactly the calls a CUDA graph replays (every
row of the batch, each call padded to its width, every cache slot read, the inputs copied into per-width
buffers) without capturing them, so on CPU everything but the capture itself is checked here:

* Fixed shapes give what dynamic shapes give, row for row: the same tokens, trace and counts, alpha within 1e-6
  relative (attending over more masked slots may round differently in the last bits). Every backend with
  fixed-shape calls: TinyGPT, the Llama and GPT-2 exports, a .pt2 GPT-2 (its calls as they are) and native
  Markov tables; batches and batch 1; greedy, temperature 1, top-k + top-p; adaptive gamma (calls of many
  widths); EOS stopping rows early; plain decoding; batches of changing size on the same models (each new size
  reallocates the row cache, so the per-width buffers must be dropped).
* The calls really are fixed: a table model that rejects any call not covering all rows and all max_length slots
  decodes with fixed shapes, and fails with dynamic ones.
* Exact laws with fixed shapes on native Markov tables: Pearson chi-square against the enumerated law at
  SIGNIFICANCE = 1e-3 per test (test_distribution.py's level and windows): the target law at temperature 1 and
  the exact lenient law at lenience 0.5, 2 windows each, make 4 tests that a correct engine fails by chance with
  probability at most 0.4% (Bonferroni) for a fresh draw of seeds; the seeds are fixed.
* Token trees (cpp/models/native_rows.cpp's extend_tree): with fixed shapes every tree call runs over every row and all
  max_length slots (its mask [rows, width, max_length]) and gives what dynamic shapes give, for a shape, a given
  tree and grown trees, each way of drawing siblings, on every backend above, with EOS stops and on a .pt2
  package; a table model whose tree call refuses anything narrower decodes with fixed shapes only; a tree call
  that rebinds its cache is refused by name; and the law of tree [2, 2] with fixed shapes is the target's
  (chi-square at SIGNIFICANCE, 2 windows: with the 4 above, at most 0.6% family-wise).
* The option: "off" is the default (docs/cuda-graphs.md says why, though the capture ran correctly on an H200); bad values,
  "on" without CUDA, and "fixed" on backends without fixed-shape calls raise ValueError saying why; "auto" on CPU
  leaves the calls as they were, without a warning.

On a GPU (marked ``cuda``; skipped without one, as in CI): graphs are captured (``graphs_captured``, no
failure), give the same tokens as the fixed-shape calls they capture run uncaptured on every backend that can be
captured, a decoder-only .pt2 package among them (its decoding steps), reproduce with a seed within a process
and across processes, and keep the exact laws of every sampling mode. The laws: greedy exactly, and temperature
1, top-k, top-p and lenience 0.5 by the chi-square test at 1e-3 (4 configurations x 2 windows), plus the device
sampling path (_sample_as_tensors) against its probabilities at 1e-3: 9 tests, at most 0.9% family-wise false
failures. Tree calls captured (a shape, a given tree and grown ones, each way of drawing siblings) give the
tokens of the same calls uncaptured on every backend, and three tree laws by the chi-square test at 1e-3, 2
windows each (6 more tests: at most 1.5% family-wise).
"""

import concurrent.futures
import functools
import inspect

import numpy as np
import pytest
import torch
from torch import Tensor

from support import hf_models
from support import markov
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.engine_checks import (GAMMA, MAX_NEW, PROMPTS, SETTINGS, TABLE_MAX_LENGTH, MarkovRows,
                                   assert_same_result, loaded_tiny_models, markov_model, table_model, tiny_models)
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples, check_no_top_p_boundary
from speculant import graphs, tiny_gpt
from speculant.decoding.decoder import KEPT_PLAIN
from speculant.testing import tensor_path

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

FIXED_MAX_LENGTH = TABLE_MAX_LENGTH  # the table models' (engine_checks.table_model) and the exports'


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


class CapturableRows(MarkovRows):
    """MarkovRows without its host-side checks (each reads a tensor on the host, which a CUDA graph cannot
    capture): the same tables, for the laws with graphs on."""

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        return self.lookup(input_ids, rows, positions, slots)

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        return self.masked_lookup(input_ids, rows, positions, slots, mask)

    def lookup(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor) -> Tensor:
        index = rows.unsqueeze(1).expand_as(slots)  # [R, T]
        self.row_tokens[index, slots] = input_ids
        self.row_positions[index, slots] = positions  # what the tree calls find their predecessors by
        return self.table_logits(input_ids, positions, self.row_tokens[index, torch.clamp(positions - 1, min=0)])

    def masked_lookup(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
        index = rows.unsqueeze(1).expand_as(slots)  # [R, T]
        self.row_tokens[index, slots] = input_ids
        self.row_positions[index, slots] = positions
        return self.table_logits(input_ids, positions, self.predecessors(rows, positions, mask)[1])

    def table_logits(self, input_ids: Tensor, positions: Tensor, before: Tensor) -> Tensor:
        prev2 = torch.where(positions >= 1, before.clamp(min=0), torch.full_like(before, self.vocab_size))
        return self.table[(positions + 1) % 2, prev2, input_ids]  # [R, T, V]


def is_bucket(keys: int, max_length: int, positions: Tensor, slots: Tensor) -> bool:
    """Whether a fixed-shape call's slots are its bucket (native_rows.h): the smallest power of two, at least 16,
    that holds every real token's slot (a padding token writes the scratch slot max_length), or max_length."""
    end = int(torch.where(slots < max_length, slots, torch.zeros_like(slots)).max()) + 1
    bucket = 16
    while bucket < end and bucket < max_length:
        bucket *= 2
    return keys == min(bucket, max_length)


class FixedOnlyRows(CapturableRows):
    """A table model that refuses any call that is not fixed-shape: every row of the batch, over its bucket of
    slots."""

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        if rows.size(0) != self.row_tokens.size(0) or not is_bucket(keys, self.max_length, positions, slots):
            raise RuntimeError("FixedOnlyRows: a call that does not cover every row and its bucket of slots")
        return self.lookup(input_ids, rows, positions, slots)


class FixedOnlyTreeCalls(CapturableRows):
    """A table model whose tree calls refuse anything but fixed shapes: every row, over its bucket of slots."""

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        if rows.size(0) != self.row_tokens.size(0) or \
                not is_bucket(mask.size(2), self.max_length, positions, slots):
            raise RuntimeError("FixedOnlyRows: a tree call that does not cover every row and its bucket of slots")
        return self.masked_lookup(input_ids, rows, positions, slots, mask)


class RebindingRows(CapturableRows):
    """Breaks the contract (model.h): each call rebinds its cache to a new tensor instead of writing in place, so a
    CUDA graph would replay into the old one."""

    @torch.jit.export
    def extend_rows(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, keys: int) -> Tensor:
        self.row_tokens = self.row_tokens.clone()
        return self.lookup(input_ids, rows, positions, slots)


class RebindingTreeCalls(CapturableRows):
    """Breaks the contract in its tree calls alone."""

    @torch.jit.export
    def extend_rows_masked(self, input_ids: Tensor, rows: Tensor, positions: Tensor, slots: Tensor,
                           mask: Tensor) -> Tensor:
        self.row_tokens = self.row_tokens.clone()
        return self.masked_lookup(input_ids, rows, positions, slots, mask)


@pytest.fixture(scope="module")
def tiny():
    return loaded_tiny_models()


def exported(arch: str, folder, device: str = "cpu"):
    model = hf_models.make(arch, seed=0)
    draft = hf_models.drafted(model, noise=0.01, seed=1)
    speculant.export(model, folder / "target.pt", max_length=FIXED_MAX_LENGTH)
    speculant.export(draft, folder / "draft.pt", max_length=FIXED_MAX_LENGTH)
    return speculant.load(folder / "target.pt", device=device), speculant.load(folder / "draft.pt", device=device)


@pytest.fixture(scope="module", params=["tiny", "export-llama", "export-gpt2", "markov"])
def pair(request, tiny, tmp_path_factory):
    """(target, draft), both with fixed-shape calls."""
    if request.param == "tiny":
        return tiny
    if request.param == "markov":
        target, draft = markov.target_and_draft(16, 44, mask_prob=0.1)  # PROMPTS' tokens are below 16
        return markov_model(target, "native"), markov_model(draft, "native")
    return exported(request.param.split("-")[1], tmp_path_factory.mktemp(request.param))


def decoders(target, draft, modes=("off", "fixed"), **kwargs):
    return [speculant.SpeculativeDecoder(target, draft, gamma=GAMMA, cuda_graphs=mode, **kwargs) for mode in modes]


def plain_runs(target, modes):
    """speculant.generate on `target` in each cuda_graphs mode, with SpeculativeDecoder.generate's call shape."""
    return [lambda *a, mode=mode, **k: speculant.generate(target, *a, cuda_graphs=mode, **k) for mode in modes]


def assert_same_runs(generates, prompts, **kwargs) -> None:
    """Every generate in `generates` gives the first one's results, batch and batch 1 alike."""
    want = generates[0](prompts, **kwargs)
    for generate in generates[1:]:
        for r, (got, expected) in enumerate(zip(generate(prompts, **kwargs), want)):
            assert_same_result(got, expected, f"row {r}")
    for r, prompt in enumerate(prompts[:2]):
        seeded = {**kwargs, "seed": kwargs["seed"] + r}
        want_one = generates[0](prompt, **seeded)
        for generate in generates[1:]:
            assert_same_result(generate(prompt, **seeded), want_one, f"prompt {r} alone")


# ------------------------------------------------------------------------------------------------
# 1. Fixed shapes change nothing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_fixed_shapes_equal_dynamic(pair, setting):
    target, draft = pair
    dynamic, fixed = decoders(target, draft)
    assert dynamic.shapes == ("dynamic", "dynamic") and fixed.shapes == ("fixed", "fixed")
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=60, max_new_tokens=MAX_NEW,
                     **SETTINGS[setting])
    assert_same_runs(plain_runs(target, ("off", "fixed")), PROMPTS, seed=70, max_new_tokens=MAX_NEW,
                     **SETTINGS[setting])


def test_fixed_shapes_with_adaptive_gamma_and_eos(tiny):
    """The heuristic policy drafts 1 to 8 tokens (target calls of widths 2 to 9, draft calls of 1 and 2); an EOS
    stops rows at different iterations, so later calls carry rows that sit them out."""
    dynamic, fixed = decoders(*tiny)
    kwargs = dict(seed=80, max_new_tokens=MAX_NEW, gamma_policy="heuristic", max_gamma=8)
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, **kwargs)
    stopped = dynamic.generate(PROMPTS, seed=81, max_new_tokens=MAX_NEW)
    eos = stopped[0].tokens[3]
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=81, max_new_tokens=MAX_NEW, eos_token_id=eos)


def test_pt2_fixed_shapes_equal_dynamic(pt2_zoo):
    """A .pt2 GPT-2 as target and as draft: its calls have fixed shapes as they are (static cache,
    cache_position), so "fixed" is accepted and runs each decoding step through the per-width buffers a graph
    replays (a step with cache moves pending, and prefills, as they are), batch 1 and replicas for batches."""
    _, path = pt2_zoo("gpt2")
    target, draft = speculant.load(path), speculant.load(path)
    assert target._core.fixed_shapes_obstacle == "" and target._core.capture_obstacle == ""
    dynamic, fixed = decoders(target, draft)
    assert fixed.shapes == ("fixed", "fixed")
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS[:3], seed=90, max_new_tokens=12)
    dynamic, fixed = tree_decoders(target, draft, [2, 1], "without_replacement")
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS[:3], seed=91, max_new_tokens=12)


def test_batches_of_changing_size_reuse_the_models(tiny):
    """Batches of 3, 5, 2 rows, then 1, on the same decoders: a new batch size reallocates the row cache, and the
    buffers of the old one are dropped (graphs would write into freed memory otherwise)."""
    dynamic, fixed = decoders(*tiny)
    for size in (3, 5, 2, 1, 5):
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(size)]
        want = dynamic.generate(prompts, seed=size, max_new_tokens=MAX_NEW)
        got = fixed.generate(prompts, seed=size, max_new_tokens=MAX_NEW)
        for r, (a, b) in enumerate(zip(got if size > 1 else [got], want if size > 1 else [want])):
            assert_same_result(a, b, f"batch {size}, row {r}")


def test_fixed_calls_cover_every_row_and_slot():
    target, draft = markov.target_and_draft(5, 45, mask_prob=0.1)
    strict = table_model(target, FixedOnlyRows), table_model(draft, FixedOnlyRows)
    loose = table_model(target, MarkovRows), table_model(draft, MarkovRows)
    prompts = [[4], [1, 0, 3], [3, 3, 3, 3, 3, 3, 0], [1, 2]]
    fixed = speculant.SpeculativeDecoder(*strict, gamma=GAMMA, cuda_graphs="fixed")
    dynamic = speculant.SpeculativeDecoder(*loose, gamma=GAMMA, cuda_graphs="off")
    for got, want in zip(fixed.generate(prompts, seed=5, max_new_tokens=MAX_NEW),
                         dynamic.generate(prompts, seed=5, max_new_tokens=MAX_NEW)):
        assert_same_result(got, want, "strict table", alpha_rel=0.0)
    with pytest.raises(torch.jit.Error, match="FixedOnlyRows"):  # dynamic calls do not cover them: the check bites
        speculant.SpeculativeDecoder(*strict, gamma=GAMMA, cuda_graphs="off").generate(prompts, seed=5,
                                                                                       max_new_tokens=MAX_NEW)


def test_fixed_shapes_refuse_a_cache_that_is_not_written_in_place():
    """A module whose calls rebind their cache (a graph would replay into the old tensor and return wrong logits)
    fails with fixed shapes, naming the tensor; with dynamic shapes it runs, as nothing is replayed."""
    target, draft = markov.target_and_draft(5, 48, mask_prob=0.1)
    models = table_model(target, RebindingRows), table_model(draft, RebindingRows)
    with pytest.raises(ValueError, match="rebinds the module's tensor `row_tokens`.*must be written in place"):
        speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="fixed").generate([[4], [1, 0]], seed=1,
                                                                                         max_new_tokens=MAX_NEW)
    speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="off").generate([[4], [1, 0]], seed=1,
                                                                                   max_new_tokens=MAX_NEW)


CHAIN_VERIFICATIONS = {**SETTINGS, "greedy-lenient0.5": dict(temperature=0.0, lenience=0.5),
                       "T1-lenient0.5": dict(temperature=1.0, lenience=0.5)}


@pytest.mark.parametrize("setting", list(CHAIN_VERIFICATIONS))
def test_fixed_chain_verification_on_the_accelerators_path_equals_dynamic(pair, setting):
    """On the accelerators' path (tensor_path) fixed shapes run the chain's sampled verification through its own
    buffers, keyed by the rows' drafts and the settings (verification_graphs.h: the work a graph captures on CUDA,
    where the placements read back come from the key's first run); greedy's few operations run without them, as a
    tree's do: the tokens, trace and counts of dynamic shapes, batch and batch 1, plain decoding included."""
    target, draft = pair
    sampling = CHAIN_VERIFICATIONS[setting]
    # the sampling set on the decoders: generate's overrides would make a decoder core (and its buffers) per call
    dynamic, fixed = decoders(target, draft, **sampling)
    with tensor_path():
        assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=113, max_new_tokens=MAX_NEW)
        if sampling.get("lenience", 1.0) == 1.0:
            assert_same_runs(plain_runs(target, ("off", "fixed")), PROMPTS, seed=114, max_new_tokens=MAX_NEW,
                             **sampling)
    keys, captured, failure = fixed._core.verification_graphs
    assert captured == 0 and failure == ""
    assert keys == 0 if sampling["temperature"] == 0 else keys >= 2  # the batch's rows, a row alone
    assert dynamic._core.verification_graphs == (0, 0, "")


def test_plain_decoding_keeps_its_decoder(tiny):
    """speculant.generate keeps its decoder for the model handle, per settings, so that the verification's buffers
    (and graphs, on CUDA) serve every call rather than being captured anew at each; a call while another thread
    decodes with the kept one gets a decoder of its own, and both finish with the tokens they get alone."""
    target = tiny[0]
    run = functools.partial(speculant.generate, target, PROMPTS, max_new_tokens=MAX_NEW, cuda_graphs="fixed")
    def assert_same(got, want, what):
        for g, w in zip(got, want):
            for r, (a, b) in enumerate(zip(g, w)):
                assert_same_result(a, b, f"{what}, row {r}")

    with tensor_path():
        want = [run(seed=s) for s in (1, 2)]
        kept = dict(KEPT_PLAIN[target])
        assert_same([run(seed=s) for s in (1, 2)], want, "again")
        assert KEPT_PLAIN[target] == kept and any(d.verification_graphs[0] >= 1 for d, _ in kept.values())
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert_same(list(pool.map(lambda s: run(seed=s), (1, 2))), want, "two threads")
    assert all(not lock.locked() for _, lock in KEPT_PLAIN[target].values())


def test_fixed_chain_verification_with_varying_drafts(tiny):
    """The heuristic policy gives each row of a batch its own gamma, and an EOS stops rows early: the chain's
    verification is keyed by every row's draft length, and past VerificationGraphs::kMaxKeys (64) keys it runs
    without the buffers. The same tokens as dynamic shapes throughout."""
    dynamic, fixed = (speculant.SpeculativeDecoder(*tiny, gamma=GAMMA, cuda_graphs=mode, gamma_policy="heuristic",
                                                   max_gamma=8) for mode in ("off", "fixed"))
    eos = dynamic.generate(PROMPTS, seed=81, max_new_tokens=MAX_NEW)[0].tokens[3]
    with tensor_path():
        for seed in range(9):
            assert_same_runs([dynamic.generate, fixed.generate], PROMPTS * 2, seed=115 + seed, max_new_tokens=MAX_NEW,
                             eos_token_id=eos if seed % 2 else None)
    keys, captured, failure = fixed._core.verification_graphs
    assert keys == 64 and captured == 0 and failure == "", (keys, captured, failure)


# ------------------------------------------------------------------------------------------------
# 2. Exact laws with fixed shapes
# ------------------------------------------------------------------------------------------------


def test_fixed_shapes_law_equals_target_law():
    target, draft = markov.target_and_draft(LAW_VOCAB, 46, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target, MarkovRows), table_model(draft, MarkovRows),
                                           gamma=3, cuda_graphs="fixed")
    samples = batched_samples(decoder, [LAW_PROMPT], 5000, seed=46000)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW), "fixed shapes")


def test_fixed_shapes_lenient_law():
    lenience, gamma = 0.5, 2
    target, draft = markov.target_and_draft(LAW_VOCAB, 47, independent_draft=True, concentration=0.5)
    decoder = speculant.SpeculativeDecoder(table_model(target, MarkovRows), table_model(draft, MarkovRows),
                                           gamma=gamma, lenience=lenience, cuda_graphs="fixed")
    samples = batched_samples(decoder, [LAW_PROMPT], 5000, seed=47000)
    assert_law(samples, markov.speculative_law(target, draft, LAW_PROMPT, LAW_NEW, gamma, lenience=lenience),
               "fixed shapes, lenience 0.5")


# ------------------------------------------------------------------------------------------------
# 3. Token trees with fixed shapes
# ------------------------------------------------------------------------------------------------

# (id, tree, siblings, sampling): a shape, a given tree (breadth-first parents) and a grown one (its width changes
# from one iteration to the next), each way of drawing siblings
TREES = [
    ("2x1x1-without-T1", [2, 1, 1], "without_replacement", dict(temperature=1.0)),
    ("given-top-T0.8-topk8", [-1, 0, 0, 0, 1, 1, 2, 4], "top", dict(temperature=0.8, top_k=8)),
    ("grown-with-greedy", speculant.DynamicTree(budget=6, depth=3, children=2, width=2), "with_replacement",
     dict(temperature=0.0)),
    ("grown-without-T1", speculant.DynamicTree(budget=6, depth=3, children=2, width=2), "without_replacement",
     dict(temperature=1.0)),
    ("3x1-coupled-T0.9", [3, 1], "coupled", dict(temperature=0.9)),
]


def tree_decoders(target, draft, tree, siblings, modes=("off", "fixed")):
    return [speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings, cuda_graphs=mode)
            for mode in modes]


@pytest.mark.parametrize("case", TREES, ids=[c[0] for c in TREES])
def test_fixed_tree_calls_equal_dynamic(pair, case):
    """Every tree call (the draft's level calls and the target's verification) over every row and all max_length
    slots, its mask [rows, width, max_length]: the tokens, trace and counts of dynamic shapes."""
    _, tree, siblings, sampling = case
    target, draft = pair
    dynamic, fixed = tree_decoders(target, draft, tree, siblings)
    assert fixed.shapes == ("fixed", "fixed")
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=110, max_new_tokens=MAX_NEW, **sampling)


@pytest.mark.parametrize("case", TREES, ids=[c[0] for c in TREES])
def test_fixed_tree_verification_on_the_accelerators_path_equals_dynamic(pair, case):
    """On the accelerators' path (tensor_path) fixed shapes run a fixed tree's verification through its own buffers
    too, keyed by the rows' trees (tree.h: VerificationGraphs; the work a graph captures on CUDA, where the
    placements read back come from the key's first run): the tokens, trace and counts of dynamic shapes, batch
    and batch 1 alike. A grown tree's shapes vary without bound: its verification is not keyed."""
    _, tree, siblings, sampling = case
    # the sampling set on the decoders: generate's overrides would make a decoder core (and its buffers) per call
    dynamic, fixed = (speculant.SpeculativeDecoder(*pair, tree=tree, siblings=siblings, cuda_graphs=mode, **sampling)
                      for mode in ("off", "fixed"))
    with tensor_path():
        assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=112, max_new_tokens=MAX_NEW)
    keys, captured, failure = fixed._core.verification_graphs
    assert dynamic._core.verification_graphs == (0, 0, "") and captured == 0 and failure == ""
    grown = isinstance(tree, speculant.DynamicTree)
    assert keys == 0 if grown or sampling["temperature"] == 0 else keys >= 2  # the batch's rows, a row alone


@pytest.mark.parametrize("tree, siblings", [(None, "coupled"), ([2, 1], "without_replacement"), ([2, 2], "top")],
                         ids=["chain", "2x1-without", "2x2-top"])
def test_block_verification_through_the_buffers_equals_dynamic(tiny, tree, siblings):
    """verification="block" (the block rule on chains, traversal verification on trees) on the accelerators' path
    with fixed shapes: its verification through its buffers, keyed apart from the token rule's: the tokens, trace
    and counts of dynamic shapes."""
    shape = dict(tree=tree, siblings=siblings) if tree else dict(gamma=GAMMA)
    dynamic, fixed = (speculant.SpeculativeDecoder(*tiny, cuda_graphs=mode, temperature=1.0, verification="block",
                                                   **shape) for mode in ("off", "fixed"))
    with tensor_path():
        assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=113, max_new_tokens=MAX_NEW)
    keys, captured, failure = fixed._core.verification_graphs
    assert keys >= 2 and captured == 0 and failure == "", (keys, captured, failure)


@pytest.mark.parametrize("siblings, sampling", [("coupled", dict(temperature=1.0)),
                                                ("with_replacement", dict(temperature=0.8, top_k=8)),
                                                ("coupled", dict(temperature=0.0))], ids=["coupled", "with", "greedy"])
def test_fixed_tree_calls_with_a_sibling_draft_equal_dynamic(tiny, siblings, sampling):
    """A sibling draft (tree.h) with fixed shapes: its level calls beside the draft's, and on the accelerators' path
    the verification through its buffers with the sibling's law as an input (keyed apart): the tokens, trace and
    counts of dynamic shapes, on both paths."""
    target, draft = tiny
    other = tiny_models()[1]
    with torch.no_grad():  # another draft than the draft
        generator = torch.Generator().manual_seed(5)
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=generator), alpha=0.2)
    sibling = speculant.load(tiny_gpt.script_cached(other))
    dynamic, fixed = (speculant.SpeculativeDecoder(target, draft, tree=[2, 2], siblings=siblings, cuda_graphs=mode,
                                                   sibling_draft=sibling, **sampling) for mode in ("off", "fixed"))
    assert fixed.shapes == ("fixed", "fixed")
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=113, max_new_tokens=MAX_NEW)
    with tensor_path():
        assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=114, max_new_tokens=MAX_NEW)
    keys, captured, failure = fixed._core.verification_graphs
    assert captured == 0 and failure == "" and (keys >= 2 if sampling["temperature"] > 0 else keys == 0)


def test_fixed_tree_calls_with_eos(tiny):
    """An EOS stops rows at different iterations: later tree calls carry rows that sit them out (all padding)."""
    dynamic, fixed = tree_decoders(*tiny, [2, 2], "without_replacement")
    eos = dynamic.generate(PROMPTS, seed=111, max_new_tokens=MAX_NEW)[0].tokens[3]
    assert_same_runs([dynamic.generate, fixed.generate], PROMPTS, seed=111, max_new_tokens=MAX_NEW, eos_token_id=eos)


def test_fixed_tree_calls_cover_every_row_and_slot():
    """A table model whose tree call refuses anything narrower decodes trees with fixed shapes (the tokens of
    dynamic shapes on a loose one) and fails with dynamic ones: the calls really are fixed."""
    target, draft = markov.target_and_draft(5, 49, mask_prob=0.1)
    strict = table_model(target, FixedOnlyTreeCalls), table_model(draft, FixedOnlyTreeCalls)
    loose = table_model(target, MarkovRows), table_model(draft, MarkovRows)
    prompts = [[4], [1, 0, 3], [3, 3, 3, 3, 3, 3, 0], [1, 2]]
    fixed = speculant.SpeculativeDecoder(*strict, tree=[2, 2, 1], cuda_graphs="fixed")
    dynamic = speculant.SpeculativeDecoder(*loose, tree=[2, 2, 1], cuda_graphs="off")
    for got, want in zip(fixed.generate(prompts, seed=6, max_new_tokens=MAX_NEW),
                         dynamic.generate(prompts, seed=6, max_new_tokens=MAX_NEW)):
        assert_same_result(got, want, "strict table", alpha_rel=0.0)
    with pytest.raises(torch.jit.Error, match="FixedOnlyRows: a tree call"):
        speculant.SpeculativeDecoder(*strict, tree=[2, 2, 1], cuda_graphs="off").generate(prompts, seed=6,
                                                                                         max_new_tokens=MAX_NEW)


def test_fixed_tree_calls_refuse_a_cache_that_is_not_written_in_place():
    target, draft = markov.target_and_draft(5, 57, mask_prob=0.1)
    models = table_model(target, RebindingTreeCalls), table_model(draft, RebindingTreeCalls)
    with pytest.raises(ValueError, match="the [0-9]+-token tree call over [0-9]+ slots rebinds the module.s tensor "
                                         "`row_tokens`"):
        speculant.SpeculativeDecoder(*models, tree=[2, 1], cuda_graphs="fixed").generate([[4], [1, 0]], seed=1,
                                                                                        max_new_tokens=MAX_NEW)


def test_fixed_tree_law_equals_target_law():
    target, draft = markov.target_and_draft(LAW_VOCAB, 58, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target, MarkovRows), table_model(draft, MarkovRows),
                                           tree=[2, 2], cuda_graphs="fixed")
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=58000)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW), "tree [2, 2], fixed shapes")


# ------------------------------------------------------------------------------------------------
# 4. The option
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", "", None, True, 1])
def test_bad_values(tiny, value):
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        speculant.SpeculativeDecoder(*tiny, cuda_graphs=value)
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        speculant.generate(tiny[0], [1], max_new_tokens=2, cuda_graphs=value)


def test_on_needs_cuda(tiny):
    with pytest.raises(ValueError, match="cuda_graphs='on' needs models on CUDA; the target is on cpu"):
        speculant.SpeculativeDecoder(*tiny, cuda_graphs="on")
    with pytest.raises(ValueError, match="needs models on CUDA"):
        speculant.generate(tiny[0], [1], max_new_tokens=2, cuda_graphs="on")


def test_fixed_needs_a_backend_with_fixed_shapes(tiny, tmp_path):
    target, draft = tiny_models()
    plain = speculant.load(tiny_gpt.script_plain(target))
    with pytest.raises(ValueError, match=r"the target \(plain form\) has no fixed-shape calls: the plain form"):
        speculant.SpeculativeDecoder(plain, tiny[1], cuda_graphs="fixed")
    live = speculant.load(hf_models.make("gpt2", seed=0))
    with pytest.raises(ValueError, match=r"the target \(live form\) has no fixed-shape calls: a live model runs "
                                         "through Python"):
        speculant.SpeculativeDecoder(live, speculant.load(hf_models.make("gpt2", seed=1)), cuda_graphs="fixed")
    t5 = hf_models.make("t5", seed=0)
    speculant.export(t5, tmp_path / "t5.pt", max_length=16, max_source_length=8)
    with pytest.raises(ValueError, match=r"\(cached form\) has no fixed-shape calls: an encoder-decoder module"):
        speculant.generate(speculant.load(tmp_path / "t5.pt"), [0], max_new_tokens=2, encoder_input_ids=[4, 5],
                           cuda_graphs="fixed")


def test_graphs_are_off_by_default():
    """Issue 25: the capture has never run on a GPU, so nothing opts into it unasked."""
    for function in (speculant.SpeculativeDecoder, speculant.generate):
        assert inspect.signature(function).parameters["cuda_graphs"].default == "off"


def test_auto_on_cpu_changes_nothing(tiny, recwarn):
    target, draft = tiny_models()
    plain = speculant.load(tiny_gpt.script_plain(target))
    for models in (tiny, (plain, tiny[1])):
        assert speculant.SpeculativeDecoder(*models, cuda_graphs="auto").shapes == ("dynamic", "dynamic")
    assert speculant.SpeculativeDecoder(tiny[0], speculant.drafters.PromptLookup(tiny[0].vocab_size),
                                        cuda_graphs="fixed").shapes == ("fixed", "dynamic")
    told = [str(w.message) for w in recwarn.list if "graph" in str(w.message)]
    assert not told, told
    assert tiny[0]._core.graphs_captured == 0 and tiny[0]._core.graph_failure == ""


def test_a_failed_capture_is_told_once():
    class Core:
        graph_failure = "capturing the 4-token call failed: operation not permitted when stream is capturing"

    class Handle:
        engine = Core()
        source = "target.pt"

    handle = Handle()
    with pytest.warns(RuntimeWarning, match="CUDA graphs are off for target.pt from now on: capturing the 4-token"):
        graphs.warn_failures([handle])
    graphs.warn_failures([handle])  # told already: no second warning (filterwarnings=error would raise)


# ------------------------------------------------------------------------------------------------
# 5. On a GPU
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_pairs(tmp_path_factory):
    """name -> (target, draft) on CUDA, every backend with fixed-shape calls."""
    target, draft = tiny_models()
    pairs = {"tiny": (speculant.load(tiny_gpt.script_cached(target), device="cuda"),
                      speculant.load(tiny_gpt.script_cached(draft), device="cuda"))}
    for arch in ("llama", "gpt2"):
        pairs[arch] = exported(arch, tmp_path_factory.mktemp(arch), device="cuda")
    return pairs


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["off", "on"])
def test_cuda_same_seed_same_tokens_across_processes(mode):
    """tests/test_threads.py's seeded run in two processes on CUDA (cuBLAS's workspace fixed), graphs off and on."""
    from support.engine_checks import same_seed_outputs

    outputs = same_seed_outputs((1, 1), "cuda", mode)
    assert len(outputs) == 1 and len(outputs.pop()) > 60


@pytest.mark.cuda
def test_cuda_pt2_graphs_equal_the_calls_they_capture(tmp_path):
    """A CUDA .pt2 GPT-2 (AOTInductor's single-threaded runner) captured: the tokens of its fixed-shape calls run
    uncaptured, chains and trees, and its decoding steps replayed from graphs."""
    model = hf_models.make("gpt2", seed=0).to("cuda")
    speculant.export(model, tmp_path / "target.pt2", max_length=FIXED_MAX_LENGTH)
    target, draft = speculant.load(tmp_path / "target.pt2"), speculant.load(tmp_path / "target.pt2")
    fixed, on = (speculant.SpeculativeDecoder(target, draft, gamma=GAMMA, cuda_graphs=mode) for mode in ("fixed", "on"))
    assert on.shapes == ("graphed", "graphed")
    assert_same_runs([fixed.generate, on.generate], PROMPTS[:2], seed=95, max_new_tokens=12)
    trees = tree_decoders(target, draft, [2, 1], "without_replacement", ("fixed", "on"))
    assert_same_runs([d.generate for d in trees], PROMPTS[:2], seed=96, max_new_tokens=12)
    on.generate(PROMPTS[0], seed=97, max_new_tokens=24)  # batch 1, a fixed gamma: each width called often
    for model in (target, draft):
        assert model._core.graph_failure == "" and model._core.graphs_captured >= 1


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["tiny", "llama", "gpt2"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_cuda_graphs_equal_the_calls_they_capture(cuda_pairs, name, setting):
    """Graphs against the same fixed-shape calls uncaptured: the same kernels on the same shapes, so the same
    tokens. (Against dynamic shapes a GPU may pick other kernels for other shapes and round the logits
    differently in the last bits, as batched calls may: the laws below cover that comparison.)"""
    target, draft = cuda_pairs[name]
    fixed, on = decoders(target, draft, ("fixed", "on"))
    assert on.shapes == ("graphed", "graphed")
    assert_same_runs([fixed.generate, on.generate], PROMPTS, seed=100, max_new_tokens=MAX_NEW, **SETTINGS[setting])
    assert_same_runs([fixed.generate, on.generate], PROMPTS, seed=101, max_new_tokens=MAX_NEW,
                     gamma_policy="heuristic", **SETTINGS[setting])
    # A model keeps the graphs of its current row count (a new count drops them), and a width is captured at
    # its third call: the batch-1 runs above, at heuristic gammas, may leave none. A batch at a fixed gamma
    # calls each width often enough.
    on.generate(PROMPTS, seed=103, max_new_tokens=MAX_NEW, **SETTINGS[setting])
    for model in (target, draft):
        assert model._core.graph_failure == ""
        assert model._core.graphs_captured >= 1
    assert_same_runs(plain_runs(target, ("fixed", "on")), PROMPTS, seed=102, max_new_tokens=MAX_NEW,
                     **SETTINGS[setting])
    # the verification's graphs (cpp/device/verification_graphs.h) serve a decoder's own core: its sampling set on it
    fixed, on = decoders(target, draft, ("fixed", "on"), **SETTINGS[setting])
    assert_same_runs([fixed.generate, on.generate], PROMPTS, seed=104, max_new_tokens=MAX_NEW)
    keys, captured, failure = on._core.verification_graphs
    assert failure == "" and captured >= 1, (keys, captured, failure)


@pytest.mark.cuda
def test_cuda_graphs_reproduce_with_a_seed(cuda_pairs):
    decoder = speculant.SpeculativeDecoder(*cuda_pairs["gpt2"], gamma=GAMMA, cuda_graphs="on")
    first = decoder.generate(PROMPTS, seed=7, max_new_tokens=MAX_NEW)
    again = decoder.generate(PROMPTS, seed=7, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in first] == [r.tokens for r in again]


@pytest.mark.cuda
def test_cuda_capture_failure_falls_back_with_one_warning():
    """MarkovRows reads tensors on the host inside extend_rows, which a capture cannot record: each model's
    capture fails, one warning per model names the reason, and its calls run uncaptured with the tokens of
    graphs off (table lookups: bit for bit). The allocators are left usable (empty_cache, new allocations)."""
    target, draft = markov.target_and_draft(16, 55, mask_prob=0.1)
    models = table_model(target, MarkovRows, "cuda"), table_model(draft, MarkovRows, "cuda")
    on = speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="auto")
    assert on.shapes == ("graphed", "graphed")
    # the target's verification call, and the draft's step call with its draws inside (rows.h: extend_then)
    with pytest.warns(RuntimeWarning, match="from now on: capturing the [0-9]+-token (call|step call) over [0-9]+ "
                                            "slots(, then the draft's draws .*)? failed"):
        first = on.generate(PROMPTS, seed=9, max_new_tokens=MAX_NEW)
    again = on.generate(PROMPTS, seed=9, max_new_tokens=MAX_NEW)  # told already: no warning (errors here)
    off = speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="off").generate(PROMPTS, seed=9,
                                                                                        max_new_tokens=MAX_NEW)
    for a, b, c in zip(first, again, off):
        assert_same_result(a, c, "first run", alpha_rel=0.0)
        assert_same_result(b, c, "second run", alpha_rel=0.0)
    assert all(m._core.graph_failure and m._core.graphs_captured == 0 for m in models)
    torch.cuda.empty_cache()
    assert torch.ones(1 << 20, device="cuda").sum().item() == 1 << 20


@pytest.mark.cuda
def test_cuda_graphs_refuse_a_cache_that_is_not_written_in_place():
    """A module that rebinds its cache is not captured (the rebinding is seen in the warm-up runs): one warning per
    model names the tensor, and the calls run uncaptured with the tokens of graphs off."""
    target, draft = markov.target_and_draft(16, 56, mask_prob=0.1)
    models = table_model(target, RebindingRows, "cuda"), table_model(draft, RebindingRows, "cuda")
    on = speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="on")
    with pytest.warns(RuntimeWarning, match="rebinds the module's tensor `row_tokens`"):
        got = on.generate(PROMPTS, seed=9, max_new_tokens=MAX_NEW)
    off = speculant.SpeculativeDecoder(*models, gamma=GAMMA, cuda_graphs="off").generate(PROMPTS, seed=9,
                                                                                        max_new_tokens=MAX_NEW)
    for a, b in zip(got, off):
        assert_same_result(a, b, "rebinding cache", alpha_rel=0.0)
    assert all(m._core.graphs_captured == 0 and "written in place" in m._core.graph_failure for m in models)


CUDA_LAWS = [  # id, sampling, gamma, table seed, independent draft
    ("T1", dict(temperature=1.0), 3, 50, False),
    ("T0.7-topk2", dict(temperature=0.7, top_k=2), 3, 51, False),
    ("T1-topp0.8", dict(temperature=1.0, top_p=0.8), 4, 52, False),
    ("T1-lenience0.5", dict(temperature=1.0, lenience=0.5), 2, 53, True),
]


@pytest.mark.cuda
@pytest.mark.parametrize("config", CUDA_LAWS, ids=[c[0] for c in CUDA_LAWS])
def test_cuda_graphs_laws(config):
    name, sampling, gamma, seed, independent = config
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1, independent_draft=independent)
    for table in (target, draft):
        check_no_top_p_boundary(table, sampling["temperature"], sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    decoder = speculant.SpeculativeDecoder(table_model(target, CapturableRows, "cuda"),
                                           table_model(draft, CapturableRows, "cuda"), gamma=gamma,
                                           cuda_graphs="on", **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 5000, seed=1000 * seed)
    assert decoder.target._core.graphs_captured >= 1 and decoder.draft._core.graphs_captured >= 1
    keys, captured, failure = decoder._core.verification_graphs  # the verification captured too
    assert failure == "" and captured >= 1, (keys, captured, failure)
    temperature, top_k, top_p = sampling["temperature"], sampling.get("top_k", 0), sampling.get("top_p", 1.0)
    if "lenience" in sampling:
        law = markov.speculative_law(target, draft, LAW_PROMPT, LAW_NEW, gamma, temperature, top_k, top_p,
                                     lenience=sampling["lenience"])
    else:
        law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, temperature, top_k, top_p)
    assert_law(samples, law, f"CUDA graphs, {name}")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["tiny", "llama", "gpt2"])
@pytest.mark.parametrize("case", TREES, ids=[c[0] for c in TREES])
def test_cuda_graphs_of_tree_calls_equal_the_calls_they_capture(cuda_pairs, name, case):
    _, tree, siblings, sampling = case
    target, draft = cuda_pairs[name]
    # the sampling set on the decoders, whose cores (and the trees' verification graphs) then serve every call
    fixed, on = (speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=siblings, cuda_graphs=mode,
                                              **sampling) for mode in ("fixed", "on"))
    assert on.shapes == ("graphed", "graphed")
    assert_same_runs([fixed.generate, on.generate], PROMPTS, seed=120, max_new_tokens=MAX_NEW)
    for model in (target, draft):
        assert model._core.graph_failure == ""
        assert model._core.graphs_captured >= 1
    keys, captured, failure = on._core.verification_graphs  # a fixed tree's verification: captured at T > 0
    assert failure == "" and (captured >= 1 if keys else isinstance(tree, speculant.DynamicTree) or
                              sampling["temperature"] == 0)


CUDA_TREE_LAWS = [  # id, tree, siblings, sampling, table seed
    ("2x2-without-T1", [2, 2], "without_replacement", dict(temperature=1.0), 71),
    ("given-top-T0.8", [-1, 0, 0, 0, 1, 1, 2, 4], "top", dict(temperature=0.8), 72),
    ("2x2-coupled-T1", [2, 2], "coupled", dict(temperature=1.0), 73),
]


@pytest.mark.cuda
@pytest.mark.parametrize("config", CUDA_TREE_LAWS, ids=[c[0] for c in CUDA_TREE_LAWS])
def test_cuda_graphs_tree_laws(config):
    name, tree, siblings, sampling, seed = config
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target, CapturableRows, "cuda"),
                                           table_model(draft, CapturableRows, "cuda"), tree=tree, siblings=siblings,
                                           cuda_graphs="on", **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=1000 * seed)
    assert decoder.target._core.graphs_captured >= 1 and decoder.draft._core.graphs_captured >= 1
    keys, captured, failure = decoder._core.verification_graphs
    assert failure == "" and captured >= 1, (keys, captured, failure)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling["temperature"]),
               f"CUDA graphs, tree {name}")


@pytest.mark.cuda
def test_cuda_graphs_greedy_is_the_enumerated_argmax():
    target, draft = markov.target_and_draft(LAW_VOCAB, 54, mask_prob=0.1)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, 0.0)
    assert law.max() == 1.0
    want = list(torch.nonzero(law == 1.0)[0].tolist())
    decoder = speculant.SpeculativeDecoder(table_model(target, CapturableRows, "cuda"),
                                           table_model(draft, CapturableRows, "cuda"), gamma=3, temperature=0.0,
                                           cuda_graphs="on")
    for result in decoder.generate([LAW_PROMPT] * 8, max_new_tokens=LAW_NEW, seed=3):
        assert result.tokens == want


@pytest.mark.cuda
def test_device_sampling_path_law():
    """_sample_as_tensors (the tensor path the engine samples with on a GPU) draws row i from probs[i]: 20,000 rows
    of one distribution against it."""
    probs = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.25, 0.0, 0.2, 0.05], device="cuda")
    draws = speculant._core._sample_as_tensors(probs.expand(20000, -1).contiguous(), 11).cpu().numpy()
    assert not np.isin(draws, [2, 5]).any()  # zero-probability tokens never come
    pvalue = chi_square_pvalue(probs.double().cpu(), draws.reshape(-1, 1))
    assert pvalue > SIGNIFICANCE, f"_sample_as_tensors on CUDA rejects its probabilities, p = {pvalue:.3g}"


def attended_slots(run) -> set:
    """The key lengths of every attention `run()` computes (the profiler's recorded input shapes)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    return {e.input_shapes[1][2] for e in prof.events() if e.name == "aten::scaled_dot_product_attention"}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fixed_calls_read_the_slots_in_use_not_the_cache_capacity(arch, tmp_path):
    """A call at a short sequence attends its bucket (16, 32, ...) however large the cache, so its cost does not
    grow with max_length (native_rows.h), and its tokens and statistics equal those of a cache just large enough."""
    model = hf_models.make(arch, seed=0, **({"max_position_embeddings": 1024} if arch == "llama" else
                                            {"n_positions": 1024}))
    runs = []
    for length in (64, 1024):
        speculant.export(model, tmp_path / f"{length}.pt", max_length=length)
        target = speculant.load(tmp_path / f"{length}.pt")
        generate = functools.partial(speculant.generate, target, [3, 1, 4], max_new_tokens=40, seed=3,
                                     temperature=1.0, cuda_graphs="fixed")
        generate()  # the first calls of each width and bucket
        runs.append((attended_slots(generate), generate()))
    (small_slots, small), (large_slots, large) = runs
    assert large_slots == small_slots == {16, 32, 64}  # 2 + 40 positions: three buckets
    assert large.tokens == small.tokens and large.stats.target_calls == small.stats.target_calls


def test_a_bucketed_call_equals_the_call_over_every_slot(tmp_path):
    """extend_rows over a bucket of slots returns the logits of the same call over the whole cache (the slots past
    the bucket are masked out either way), to float32 rounding."""
    model = hf_models.make("llama", seed=0)
    speculant.export(model, tmp_path / "m.pt", max_length=128)
    module = torch.jit.load(tmp_path / "m.pt")
    module.start_rows(1)
    rows = torch.zeros(1, dtype=torch.long)
    prompt = torch.tensor([[5, 9, 2, 7, 1, 3]])
    positions = torch.arange(6).unsqueeze(0)
    module.extend_rows(prompt, rows, positions, positions, 6)
    step, at = torch.tensor([[4, 8]]), torch.tensor([[6, 7]])
    bucket = module.extend_rows(step, rows, at, at, 16)
    full = module.extend_rows(step, rows, at, at, 128)
    torch.testing.assert_close(bucket, full, rtol=1e-5, atol=1e-5)
    assert torch.equal(bucket.argmax(-1), full.argmax(-1))
