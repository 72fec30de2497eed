"""Early-exit drafts (speculant.EarlyExitDraft): the target's first l layers, final norm and LM head as its draft.

* The draft's logits are the target's norm and head over the hidden state after layer l (transformers'
  output_hidden_states), for Llama and GPT-2 and every exit layer; it has no parameter of its own, and building
  it leaves the target as it was.
* Greedy: chains, token trees, grown trees, batch rows and a hierarchy of the target's own layers give
  transformers' greedy generate token for token; a sweep takes the draft.
* Sampling: the joint law of the first two tokens is the target's law from transformers' logits (Pearson
  chi-square with cells of expected count < 5 pooled, SIGNIFICANCE = 1e-3 per test, fixed seeds): a GPT-2 chain at
  T = 0.7 with top-k, a Llama tree [3, 2] of siblings drawn without replacement at T = 1, the same tree on GPT-2
  under traversal verification (verification="block"), and a Llama chain at T = 1 through speculant.testing's own
  check_distribution (4 tests: a correct engine fails one by chance with probability at most 0.4% for a fresh draw
  of seeds).
* The shared cache (share_cache=True, the default): the target's verification of a drafted chain runs only its
  last token through the first l layers, and of a tree only the nodes the draft did not run (found whatever the
  order the draft ran them in, and only where they see the same entries); its logits are transformers' forward's.
  In a generation (chains, trees, grown trees) every token goes through those layers once (a forward hook counts
  them), where a draft with a cache of its own runs them again; at T = 1 too, where twins (one token drawn twice
  under one parent) have children of their own. A kept tree path, a rollback, a newer draft on the same target, a
  draft gone (its finalizer) and an EAGLE draft on the same target all keep the target's greedy output.
* Refused by name: exit layers outside [1, L - 1], encoder-decoders, exported targets, other objects; sharing with
  compile=True, with a compiled target or with another target than its own, or in speculative beam search (which
  takes a draft with a cache of its own: the target's beams); calls of a draft a newer one replaced.
"""

import gc


import numpy as np
import pytest
import torch

from support import hf_models
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.hf_models import MAX_NEW, PROMPTS, hf_greedy
from support.live_reference import two_token_law

LAYERS = 4


def make(arch: str):
    layers = {"num_hidden_layers": LAYERS} if arch == "llama" else {"n_layer": LAYERS}
    return hf_models.make(arch, seed=10, **layers)


def norm_and_head(model, arch: str):
    final_norm = model.model.norm if arch == "llama" else model.transformer.ln_f
    return lambda hidden: model.lm_head(final_norm(hidden))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_logits_are_the_targets_head_after_layer_l(arch):
    model = make(arch)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states  # [0]: the embeddings, [l]: after layer l
        for exit_layer in range(1, LAYERS):
            draft = speculant.EarlyExitDraft(model, exit_layer=exit_layer)
            torch.testing.assert_close(draft.module(ids).logits, norm_and_head(model, arch)(hidden[exit_layer]),
                                       rtol=1e-6, atol=1e-6)
            assert draft.exit_layer == exit_layer and draft.form == "live"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_no_parameters_of_its_own_and_the_target_unchanged(arch):
    model = make(arch)
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        before = model(ids).logits
    draft = speculant.EarlyExitDraft(speculant.load(model), exit_layer=2)
    own = {id(p) for p in model.parameters()}
    assert all(id(p) in own for p in draft.module.parameters())
    assert sum(p.numel() for p in draft.module.parameters()) < sum(p.numel() for p in model.parameters())
    assert model.config.num_hidden_layers == LAYERS
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("arch, share", [("llama", True), ("gpt2", True), ("llama", False)])
def test_greedy_equals_transformers_generate(arch, share):
    model = make(arch)
    target = speculant.load(model)
    draft = speculant.EarlyExitDraft(target, exit_layer=2, share_cache=share)
    expected = [hf_greedy(model, arch, index, eos=None) for index in range(len(PROMPTS))]
    decoders = [speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=0) for gamma in (1, 3)]
    decoders.append(speculant.SpeculativeDecoder(target, draft, tree=[2, 2], temperature=0))
    decoders.append(speculant.SpeculativeDecoder(target, draft, temperature=0,
                                                 tree=speculant.DynamicTree(budget=6, depth=3)))
    stats = []
    for decoder in decoders:
        for index, prompt in enumerate(PROMPTS):
            result = decoder.generate(prompt, max_new_tokens=MAX_NEW)
            assert result.tokens == expected[index], decoder
            stats.append(result.stats)
        assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)] == expected, "batch rows"
    accepted = sum(s.accepted_tokens for s in stats)
    assert 0 < accepted < sum(s.drafted_tokens for s in stats)  # both paths of the verification ran


