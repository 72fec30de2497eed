"""Feature drafts (speculant.EagleDraft, speculant.MedusaDraft) on a target exported with speculant.export:
TorchScript (cpp/models/model.h: record_features / features / feature_weights), and .pt2 packages exported with
features= (export/pt2.py: a buffer of features per slot).

* The export keeps each cache slot's features beside its keys and values: after chains, token trees and batches, with
  dynamic and fixed shapes (cuda_graphs="fixed": padded rows, power-of-two buckets of slots), each row's committed
  features are the base model's output over its sequence (the LM head's input), or the decoder layers' outputs side by
  side (EAGLE-3), for Llama and GPT-2.
* A head on the export computes what the same head on the live model computes: after the same generation its
  outputs at every entry are equal, and which were computed from the target's features. A head saved from the
  live model loads onto the export.
* Greedy output is transformers' greedy generate (chains, trees, batch rows); the joint law of the first two
  tokens of an EAGLE tree at T = 0.7 with top-k is the target's (chi-square, SIGNIFICANCE = 1e-3, fixed seed);
  speculant.testing.check_distribution and a sweep take an exported target with its head (the sweep's α and
  tokens per target call are the live target's).
* A .pt2 package keeps them too (its row replicas, its deferred tree moves, fixed shapes, EAGLE-3's layers, a tied
  LM head), and a head on it computes what it does on the live model; it shares the package's own embedding and LM head. A package keeps
  one view, fixed when exported: another is refused by name, as is a package without features.
* On CUDA (run where one is lent), the target's captured calls write the features its uncaptured calls write.
* The recording stops with the last draft reading it. Refused by name: distill on an export, a second view of one
  export, a file whose metadata lacks the target's shapes, forms that keep no features.
"""

import gc
import warnings

import numpy as np
import pytest
import torch

from support import hf_models
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.hf_models import MAX_NEW, PROMPTS, hf_greedy, noisy_medusa
from support.live_reference import two_token_law
from speculant.models.features import recorded
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_plain


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request, tmp_path_factory):
    """(arch, transformers model, its export loaded)."""
    model = hf_models.make(request.param, seed=10)
    path = tmp_path_factory.mktemp(request.param) / "target.pt"
    speculant.export(model, path)
    return request.param, model, speculant.load(path)


def layer_outputs(model, ids: list, layers) -> torch.Tensor:
    """The live model's features over `ids` (features.recorded: forward hooks on its base model or layers)."""
    return recorded(model, layers, torch.tensor([ids]))[0][0]


@pytest.mark.parametrize("layers", [None, (1, 0)])
@pytest.mark.parametrize("shape", [{"gamma": 3}, {"tree": [2, 2]}, {"gamma": 3, "cuda_graphs": "fixed"},
                                   {"tree": [2, 2], "cuda_graphs": "fixed"}])
def test_the_export_keeps_each_rows_features(pair, layers, shape):
    arch, model, exported = pair
    draft = speculant.EagleDraft(exported, feature_layers=layers, seed=1)
    decoder = speculant.SpeculativeDecoder(exported, draft, temperature=1.0, **shape)
    for prompts in (PROMPTS, PROMPTS[2]):  # a batch (native rows), then batch 1
        results = decoder.generate(prompts, max_new_tokens=12, seed=3)
        if prompts is PROMPTS[2]:
            prompts, results = [prompts], [results]
        for row, (prompt, result) in enumerate(zip(prompts, results)):
            values = exported._core.features(row)
            sequence = prompt + result.tokens
            assert len(sequence) - 2 <= values.size(0) < len(sequence)
            expected = layer_outputs(model, sequence[:values.size(0)], layers)
            torch.testing.assert_close(values, expected, rtol=1e-4, atol=1e-4)


def test_a_head_on_the_export_computes_what_it_does_on_the_live_model(pair, tmp_path):
    arch, model, exported = pair
    live = speculant.load(model)
    expected = [hf_greedy(model, arch, index, eos=None) for index in range(len(PROMPTS))]
    on_live = speculant.EagleDraft(live, seed=4)
    on_live.save(tmp_path / "eagle")
    on_export = speculant.EagleDraft.load(tmp_path / "eagle", exported)
    for shape in ({"gamma": 3}, {"tree": [2, 2]}, {"tree": [2, 2], "cuda_graphs": "fixed"}):
        for target, draft in ((live, on_live), (exported, on_export)):
            options = shape if target is exported else {k: v for k, v in shape.items() if k != "cuda_graphs"}
            decoder = speculant.SpeculativeDecoder(target, draft, temperature=0, **options)
            assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)] == expected, shape
        for row in range(len(PROMPTS)):
            a, b = on_live.live._family[row], on_export.live._family[row]
            assert a.real == b.real > len(PROMPTS[row])
            torch.testing.assert_close(b.out[:b.real], a.out[:a.real], rtol=1e-4, atol=1e-4)
    medusa = speculant.MedusaDraft(exported, heads=2)
    decoder = speculant.SpeculativeDecoder(exported, medusa, tree=[2, 2], temperature=0)
    assert decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW).tokens == expected[0]


