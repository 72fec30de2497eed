"""Token trees in the decoder: ``SpeculativeDecoder(target, draft, tree=[k_1, ..., k_d])`` (cpp/math/tree.h).

Each iteration the draft grows a tree level by level (one draft call per depth, every node of a depth in it),
the target verifies the pending token and every node in one call with an ancestor mask and positions by depth,
and only the accepted path's cache entries are kept, moved into place (model.h: extend_rows_masked,
copy_slots). What is checked:

* Greedy: token for token the pure-torch greedy loop of tests/support/decoding_references.py (no engine, no cache;
  every step's top-2 gap at least 1e-3), for several shapes, drafts that are often right, unrelated or identical,
  batches of ragged prompts and EOS stops. A cache entry left in the wrong slot changes later argmaxes, so this also
  checks the cache after every iteration against a cache-free recomputation of the kept path.
* The law: Pearson chi-square of the first LAW_NEW tokens against the target's exact law on native Markov
  tables (tests/support/engine_checks.py's MarkovRows, which reads each node's predecessor through the mask), at
  SIGNIFICANCE = 1e-3 per window, 2 windows per case, fixed seeds: 9 cases (each way of drawing siblings, given
  trees), at most 1.8% family-wise false failures for a fresh choice of seeds (Bonferroni).
* Sibling drafts (``sibling_draft=``, cpp/math/tree.h): a second draft model for the later children. The law on
  Markov tables (chi-square, 2 more cases under the family-wise bound below: at most 2.8% with the 12), greedy
  trees equal plain greedy, the second model's cache follows the accepted path (its calls, and the tokens of a
  sibling equal to the draft those without one), and the refusals by name.
* The statistics: per depth and rank acceptance counts, tokens per call, and the refusals by name.
* Drafters without a model: Unigram / Bigram tables and a PythonDrafter with score= propose trees (the engine
  draws each node's children from their law there): the law on Markov tables (chi-square, 3 more cases under
  the same family-wise bound: at most 2.4% with the 9 above), greedy trees equal plain greedy.
* Live transformers objects (python/speculant/models/live.py: a 4-D attention mask, position_ids, the cache's entries
  selected in place), probed once per model: greedy trees equal transformers' greedy generate for GPT-2 and
  Llama, alone and in a batch; the first two tokens' law with trees is the target's (Llama, chi-square at
  SIGNIFICANCE = 1e-3, fixed seeds); a model that ignores the mask, an encoder-decoder other than T5 (BART),
  an ALiBi model (Bloom), layer types without tree masks and a config window the model does not apply are
  refused by name. (Every other family of tests/support/hf_families.py, sliding
  windows and attention chunks included: tests/test_live.py.)
"""

import dataclasses

import pytest
import torch

from support import markov
import speculant
from support.decoding_references import (GIVEN, NEW, PROMPTS, TARGET, TARGET_CONFIG, perturbed, scripted, tiny_gpt,
                                         torch_greedy)
from support.drafter_sets import table_drafters
from support.engine_checks import table_model
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples
from speculant.tiny_gpt import script_cached

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

SHAPES = [[2, 2], [3, 1, 1], [1, 1, 1], [4], [2, 2, 2, 2], GIVEN]


