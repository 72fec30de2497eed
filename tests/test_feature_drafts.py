"""Drafts that read the target's own features: speculant.EagleDraft (EAGLE-1/2, and EAGLE-3's fused layers) and
speculant.MedusaDraft.

* The target records its hidden states beside its cache: after a generation (chains, trees, batches) each row's
  committed features are the base model's output over its sequence. Its hooks go with the last draft reading them.
* The draft's calls are the head's math: EAGLE's first draft position equals the teacher-forced head at depth 1,
  a position drafted ahead of the target equals the training-time test's depth 2 (so training sees what drafting
  does), accepted drafts are computed again from the target's features (once, not at every call of a round), and a
  tree call equals the chain calls of each node's path. Medusa's law at depth j is head j's at the anchor.
* Greedy: chains, token trees, grown trees and batch rows give transformers' greedy generate token for token, for
  Llama and GPT-2; a hierarchy's bottom level and a sweep take the drafts.
* Sampling: the joint law of the first two tokens is the target's law from transformers' logits (Pearson
  chi-square, cells of expected count < 5 pooled, SIGNIFICANCE = 1e-3 per test, fixed seeds): an EAGLE chain at
  T = 0.7 with top-k, an EAGLE-3 tree [3, 2] at T = 1, a Medusa tree [2, 2] at T = 1 with top-p; with
  verification="block" (Sun et al.'s block rule on chains, traversal on trees) an EAGLE chain at T = 1 with top-p,
  an EAGLE tree [3, 2] at T = 0.7 with top-k and a Medusa chain at T = 1.
* speculant.testing.check_distribution takes a head built on the model it is given.
* distill trains the heads (α after > α before, the caller's draft unchanged); save and load give the same logits.
* Refused by name: compiled and encoder-decoder targets, a feature draft as a target, another target in the
  decoder or in distill, bad shapes, an executor sweep, a saved head on a target of another size, damaged or
  misfitting head files.
"""

import re

import numpy as np
import pytest
import torch

from support import hf_models
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.hf_models import MAX_NEW, PROMPTS, hf_greedy, noisy_medusa
from support.live_reference import two_token_law
from speculant.models.eagle import EagleRows


def make(arch: str):
    return hf_models.make(arch, seed=10)


def drafts(target):
    return [speculant.EagleDraft(target, seed=1), speculant.EagleDraft(target, feature_layers=(0, 1), seed=2),
            speculant.MedusaDraft(target, heads=3)]


def base_output(model, ids: list) -> torch.Tensor:
    with torch.no_grad():
        return model.base_model(torch.tensor([ids])).last_hidden_state[0]


@pytest.mark.parametrize("shape", [{"gamma": 3}, {"tree": [2, 2]}])
def test_target_features_follow_its_cache(shape):
    model = make("llama")
    target = speculant.load(model)
    decoder = speculant.SpeculativeDecoder(target, speculant.EagleDraft(target), temperature=1.0, **shape)
    results = decoder.generate(PROMPTS, max_new_tokens=12, seed=3)
    for row, (prompt, result) in enumerate(zip(PROMPTS, results)):
        values, committed = target.live.row(row).features(None)
        sequence = prompt + result.tokens
        assert len(sequence) - 2 <= committed <= len(sequence)
        torch.testing.assert_close(values[:committed], base_output(model, sequence[:committed]), rtol=1e-5,
                                   atol=1e-5)


def logits_of(model, hidden):
    return model.lm_head(hidden)


