"""speculant.drafters and adaptive gamma: greedy equality with plain decoding, the tables' estimation and
files, prompt lookup's proposals, the Python drafter's checks, and the gamma policies' schedules. Their output
laws are tested in test_distribution.py (test_drafter_and_gamma_policy_law_equals_target_law)."""

import numpy as np
import pytest
import torch

from support import markov
import speculant
from support.drafter_sets import VOCAB, every_drafter
from speculant import drafters
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached

PROMPT = [3, 7, 3, 7, 1, 3, 7]


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return speculant.load(script_cached(TinyGPT(TinyGPTConfig(VOCAB, 2, 2, 32, 128))))


@pytest.mark.parametrize("kind", ["unigram", "bigram", "prompt_lookup", "python"])
@pytest.mark.parametrize("policy", ["fixed", "heuristic"])
def test_greedy_output_equals_plain_greedy(target, kind, policy):
    expected = speculant.generate(target, PROMPT, max_new_tokens=40, temperature=0).tokens
    for gamma in (1, 3, 6):
        decoder = speculant.SpeculativeDecoder(target, every_drafter()[kind], gamma=gamma, temperature=0)
        result = decoder.generate(PROMPT, max_new_tokens=40, gamma_policy=policy)
        assert result.tokens == expected, (kind, gamma)
        assert result.stats.draft_calls == 0  # no model call: c is about 0


def test_bigram_counts_and_files(tmp_path):
    corpus = [[0, 1, 0, 1, 2], [2, 2, 1]]  # two documents: no pair across them
    bigram = drafters.Bigram.fit(corpus, 4)
    assert bigram.row_ptr.tolist() == [0, 1, 3, 5, 5]  # rows: 0 -> {1}, 1 -> {0, 2}, 2 -> {1, 2}, 3 -> {}
    assert bigram.followers.tolist() == [1, 0, 2, 1, 2]
    assert bigram.counts.tolist() == [2, 1, 1, 1, 1]
    unigram = np.array([2, 3, 3, 0]) + 1.0
    assert np.allclose(bigram.unigram.numpy(), unigram / unigram.sum())
    bigram.save(tmp_path / "bigram.pt")
    loaded = drafters.Bigram.load(tmp_path / "bigram.pt")
    assert all(torch.equal(getattr(loaded, f), getattr(bigram, f)) for f in ("unigram", "row_ptr", "followers",
                                                                            "counts"))
    drafters.Unigram.fit(corpus, 4).save(tmp_path / "unigram.pt")
    assert torch.equal(drafters.Unigram.load(tmp_path / "unigram.pt").probabilities, bigram.unigram)
    with pytest.raises(ValueError, match="holds a 'unigram' drafter, not a 'bigram' one"):
        drafters.Bigram.load(tmp_path / "unigram.pt")
    with pytest.raises(FileNotFoundError):
        drafters.Unigram.load(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match=r"corpus token ids must be in \[0, vocab_size = 4\)"):
        drafters.Bigram.fit([0, 4], 4)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 1"):
        drafters.Unigram.fit([0], 0)


def test_bigram_rows_are_witten_bell():
    """The bigram's q after a token is the Witten-Bell row: against a target whose law is that row, every
    verified position has beta = sum min(p, q) = 1 (alpha 1), and the drafted tokens follow it."""
    bigram = drafters.Bigram.fit([0, 1, 0, 1, 2, 2, 1], 4)
    u = bigram.unigram.numpy()
    expected = (2 * u + np.array([1, 0, 1, 0])) / (2 + 2)  # after token 1: followers 0 and 2 once each
    model = speculant.load(markov.cached_model(markov.constant_table(torch.tensor(expected))))
    decoder = speculant.SpeculativeDecoder(model, bigram, gamma=1)
    counts = np.zeros(4)
    for seed in range(400):
        result = decoder.generate([1], max_new_tokens=2, seed=seed)
        assert result.stats.alpha == pytest.approx(1.0, abs=1e-6)
        counts[result.trace[0].drafted[0]] += 1
    assert np.abs(counts / 400 - expected).max() < 0.08  # about 3.5 standard errors


