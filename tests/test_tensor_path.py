"""The accelerators' code path, end to end on the CPU (``speculant.testing.tensor_path``).

On CUDA tensors the engine draws, verifies and walks token trees with tensor operations and one device-to-host
read per verification (cpp/math/step.cpp, cpp/math/tree.cpp: the *_as_tensors functions); on CPU tensors it runs host kernels
(cpp/math/cpu_kernels.cpp). tests/test_step.py and tests/test_tree.py check each as_tensors function alone; here whole
decodes take that path, batches, level-wide draws, tree verification and rollback included, so the loop a GPU
runs (all of it but the CUDA graphs) is checked on every machine:

* the law: Pearson chi-square of the first LAW_NEW tokens against the target's exact law on native Markov tables
  (tests/support/engine_checks.py's MarkovRows, 4,000 rows in batches of 1,000), at SIGNIFICANCE = 1e-3 per window, 2
  windows per case, fixed seeds: 9 cases (chains, trees of each way of drawing siblings, a grown tree whose last
  level has unequal child counts, a tree with a sibling draft, and a chain with lenience against its own exact law,
  A.5), at most 1.8% family-wise false failures for a fresh choice of seeds (Bonferroni);
* greedy decoding token for token the pure-torch greedy loop (tests/support/decoding_references.py), chains and
  trees, one prompt and a batch; sampled rows of a batch equal to each row decoded alone with its seed;
* one device -> host read per iteration (the verification's read-back, counted by ``_core._host_reads``), chains and
  trees of every sibling rule, sampled and greedy; none on the host kernels;
* that the switch switches: sampled tokens differ from the host kernels' under the same seed (other draws of the
  same law), and the host kernels are back after the block, an exception included.
"""

import contextlib

import pytest

from support import markov
import speculant
from speculant import _core
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.decoding_references import GIVEN, NEW, PROMPTS, TARGET, perturbed, torch_greedy
from support.engine_checks import SETTINGS, check_rows, markov_model, poisoned_table, table_model
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples
from speculant.testing import tensor_path
from speculant.tiny_gpt import script_cached

LAW_CASES = [  # id, decoder options, sampling, table seed
    ("chain-g3-T1-topk2", dict(gamma=3), dict(temperature=1.0, top_k=2), 71),
    ("chain-g5-T0.7-topp0.8", dict(gamma=5), dict(temperature=0.7, top_p=0.8), 72),
    ("2x2-coupled-T1", dict(tree=[2, 2], siblings="coupled"), dict(temperature=1.0), 73),
    ("3x1-without-T0.8", dict(tree=[3, 1], siblings="without_replacement"), dict(temperature=0.8), 74),
    ("2x2-top-T1", dict(tree=[2, 2], siblings="top"), dict(temperature=1.0), 75),
    ("given-with-T1", dict(tree=GIVEN, siblings="with_replacement"), dict(temperature=1.0), 76),
    ("grown-5-coupled-T1", dict(tree=speculant.DynamicTree(budget=5, depth=3, children=2, width=2),
                                siblings="coupled"), dict(temperature=1.0), 77),
]


@pytest.mark.parametrize("case", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_tensor_path_law_equals_target_law(case):
    name, options, sampling, seed = case
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), **options, **sampling)
    with tensor_path():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=seed * 1000)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling.get("temperature", 1.0),
                                  sampling.get("top_k", 0), sampling.get("top_p", 1.0))
    assert_law(samples, law, name)


def test_tensor_path_sibling_draft_law():
    """A sibling draft (tree.h) on the accelerators' path: the later children from a third table's law, the
    verification against it (one more case in the family above)."""
    target, draft = markov.target_and_draft(LAW_VOCAB, 78, mask_prob=0.1)
    _, sibling = markov.target_and_draft(LAW_VOCAB, 178, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), tree=[3, 1], siblings="coupled",
                                           sibling_draft=table_model(sibling), temperature=1.0)
    with tensor_path():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=78000)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW, 1.0), "sibling draft")


def test_tensor_path_lenient_law():
    """Lenience (A.5) changes the law on purpose: the samples follow the exact lenient law, enumerated with
    tests/support/reference.py (one more case in the family above: at most 1.8% in all)."""
    lenience, gamma, temperature = 0.3, 2, 1.0
    target, draft = markov.target_and_draft(LAW_VOCAB, 78, independent_draft=True, concentration=0.5)
    decoder = speculant.SpeculativeDecoder(table_model(target), table_model(draft), gamma=gamma,
                                           temperature=temperature, lenience=lenience)
    with tensor_path():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=78000)
    assert_law(samples, markov.speculative_law(target, draft, LAW_PROMPT, LAW_NEW, gamma, temperature,
                                               lenience=lenience), "lenience 0.3")
    exact = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, temperature)  # lenience is applied: not this law
    assert chi_square_pvalue(markov.marginal(exact, [0, 1, 2]), samples[:, [0, 1, 2]]) < SIGNIFICANCE


@pytest.fixture(scope="module")
def models():
    """tests/test_tree_decoding.py's TinyGPT target, a draft close to it, and the target's greedy continuations."""
    draft = speculant.load(script_cached(perturbed(TARGET, seed=3, scale=0.05)))
    return speculant.load(script_cached(TARGET)), draft, [torch_greedy(TARGET, prompt, NEW) for prompt in PROMPTS]


