"""A feature draft's fixed-shape calls (feature_draft.py; cuda_graphs="fixed", and "auto" / "on" on CUDA).

* With fixed shapes each decoding call of the head goes through a graph cache's static buffers (cpp/device/graphs.h)
  keyed by its shapes: an EAGLE call's attention reads a power-of-two bucket of its entries (at least 16), the rest
  hidden by its mask; a Medusa call's shapes are its width's. The prompt's entries run as they are.
* Those calls compute what the dynamic ones do: the same greedy tokens as transformers' generate, the same
  accepted drafts and draft calls (which at T = 0 follow what every draft call proposed, trees included), the same
  head outputs at every entry and the same laws for the next tokens (chains, token trees, grown trees, batch rows,
  EAGLE-3's layers, Medusa), also past the head's first buffers.
* A head whose call rebinds its cache to a new tensor is refused by name, as graphs.h refuses a module that does.
* compile=True runs the decoding steps through torch.compile in a few graphs (an EAGLE head's calls bucketed in
  every mode): the same tokens, head outputs and laws as the eager head, with dynamic and fixed shapes, on a live
  and an exported target; saved and loaded compiled, trained compiled; compile that is no bool is refused.
* On CUDA (run where one is lent): "auto" captures the head's calls into CUDA graphs beside a live target (which runs
  uncaptured, with a warning) and beside a captured export, with the tokens and head outputs of uncaptured calls,
  its steps eager or compiled.
"""

import warnings

import pytest
import torch

from support import hf_models
import speculant
from support.hf_models import MAX_NEW, PROMPTS, hf_greedy
from speculant.models.feature_draft import FeatureRows
from torch._dynamo.utils import counters

SHAPES = [{"gamma": 3}, {"tree": [2, 2]}, {"tree": speculant.DynamicTree(budget=6, depth=3)}]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the Llama, its TorchScript export loaded)."""
    model = hf_models.make("llama", seed=10)
    path = tmp_path_factory.mktemp("llama") / "target.pt"
    speculant.export(model, path)
    return model, speculant.load(path)


def make_draft(kind: str, target, compile: bool = False):
    if kind == "medusa":
        return speculant.MedusaDraft(target, heads=2, compile=compile)
    return speculant.EagleDraft(target, feature_layers=(1, 0) if kind == "eagle3" else None, seed=4,
                                compile=compile)


def heads_state(draft) -> list:
    """Each row's (entries computed from the target's features, the head's outputs at them); Medusa keeps none."""
    rows = draft.live._family
    return [(r.real, r.out[:r.real].clone()) for r in rows] if hasattr(rows[0], "real") else []


def generate(target, draft, mode: str, shape: dict, prompts=PROMPTS) -> tuple:
    """(each row's tokens, with the drafts it accepted and the draft calls it made: at T = 0 these follow what
    every draft call proposed, trees included), heads_state."""
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=0, cuda_graphs=mode, **shape)
    results = decoder.generate(prompts, max_new_tokens=MAX_NEW)
    return [(r.tokens, r.stats.accepted_tokens, r.stats.draft_calls) for r in results], heads_state(draft)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fixed_calls_compute_what_dynamic_ones_do(llama, kind, shape, monkeypatch):
    model, exported = llama
    draft = make_draft(kind, exported)
    tokens, heads = generate(exported, draft, "off", shape)
    assert [t for t, _, _ in tokens] == [hf_greedy(model, "llama", i, eos=None) for i in range(len(PROMPTS))]
    keys = []
    original = FeatureRows.fixed

    def spy(rows, key, inputs, step):
        if rows.shapes == "fixed":
            keys.append(key)
        return original(rows, key, inputs, step)

    monkeypatch.setattr(FeatureRows, "fixed", spy)
    fixed_tokens, fixed_heads = generate(exported, draft, "fixed", shape)
    assert fixed_tokens == tokens
    for (real, out), (fixed_real, fixed_out) in zip(heads, fixed_heads):
        assert fixed_real == real
        torch.testing.assert_close(fixed_out, out, rtol=1e-5, atol=1e-5)
    assert keys, "no call took the fixed path"
    widths = {width for width, _, _ in keys}
    assert max(widths) <= 4 + 1  # a decoding call's tokens: a chain's gamma + 1, a tree level's nodes
    if kind != "medusa":
        buckets = {bucket for _, _, bucket in keys}
        assert all(bucket >= 16 and bucket & (bucket - 1) == 0 for bucket in buckets), buckets
        assert any(tree for _, tree, _ in keys) == ("tree" in shape)
    assert draft._core.graphs_captured == 0  # fixed shapes capture nothing
    laws = []  # row 0 after the batch: its laws for two more tokens in a chain and as siblings, both ways
    for mode in ("dynamic", "fixed"):
        draft.live.use_shapes(mode)
        laws.append(torch.cat([next_laws(draft), next_laws(draft, tree=True)]))
    torch.testing.assert_close(laws[1], laws[0], rtol=1e-5, atol=1e-5)


