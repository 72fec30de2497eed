"""The confidence stop (``draft_confidence=``, cpp/drafting/model_drafter.h): a draft model's chain ends after a
token its q gave less than the threshold, so gamma is the most an iteration drafts.

- Exactness: the output law is the target's. Pearson chi-square on tests/support/laws.py's two windows against the
  enumerated law of 4-token Markov tables, 4,000 rows per case at SIGNIFICANCE = 1e-3 per window, fixed seeds: 4
  cases (T = 1 and T = 0.7 with top-k, on the host kernels and on the accelerators' tensor path), so at most 0.8%
  family-wise false failures.
- Greedy: the target's own greedy tokens.
- What stops: every iteration's drafts are exactly the draws up to the first one under the threshold (read from the
  trace), a threshold of 1 drafts one token per iteration, and a batch's rows are the rows alone.
"""
import pytest
import torch

from support import markov
import speculant
from support.engine_checks import table_model
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, assert_law, batched_samples, check_no_top_p_boundary
from speculant.testing import tensor_path

LAWS = [  # id, sampling, path, table seed
    ("T1-host", dict(temperature=1.0), "host", 81),
    ("T0.7-topk3-host", dict(temperature=0.7, top_k=3), "host", 82),
    ("T1-tensor", dict(temperature=1.0), "tensor", 83),
    ("T0.7-topk3-tensor", dict(temperature=0.7, top_k=3), "tensor", 84),
]


def pair(seed: int):
    target, draft = markov.target_and_draft(LAW_VOCAB, seed, mask_prob=0.1)
    return target, draft, table_model(target), table_model(draft)


@pytest.mark.parametrize("case", LAWS, ids=[c[0] for c in LAWS])
def test_confidence_stopped_chains_keep_the_target_law(case):
    name, sampling, path, seed = case
    target, draft, target_model, draft_model = pair(seed)
    check_no_top_p_boundary(target, sampling["temperature"], sampling.get("top_k", 0), 1.0)
    decoder = speculant.SpeculativeDecoder(target_model, draft_model, gamma=4, draft_confidence=0.5, **sampling)
    with tensor_path() if path == "tensor" else torch.no_grad():
        samples = batched_samples(decoder, [LAW_PROMPT], 4000, seed=1000 * seed)
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW, sampling["temperature"], sampling.get("top_k", 0))
    assert_law(samples, law, f"draft_confidence, {name}")


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("path", ["host", "tensor"])
def test_each_chain_stops_at_its_first_unsure_draft(path, temperature):
    """The trace's drafts of each iteration: every one before the last had q(x) >= the threshold under the draft's
    law at temperature 1 (q at T = 1; at T = 0, where q is a point mass, the draft's softmax: the same law), and a
    chain shorter than gamma ends with one below it."""
    target, draft, target_model, draft_model = pair(85)
    threshold, gamma = 0.45, 4
    decoder = speculant.SpeculativeDecoder(target_model, draft_model, gamma=gamma, temperature=temperature,
                                           draft_confidence=threshold)
    law = markov.standardized_table(draft, 1.0, 0, 1.0)
    lengths = []
    with tensor_path() if path == "tensor" else torch.no_grad():
        for seed in range(20):
            prompt = [seed % LAW_VOCAB, (3 * seed + 1) % LAW_VOCAB, 2]  # greedy: other prompts, other paths
            result = decoder.generate(prompt, max_new_tokens=24, seed=seed)
            tokens = list(prompt)
            for it in result.trace:
                sure = [float(markov.row_logits(law, tokens + list(it.drafted[:i]))[x]) >= threshold
                        for i, x in enumerate(it.drafted)]
                far = 24 - (len(tokens) - len(prompt)) > gamma + 1  # the generation's end caps no chain
                assert all(sure[:-1]) and (not far or len(sure) == gamma or not sure[-1]), (tokens, it)
                if far:
                    lengths.append(len(sure))
                kept = list(it.drafted[:min(it.accepted, it.emitted)])
                tokens += kept + ([it.token] if it.emitted > it.accepted else [])
            assert tokens == prompt + result.tokens
    assert 0 < lengths.count(gamma) < len(lengths) and min(lengths) == 1  # stopped and full chains both happened


def test_a_threshold_of_one_drafts_one_token_per_iteration():
    _, _, target_model, draft_model = pair(86)
    decoder = speculant.SpeculativeDecoder(target_model, draft_model, gamma=5, temperature=1.0, draft_confidence=1.0)
    result = decoder.generate(LAW_PROMPT, max_new_tokens=30, seed=3)
    other = decoder.with_sampling(0.8).generate(LAW_PROMPT, max_new_tokens=30, seed=3)  # the stop kept
    for run in (result, other):
        lengths = [len(it.drafted) for it in run.trace]  # the last iteration's may be capped to 0 by the end
        assert set(lengths[:-1]) == {1} and lengths[-1] <= 1 and run.stats.draft_calls == sum(lengths)
    plain = speculant.SpeculativeDecoder(target_model, draft_model, gamma=5, temperature=1.0)
    assert plain.generate(LAW_PROMPT, max_new_tokens=30, seed=3).stats.drafted_tokens > result.stats.drafted_tokens


@pytest.mark.parametrize("path", ["host", "tensor"])
def test_greedy_with_the_stop_is_the_target_greedy_output_and_rows_are_alone(path):
    _, _, target_model, draft_model = pair(87)
    prompts = [LAW_PROMPT, [0, 1], [3, 3, 2, 1]]
    with tensor_path() if path == "tensor" else torch.no_grad():
        greedy = speculant.SpeculativeDecoder(target_model, draft_model, gamma=4, temperature=0.0,
                                              draft_confidence=0.6)
        want = [speculant.generate(target_model, p, max_new_tokens=20, temperature=0.0).tokens for p in prompts]
        assert [r.tokens for r in greedy.generate(prompts, max_new_tokens=20, seed=0)] == want
        sampled = speculant.SpeculativeDecoder(target_model, draft_model, gamma=4, temperature=1.0,
                                               draft_confidence=0.5)
        batch = sampled.generate(prompts, max_new_tokens=20, seed=10)
        alone = [sampled.generate(p, max_new_tokens=20, seed=10 + i) for i, p in enumerate(prompts)]
    assert [r.tokens for r in batch] == [r.tokens for r in alone]
    assert [r.stats.drafted_tokens for r in batch] == [r.stats.drafted_tokens for r in alone]


@pytest.mark.parametrize("value, match", [(0, r"\(0, 1\]"), (1.5, r"\(0, 1\]"), (float("nan"), r"\(0, 1\]"),
                                          ("0.4", "real number"), (True, "real number")])
def test_bad_thresholds_are_refused_by_name(value, match):
    _, _, target_model, draft_model = pair(88)
    with pytest.raises(ValueError, match=r"draft_confidence.*" + match):
        speculant.SpeculativeDecoder(target_model, draft_model, draft_confidence=value)


def test_trees_and_drafters_without_a_model_are_refused_by_name():
    _, _, target_model, draft_model = pair(89)
    with pytest.raises(ValueError, match="draft_confidence stops chains"):
        speculant.SpeculativeDecoder(target_model, draft_model, tree=[2, 1], draft_confidence=0.4)
    table = speculant.drafters.Unigram(torch.ones(LAW_VOCAB))
    with pytest.raises(ValueError, match="draft_confidence stops a draft model's chain, got a Unigram"):
        speculant.SpeculativeDecoder(target_model, table, draft_confidence=0.4)