@pytest.fixture(scope="module")
def expected():
    return [torch_greedy(TARGET, prompt, NEW) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def models():
    drafts = {"near": perturbed(TARGET, seed=3, scale=0.05), "unrelated": tiny_gpt(TARGET_CONFIG, seed=9),
              "same": TARGET}
    return speculant.load(script_cached(TARGET)), {name: speculant.load(script_cached(m)) for name, m in drafts.items()}


@pytest.mark.parametrize("draft", ["near", "unrelated", "same"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_greedy_trees_are_plain_greedy(models, expected, shape, draft):
    target, drafts = models
    for siblings in ("without_replacement", "top"):  # both the draft's top k at temperature 0
        decoder = speculant.SpeculativeDecoder(target, drafts[draft], tree=shape, siblings=siblings,
                                               temperature=0.0)
        assert decoder.gamma == (4 if shape is GIVEN else len(shape))
        results = decoder.generate(PROMPTS, max_new_tokens=NEW, seed=0)
        for r, result in enumerate(results):
            assert result.tokens == expected[r], f"prompt {r}"
            assert decoder.generate(PROMPTS[r], max_new_tokens=NEW, seed=0).tokens == expected[r]
            stats = result.stats
            assert stats.new_tokens == NEW and stats.target_calls == stats.iterations
            assert sum(stats.tree_accepted[0]) <= stats.tree_visits[0] <= stats.iterations
        if draft == "same":  # the target's own argmax is every node's first child: the whole depth each call
            assert all(it.accepted == min(decoder.gamma, it.emitted) or it.emitted < decoder.gamma + 1
                       for r in results for it in r.trace)
            assert results[0].stats.tokens_per_target_call > decoder.gamma


def test_greedy_trees_stop_at_eos(models, expected):
    target, drafts = models
    decoder = speculant.SpeculativeDecoder(target, drafts["near"], tree=[2, 2], temperature=0.0)
    eos = expected[1][6]
    got = decoder.generate(PROMPTS[1], max_new_tokens=NEW, eos_token_id=eos).tokens
    assert got == expected[1][: expected[1].index(eos) + 1]


def test_siblings_keep_more_tokens_per_call(models):
    """At temperature 0 with an unrelated draft, a wide first level catches the target's argmax more often
    than a chain of the same depth."""
    target, drafts = models
    calls = {}
    for shape in ([1, 1], [6, 1]):
        decoder = speculant.SpeculativeDecoder(target, drafts["unrelated"], tree=shape, temperature=0.0)
        calls[str(shape)] = sum(r.stats.tokens_per_target_call for r in decoder.generate(PROMPTS, max_new_tokens=NEW))
    assert calls["[6, 1]"] > calls["[1, 1]"]


LAW_CASES = [  # id, shape, siblings, sampling, table seed
    ("2x2-without-T1", [2, 2], "without_replacement", dict(temperature=1.0), 61),
    ("2x2-with-T1", [2, 2], "with_replacement", dict(temperature=1.0), 62),
    ("3x1-without-topk2", [3, 1], "without_replacement", dict(temperature=1.0, top_k=2), 63),
    ("1x3-with-T0.7-topp0.8", [1, 3], "with_replacement", dict(temperature=0.7, top_p=0.8), 64),
    ("1x1x1-chain", [1, 1, 1], "without_replacement", dict(temperature=1.0), 65),
    ("3x2-top-T0.8", [3, 2], "top", dict(temperature=0.8), 66),
    ("given-without-T1", GIVEN, "without_replacement", dict(temperature=1.0), 67),
    ("2x2-coupled-T1", [2, 2], "coupled", dict(temperature=1.0), 68),
    ("given-coupled-T0.9-topp0.9", GIVEN, "coupled", dict(temperature=0.9, top_p=0.9), 69),
]


@pytest.mark.parametrize("case", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_tree_law_equals_target_law(case):
    _, shape, siblings, sampling, seed = case
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), tree=shape,
                                           siblings=siblings, **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=seed * 1000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling.get("temperature", 1.0),
                                  sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    assert_law(samples, law, f"tree {shape}")


SIBLING_LAW_CASES = [  # id, shape, siblings, sampling, table seed
    ("2x2-coupled-sibling-T1", [2, 2], "coupled", dict(temperature=1.0), 71),
    ("3x1-with-sibling-topk3", [3, 1], "with_replacement", dict(temperature=0.8, top_k=3), 72),
]


@pytest.mark.parametrize("case", SIBLING_LAW_CASES, ids=[c[0] for c in SIBLING_LAW_CASES])
def test_sibling_draft_law_equals_target_law(case):
    """The later children from a third table through its own cache (MarkovRows reads each node's predecessor
    through the mask, so a sibling cache out of step with the tree would draw from the wrong rows)."""
    _, shape, siblings, sampling, seed = case
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    _, sibling = markov.target_and_draft(LAW_VOCAB, seed + 100, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), tree=shape, siblings=siblings,
                                           sibling_draft=table_model(sibling), **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=seed * 1000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling.get("temperature", 1.0),
                                  sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    assert_law(samples, law, f"tree {shape} with a sibling draft")


def sibling_calls(parents):
    """The sibling draft's calls for a tree (breadth-first parents): one per level up to the deepest node with two or
    more children (none without such a node)."""
    depths = [0]
    for v in range(1, len(parents)):
        depths.append(depths[parents[v]] + 1)
    branching = [depths[v] for v in range(len(parents)) if list(parents).count(v) >= 2]
    return max(branching) + 1 if branching else 0


def test_sibling_drafts_in_the_decoder(models, expected):
    """Greedy trees with a sibling draft are plain greedy (alone and in a batch); the sibling runs at the levels up
    to the deepest that branches (GIVEN's last two levels have one child per node: the draft's alone); a sibling
    equal to the draft (another Model of the same file) gives the tokens of no sibling at T = 1 (the same uniforms,
    the same laws), over several iterations, so its cache followed the accepted paths, including those deeper than
    it ran (fed with the next root)."""
    target, drafts = models
    sibling = speculant.load(script_cached(perturbed(TARGET, seed=4, scale=0.3)))
    for shape in ([2, 2], [3, 1, 1], GIVEN):
        decoder = speculant.SpeculativeDecoder(target, drafts["unrelated"], tree=shape, temperature=0.0,
                                               sibling_draft=sibling)
        results = decoder.generate(PROMPTS, max_new_tokens=NEW, seed=0)
        assert [r.tokens for r in results] == expected
    twin = speculant.load(script_cached(perturbed(TARGET, seed=3, scale=0.05)))
    for shape in ([2, 2], GIVEN):
        alone = speculant.SpeculativeDecoder(target, drafts["near"], tree=shape, temperature=1.0)
        paired = speculant.SpeculativeDecoder(target, drafts["near"], tree=shape, temperature=1.0, sibling_draft=twin)
        a = alone.generate(PROMPTS, max_new_tokens=NEW, seed=3)
        b = paired.generate(PROMPTS, max_new_tokens=NEW, seed=3)
        assert [r.tokens for r in a] == [r.tokens for r in b]
        for ra, rb in zip(a, b):
            assert rb.stats.draft_calls == ra.stats.draft_calls + sum(sibling_calls(it.tree) for it in rb.trace)
        assert sum(r.stats.iterations for r in a) >= 3 * len(PROMPTS)
        if shape == GIVEN:  # deeper accepted paths than the sibling ran on, caught up with the next root
            assert sibling_calls(GIVEN) == 2 and speculant.analysis.tree_depth(GIVEN) == 4
            assert any(it.accepted >= 3 for r in b for it in r.trace)
    with_sibling = speculant.SpeculativeDecoder(target, drafts["near"], tree=[2, 2], sibling_draft=sibling)
    assert with_sibling.with_sampling(0.5).sibling_draft is sibling


def test_sibling_draft_refusals(models):
    target, drafts = models
    draft, sibling = drafts["near"], drafts["unrelated"]
    cases = [
        (dict(gamma=3), "sibling_draft draws the later children of a token tree of a fixed shape"),
        (dict(tree=speculant.DynamicTree(8, 3, 2, 2)), "a token tree of a fixed shape"),
        (dict(tree=[2, 2], siblings="without_replacement"), "siblings must be 'coupled' or 'with_replacement'"),
        (dict(tree=[2, 2], siblings="top"), "siblings must be 'coupled' or 'with_replacement', got 'top'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            speculant.SpeculativeDecoder(target, draft, sibling_draft=sibling, **kwargs)
    with pytest.raises(ValueError, match="sibling_draft must be another model than the draft"):
        speculant.SpeculativeDecoder(target, draft, tree=[2], sibling_draft=draft)
    with pytest.raises(ValueError, match="sibling_draft needs a draft model beside it"):
        speculant.SpeculativeDecoder(target, speculant.drafters.Unigram(torch.ones(target.vocab_size)), tree=[2],
                                     sibling_draft=sibling)
    wider = dataclasses.replace(TARGET_CONFIG, vocab_size=TARGET_CONFIG.vocab_size + 1)
    other = speculant.load(script_cached(tiny_gpt(wider, seed=1)))
    with pytest.raises(ValueError, match=r"sibling_draft's vocabulary \(\d+\) must be the draft's"):
        speculant.SpeculativeDecoder(target, draft, tree=[2], sibling_draft=other)
    with pytest.raises(ValueError, match="sibling_draft: "):
        speculant.SpeculativeDecoder(target, draft, tree=[2], sibling_draft=42)


def test_refusals(models, tmp_path):
    target, drafts = models
    draft = drafts["near"]
    cases = [
        (dict(tree=[2, 0]), r"tree\[1\] must be an integer >= 1"),
        (dict(tree=[]), "tree must be a non-empty list"),
        (dict(tree="22"), "tree must be a non-empty list"),
        (dict(tree=[2, 2], gamma=3), "gamma must be the tree's depth 2"),
        (dict(tree=[2], lenience=0.5), "lenience must be 1 with tree="),
        (dict(tree=[2], siblings="sorted"), r"siblings must be one of \('without_replacement', 'with_replacement', "
                                            r"'top', 'coupled'\), got 'sorted'"),
        (dict(tree=[2], siblings=True), "siblings must be one of"),
        (dict(tree=[-1, 1]), "tree node 1 has parent 1"),
        (dict(tree=[-1]), "parents must give 1 to 4096 drafts, got 0"),
        (dict(tree=GIVEN, gamma=3), "gamma must be the tree's depth 4"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            speculant.SpeculativeDecoder(target, draft, **kwargs)
    with pytest.raises(ValueError, match="draft cannot propose trees: the prompt_lookup drafter proposes chains"):
        speculant.SpeculativeDecoder(target, speculant.drafters.PromptLookup(target.vocab_size), tree=[2])
    plain = speculant.load(scripted(TARGET, "plain"))
    with pytest.raises(ValueError, match=r"target \(plain form\) cannot verify a tree in one call"):
        speculant.SpeculativeDecoder(plain, draft, tree=[2])
    decoder = speculant.SpeculativeDecoder(target, draft, tree=[2])
    with pytest.raises(ValueError, match='gamma_policy must be "fixed" with tree='):
        decoder.generate([1, 2], max_new_tokens=4, gamma_policy="heuristic")


def test_tree_statistics_feed_the_analysis(models):
    """The per-depth, per-rank counts add up to the accepted drafts, and the acceptance table they estimate
    predicts the tokens per target call (speculant.analysis) measured over the iterations that drafted the whole
    tree (a row's last iterations draft fewer depths: tokens still wanted), within 5% for 20 rows of 40 tokens."""
    from speculant import analysis
    target, drafts = models
    shape, new = [3, 2], 40
    decoder = speculant.SpeculativeDecoder(target, drafts["near"], tree=shape, temperature=1.0)
    results = decoder.generate([[1 + r, 2, 3] for r in range(20)], max_new_tokens=new, seed=5)
    visits = [sum(r.stats.tree_visits[i] for r in results) for i in range(len(shape))]
    accepted = [[sum(r.stats.tree_accepted[i][j] for r in results) for j in range(k)] for i, k in enumerate(shape)]
    full = []  # tokens per call of the iterations that drafted every depth
    for r in results:
        assert sum(map(sum, r.stats.tree_accepted)) == r.stats.accepted_tokens
        assert r.stats.tree_visits[1] <= sum(r.stats.tree_accepted[0]) and r.stats.tree_visits[0] <= r.stats.iterations
        done = 0
        for it in r.trace:
            if new - done - 1 >= len(shape):
                full.append(it.emitted)
            done += it.emitted
    assert sum(accepted[0][1:]) > 0  # siblings were accepted too
    predicted = analysis.tree_expected_tokens(shape, analysis.acceptance_from_counts(accepted, visits))
    assert len(full) >= 200
    assert sum(full) / len(full) == pytest.approx(predicted, rel=0.05)


def test_given_trees_count_what_each_rank_was_offered(models):
    """A given tree's nodes of one depth have different numbers of children: stats.tree_offered counts, per depth
    and rank, the visited nodes that had that rank, and the table from it predicts the tokens per call of the
    iterations that drafted the whole tree within 5% (as test_tree_statistics_feed_the_analysis does for a shape);
    analysis.best_tree's result runs as given."""
    from speculant import analysis, timing
    target, drafts = models
    new = 40
    decoder = speculant.SpeculativeDecoder(target, drafts["near"], tree=GIVEN, temperature=1.0)
    results = decoder.generate([[1 + r, 2, 3] for r in range(20)], max_new_tokens=new, seed=5)
    full = []
    for r in results:
        stats = r.stats
        assert [len(row) for row in stats.tree_offered] == [3, 3, 1, 1]  # each depth's most children
        assert [row[0] for row in stats.tree_offered] == stats.tree_visits
        # depth 1: node 1 has three children, node 2 one, node 3 none (a path ending there visits nothing)
        assert stats.tree_offered[1][1] == stats.tree_offered[1][2] <= stats.tree_offered[1][0]
        assert all(a <= o for acc, off in zip(stats.tree_accepted, stats.tree_offered) for a, o in zip(acc, off))
        done = 0
        for it in r.trace:
            assert it.tree == GIVEN[:len(it.tree)]
            if new - done - 1 >= 4:
                full.append(it.emitted)
            done += it.emitted
    predicted = analysis.tree_expected_tokens(GIVEN, timing.tree_table(results))
    assert len(full) >= 150
    assert sum(full) / len(full) == pytest.approx(predicted, rel=0.05)
    choice = analysis.best_tree(6, timing.tree_table(results))
    again = speculant.SpeculativeDecoder(target, drafts["near"], tree=choice, temperature=1.0)
    assert again.gamma == analysis.tree_depth(choice.tree)
    assert again.generate([1, 2, 3], max_new_tokens=8, seed=0).trace[0].tree == choice.tree


def test_tree_obstacle_names_the_form(models):
    target, _ = models
    assert target.tree_obstacle == ""
    assert "plain form has no tree calls" in speculant.load(scripted(TARGET, "plain")).tree_obstacle


# ------------------------------------------------------------------------------------------------
# Live transformers objects
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_pairs():
    from support import hf_models
    out = {}
    for arch in ("gpt2", "llama"):
        model = hf_models.make(arch, seed=10)
        out[arch] = model, speculant.load(model), speculant.load(hf_models.drafted(model, noise=0.01, seed=11))
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_live_greedy_trees_equal_transformers_generate(live_pairs, arch):
    from support.hf_models import PROMPTS as HF_PROMPTS, hf_greedy
    model, target, draft = live_pairs[arch]
    assert target.tree_obstacle == "" and draft.tree_obstacle == ""
    expected = [hf_greedy(model, arch, i, eos=None) for i in range(len(HF_PROMPTS))]
    for shape in ([2, 2], [3, 1, 1]):
        decoder = speculant.SpeculativeDecoder(target, draft, tree=shape, temperature=0)
        assert [decoder.generate(p, max_new_tokens=20).tokens for p in HF_PROMPTS] == expected, f"tree {shape}"
        assert [r.tokens for r in decoder.generate(HF_PROMPTS, max_new_tokens=20)] == expected, f"tree {shape}"
        accepted = sum(r.stats.accepted_tokens for r in decoder.generate(HF_PROMPTS, max_new_tokens=20))
        assert accepted > 0


def test_live_tree_law_matches_transformers(live_pairs):
    import numpy as np
    from support.chisquare import chi_square_pvalue
    from support.hf_models import PROMPTS as HF_PROMPTS
    from support.live_reference import two_token_law
    model, target, draft = live_pairs["llama"]
    law = two_token_law(model, "llama", HF_PROMPTS[0], 1.0, 0)
    decoder = speculant.SpeculativeDecoder(target, draft, tree=[3, 2], temperature=1.0)
    samples = np.array([r.tokens[:2] for b in range(6)
                        for r in decoder.generate([HF_PROMPTS[0]] * 500, max_new_tokens=3, seed=7000 + 500 * b)])
    pvalue = chi_square_pvalue(law, samples)
    assert pvalue > 1e-3, f"p = {pvalue:.3g}"


def test_live_models_that_cannot_run_trees_are_refused_by_name():
    from support import hf_models
    model = hf_models.make("gpt2", seed=3)
    forward = model.forward

    def ignores_the_mask(input_ids=None, past_key_values=None, attention_mask=None, position_ids=None,
                         use_cache=None, logits_to_keep=0, **kwargs):
        return forward(input_ids=input_ids, past_key_values=past_key_values, position_ids=position_ids,
                       use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)

    model.forward = ignores_the_mask  # a model whose attention ignores the mask it is given
    broken = speculant.load(model)
    assert "does not honour a 4-D attention mask" in broken.tree_obstacle
    with pytest.raises(ValueError, match="does not honour a 4-D attention mask"):
        speculant.SpeculativeDecoder(broken, speculant.load(hf_models.make("gpt2", seed=4)), tree=[2])
    from support import hf_families
    bart = speculant.load(hf_families.make("bart", seed=0))  # learned absolute positions: no tree calls built
    assert "verifies trees only with T5's decoder" in bart.tree_obstacle and bart.beam_obstacle == bart.tree_obstacle
    bloom = speculant.load(hf_families.make("bloom", seed=0))  # ALiBi: positions come from the 2-D mask
    assert "BloomForCausalLM.forward takes no position_ids" in bloom.tree_obstacle
    indexed = hf_families.make("llama", seed=0)
    indexed.config.layer_types = ["indexed_attention", "full_attention"]  # a layer type without a tree mask here
    assert "its layers of type 'indexed_attention' have no tree mask here" in speculant.load(indexed).tree_obstacle
    unsized = hf_families.make("llama", seed=0)
    unsized.config.layer_types = ["sliding_attention", "full_attention"]  # and no sliding_window
    assert "has sliding_attention layers but no sliding_window" in speculant.load(unsized).tree_obstacle
    # a config whose window the model's attention never applies (Llama's masks read no sliding_window): the
    # probe, with the window shrunk to 2, finds the tree mask's window where the model has none, instead of
    # trees that differ from the model's own forward past the window
    stray = hf_families.make("llama", seed=0)
    stray.config.sliding_window = 8
    stray.config.layer_types = None
    stray_model = speculant.load(stray)
    assert "its attention does not apply sliding_window as transformers' masks do" in stray_model.tree_obstacle
    assert stray.config.sliding_window == 8  # the probe puts the config back
    expected = speculant.generate(speculant.load(hf_families.make("llama", seed=0)), [1, 5, 9], max_new_tokens=12,
                                  temperature=0).tokens
    assert speculant.generate(stray_model, [1, 5, 9], max_new_tokens=12, temperature=0).tokens == expected


# ------------------------------------------------------------------------------------------------
# Drafters without a model: tables and Python code
# ------------------------------------------------------------------------------------------------


DRAFTER_LAW_CASES = [("bigram", [2, 2], "without_replacement", dict(temperature=1.0), 71),
                     ("unigram", [3, 1], "with_replacement", dict(temperature=0.8, top_k=3), 72),
                     ("python", [2, 1, 1], "top", dict(temperature=1.0), 73)]


@pytest.mark.parametrize("case", DRAFTER_LAW_CASES, ids=[c[0] for c in DRAFTER_LAW_CASES])
def test_drafter_tree_law_equals_target_law(case):
    name, shape, siblings, sampling, seed = case
    target, _ = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    drafter = table_drafters(LAW_VOCAB, seed)[name]
    assert drafter.tree_obstacle == ""
    decoder = speculant.SpeculativeDecoder(table_model(target), drafter, tree=shape, siblings=siblings,
                                           **sampling)
    samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=seed * 1000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling.get("temperature", 1.0),
                                  sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    assert_law(samples, law, f"{name} tree {shape}")


@pytest.mark.parametrize("name", ["bigram", "unigram", "python"])
def test_drafter_greedy_trees_are_plain_greedy(models, expected, name):
    target, _ = models
    drafter = table_drafters(TARGET_CONFIG.vocab_size, 5)[name]
    decoder = speculant.SpeculativeDecoder(target, drafter, tree=[3, 2], temperature=0.0)
    results = decoder.generate(PROMPTS, max_new_tokens=NEW)
    assert [r.tokens for r in results] == expected
    assert all(r.stats.draft_calls == 0 and r.stats.draft_seconds > 0 for r in results)


def test_python_drafter_without_score_and_bad_laws_are_refused():
    from speculant import drafters
    target = table_model(markov.target_and_draft(LAW_VOCAB, 1)[0])
    chains_only = drafters.PythonDrafter(lambda context, gamma: ([], None), LAW_VOCAB)
    with pytest.raises(ValueError, match=r"proposes chains only; PythonDrafter\(\.\.\., score=f\)"):
        speculant.SpeculativeDecoder(target, chains_only, tree=[2])
    bad = drafters.PythonDrafter(lambda context, gamma: ([], None), LAW_VOCAB,
                                 score=lambda contexts: torch.ones(len(contexts), LAW_VOCAB))
    with pytest.raises(ValueError, match=r"row 0 of score\(contexts\) sums to 4"):
        speculant.SpeculativeDecoder(target, bad, tree=[2]).generate(LAW_PROMPT, max_new_tokens=3)
    one_law = drafters.PythonDrafter(lambda context, gamma: ([], None), LAW_VOCAB,
                                     score=lambda contexts: torch.full((1, LAW_VOCAB), 1 / LAW_VOCAB))
    with pytest.raises(ValueError, match=rf"score\(contexts\) must have shape \[n, V\] = \[2, {LAW_VOCAB}\], got "
                                         rf"\[1, {LAW_VOCAB}\]"):
        speculant.SpeculativeDecoder(target, one_law, tree=[2, 1]).generate(LAW_PROMPT, max_new_tokens=3)
    with pytest.raises(ValueError, match="score must be callable"):
        drafters.PythonDrafter(lambda context, gamma: ([], None), LAW_VOCAB, score=3)