def layer_counts(model) -> list:
    """How many tokens each decoder layer has run since it was made (forward hooks on the layers)."""
    counts = [0] * LAYERS
    layers = model.model.layers if hasattr(model, "model") else model.transformer.h
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda m, args, out, i=i: counts.__setitem__(i, counts[i] + out.shape[-2]))
    return counts


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_shared_verification_starts_from_the_drafts_layers(arch):
    """The draft runs 3 tokens into the target's first 2 layers; the target verifies 4 and runs only the last
    through them. Both give transformers' logits; after a rollback, the draft reads the entry the target made."""
    model = make(arch)
    target = speculant.load(model)
    draft = speculant.EarlyExitDraft(target, exit_layer=2)
    counts = layer_counts(model)
    sequence = torch.tensor(PROMPTS[0] + [5, 7, 9, 11])
    n = len(PROMPTS[0])
    target.live.reset(sequence[:n - 1])
    draft.live.reset(sequence[:n - 1])
    drafted = torch.cat([draft.live.extend(sequence[i:i + 1]) for i in range(n - 1, n + 2)])
    before = list(counts)
    verified = target.live.extend(sequence[n - 1:n + 3])
    assert [c - b for c, b in zip(counts, before)] == [1, 1, 4, 4]  # the first 3 tokens' first layers: the draft's
    with torch.no_grad():
        full = model(sequence.view(1, -1)).logits[0]
        early = draft.module(sequence.view(1, -1)).logits[0]
    torch.testing.assert_close(verified, full[n - 1:n + 3], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(drafted, early[n - 1:n + 2], rtol=1e-5, atol=1e-5)
    target.live.truncate(n + 2)  # keeps 3 of the 4: the draft is a token behind it
    draft.live.truncate(n + 1)
    before = list(counts)
    after = draft.live.extend(sequence[n + 1:n + 3])  # the target's entry at n + 1 is read, not run
    assert [c - b for c, b in zip(counts, before)] == [1, 1, 0, 0]
    torch.testing.assert_close(after, early[n + 1:n + 3], rtol=1e-5, atol=1e-5)
    assert draft.live._cache is target.live._cache  # no cache of its own


def tree_mask(parents: list, committed: int) -> torch.Tensor:
    """The mask of a tree call after `committed` entries: node j sees them, itself and its ancestors."""
    mask = torch.zeros(len(parents), committed + len(parents), dtype=torch.bool)
    mask[:, :committed] = True
    for j in range(len(parents)):
        up = j
        while up >= 0:
            mask[j, committed + up] = True
            up = parents[up]
    return mask


@pytest.mark.parametrize("arch, odd", [("llama", False), ("gpt2", False), ("llama", True)])
def test_shared_tree_verification_starts_the_drafts_nodes(arch, odd):
    """The draft runs x, then A and B (children of x), then 9 under A and 9 under B. The target verifies the tree
    x, A, F (under A), B, 9 (under B), H (under F) and two twins of A (under x, as the engine draws children past a
    point mass): it finds x, A (for all three), B and the 9 under B (not the 9 under A, which sees other entries)
    and runs only F and H through layers 1-2. Every node's logits are transformers' forward of
    its path, in the call's order; after the kept path x, A, F the draft reads F's entry. `odd`: the draft's B
    did not see the first entry, so neither B nor the 9 under it is the target's."""
    model = make(arch)
    target = speculant.load(model)
    draft = speculant.EarlyExitDraft(target, exit_layer=2)
    counts = layer_counts(model)
    prompt, n = PROMPTS[0], len(PROMPTS[0])
    ids = lambda *values: torch.tensor(values)  # noqa: E731
    target.live.reset(torch.tensor(prompt[:n - 1]))
    draft.live.reset(torch.tensor(prompt[:n - 1]))
    draft.live.extend(ids(prompt[-1]))
    first = tree_mask([-1, -1], n)
    first[1, 0] = not odd
    draft.live.extend_masked(ids(5, 7), ids(n, n), first)
    second = torch.zeros(2, n + 4, dtype=torch.bool)
    second[:, :n] = True
    second[[0, 1, 0, 1], [n, n + 1, n + 2, n + 3]] = True  # 9 under A (entry n), 9 under B (entry n + 1)
    draft.live.extend_masked(ids(9, 9), ids(n + 1, n + 1), second)
    before = list(counts)
    parents = [-1, 0, 1, 0, 3, 2, 0, 0]  # x, A, F, B, 9 under B, H under F, A, A
    tokens, positions = ids(prompt[-1], 5, 13, 7, 9, 9, 5, 5), ids(n - 1, n, n + 1, n, n + 1, n + 2, n, n)
    verified = target.live.extend_masked(tokens, positions, tree_mask(parents, n - 1))
    run = 4 if odd else 2
    assert [c - b for c, b in zip(counts, before)] == [run, run, 8, 8]
    paths = [[], [5], [5, 13], [7], [7, 9], [5, 13, 9], [5], [5]]
    with torch.no_grad():
        for node, path in enumerate(paths):
            full = model(torch.tensor([prompt + path])).logits[0, -1]
            torch.testing.assert_close(verified[node], full, rtol=1e-5, atol=1e-5)
    target.live.keep(torch.arange(n + 2))  # x, A, F
    draft.live.keep(torch.arange(n + 1))  # x, A
    before = list(counts)
    after = target.live.extend(ids(17))
    drafted = draft.live.extend(ids(13, 17))
    assert [c - b for c, b in zip(counts, before)] == [1, 1, 1, 1]  # the draft found F's entry and 17's
    sequence = torch.tensor([prompt + [5, 13, 17]])
    with torch.no_grad():
        torch.testing.assert_close(after[0], model(sequence).logits[0, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(drafted, draft.module(sequence).logits[0, -2:], rtol=1e-5, atol=1e-5)


def test_each_token_runs_the_shared_layers_once():
    """A chain, token tree or grown tree generation with the shared cache runs as many tokens through layers 1-2
    as through 3-4 (the target's verification starts the tokens the draft ran above layer 2); with a cache of its
    own the draft runs them again. At T = 1 a tree [3, 3, 2] draws twins whose children the draft ran: the target
    finds them too."""
    model = make("llama")
    counts = layer_counts(model)
    target = speculant.load(model)
    expected = hf_greedy(model, "llama", 0, eos=None)
    shapes = {"chain": {"gamma": 3}, "tree": {"tree": [2, 2]},
              "grown": {"tree": speculant.DynamicTree(budget=6, depth=3)}}
    runs, drafts = {}, {}
    for share in (True, False):
        draft = drafts[share] = speculant.EarlyExitDraft(target, exit_layer=2, share_cache=share)
        for shape, options in shapes.items():
            decoder = speculant.SpeculativeDecoder(target, draft, temperature=0, **options)
            counts[:] = [0] * LAYERS
            assert decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW).tokens == expected
            runs[share, shape] = list(counts)
    for shape in shapes:
        assert runs[True, shape][0] == runs[True, shape][-1] < runs[False, shape][0], shape
        assert runs[True, shape][-1] == runs[False, shape][-1], shape  # the same target work above the exit
    decoder = speculant.SpeculativeDecoder(target, drafts[True], temperature=1, tree=[3, 3, 2])
    counts[:] = [0] * LAYERS
    for prompt in PROMPTS:
        decoder.generate(prompt, max_new_tokens=40, seed=1)
    assert counts[0] == counts[-1] > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_beam_search_takes_a_draft_with_a_cache_of_its_own(arch):
    """Speculative beam search gives the target's own beams with share_cache=False; a sharing draft is refused
    by name (its beams would need entries of their own in the shared layers)."""
    model = make(arch)
    target = speculant.load(model)
    options = {"max_new_tokens": 12, "num_beams": 3, "num_return_sequences": 3}
    plain = speculant.generate(target, PROMPTS[1], **options)
    own = speculant.EarlyExitDraft(target, exit_layer=2, share_cache=False)
    result = speculant.SpeculativeDecoder(target, own, gamma=3).generate(PROMPTS[1], draft_beams=5, **options)
    assert result.sequences == plain.sequences
    shared = speculant.EarlyExitDraft(target, exit_layer=2)
    with pytest.raises(ValueError, match="shares its target's cache cannot draft for beam search.*share_cache=False"):
        speculant.SpeculativeDecoder(target, shared, gamma=3).generate(PROMPTS[1], draft_beams=5, **options)


def test_shared_cache_survives_its_neighbours():
    """A newer sharing draft replaces the older (whose calls then refuse, by name); a draft gone gives the target
    its cache back; an EAGLE draft reading the same target's features decodes beside a sharing draft."""
    model = make("llama")
    target = speculant.load(model)
    expected = hf_greedy(model, "llama", 1, eos=None)
    old = speculant.EarlyExitDraft(target, exit_layer=1)
    new = speculant.EarlyExitDraft(target, exit_layer=3)
    assert speculant.SpeculativeDecoder(target, new, gamma=2, temperature=0).generate(
        PROMPTS[1], max_new_tokens=MAX_NEW).tokens == expected
    with pytest.raises(ValueError, match="a newer EarlyExitDraft shares its target's cache"):
        speculant.SpeculativeDecoder(target, old, gamma=2, temperature=0).generate(PROMPTS[1], max_new_tokens=4)
    eagle = speculant.EagleDraft(target)
    for draft in (eagle, new, eagle):
        decoder = speculant.SpeculativeDecoder(target, draft, gamma=3, temperature=0)
        assert decoder.generate(PROMPTS[1], max_new_tokens=MAX_NEW).tokens == expected, draft
    del old, new, decoder, draft
    gc.collect()
    assert target.live._share is None
    assert speculant.SpeculativeDecoder(target, eagle, gamma=3, temperature=0).generate(
        PROMPTS[1], max_new_tokens=MAX_NEW).tokens == expected


@pytest.mark.cuda
def test_shared_cache_on_cuda():
    """On CUDA the shared cache gives plain greedy decoding's tokens (chains, trees, batch rows), and the target's
    verification runs only the tokens the draft did not run through the shared layers (chains and trees)."""
    model = make("llama").to("cuda")
    counts = layer_counts(model)
    target = speculant.load(model)
    draft = speculant.EarlyExitDraft(target, exit_layer=2)
    expected = [speculant.generate(target, p, max_new_tokens=MAX_NEW, temperature=0).tokens for p in PROMPTS]
    for shape in ({"gamma": 3}, {"tree": [2, 2]}):
        decoder = speculant.SpeculativeDecoder(target, draft, temperature=0, **shape)
        assert [decoder.generate(p, max_new_tokens=MAX_NEW).tokens for p in PROMPTS] == expected, shape
        assert [r.tokens for r in decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)] == expected, shape
    for shape in ({"gamma": 3}, {"tree": [2, 2]}, {"tree": [3, 3, 2], "temperature": 1}):
        decoder = speculant.SpeculativeDecoder(target, draft, **{"temperature": 0, **shape})
        counts[:] = [0] * LAYERS
        tokens = decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW, seed=1).tokens
        assert counts[0] == counts[-1] > 0, shape
        assert "temperature" in shape or tokens == expected[0]