def test_fixed_calls_past_the_first_buffers(llama):
    """A prompt longer than the head's first buffers (64 entries): they double, the graph cache's keys over the old
    ones are dropped, and the calls still compute what dynamic ones do."""
    model, exported = llama
    prompts = [(PROMPTS[0] * 30)[:70], PROMPTS[1]]
    draft = make_draft("eagle", exported)
    outputs = [generate(exported, draft, mode, {"gamma": 3}, prompts) for mode in ("off", "fixed")]
    (tokens, heads), (fixed_tokens, fixed_heads) = outputs
    assert fixed_tokens == tokens
    assert draft.live._buffers[0].size(0) == 128 and heads[0][0] > 64
    for (real, out), (fixed_real, fixed_out) in zip(heads, fixed_heads):
        assert fixed_real == real
        torch.testing.assert_close(fixed_out, out, rtol=1e-5, atol=1e-5)


def test_the_modes_give_a_feature_draft_fixed_shapes(llama):
    _, exported = llama
    for draft in (make_draft("eagle", exported), make_draft("medusa", exported)):
        assert draft._core.fixed_shapes_obstacle == ""
        decoder = speculant.SpeculativeDecoder(exported, draft, gamma=2, cuda_graphs="fixed")
        assert decoder.shapes == ("fixed", "fixed")
        assert speculant.SpeculativeDecoder(exported, draft, gamma=2, cuda_graphs="auto").shapes == ("dynamic",
                                                                                                      "dynamic")


def test_a_head_that_rebinds_its_cache_is_refused(llama, monkeypatch):
    _, exported = llama
    draft = make_draft("eagle", exported)
    original = type(draft.live)._step

    def rebinding(rows, inputs):
        rows._buffers = tuple(buffer.clone() for buffer in rows._buffers)
        return original(rows, inputs)

    monkeypatch.setattr(type(draft.live), "_step", rebinding)
    decoder = speculant.SpeculativeDecoder(exported, draft, gamma=2, temperature=0, cuda_graphs="fixed")
    with pytest.raises(ValueError, match="rebinds the head's features to a new tensor"):
        decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW)


def next_laws(draft, tree: bool = False) -> torch.Tensor:
    """Row 0's laws for two more tokens after its entries, in a chain or as two siblings (then dropped again)."""
    rows = draft.live
    length = rows.length
    tokens = torch.tensor([5, 7])
    if tree:
        mask = torch.ones(2, length + 2, dtype=torch.bool)
        mask[0, length + 1] = mask[1, length] = False
        laws = rows.extend_masked(tokens, torch.full((2,), length), mask)
    else:
        laws = rows.extend(tokens)
    rows.truncate(length)
    return laws


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_compiled_steps_compute_what_eager_ones_do(llama, kind, tmp_path):
    model, exported = llama
    live = speculant.load(model)
    expected = [hf_greedy(model, "llama", i, eos=None) for i in range(len(PROMPTS))]
    graphs = counters["stats"]["unique_graphs"]
    for target, modes in ((live, ("off",)), (exported, ("off", "fixed"))):
        eager, compiled = make_draft(kind, target), make_draft(kind, target, compile=True)
        assert compiled.compiled and not eager.compiled
        for mode in modes:
            for shape in SHAPES[:2]:
                tokens, heads = generate(target, eager, mode, shape)
                compiled_tokens, compiled_heads = generate(target, compiled, mode, shape)
                assert compiled_tokens == tokens and [t for t, _, _ in tokens] == expected, (mode, shape)
                for (real, out), (compiled_real, compiled_out) in zip(heads, compiled_heads):
                    assert compiled_real == real
                    torch.testing.assert_close(compiled_out, out, rtol=1e-5, atol=1e-5)
                for tree in (False, True):
                    torch.testing.assert_close(next_laws(compiled, tree), next_laws(eager, tree), rtol=1e-5,
                                               atol=1e-5)
    assert 0 < counters["stats"]["unique_graphs"] - graphs <= 2 * 4  # two drafts, a few graphs each
    compiled.save(tmp_path / "head")
    assert type(compiled).load(tmp_path / "head", exported, compile=True).compiled
    with pytest.raises(ValueError, match="compile must be True or False, got 'yes'"):
        make_draft(kind, exported, compile="yes")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "eagle compiled"])
@pytest.mark.parametrize("form", ["live", "export"])
def test_captured_head_calls_on_cuda(kind, form, tmp_path):
    model = hf_models.make("llama", seed=10).to("cuda")
    if form == "export":
        speculant.export(model, tmp_path / "target.pt")
    outputs = []
    for mode in ("off", "auto"):
        target = speculant.load(tmp_path / "target.pt", device="cuda") if form == "export" else speculant.load(model)
        draft = make_draft(kind.split()[0], target, compile=kind.endswith("compiled"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "auto": a live target runs uncaptured
            outputs.append([(*generate(target, draft, mode, shape),
                             torch.cat([next_laws(draft), next_laws(draft, tree=True)])) for shape in SHAPES[:2]])
        if mode == "auto":
            assert draft._core.graph_failure == ""
            assert draft._core.graphs_captured > 0
    for (tokens, heads, laws), (graphed_tokens, graphed_heads, graphed_laws) in zip(*outputs):
        assert graphed_tokens == tokens
        torch.testing.assert_close(graphed_laws.float(), laws.float(), rtol=1e-3, atol=1e-3)
        for (real, out), (graphed_real, graphed_out) in zip(heads, graphed_heads):
            assert graphed_real == real
            torch.testing.assert_close(graphed_out.float(), out.float(), rtol=1e-3, atol=1e-3)