def test_the_target_records_only_while_a_draft_reads_it():
    """One tap per view while a draft reads it, dropped with the last reader; the hooks live on the user's modules
    only for the duration of speculant's own forwards (none before, between or after its calls)."""
    import gc

    model = make("llama")
    target = speculant.load(model)
    hooks = lambda: len(model.base_model._forward_hooks) + sum(len(l._forward_hooks) for l in model.model.layers)  # noqa: E731
    taps = lambda: len(target.live._features.taps)  # noqa: E731
    during = []
    model.model.layers[0].register_forward_pre_hook(lambda module, args: during.append(hooks()))
    drafts = [speculant.EagleDraft(target), speculant.MedusaDraft(target), speculant.EagleDraft(target,
                                                                                                feature_layers=(1,))]
    assert taps() == 2 and hooks() == 0  # one tap per view: the LM head's input (shared by two drafts) and layer 1
    speculant.SpeculativeDecoder(target, drafts[0], gamma=2, temperature=0).generate(PROMPTS[0], max_new_tokens=4)
    assert hooks() == 0 and during and set(during) == {2}  # armed around the target's calls: one hook per view
    del drafts[:2]
    gc.collect()
    assert taps() == 1 and hooks() == 0 and target.live.features(None) == (None, 0)
    del drafts[0]
    gc.collect()
    assert taps() == 0
    during.clear()
    speculant.generate(target, PROMPTS[0], max_new_tokens=2)
    assert during and set(during) == {0}


def test_a_second_load_of_the_targets_file_is_said_to_be_another_model(tmp_path):
    """The decoder refuses a target that is not the one a bound draft was built on; given the path of that target's
    files again (or a second load of them), it says that a second load is another model and how to pass the first,
    rather than "pass that target" naming the very path passed."""
    make("llama").save_pretrained(tmp_path / "llama")
    first = speculant.load(tmp_path / "llama")
    said = (r"\(" + re.escape(str(tmp_path / "llama")) + r"\); the target given(, .*,)? is .*a second load of the same "
            r"file is another model \(weights and a cache of its own\), not the one the draft was built on; pass that "
            r"first load itself \(draft\.target")
    for draft in (speculant.MedusaDraft(first, heads=2), speculant.EarlyExitDraft(first, exit_layer=1)):
        for given in (tmp_path / "llama", str(tmp_path / "llama"), speculant.load(tmp_path / "llama")):
            with pytest.raises(ValueError, match=said):
                speculant.SpeculativeDecoder(given, draft, gamma=2)
        assert draft.target is first
        speculant.SpeculativeDecoder(draft.target, draft, gamma=2).generate(PROMPTS[0], max_new_tokens=2)


