"""Drafts with another tokenizer (speculant.cross_tokenizer): greedy equality with transformers' generate, the
output law at temperature 1 (chi-square; under verification="block" too, both modes), proposals that are accepted
when the draft's text is right, and refusals by name.

Two byte-level BPE tokenizers trained here on different standard-library modules with different vocabulary
sizes (so their merges differ), random GPT-2s over each vocabulary (tests/support/hf_models.py's initialization)."""
import copy
import inspect
import string
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from support import hf_models  # noqa: E402
import speculant  # noqa: E402
from speculant import testing  # noqa: E402
from speculant.cross_tokenizer import CrossTokenizer  # noqa: E402
from support.live_reference import hf_greedy  # noqa: E402

TEXTS = ["def __init__(self, width=70):", "    return text.strip()\n", "import os\nimport sys\n"]
NEW = 20


def bpe(module, vocab_size: int):
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([inspect.getsource(module)], trainer=trainer)
    return tokenizer


@pytest.fixture(scope="module")
def pair():
    target_tokenizer, draft_tokenizer = bpe(textwrap, 300), bpe(string, 420)
    assert target_tokenizer.get_vocab() != draft_tokenizer.get_vocab()
    target = hf_models.make("gpt2", 0, vocab_size=target_tokenizer.get_vocab_size(), eos_token_id=None)
    draft = hf_models.make("gpt2", 1, vocab_size=draft_tokenizer.get_vocab_size(), eos_token_id=None)
    return target, draft, target_tokenizer, draft_tokenizer


def ascii_bytes():
    """A byte-level tokenizer of the 128 ASCII bytes and no merges: every sequence of its tokens decodes to text
    that encodes back to the very same tokens (as a trained model's output mostly does; a random model's bytes
    above 127 would often not be valid UTF-8)."""
    split = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = {split.pre_tokenize_str(chr(b))[0][0]: b for b in range(128)}  # the byte-level symbol of each byte
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=symbols, merges=[]))
    tokenizer.pre_tokenizer = split
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    return tokenizer


@pytest.fixture(scope="module")
def bytes_pair(pair):
    """A target over ascii_bytes(), its output layer scaled so its laws are peaked, and the merging draft."""
    _, draft, _, draft_tokenizer = pair
    target = hf_models.make("gpt2", 2, vocab_size=128, eos_token_id=None)
    with torch.no_grad():
        target.lm_head.weight.mul_(30.0)
    return target, draft, ascii_bytes(), draft_tokenizer


def test_greedy_equals_the_targets_generate(pair):
    target, draft, target_tokenizer, draft_tokenizer = pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=3, temperature=0.0, draft_tokenizer=draft_tokenizer,
                                           target_tokenizer=target_tokenizer)
    for text in TEXTS:
        prompt = target_tokenizer.encode(text).ids
        result = decoder.generate(prompt, max_new_tokens=NEW)
        assert result.tokens == hf_greedy(target, "gpt2", prompt=prompt, max_new=NEW), text
        assert result.stats.draft_calls == 0 and result.stats.target_calls >= 1  # the drafter calls the draft


def test_a_draft_that_writes_the_targets_text_is_accepted(bytes_pair):
    """A draft whose text is the target's own greedy text: its proposals are that text's tokens under the
    target's tokenizer, all accepted but where the text is cut (more than 2 tokens per target call), and the
    output is still the greedy one."""
    target, draft, target_tokenizer, draft_tokenizer = bytes_pair
    for text in TEXTS:
        prompt = target_tokenizer.encode(text).ids
        expected = hf_greedy(target, "gpt2", prompt=prompt, max_new=NEW)
        whole = target_tokenizer.decode(prompt + expected)
        drafter = CrossTokenizer(draft, draft_tokenizer, target_tokenizer, target.config.vocab_size)
        drafter.continuation = lambda context, count: whole[len(context):len(context) + 4 * count] \
            if whole.startswith(context) else ""
        result = speculant.SpeculativeDecoder(target, drafter, gamma=4, temperature=0.0).generate(
            prompt, max_new_tokens=NEW)
        assert result.tokens == expected, text
        assert NEW / result.stats.target_calls > 2, result.stats