@pytest.mark.parametrize("options", [dict(gamma=4), dict(tree=[2, 2], siblings="coupled"),
                                     dict(tree=[3, 1, 1], siblings="top"), dict(tree=GIVEN)], ids=str)
def test_tensor_path_greedy_is_plain_greedy(models, options):
    target, draft, expected = models
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=0.0, **options)
    with tensor_path():
        results = decoder.generate(PROMPTS, max_new_tokens=NEW, seed=0)
        alone = decoder.generate(PROMPTS[1], max_new_tokens=NEW, seed=0)
    assert [r.tokens for r in results] == expected
    assert alone.tokens == expected[1]


@pytest.mark.parametrize("options", [dict(gamma=3), dict(tree=[2, 2], siblings="coupled"),
                                     dict(tree=[3, 1], siblings="without_replacement"),
                                     dict(tree=speculant.DynamicTree(budget=5, depth=3, children=2, width=2))],
                         ids=str)
@pytest.mark.parametrize("setting", ["T1", "T0.8-topk8-topp0.9"])
def test_tensor_path_rows_equal_batch_one(models, options, setting):
    """The batched passes (every row's draft step or tree level at once, every row's tree in one verification) give
    row r of a batch what it gets alone with seed + r: its draws come from its own generator in the same order."""
    target, draft, _ = models
    decoder = speculant.SpeculativeDecoder(target, draft, **options)
    with tensor_path():
        batch = check_rows(decoder.generate, PROMPTS, seed=40, max_new_tokens=NEW, **SETTINGS[setting])
    assert len({tuple(result.tokens) for result in batch}) == len(batch)


@pytest.mark.parametrize("options, role", [(options, role) for options in (dict(gamma=1), dict(tree=[2]))
                                           for role in ("target", "draft")] + [(dict(tree=[2]), "sibling")], ids=str)
@pytest.mark.parametrize("path", ["tensor", "host"])
def test_tensor_path_names_the_row_with_non_finite_logits(options, role, path):
    """The batch's one read-back carries each row's flags: row 1's prompt ends in token 0, after which the table's
    logits are NaN (tests/test_batch.py's case, on native Markov rows); a sibling draft's too (trees only), on
    both paths."""
    bad = markov_model(poisoned_table(float("nan")), "native")
    good = markov_model(markov.random_table(3, 5), "native")
    prompts = [[1, 2], [1, 0], [2, 1]]
    with (tensor_path() if path == "tensor" else contextlib.nullcontext()), \
            pytest.raises(ValueError, match="NaN or \\+inf logits.* of row 1 "):
        if role == "target":
            speculant.SpeculativeDecoder(bad, good, **options).generate(prompts, max_new_tokens=1, seed=0)
        elif role == "draft":
            speculant.SpeculativeDecoder(good, bad, **options).generate(prompts[:2], max_new_tokens=2, seed=0)
        else:
            other = markov_model(markov.random_table(3, 6), "native")
            speculant.SpeculativeDecoder(good, other, sibling_draft=bad, **options).generate(prompts[:2],
                                                                                             max_new_tokens=2, seed=0)


@pytest.mark.parametrize("options", [dict(gamma=4), dict(tree=[2, 2]), dict(tree=[2, 2], siblings="coupled"),
                                     dict(tree=[3, 1], siblings="without_replacement"),
                                     dict(tree=[2, 2], siblings="top")], ids=str)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tensor_path_reads_the_device_once_per_iteration(models, options, temperature):
    """The accelerators' path reads the device once per iteration: the verification's one read-back, which holds which
    children the tests kept, each position's candidate t, the betas and the finiteness witnesses. Every child's coin and test
    and the residual draw run as tensor work before it (cpp/math/tree_verification.cpp); no draft level and no
    child reads anything (a draft model on fixed shapes keeps its tokens on the device). The host kernels read
    nothing (CPU tensors are already on the host)."""
    target, draft, _ = models
    decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, **options)
    with tensor_path():
        before = _core._host_reads()[0]
        result = decoder.generate(PROMPTS[1], max_new_tokens=NEW, seed=3)
        reads = _core._host_reads()[0] - before
    assert reads == len(result.trace) > 1
    before = _core._host_reads()[0]
    decoder.generate(PROMPTS[1], max_new_tokens=NEW, seed=3)
    assert _core._host_reads()[0] == before


def test_tensor_path_switches_and_switches_back(models):
    target, draft, _ = models
    for options in (dict(gamma=4), dict(tree=[2, 2])):
        decoder = speculant.SpeculativeDecoder(target, draft, temperature=1.0, **options)
        host = [decoder.generate(p, max_new_tokens=NEW, seed=5).tokens for p in PROMPTS]
        with tensor_path():
            tensor = [decoder.generate(p, max_new_tokens=NEW, seed=5).tokens for p in PROMPTS]
            assert [decoder.generate(p, max_new_tokens=NEW, seed=5).tokens for p in PROMPTS] == tensor  # seeded
        assert tensor != host, options
        with pytest.raises(RuntimeError, match="inside"):
            with tensor_path():
                raise RuntimeError("inside")
        assert [decoder.generate(p, max_new_tokens=NEW, seed=5).tokens for p in PROMPTS] == host