def test_bottom_of_a_hierarchy_and_a_sweep():
    """A hierarchy whose levels are all the target's own (exit after layer 3, drafted by exit after layer 1) gives
    transformers' greedy output; a sweep takes the draft as it takes a model."""
    model = make("llama")
    target = speculant.load(model)
    level = speculant.SpeculativeDecoder(speculant.EarlyExitDraft(target, exit_layer=3),
                                         speculant.EarlyExitDraft(target, exit_layer=1, share_cache=False), gamma=2,
                                         temperature=0)
    top = speculant.SpeculativeDecoder(target, level, gamma=3, temperature=0)
    result = top.generate(PROMPTS[0], max_new_tokens=MAX_NEW)
    assert result.tokens == hf_greedy(model, "llama", 0, eos=None) and len(result.levels) == 1
    pytest.importorskip("pandas")
    frame = speculant.sweep(target, speculant.EarlyExitDraft(target, exit_layer=2), [PROMPTS[0]], gammas=[2],
                            temperatures=[0.0, 1.0], max_new_tokens=8, repeats=1, progress=False)
    assert len(frame) == 2 and (frame["tokens_per_target_call"] >= 1).all()


SAMPLES, BATCH = 2000, 500  # a live model's call re-enters Python: 2000 samples take about 30 s


