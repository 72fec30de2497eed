"""Statistical tests of the C++ engine's output law (Algorithm 1 end to end, Theorem A.1).

Notation (paper §2): p = target, q = draft, γ = draft length, l = lenience.

Each test runs N_SAMPLES generations of MAX_NEW_TOKENS tokens with fixed seeds (seed = base + i), from a
fixed prompt, on Markov table models (tests/support/markov.py: second order, position-parity dependent, so a stale
cache or a wrong rollback shows in later tokens), and compares the empirical joint law of a window of
generated tokens with the exact law enumerated by tests/support/markov.py:

* a cell whose exact probability is zero must never be observed (asserted exactly);
* cells with expected count < 5 are pooled; Pearson's chi-square goodness-of-fit test must not reject at
  SIGNIFICANCE = 1e-3 per test.

Every test here runs at SIGNIFICANCE = 1e-3: 2 windows (tokens 1-3 and 4-6) x 16 configurations (6 of them
drafters other than a draft model and adaptive gamma policies), 2 windows of the exact lenient law, 4 one-sided
binomial bounds and 2 accepted-count laws make 40 tests that a correct engine could fail by chance, so the
family-wise false-rejection rate is at most 40 * 1e-3 = 4% (Bonferroni)
for a fresh draw of seeds; the seeds are fixed, so the suite's outcome is deterministic. Power: the lenience
negative control (test_lenient_law_is_detected) must be rejected by the same test, and its predicted power at
N_SAMPLES is asserted to exceed 0.999. (Offline, the same approximation gives power ~1 at N_SAMPLES against a
residual replaced by p or a bonus token drawn from the wrong row, for every configuration below.)
"""


import numpy as np
import pytest
import scipy.stats
import torch

from support import markov
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue, pooled
from support.laws import WINDOWS, assert_law, check_no_top_p_boundary

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

N_SAMPLES = 5000
MAX_NEW_TOKENS = 6
VOCAB = 4
PROMPT = [2, 1, 3]


# ------------------------------------------------------------------------------------------------
# The test statistic (tests/support/chisquare.py) and its power
# ------------------------------------------------------------------------------------------------


def predicted_power(law: torch.Tensor, alternative: torch.Tensor, n: int) -> float:
    """Power of the pooled chi-square test at SIGNIFICANCE against data drawn from `alternative`
    (noncentral chi-square approximation, noncentrality n Σ (P_alt - P)^2 / P over the pooled cells)."""
    probs = law.reshape(-1).numpy()
    alt = alternative.reshape(-1).numpy()
    keep = probs > 0
    expected, alt_expected = pooled(probs[keep] * n, alt[keep] * n)
    noncentrality = float(((alt_expected - expected) ** 2 / expected).sum())
    df = len(expected) - 1
    critical = scipy.stats.chi2.ppf(1 - SIGNIFICANCE, df)
    return float(scipy.stats.ncx2.sf(critical, df, noncentrality))


# ------------------------------------------------------------------------------------------------
# Models, configurations and sampling
# ------------------------------------------------------------------------------------------------


def generate_samples(generate, n: int, seed_base: int) -> np.ndarray:
    out = np.empty((n, MAX_NEW_TOKENS), dtype=np.int64)
    for i in range(n):
        tokens = generate(seed_base + i)
        assert len(tokens) == MAX_NEW_TOKENS
        out[i] = tokens
    return out


CONFIGS = [
    # id, temperature, top_k, top_p, gamma, target form, draft form, table seed, independent draft, prompt
    ("T1-plain-g1-cached-prompt1", 1.0, 0, 1.0, 1, "cached", "cached", 1, False, [2]),
    ("T0.7-plain-g3-cached", 0.7, 0, 1.0, 3, "cached", "cached", 2, False, PROMPT),
    ("T1-topk2-g3-plain", 1.0, 2, 1.0, 3, "plain", "plain", 3, False, PROMPT),
    ("T0.7-topk3-g8-mixed", 0.7, 3, 1.0, 8, "cached", "plain", 4, False, PROMPT),
    ("T1-topp0.8-g8-cached", 1.0, 0, 0.8, 8, "cached", "cached", 5, False, PROMPT),
    ("T0.7-topp0.7-g1-mixed-prompt1", 0.7, 0, 0.7, 1, "plain", "cached", 6, False, [0]),
    ("T1-plain-g3-unrelated-masked-draft", 1.0, 0, 1.0, 3, "cached", "cached", 7, True, PROMPT),
    ("T0.7-topk2-topp0.9-g8-unrelated", 0.7, 2, 0.9, 8, "cached", "cached", 8, True, PROMPT),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_speculative_law_equals_target_law(config):
    name, temperature, top_k, top_p, gamma, target_form, draft_form, seed, independent, prompt = config
    target, draft = markov.target_and_draft(
        VOCAB, seed, mask_prob=0.25 if independent else 0.1, independent_draft=independent
    )
    check_no_top_p_boundary(target, temperature, top_k, top_p)
    check_no_top_p_boundary(draft, temperature, top_k, top_p)
    decoder = speculant.SpeculativeDecoder(
        speculant.load(markov.script(target, target_form)),
        speculant.load(markov.script(draft, draft_form)),
        gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p,
    )
    samples = generate_samples(
        lambda s: decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, seed=s).tokens,
        N_SAMPLES, seed_base=1000 * seed,
    )
    law = markov.continuation_law(target, prompt, MAX_NEW_TOKENS, temperature, top_k, top_p)
    assert_law(samples, law, name)