def test_bigram_rows_after_every_token():
    """Against a target whose law after each token is the bigram's Witten-Bell row for it (and the unigram after
    a token never followed), beta = 1 at every verified position of long drafts: each of the rows the drafter
    builds, and keeps for reuse, is the row of the token before it."""
    corpus = [0, 1, 0, 1, 2, 2, 1, 3, 0, 2]
    bigram = drafters.Bigram.fit(corpus, 5)  # token 4 never occurs: its row is the unigram
    u = bigram.unigram.numpy()
    rows = np.tile(u, (5, 1))
    for a in range(5):
        followers = np.zeros(5)
        for x, y in zip(corpus, corpus[1:]):
            followers[y] += x == a
        distinct = (followers > 0).sum()
        if distinct:
            rows[a] = (distinct * u + followers) / (followers.sum() + distinct)
    table = torch.tensor(np.log(rows)).expand(2, 6, 5, 5).clone()  # [parity, prev2, prev1] -> the row of prev1
    model = speculant.load(markov.cached_model(table))
    decoder = speculant.SpeculativeDecoder(model, bigram, gamma=4)
    seen = set()
    for seed in range(40):
        result = decoder.generate([seed % 5], max_new_tokens=24, seed=seed)
        assert result.stats.alpha == pytest.approx(1.0, abs=1e-6) and result.stats.accepted_tokens > 0
        seen.update(result.tokens)
    assert seen == set(range(5))


def test_prompt_lookup_copies_the_latest_longest_match(target):
    lookup = drafters.PromptLookup(VOCAB, min_ngram=1, max_ngram=2)
    decoder = speculant.SpeculativeDecoder(target, lookup, gamma=3, temperature=0)
    result = decoder.generate([5, 9, 4, 8, 5, 9, 2, 6, 5, 9], max_new_tokens=1 + 3)
    # the suffix [5, 9] last occurred at positions 4-5, followed by 2, 6, 5
    assert result.trace[0].drafted == [2, 6, 5]
    none = decoder.generate([1, 2, 3], max_new_tokens=3)  # no earlier occurrence of any suffix
    assert none.trace[0].drafted == [] and none.stats.target_calls >= 1
    with pytest.raises(ValueError, match="min_ngram must be an integer >= 1"):
        drafters.PromptLookup(VOCAB, min_ngram=0)
    with pytest.raises(ValueError, match="1 <= min_ngram <= max_ngram"):
        drafters.PromptLookup(VOCAB, min_ngram=3, max_ngram=2)


@pytest.mark.parametrize("bad, message", [
    (lambda c, g: "nope", "must return a tuple"),
    (lambda c, g: ([1] * (g + 1), torch.full((g + 1, VOCAB), 1 / VOCAB)), "more than gamma"),
    (lambda c, g: ([1], torch.full((1, VOCAB + 1), 1 / (VOCAB + 1))), r"shape \[k, V\] = \[1, 32\]"),
    (lambda c, g: ([1], torch.full((1, VOCAB), 0.5)), "sums to 16"),
    (lambda c, g: ([1], torch.nn.functional.one_hot(torch.tensor([2]), VOCAB).float()), "probability 0"),
    (lambda c, g: ([1], torch.full((1, VOCAB), float("nan"))), "finite and nonnegative"),
    (lambda c, g: ([VOCAB], torch.full((1, VOCAB), 1 / VOCAB)), "outside the vocabulary"),
])
def test_python_drafter_output_is_checked(target, bad, message):
    decoder = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(bad, VOCAB), gamma=2)
    with pytest.raises(ValueError, match=message):
        decoder.generate(PROMPT, max_new_tokens=4, seed=0)