def test_a_one_token_prompt_on_a_fresh_export(pair):
    """The draft reads the target before its first call (a one-token prompt: the target has run nothing)."""
    arch, model, exported = pair
    fresh = speculant.load(exported.source)
    decoder = speculant.SpeculativeDecoder(fresh, speculant.MedusaDraft(fresh, heads=2), gamma=2, temperature=0)
    assert decoder.generate(PROMPTS[1], max_new_tokens=MAX_NEW).tokens == hf_greedy(model, arch, 1, eos=None)


def test_check_distribution_and_a_sweep_take_an_exported_target(pair):
    arch, model, exported = pair
    if arch != "llama":
        pytest.skip("one architecture is enough")
    draft = noisy_medusa(exported)
    check = speculant.testing.check_distribution(exported, draft, PROMPTS[1], k=2, gamma=2, samples=600,
                                                 significance=SIGNIFICANCE, seed=12, progress=False)
    assert check.passed and check.samples == 600, str(check)
    pytest.importorskip("pandas")
    frames = [speculant.sweep(target, speculant.EagleDraft(target, seed=6), [PROMPTS[2]], gammas=[3],
                              temperatures=[0.0], max_new_tokens=MAX_NEW, repeats=1, progress=False)
              for target in (speculant.load(model), exported)]  # the same head on either: the same calls
    assert list(frames[1]["tokens_per_target_call"]) == list(frames[0]["tokens_per_target_call"])
    assert list(frames[1]["alpha"]) == pytest.approx(list(frames[0]["alpha"]), abs=1e-6)


def test_two_token_law_of_a_tree_on_the_export(pair):
    arch, model, exported = pair
    if arch != "gpt2":
        pytest.skip("one architecture is enough for the law")
    draft = speculant.EagleDraft(exported, seed=5)
    decoder = speculant.SpeculativeDecoder(exported, draft, tree=[2, 2], siblings="without_replacement",
                                           temperature=0.7, top_k=10)
    results = [r for b in range(4)
               for r in decoder.generate([PROMPTS[0]] * 500, max_new_tokens=3, seed=8100 + 500 * b)]
    assert 0 < sum(r.stats.accepted_tokens for r in results) < sum(r.stats.drafted_tokens for r in results)
    law = two_token_law(model, arch, PROMPTS[0], 0.7, 10)
    pvalue = chi_square_pvalue(law, np.array([r.tokens[:2] for r in results]))
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_recording_stops_with_the_last_reader_and_refusals(pair, tmp_path):
    arch, model, exported = pair
    drafts = [speculant.EagleDraft(exported), speculant.MedusaDraft(exported)]  # one view: the LM head's input
    with pytest.raises(ValueError, match=r"records one view at a time, not also layers 0"):
        speculant.EagleDraft(exported, feature_layers=(0,))
    with pytest.raises(ValueError, match="distill trains a head on the live transformers model"):
        speculant.distill(exported, drafts[0], [[1, 2, 3, 4]], steps=1, progress=False)
    del drafts
    gc.collect()
    with pytest.raises(Exception, match="call record_features first"):
        exported._core.features(0)
    speculant.EagleDraft(exported, feature_layers=(0,))  # a new view once no draft reads the old one
    if arch == "gpt2":
        return
    scripted = torch.jit.load(exported.source)  # the same module without its metadata
    with pytest.raises(ValueError, match="has no hidden_size, num_hidden_layers, num_attention_heads; re-export"):
        speculant.MedusaDraft(speculant.load(scripted))
    plain = script_plain(TinyGPT(TinyGPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=8, max_length=8)))
    with pytest.warns(UserWarning, match="is in the plain form"):
        plain = speculant.load(plain)
    with pytest.raises(ValueError, match="is of the plain form; feature drafts read"):
        speculant.EagleDraft(plain)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [{"gamma": 3}, {"tree": [2, 2]}])
def test_captured_target_calls_record_the_features(shape, tmp_path):
    """cuda_graphs="auto": the target's calls replay CUDA graphs (the head's replay graphs of their own:
    test_feature_draft_graphs.py), and the replays write the features the uncaptured calls write: the same tokens,
    the same head outputs."""
    model = hf_models.make("llama", seed=10)
    speculant.export(model, tmp_path / "target.pt")
    outputs = []
    for mode in ("off", "auto"):
        exported = speculant.load(tmp_path / "target.pt", device="cuda")
        draft = speculant.EagleDraft(exported, seed=4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "auto" captures both: nothing to warn of
            decoder = speculant.SpeculativeDecoder(exported, draft, temperature=0, cuda_graphs=mode, **shape)
            tokens = [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)]
        rows = [draft.live._family[row] for row in range(len(PROMPTS))]
        outputs.append((tokens, [(r.real, r.out[:r.real].float().cpu()) for r in rows]))
        if mode == "auto":
            assert exported._core.graphs_captured > 0
    (tokens, heads), (graphed_tokens, graphed_heads) = outputs
    assert graphed_tokens == tokens
    for (real, out), (graphed_real, graphed_out) in zip(heads, graphed_heads):
        assert graphed_real == real
        torch.testing.assert_close(graphed_out, out, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope="module")