def make_drafter(kind: str, draft_table: torch.Tensor, target_table: torch.Tensor):
    """Drafters other than a draft model (speculant.drafters), for the same law test."""
    if kind in ("unigram", "bigram"):
        corpus = np.random.default_rng(5).choice(VOCAB, size=400, p=[0.4, 0.3, 0.2, 0.1])  # a skewed corpus
        cls = speculant.drafters.Unigram if kind == "unigram" else speculant.drafters.Bigram
        return cls.fit(corpus, VOCAB)
    if kind == "prompt_lookup":
        return speculant.drafters.PromptLookup(VOCAB, min_ngram=1, max_ngram=2)
    rng = np.random.default_rng(7)  # the Python drafter's own randomness, fixed for the test

    def propose(context, gamma):
        k = int(rng.integers(0, gamma + 1))  # sometimes fewer than gamma tokens, sometimes none
        q = torch.softmax(torch.as_tensor(rng.normal(size=(k, VOCAB))), -1)
        tokens = [int(rng.choice(VOCAB, p=row.numpy())) for row in q]
        return tokens, q

    return speculant.drafters.PythonDrafter(propose, VOCAB)


DRAFTER_CONFIGS = [
    # id, drafter kind, gamma policy, temperature, top_k, top_p, gamma, table seed
    ("unigram-T1-g3", "unigram", "fixed", 1.0, 0, 1.0, 3, 31),
    ("bigram-T0.7-topk3-g4", "bigram", "fixed", 0.7, 3, 1.0, 4, 32),
    ("prompt-lookup-T1-topp0.8-g4", "prompt_lookup", "fixed", 1.0, 0, 0.8, 4, 33),
    ("python-T1-g3", "python", "fixed", 1.0, 0, 1.0, 3, 34),
    ("model-heuristic-T0.7-g2", "model", "heuristic", 0.7, 0, 1.0, 2, 35),
    ("prompt-lookup-alpha-T1-g2", "prompt_lookup", "alpha", 1.0, 0, 1.0, 2, 36),
]


@pytest.mark.parametrize("config", DRAFTER_CONFIGS, ids=[c[0] for c in DRAFTER_CONFIGS])
def test_drafter_and_gamma_policy_law_equals_target_law(config):
    """The same test for every drafter of speculant.drafters and every adaptive gamma policy."""
    name, kind, policy, temperature, top_k, top_p, gamma, seed = config
    target, draft = markov.target_and_draft(VOCAB, seed, mask_prob=0.1)
    check_no_top_p_boundary(target, temperature, top_k, top_p)
    drafter = speculant.load(markov.cached_model(draft)) if kind == "model" else make_drafter(kind, draft, target)
    decoder = speculant.SpeculativeDecoder(speculant.load(markov.cached_model(target)), drafter, gamma=gamma,
                                           temperature=temperature, top_k=top_k, top_p=top_p)
    options = {"gamma_policy": policy, "max_gamma": 5}
    if policy == "alpha":
        options["cost"] = 0.05
    samples = generate_samples(
        lambda s: decoder.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, seed=s, **options).tokens,
        N_SAMPLES, seed_base=1000 * seed,
    )
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS, temperature, top_k, top_p)
    assert_law(samples, law, name)


PLAIN_CONFIGS = [
    ("T1-cached", 1.0, 0, 1.0, "cached", 11),
    ("T0.7-topk3-topp0.8-plain", 0.7, 3, 0.8, "plain", 12),
]


@pytest.mark.parametrize("config", PLAIN_CONFIGS, ids=[c[0] for c in PLAIN_CONFIGS])
def test_plain_decoding_law_equals_target_law(config):
    name, temperature, top_k, top_p, form, seed = config
    target = markov.random_table(VOCAB, seed, mask_prob=0.1)
    check_no_top_p_boundary(target, temperature, top_k, top_p)
    model = speculant.load(markov.script(target, form))
    samples = generate_samples(
        lambda s: speculant.generate(
            model, PROMPT, max_new_tokens=MAX_NEW_TOKENS, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=s,
        ).tokens,
        N_SAMPLES, seed_base=1000 * seed,
    )
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS, temperature, top_k, top_p)
    assert_law(samples, law, name)