def test_drafter_must_match_the_target(target):
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculant.SpeculativeDecoder(target, drafters.PromptLookup(VOCAB + 1), gamma=2)
    with pytest.raises(ValueError, match="draft must be a model .*, a drafter from speculant.drafters or a SpeculativeDecoder .*got int"):
        speculant.SpeculativeDecoder(target, 3, gamma=2)
    with pytest.raises(FileNotFoundError, match="no such file or directory: draft.pt"):  # paths load as models
        speculant.SpeculativeDecoder(target, "draft.pt", gamma=2)
    with pytest.raises(ValueError, match="propose must be callable"):
        drafters.PythonDrafter(3, VOCAB)


def gammas(result) -> list:
    return [len(it.drafted) for it in result.trace]


def test_heuristic_policy_schedule(target):
    """+2 after an iteration that kept every draft, -1 otherwise, within [1, max_gamma]; the last
    iterations are trimmed to the tokens still wanted."""
    draft = speculant.load(script_cached(TinyGPT(TinyGPTConfig(VOCAB, 1, 1, 16, 128))))
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=3)
    result = decoder.generate(PROMPT, max_new_tokens=60, seed=1, gamma_policy="heuristic", max_gamma=6)
    wanted = 3
    produced = 0
    for it in result.trace:
        assert len(it.drafted) == min(wanted, 60 - produced - 1)
        if len(it.drafted):
            wanted = min(wanted + 2, 6) if it.accepted == len(it.drafted) else max(wanted - 1, 1)
        produced += it.emitted
    assert len(set(gammas(result))) > 1  # it did adapt


def test_alpha_policy_follows_theorem_3_8(target):
    """A draft identical to the target keeps every draft (alpha = 1): with c = 0 Theorem 3.8's best gamma is
    max_gamma, with c = 5 only gamma = 1 pays."""
    torch.manual_seed(0)  # the same weights as the target fixture
    same = speculant.load(script_cached(TinyGPT(TinyGPTConfig(VOCAB, 2, 2, 32, 128))))
    decoder = speculant.SpeculativeDecoder(target, same, gamma=2, temperature=0)
    cheap = decoder.generate(PROMPT, max_new_tokens=40, gamma_policy="alpha", cost=0.0, max_gamma=7)
    assert max(gammas(cheap)) == 7 and cheap.stats.acceptance_rate == 1.0
    dear = decoder.generate(PROMPT, max_new_tokens=40, gamma_policy="alpha", cost=5.0, max_gamma=7)
    assert set(gammas(dear)) == {1}
    with pytest.raises(ValueError, match="needs cost"):
        decoder.generate(PROMPT, max_new_tokens=4, gamma_policy="alpha")
    with pytest.raises(ValueError, match="gamma_policy must be one of"):
        decoder.generate(PROMPT, max_new_tokens=4, gamma_policy="grow")
    with pytest.raises(ValueError, match="max_gamma must be >= gamma = 2"):
        decoder.generate(PROMPT, max_new_tokens=4, gamma_policy="heuristic", max_gamma=1)


def test_decoders_sharing_a_draft_model_take_turns(target):
    """Two decoders over the same draft model (each wraps it in its own drafter) run from two threads: the
    engine locks the model's cache, so each thread gets exactly its sequential result."""
    import threading

    torch.manual_seed(1)
    draft = speculant.load(script_cached(TinyGPT(TinyGPTConfig(VOCAB, 1, 1, 16, 128))))
    other = speculant.load(script_cached(TinyGPT(TinyGPTConfig(VOCAB, 2, 2, 32, 128))))
    decoders = [speculant.SpeculativeDecoder(model, draft, gamma=3) for model in (target, other)]
    expected = [d.generate(PROMPT, max_new_tokens=60, seed=i).tokens for i, d in enumerate(decoders)]
    got = [None, None]

    def run(i):
        for _ in range(5):
            got[i] = decoders[i].generate(PROMPT, max_new_tokens=60, seed=i).tokens
            assert got[i] == expected[i]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == expected