@pytest.mark.parametrize("arch, temperature, top_k, tree, verification", [
    ("gpt2", 0.7, 10, None, "token"), ("llama", 1.0, 0, [3, 2], "token"), ("gpt2", 1.0, 0, [3, 2], "block")])
def test_two_token_law_is_the_targets(arch, temperature, top_k, tree, verification):
    """Rows of one batch, each with its own seed; three tokens, so that a tree's first iteration is verified
    whole. The first two are tested against the law from transformers' logits."""
    model = make(arch)
    target = speculant.load(model)
    draft = speculant.EarlyExitDraft(target, exit_layer=2)
    shape = {"tree": tree, "siblings": "without_replacement"} if tree else {"gamma": 3}
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, top_k=top_k,
                                           verification=verification, **shape)
    samples = np.array([r.tokens[:2] for b in range(SAMPLES // BATCH)
                        for r in decoder.generate([PROMPTS[0]] * BATCH, max_new_tokens=3, seed=7000 + b * BATCH)])
    law = two_token_law(model, arch, PROMPTS[0], temperature, top_k)
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.3g}"


def test_check_distribution_takes_the_draft():
    """speculant.testing's own check (one generation per sample) accepts the draft as it does any model."""
    model = make("llama")
    draft = speculant.EarlyExitDraft(model, exit_layer=1)
    check = speculant.testing.check_distribution(model, draft, PROMPTS[1], k=2, gamma=2, samples=600,
                                                 significance=SIGNIFICANCE, seed=11, progress=False)
    assert check.passed and check.samples == 600, str(check)