def test_lenient_law_is_detected():
    """Negative control (power): lenience l = 0.3 with an unrelated draft changes the output law; the same
    chi-square test must reject the target law, while the exact lenient law (enumerated with
    tests/support/reference.py) is not rejected, and the first token respects P(x) <= p(x) / l (A.5)."""
    lenience, gamma, temperature = 0.3, 2, 1.0
    target, draft = markov.target_and_draft(VOCAB, 21, independent_draft=True, concentration=0.5)
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS, temperature)
    lenient = markov.speculative_law(target, draft, PROMPT, MAX_NEW_TOKENS, gamma, temperature, lenience=lenience)
    first, first_p = markov.marginal(lenient, [0]), markov.marginal(law, [0])
    assert (first <= first_p / lenience + 1e-12).all()
    for window in WINDOWS:
        power = predicted_power(markov.marginal(law, list(window)), markov.marginal(lenient, list(window)), N_SAMPLES)
        assert power > 0.999, f"the test has too little power at N = {N_SAMPLES}: {power:.4f}"

    decoder = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(target)), speculant.load(markov.cached_model(draft)),
        gamma=gamma, temperature=temperature, lenience=lenience,
    )
    samples = generate_samples(
        lambda s: decoder.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, seed=s).tokens,
        N_SAMPLES, seed_base=21000,
    )
    for window in WINDOWS:
        pvalue = chi_square_pvalue(markov.marginal(law, list(window)), samples[:, list(window)])
        assert pvalue < SIGNIFICANCE, f"lenient output not told apart from the target law, p = {pvalue:.3g}"
    assert_law(samples, lenient, "lenience 0.3")
    # One-sided binomial tests at 1e-3 each: the first token's frequency is not above p(x) / l.
    counts = np.bincount(samples[:, 0], minlength=VOCAB)
    for x in range(VOCAB):
        bound = min(1.0, float(first_p[x]) / lenience)
        test = scipy.stats.binomtest(int(counts[x]), N_SAMPLES, bound, alternative="greater")
        assert test.pvalue > SIGNIFICANCE, (x, counts[x], bound)


@pytest.mark.parametrize("gamma", [2, 5])
def test_accepted_count_law_iid(gamma):
    """Same p and q in every context: the number of accepted drafts per iteration follows
    P(n) = α^n (1 - α) for n < γ and α^γ for n = γ, α = Σ min(p, q) (STYLE.md, Corollary 3.6), tested
    with a chi-square test at SIGNIFICANCE over the iterations that drafted all γ tokens."""
    gen = torch.Generator().manual_seed(gamma)
    p = torch.rand(5, generator=gen, dtype=torch.float64) + 0.05
    q = torch.rand(5, generator=gen, dtype=torch.float64) + 0.05
    target, draft = markov.constant_table(p / p.sum()), markov.constant_table(q / q.sum())
    probs = [torch.softmax(t[0, 0, 0].float().double(), -1) for t in (target, draft)]  # what the models emit
    alpha = float(torch.minimum(*probs).sum())
    decoder = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(target)), speculant.load(markov.plain_model(draft)), gamma=gamma
    )
    counts = np.zeros(gamma + 1)
    for seed in range(25):
        result = decoder.generate(PROMPT, max_new_tokens=200, seed=seed)
        for it in result.trace:
            if len(it.drafted) == gamma:
                counts[it.accepted] += 1
    law = np.array([alpha**n * (1 - alpha) for n in range(gamma)] + [alpha**gamma])
    expected, observed = pooled(law * counts.sum(), counts)
    assert counts.sum() > 500
    pvalue = scipy.stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
    assert pvalue > SIGNIFICANCE, (counts, law * counts.sum())


def test_statistic_rejects_a_wrong_law():
    """Self-check of chi_square_pvalue: a clear mismatch is rejected, an exact sample is not, and a
    sample in a zero-probability cell fails outright."""
    law = torch.tensor([[0.5, 0.2], [0.0, 0.3]], dtype=torch.float64)
    rng = np.random.default_rng(0)
    cells = rng.choice(4, size=4000, p=law.reshape(-1).numpy())
    samples = np.stack(np.unravel_index(cells, (2, 2)), axis=1)
    assert chi_square_pvalue(law, samples) > SIGNIFICANCE
    shifted = torch.tensor([[0.45, 0.25], [0.0, 0.3]], dtype=torch.float64)
    assert chi_square_pvalue(shifted, samples) < SIGNIFICANCE
    with pytest.raises(AssertionError, match="zero-probability"):
        chi_square_pvalue(law, np.array([[1, 0]] * 10))


def test_a_drafter_misreporting_q_is_detected():
    """Power for the drafter path: a Python drafter that always proposes token 0 but reports a uniform q breaks
    the premise of speculative sampling (x ~ q), the output law moves towards token 0, and the same test
    rejects the target law."""
    target, _ = markov.target_and_draft(VOCAB, 37, mask_prob=0.0)

    def propose(context, gamma):
        return [0] * gamma, torch.full((gamma, VOCAB), 1.0 / VOCAB)

    decoder = speculant.SpeculativeDecoder(speculant.load(markov.cached_model(target)),
                                           speculant.drafters.PythonDrafter(propose, VOCAB), gamma=3)
    samples = generate_samples(lambda s: decoder.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, seed=s).tokens,
                               N_SAMPLES, seed_base=37000)
    law = markov.continuation_law(target, PROMPT, MAX_NEW_TOKENS, 1.0)
    assert chi_square_pvalue(markov.marginal(law, [0, 1, 2]), samples[:, :3]) < SIGNIFICANCE