def pt2_pair(tmp_path_factory):
    """(the Llama, its .pt2 package keeping the LM head's input, one keeping no features)."""
    model = hf_models.make("llama", seed=10)
    directory = tmp_path_factory.mktemp("pt2")
    speculant.export(model, directory / "features.pt2", features=True, max_length=64)
    speculant.export(model, directory / "plain.pt2", max_length=64)
    return model, speculant.load(directory / "features.pt2"), speculant.load(directory / "plain.pt2")


def test_a_pt2_package_of_a_tied_model_keeps_layer_features(tmp_path):
    """EAGLE-3's layers traced into the package, and a tied LM head (one constant for both weights)."""
    model = hf_models.make("gpt2", seed=10, tie_word_embeddings=True)
    speculant.export(model, tmp_path / "layers.pt2", features=(1, 0), max_length=64)
    package = speculant.load(tmp_path / "layers.pt2")
    draft = speculant.EagleDraft(package, feature_layers=(0, 1), seed=2)
    embedding, head = package._core.feature_weights()
    torch.testing.assert_close(head, embedding, rtol=0, atol=0)
    torch.testing.assert_close(embedding, model.get_input_embeddings().weight, rtol=0, atol=0)
    decoder = speculant.SpeculativeDecoder(package, draft, tree=[2, 2], temperature=0)
    results = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in results] == [hf_greedy(model, "gpt2", i, eos=None) for i in range(len(PROMPTS))]
    for row, (prompt, result) in enumerate(zip(PROMPTS, results)):
        values = package._core.features(row)
        sequence = prompt + result.tokens
        torch.testing.assert_close(values, layer_outputs(model, sequence[:values.size(0)], (0, 1)), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("shape", [{"gamma": 3}, {"tree": [2, 2]}, {"tree": [2, 2], "cuda_graphs": "fixed"}])
def test_a_pt2_package_keeps_each_rows_features(pt2_pair, shape):
    """Row replicas of the package (batches), its deferred moves (trees: a kept path moves at the next call, so a
    read applies the pending moves) and its fixed-shape calls."""
    model, package, _ = pt2_pair
    draft = speculant.EagleDraft(package, seed=1)
    decoder = speculant.SpeculativeDecoder(package, draft, temperature=1.0, **shape)
    results = decoder.generate(PROMPTS, max_new_tokens=12, seed=3)
    for row, (prompt, result) in enumerate(zip(PROMPTS, results)):
        values = package._core.features(row)
        sequence = prompt + result.tokens
        assert len(sequence) - 2 <= values.size(0) < len(sequence)
        torch.testing.assert_close(values, layer_outputs(model, sequence[:values.size(0)], None), rtol=1e-4,
                                   atol=1e-4)


def test_a_head_on_a_pt2_package_computes_what_it_does_on_the_live_model(pt2_pair, tmp_path):
    model, package, plain = pt2_pair
    live = speculant.load(model)
    expected = [hf_greedy(model, "llama", index, eos=None) for index in range(len(PROMPTS))]
    on_live = speculant.EagleDraft(live, seed=4)
    on_live.save(tmp_path / "eagle")
    on_package = speculant.EagleDraft.load(tmp_path / "eagle", package)
    for target, draft in ((live, on_live), (package, on_package)):
        decoder = speculant.SpeculativeDecoder(target, draft, tree=[2, 2], temperature=0)
        assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)] == expected
    for row in range(len(PROMPTS)):
        a, b = on_live.live._family[row], on_package.live._family[row]
        assert a.real == b.real
        torch.testing.assert_close(b.out[:b.real], a.out[:a.real], rtol=1e-4, atol=1e-4)
    embedding, head = package._core.feature_weights()
    torch.testing.assert_close(embedding, model.get_input_embeddings().weight, rtol=0, atol=0)
    torch.testing.assert_close(head, model.get_output_embeddings().weight, rtol=0, atol=0)
    del on_live, on_package, draft, decoder
    gc.collect()
    fresh = speculant.load(package.source)  # a one-token prompt: the draft reads the package before its first call
    decoder = speculant.SpeculativeDecoder(fresh, speculant.MedusaDraft(fresh, heads=2), gamma=2, temperature=0)
    assert decoder.generate(PROMPTS[1], max_new_tokens=MAX_NEW).tokens == expected[1]
    del decoder
    gc.collect()
    with pytest.raises(ValueError, match="keeps the features of the LM head's input, not of layers 0"):
        speculant.EagleDraft(package, feature_layers=(0,))
    with pytest.raises(ValueError, match=r"keeps no features: export it with features=True"):
        speculant.MedusaDraft(plain)
    with pytest.raises(ValueError, match="features=True is for .pt2 packages"):
        speculant.export(model, tmp_path / "t.pt", features=True)
    with pytest.raises(ValueError, match=r"features must be False, True .* \[0, 1\], got \(2,\)"):
        speculant.export(model, tmp_path / "t.pt2", features=(2,))