def test_proposals_are_the_target_tokenizers_encoding_of_the_drafts_text(pair):
    target, draft, target_tokenizer, draft_tokenizer = pair
    drafter = CrossTokenizer(draft, draft_tokenizer, target_tokenizer, target.config.vocab_size)
    drafter.continuation = lambda context, count: "(self, text):\n        return text"
    context = target_tokenizer.encode("def wrap").ids
    canonical = target_tokenizer.encode("def wrap(self, text):\n        return text").ids
    assert canonical[:len(context)] == context
    assert drafter.proposal(context, 3) == canonical[len(context):len(context) + 3]
    # a context its own text does not re-encode to: the added text is encoded alone
    odd = [target_tokenizer.token_to_id(c) for c in "def"]  # 'd', 'e', 'f' rather than the merged 'def'
    assert target_tokenizer.encode("def").ids != odd
    assert drafter.proposal(odd, 5) == target_tokenizer.encode("(self, text):\n        return text").ids[:5]
    small = CrossTokenizer(draft, draft_tokenizer, target_tokenizer, 40)  # proposals stop at the vocabulary
    small.continuation = drafter.continuation
    assert all(t < 40 for t in small.proposal(context, 8))


def test_the_drafts_cache_is_kept_between_continuations(pair, tmp_path):
    """_core.GreedyContinuation (the text mode's draft calls) gives generate(temperature=0)'s tokens whatever the
    previous call was: sequences extending it (the cache reused), diverging from it, shorter; and after another
    generation changed the model's cache; for an export and a live model."""
    _, draft, _, _ = pair
    speculant.export(draft, tmp_path / "draft.pt", max_length=64)
    start = [5, 9, 14, 2, 33]
    calls = [start, start + [7, 8], start + [7, 8, 1], start[:3] + [40], [6], start + [7, 8, 1, 12]]
    for load in (lambda: speculant.load(tmp_path / "draft.pt"), lambda: speculant.load(draft)):
        model, reference = load(), load()
        expected = [speculant.generate(reference, ids, max_new_tokens=6, temperature=0).tokens for ids in calls]
        greedy = speculant._core.GreedyContinuation(model._core)
        assert [greedy(ids, 6) for ids in calls] == expected
        assert 5 + 7 + 3 <= greedy.reused <= 6 + 7 + 3  # the positions each call shares with the previous one
        speculant.generate(model, [50, 51], max_new_tokens=3, temperature=0)  # the cache changes hands
        assert greedy(calls[-1], 6) == expected[-1]
        assert greedy(calls[-1][:-1] + [13], 6) == speculant.generate(
            reference, calls[-1][:-1] + [13], max_new_tokens=6, temperature=0).tokens
    bounded = speculant._core.GreedyContinuation(speculant.load(tmp_path / "draft.pt")._core)
    assert len(bounded(list(range(60)), 10)) == 4  # max_length 64: 4 more tokens fit
    with pytest.raises(ValueError, match="ids is empty"):
        bounded([], 3)


# Significance 1e-3 for each of the three checks: a correct engine fails this test with probability <= 3e-3.
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_output_law_is_the_targets(bytes_pair, pair, temperature):
    target, draft, target_tokenizer, draft_tokenizer = bytes_pair
    prompt = target_tokenizer.encode(TEXTS[0]).ids
    assert prompt == list(TEXTS[0].encode())
    drafters = {  # the other tokenizer's random draft, and the target itself through text (proposals: its argmax)
        "draft": CrossTokenizer(draft, draft_tokenizer, target_tokenizer, 128),
        "target through text": CrossTokenizer(target, target_tokenizer, target_tokenizer, 128),
    }
    for name, drafter in drafters.items():
        if name == "draft" and temperature != 1.0:
            continue
        check = testing.check_distribution(target, drafter, prompt, k=2, gamma=2, temperature=temperature,
                                           samples=1500, significance=1e-3, seed=3)
        assert check.passed, (name, check)
    stats = speculant.SpeculativeDecoder(target, drafters["target through text"], gamma=2,
                                         temperature=temperature).generate(prompt, max_new_tokens=30, seed=0).stats
    assert stats.alpha > 0.3 and stats.accepted_tokens > 5, stats  # the check saw acceptances, not only residuals