def test_eagle_calls_are_the_heads_training_math():
    model = make("llama")
    target = speculant.load(model)
    draft = speculant.EagleDraft(target, seed=4)
    sequence = torch.tensor([1, 5, 9, 14, 3, 22, 7])
    n = 4
    with torch.no_grad():
        features = model.base_model(sequence[None]).last_hidden_state
        depths = draft.head.unrolled(model.get_input_embeddings()(sequence[None]), features, 2)
    rows, own = draft.live, target.live
    own.reset(sequence[:n - 1])
    rows.reset(sequence[:n - 1])
    first = rows.extend(sequence[n - 1:n])  # position n - 1, from the target's f_{n-2}
    ahead = rows.extend(sequence[n:n + 1])  # position n, from the head's own prediction of f_{n-1}
    torch.testing.assert_close(first[0], logits_of(model, depths[0][0, n - 1]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ahead[0], logits_of(model, depths[1][0, n]), rtol=1e-5, atol=1e-5)
    own.extend(sequence[n - 1:n + 1])  # the target catches up: the entry at n is computed again from f_{n-1}
    after = rows.extend(sequence[n + 1:n + 2])
    torch.testing.assert_close(after[0], logits_of(model, depths[0][0, n + 1]), rtol=1e-5, atol=1e-5)
    # a tree as the engine feeds a draft's (cpp/drafting/model_drafter.cpp): the root s_{n+2} in a plain call (from
    # the target's feature), then level by level its children a and b, then a's child c; each node equals its
    # path's chain
    own.extend(sequence[n + 1:n + 2])
    entries = rows.length
    root = sequence[n + 2:n + 3]
    first = rows.extend(root)
    mask = torch.ones(2, entries + 3, dtype=torch.bool)
    mask[:, entries + 1:] = torch.tensor([[1, 0], [0, 1]], dtype=torch.bool)
    tree = rows.extend_masked(torch.tensor([11, 12]), torch.tensor([n + 3, n + 3]), mask)
    deeper = rows.extend_masked(torch.tensor([13]), torch.tensor([n + 4]),
                                torch.cat([mask[0], torch.tensor([True])])[None])
    chains = []
    for path in ([11, 13], [12]):
        rows.truncate(entries)
        chains.append(rows.extend(torch.cat([root, torch.tensor(path[:1])])))
        if len(path) > 1:
            chains.append(rows.extend(torch.tensor(path[1:])))
    torch.testing.assert_close(first[0], chains[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree[0], chains[0][1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(deeper, chains[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree[1], chains[2][1], rtol=1e-5, atol=1e-5)


def test_a_round_runs_each_new_token_through_the_head_once(monkeypatch):
    """Entries computed from the head's predictions are computed again once the target has their features (the
    accepted drafts, at the round's first call), not at every call of the round."""
    model = make("llama")
    target = speculant.load(model)
    draft = speculant.EagleDraft(target, seed=4)
    counts, original = [], EagleRows._run
    monkeypatch.setattr(EagleRows, "_run", lambda rows, tokens, *rest: counts.append(tokens.numel())
                        or original(rows, tokens, *rest))
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=4, temperature=0)
    stats = decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW).stats
    # per round: the accepted drafts again, the bonus token (after the last draft too if all were accepted), then
    # one token per call; the prompt's entries in the first call
    assert sum(counts) <= len(PROMPTS[0]) + stats.draft_calls + stats.accepted_tokens + stats.iterations
    assert stats.iterations >= 2


def test_a_tree_call_right_after_a_reset_computes_the_entries_first():
    model = make("gpt2")
    target = speculant.load(model)
    rows = speculant.EagleDraft(target, seed=6).live
    sequence = torch.tensor([3, 1, 4, 1, 5, 9])
    target.live.reset(sequence[:5])
    outputs = []
    for tree in (True, False):
        rows.reset(sequence[:5])
        if tree:
            outputs.append(rows.extend_masked(sequence[5:], torch.tensor([5]), torch.ones(1, 6, dtype=torch.bool)))
        else:
            outputs.append(rows.extend(sequence[5:]))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


def test_medusa_laws_are_the_heads_at_the_anchor():
    model = make("gpt2")
    target = speculant.load(model)
    draft = noisy_medusa(target)
    sequence = torch.tensor([4, 8, 15, 16, 23])
    target.live.reset(sequence[:3])
    draft.live.reset(sequence[:2])
    logits = draft.live.extend(sequence[2:5])  # positions 2 (the target has f_2: its own law), 3 and 4
    anchor = base_output(model, sequence[:3].tolist())[2]
    heads = draft.head(anchor)
    expected = torch.stack([model.lm_head(anchor), model.lm_head(heads[0]), model.lm_head(heads[1])])
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    beyond = draft.live.extend(sequence[:1])  # position 5: past the last head, the last head's law
    torch.testing.assert_close(beyond[0], model.lm_head(heads[1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_equals_transformers_generate(arch):
    model = make(arch)
    target = speculant.load(model)
    expected = [hf_greedy(model, arch, index, eos=None) for index in range(len(PROMPTS))]
    for draft in drafts(target):
        for shape in ({"gamma": 3}, {"tree": [2, 2]}, {"tree": speculant.DynamicTree(budget=6, depth=3)}):
            decoder = speculant.SpeculativeDecoder(model, draft, temperature=0, **shape)  # its module: the handle
            for index, prompt in enumerate(PROMPTS):
                assert decoder.generate(prompt, max_new_tokens=MAX_NEW).tokens == expected[index], (draft, shape)
            assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)] == expected, "batch rows"


def test_bottom_of_a_hierarchy_and_a_sweep():
    model = make("llama")
    target = speculant.load(model)
    middle = speculant.EarlyExitDraft(target, exit_layer=1)
    level = speculant.SpeculativeDecoder(middle, speculant.MedusaDraft(middle, heads=2), gamma=2, temperature=0)
    top = speculant.SpeculativeDecoder(target, level, gamma=3, temperature=0)
    result = top.generate(PROMPTS[0], max_new_tokens=MAX_NEW)
    assert result.tokens == hf_greedy(model, "llama", 0, eos=None) and len(result.levels) == 1
    pytest.importorskip("pandas")
    frame = speculant.sweep(target, speculant.EagleDraft(target), [PROMPTS[0]], gammas=[2], temperatures=[0.0, 1.0],
                            max_new_tokens=8, repeats=1, progress=False)
    assert len(frame) == 2 and (frame["tokens_per_target_call"] >= 1).all()


SAMPLES, BATCH = 2000, 500


@pytest.mark.parametrize("arch, kind, temperature, top_k, top_p, tree, verification", [
    ("gpt2", "eagle", 0.7, 10, 1.0, None, "token"),
    ("llama", "eagle3", 1.0, 0, 1.0, [3, 2], "token"),
    ("llama", "medusa", 1.0, 0, 0.9, [2, 2], "token"),
    ("gpt2", "eagle", 1.0, 0, 0.9, None, "block"),
    ("llama", "eagle", 0.7, 10, 1.0, [3, 2], "block"),
    ("llama", "medusa", 1.0, 0, 1.0, None, "block"),
])
def test_two_token_law_is_the_targets(arch, kind, temperature, top_k, top_p, tree, verification):
    """Rows of one batch, each with its own seed; three tokens, so that a tree's first iteration is verified
    whole. The heads have random weights (Medusa's drawn away from zero), so that both acceptances and rejections
    happen."""
    model = make(arch)
    target = speculant.load(model)
    if kind == "medusa":
        draft = noisy_medusa(target)
    else:
        draft = speculant.EagleDraft(target, feature_layers=(0, 1) if kind == "eagle3" else None, seed=5)
    shape = {"tree": tree, "siblings": "without_replacement"} if tree else {"gamma": 3}
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, top_k=top_k, top_p=top_p,
                                           verification=verification, **shape)
    results = [r for b in range(SAMPLES // BATCH)
               for r in decoder.generate([PROMPTS[0]] * BATCH, max_new_tokens=3, seed=7100 + b * BATCH)]
    accepted = sum(r.stats.accepted_tokens for r in results)
    assert 0 < accepted < sum(r.stats.drafted_tokens for r in results)
    law = two_token_law(model, arch, PROMPTS[0], temperature, top_k, top_p)
    pvalue = chi_square_pvalue(law, np.array([r.tokens[:2] for r in results]))
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_check_distribution_takes_the_drafts():
    """speculant.testing's own check (one generation per sample) accepts a feature draft built on the transformers
    model it is given."""
    model = make("llama")
    draft = noisy_medusa(model)
    check = speculant.testing.check_distribution(model, draft, PROMPTS[1], k=2, gamma=2, samples=600,
                                                 significance=SIGNIFICANCE, seed=12, progress=False)
    assert check.passed and check.samples == 600, str(check)


PROMPTS_TRAIN = [[1 + (7 * i + 3 * j) % 60 for j in range(6)] for i in range(20)]


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_distill_raises_alpha_and_saves(kind, tmp_path):
    model = make("llama")
    target = speculant.load(model)
    draft = speculant.EagleDraft(target, intermediate_size=64) if kind == "eagle" else speculant.MedusaDraft(
        target, heads=2)
    before = {k: v.clone() for k, v in draft.head.state_dict().items()}
    result = speculant.distill(target, draft, PROMPTS_TRAIN, steps=40, data="target", new_tokens=12, lr=3e-3,
                               loss="forward_kl", progress=False, save=tmp_path / kind, seed=2)
    assert result.alpha_after.mean > result.alpha_before.mean + 0.005, (result.alpha_before, result.alpha_after)
    assert all(torch.equal(before[k], v) for k, v in draft.head.state_dict().items()), "the caller's draft changed"
    trained = result.draft
    assert type(trained) is type(draft) and trained.parameters() == draft.parameters()
    loaded = type(draft).load(tmp_path / kind, model)
    sequence = torch.tensor(PROMPTS_TRAIN[0])
    outputs = []
    for d in (trained, loaded):
        d.target.live.reset(sequence[:4])
        d.live.reset(sequence[:4])
        outputs.append(d.live.extend(sequence[4:]))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    greedy = speculant.SpeculativeDecoder(model, loaded, gamma=3, temperature=0).generate(PROMPTS[0],
                                                                                        max_new_tokens=MAX_NEW)
    assert greedy.tokens == hf_greedy(model, "llama", 0, eos=None)


def test_refusals_name_what_is_wrong(tmp_path):
    model = make("llama")
    target = speculant.load(model)
    with pytest.raises(ValueError, match="compile=True"):
        speculant.MedusaDraft(speculant.load(make("llama"), compile=True))
    with pytest.raises(ValueError, match="encoder-decoder"):
        speculant.EagleDraft(hf_models.make("t5"))
    with pytest.raises(ValueError, match="live transformers model"):
        speculant.MedusaDraft(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="is of the feature form; feature drafts read"):
        speculant.MedusaDraft(speculant.EagleDraft(target))
    for bad in ((2,), (0, 0), "01", (True,), ()):
        with pytest.raises(ValueError, match=r"feature_layers must be None or distinct decoder layer .* \[0, 1\]"):
            speculant.EagleDraft(target, feature_layers=bad)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="intermediate_size must be an integer >= 1"):
            speculant.EagleDraft(target, intermediate_size=bad)
    with pytest.raises(ValueError, match="heads must divide the hidden size 64"):
        speculant.EagleDraft(target, heads=3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="heads must be an integer >= 1"):
            speculant.MedusaDraft(target, heads=bad)
    draft = speculant.EagleDraft(target)
    with pytest.raises(ValueError, match="reads the hidden states of the target it was built on"):
        speculant.SpeculativeDecoder(speculant.load(model), draft)
    with pytest.raises(ValueError, match="learns from the target it was built on"):
        speculant.distill(speculant.load(model), draft, PROMPTS_TRAIN, steps=1, progress=False)
    from concurrent.futures import ThreadPoolExecutor

    model.save_pretrained(tmp_path / "llama")
    saved = speculant.load(tmp_path / "llama")  # a target the workers could load: the draft is what they cannot
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="draft: EagleDraft reads the hidden states"):
        speculant.sweep(saved, speculant.EagleDraft(saved), [PROMPTS[0]], gammas=[2], executor=pool, progress=False)
    draft.save(tmp_path / "eagle")
    with pytest.raises(ValueError, match="hidden_size 64, this target has 48"):
        speculant.EagleDraft.load(tmp_path / "eagle", make("gpt2"))
    with pytest.raises(ValueError, match="holds a 'eagle' draft, not 'medusa'"):
        speculant.MedusaDraft.load(tmp_path / "eagle", model)
    with pytest.raises(ValueError, match="holds no config.json"):
        speculant.MedusaDraft.load(tmp_path, model)
    weights = tmp_path / "eagle" / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(ValueError, match="head.safetensors is truncated"):
        speculant.EagleDraft.load(tmp_path / "eagle", model)
    speculant.MedusaDraft(target, heads=2).save(tmp_path / "medusa")
    config = tmp_path / "medusa" / "config.json"
    config.write_text(config.read_text().replace('"heads": 2', '"heads": 3'))
    with pytest.raises(ValueError, match="head.safetensors does not fit the head its config.json describes"):
        speculant.MedusaDraft.load(tmp_path / "medusa", model)