def test_refusals_name_what_is_wrong(tmp_path):
    model = make("llama")
    for bad in (0, LAYERS, -1, "2", True, 1.5):
        with pytest.raises(ValueError, match=r"exit_layer must be an integer in \[1, 3\]"):
            speculant.EarlyExitDraft(model, exit_layer=bad)
    with pytest.raises(ValueError, match="encoder-decoder"):
        speculant.EarlyExitDraft(hf_models.make("t5"), exit_layer=1)
    speculant.export(model, tmp_path / "target.pt")
    with pytest.raises(ValueError, match="exported file .* needs the live transformers model"):
        speculant.EarlyExitDraft(speculant.load(tmp_path / "target.pt"), exit_layer=1)
    with pytest.raises(ValueError, match="live transformers model"):
        speculant.EarlyExitDraft(torch.nn.Linear(2, 2), exit_layer=1)
    with pytest.raises(ValueError, match="share_cache must be True or False"):
        speculant.EarlyExitDraft(model, exit_layer=1, share_cache=1)
    with pytest.raises(ValueError, match="compile=True .* pass share_cache=False"):
        speculant.EarlyExitDraft(model, exit_layer=1, compile=True)
    with pytest.raises(ValueError, match="needs the eager live target .* compiled form"):
        speculant.EarlyExitDraft(speculant.load(model, compile=True, max_length=64), exit_layer=1)
    draft = speculant.EarlyExitDraft(speculant.load(model), exit_layer=1)
    with pytest.raises(ValueError, match="EarlyExitDraft shares the cache of the target it was built on"):
        speculant.SpeculativeDecoder(speculant.load(model), draft, gamma=2)
    speculant.SpeculativeDecoder(model, draft, gamma=2)  # its transformers model: the draft's own target