# Significance 1e-3 for each of the two checks: a correct engine fails this test with probability <= 2e-3.
def test_sampling_in_the_intersection_is_exact_and_keeps_alpha(bytes_pair):
    target, draft, target_tokenizer, draft_tokenizer = bytes_pair
    prompt = target_tokenizer.encode(TEXTS[0]).ids
    other = CrossTokenizer(draft, draft_tokenizer, target_tokenizer, 128, mode="intersection", seed=1)
    draft_ids, target_ids = other.pairs()
    assert 90 <= len(target_ids) <= 128  # the draft's single-byte tokens (printable ASCII and more)
    assert all(draft_tokenizer.decode([d]) == target_tokenizer.decode([t])
               for d, t in zip(draft_ids.tolist(), target_ids.tolist()))
    itself = CrossTokenizer(target, target_tokenizer, target_tokenizer, 128, mode="intersection", seed=2)
    for name, drafter in {"draft": other, "target through the intersection": itself}.items():
        check = testing.check_distribution(target, drafter, prompt, k=2, gamma=2, temperature=1.0, samples=1500,
                                           significance=1e-3, seed=4)
        assert check.passed, (name, check)
    # The target as its own draft: q is p on every token, so every proposal is kept (β = 1 up to rounding),
    # where the text mode only keeps a proposal with probability p(x).
    sampled = speculant.SpeculativeDecoder(target, itself, gamma=3).generate(prompt, max_new_tokens=30, seed=0)
    text = speculant.SpeculativeDecoder(
        target, CrossTokenizer(target, target_tokenizer, target_tokenizer, 128), gamma=3).generate(
        prompt, max_new_tokens=30, seed=0)
    assert sampled.stats.alpha > 0.98 and sampled.stats.alpha > text.stats.alpha + 0.1, (sampled.stats, text.stats)
    with pytest.raises(ValueError, match="mode must be one of 'text', 'intersection', got 'vocab'"):
        CrossTokenizer(draft, draft_tokenizer, target_tokenizer, 128, mode="vocab")


# Significance 1e-3 for each of the two checks: a correct engine fails this test with probability <= 2e-3.
@pytest.mark.parametrize("mode", ["text", "intersection"])
def test_block_verification_keeps_the_targets_law(bytes_pair, mode):
    """verification="block" on proposals through text: in the text mode a point mass (q of 0 / 1 at the
    re-encoded proposal), in the intersection mode the drafting model's law on the shared tokens. The draft is the
    target with its output layer halved (flatter laws), so that many proposals are kept and many rejected (a random
    draft's are nearly all rejected, the target's own all kept)."""
    target, _, target_tokenizer, _ = bytes_pair
    prompt = target_tokenizer.encode(TEXTS[0]).ids
    blunt = copy.deepcopy(target)
    with torch.no_grad():
        blunt.lm_head.weight.mul_(0.5)
    drafter = CrossTokenizer(blunt, target_tokenizer, target_tokenizer, 128, mode=mode, seed=5)
    check = testing.check_distribution(target, drafter, prompt, k=2, gamma=3, temperature=1.0, samples=1500,
                                       significance=1e-3, seed=6, verification="block")
    assert check.passed, check
    stats = speculant.SpeculativeDecoder(target, drafter, gamma=3, verification="block").generate(
        prompt, max_new_tokens=30, seed=0).stats
    assert 5 < stats.accepted_tokens < stats.drafted_tokens, stats  # both the block's keeps and its residuals ran


def test_refusals_name_what_is_wrong(pair):
    target, draft, target_tokenizer, draft_tokenizer = pair
    with pytest.raises(ValueError, match=r"vocabularies differ: .* A draft with another tokenizer: "
                                         r"SpeculativeDecoder\(\.\.\., draft_tokenizer=, target_tokenizer=\)"):
        speculant.SpeculativeDecoder(target, draft)
    with pytest.raises(ValueError, match="draft_tokenizer and target_tokenizer go together"):
        speculant.SpeculativeDecoder(target, draft, draft_tokenizer=draft_tokenizer)
    with pytest.raises(ValueError, match="draft_tokenizer: the draft must be a model"):
        speculant.SpeculativeDecoder(target, speculant.drafters.PromptLookup(target.config.vocab_size),
                                     draft_tokenizer=draft_tokenizer, target_tokenizer=target_tokenizer)
    with pytest.raises(ValueError, match="draft_tokenizer must be a transformers tokenizer"):
        speculant.SpeculativeDecoder(target, draft, draft_tokenizer="gpt2", target_tokenizer=target_tokenizer)
    with pytest.raises(ValueError, match=r"tree: a draft with another tokenizer .* proposes chains only") as refusal:
        speculant.SpeculativeDecoder(target, draft, tree=[2, 2], draft_tokenizer=draft_tokenizer,
                                     target_tokenizer=target_tokenizer)
    assert "PythonDrafter" not in str(refusal.value)  # issue 51: it named a drafter the user never made
    t5 = hf_models.make("t5", 0)
    with pytest.raises(ValueError, match="an encoder-decoder draft cannot continue the target's text"):
        speculant.SpeculativeDecoder(target, t5, draft_tokenizer=draft_tokenizer, target_tokenizer=target_tokenizer)
