"""Exact, enumerated checks of speculative sampling (§2.3, Algorithm 1, Appendix A.1, A.5).

Notation (paper §2): p = target, q = draft, γ = draft length, α = Σ_x min(p, q), l = lenience.
Small vocabularies (3-8 tokens) make every law enumerable, so these tests assert equalities to 1e-6
instead of statistical bounds; they exercise speculant.sampling (C++) only.
"""

import itertools

import pytest
import torch

from support import markov
from support import reference
from support.reference import one_hot
from speculant import sampling

F64 = torch.float64
ATOL = 1e-6


def dirichlet(vocab: int, concentration: float, gen: torch.Generator) -> torch.Tensor:
    g = torch._standard_gamma(torch.full((vocab,), concentration, dtype=F64), gen)
    return g / g.sum()


def on_support(values: dict[int, float], vocab: int) -> torch.Tensor:
    x = torch.zeros(vocab, dtype=F64)
    for i, v in values.items():
        x[i] = v
    return x / x.sum()


def one_position_law(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """P(y) = Σ_x q(x)[a(x) 1{y = x} + (1 - a(x)) r(y)] with speculant's a and r."""
    a = sampling.acceptance_probability(p, q, lenience=lenience).to(F64)
    r = sampling.residual(p, q).to(F64)
    return q * a + (q * (1.0 - a)).sum() * r


def one_position_law_via_verify(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The same law through speculant.sampling.verify with γ = 1, one call per draft token x."""
    vocab = p.shape[0]
    logits = torch.stack([p.log(), p.log()])  # [γ + 1, V]; -inf where p = 0
    law = torch.zeros(vocab, dtype=F64)
    for x in range(vocab):
        if q[x] == 0:
            continue
        accept, next_dist = sampling.verify(logits, q[None], torch.tensor([x]))
        law += q[x] * (accept[0] * one_hot(x, vocab) + (1 - accept[0]) * next_dist[0].to(F64))
    return law


def random_pairs():
    """(name, p, q) for V in 3..8 and Dirichlet concentrations 0.1 (spiky), 1, 10 (flat)."""
    gen = torch.Generator().manual_seed(2023)
    for vocab in range(3, 9):
        for cp, cq in [(0.1, 0.1), (1.0, 1.0), (10.0, 10.0), (0.1, 10.0), (10.0, 0.1), (1.0, 0.3)]:
            for rep in range(3):
                yield f"V{vocab}-a{cp}-b{cq}-{rep}", dirichlet(vocab, cp, gen), dirichlet(vocab, cq, gen)


def edge_pairs():
    gen = torch.Generator().manual_seed(7)
    for vocab in (3, 5, 8):
        p = dirichlet(vocab, 1.0, gen)
        q = dirichlet(vocab, 1.0, gen)
        near = p.clone()
        near[0] += 1e-12
        near[1] -= 1e-12
        yield f"V{vocab}-equal", p, p.clone()
        yield f"V{vocab}-nearly-equal", p, near
        yield f"V{vocab}-nearly-equal-swapped", near, p
        yield f"V{vocab}-onehot-p", one_hot(1, vocab), q
        yield f"V{vocab}-onehot-q", p, one_hot(2, vocab)
        yield f"V{vocab}-onehot-both-same", one_hot(0, vocab), one_hot(0, vocab)
        yield f"V{vocab}-onehot-both-different", one_hot(0, vocab), one_hot(vocab - 1, vocab)
        yield f"V{vocab}-disjoint", on_support({0: 0.7, 1: 0.3}, vocab), on_support({2: 0.5, vocab - 1: 0.5}, vocab)
        yield f"V{vocab}-q-zero-where-p-positive", p, on_support({0: 0.2, 1: 0.8}, vocab)
        yield f"V{vocab}-p-zero-where-q-positive", on_support({0: 0.2, 1: 0.8}, vocab), q
        yield f"V{vocab}-q-tiny-where-p-large", on_support({0: 0.9, 1: 0.1}, vocab), on_support({0: 1e-300, 1: 1.0}, vocab)


PAIRS = list(random_pairs()) + list(edge_pairs())


# ------------------------------------------------------------------------------------------------
# (a) One position: speculative sampling reproduces p (Theorem A.1)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,p,q", PAIRS, ids=[n for n, _, _ in PAIRS])
def test_one_position_law_equals_p(name, p, q):
    law = one_position_law(p, q)
    torch.testing.assert_close(law, p, rtol=0, atol=ATOL)
    assert torch.isfinite(law).all() and (law >= 0).all()
    assert (law[p == 0] == 0).all()  # forbidden tokens stay exactly forbidden


@pytest.mark.parametrize("name,p,q", PAIRS[::5] + list(edge_pairs()), ids=lambda v: v if isinstance(v, str) else None)
def test_one_position_law_via_verify_equals_p(name, p, q):
    torch.testing.assert_close(one_position_law_via_verify(p, q), p, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name,p,q", PAIRS[::4], ids=lambda v: v if isinstance(v, str) else None)
def test_acceptance_mass_is_alpha(name, p, q):
    """β = Σ_x q(x) a(x) = Σ_x min(p(x), q(x)) (Definition 3.1, Lemma 3.3)."""
    a = sampling.acceptance_probability(p, q).to(F64)
    torch.testing.assert_close((q * a).sum(), torch.minimum(p, q).sum(), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# (b) Algorithm 1 over γ positions with context-dependent p_i, q_i
# ------------------------------------------------------------------------------------------------

SAMPLING = [
    # temperature, top_k, top_p
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.0, 2, 1.0),
    (1.0, 0, 0.8),
    (0.7, 3, 0.9),
]
PROMPT = [1, 0]


def verify_block(target, draft, prefix, xs, config, lenience=1.0):
    """Draft probability Π q_i(x_i) and speculant.sampling.verify's outputs for draft block xs."""
    temperature, top_k, top_p = config
    ctx = list(prefix)
    q_rows, p_logits, weight = [], [], 1.0
    for x in xs:
        q_row = reference.standardize(markov.row_logits(draft, ctx), temperature, top_k, top_p)
        weight *= float(q_row[x])
        q_rows.append(q_row)
        p_logits.append(markov.row_logits(target, ctx))
        ctx.append(x)
    p_logits.append(markov.row_logits(target, ctx))
    accept, next_dist = sampling.verify(
        torch.stack(p_logits), torch.stack(q_rows), torch.tensor(list(xs)),
        temperature=temperature, top_k=top_k, top_p=top_p, lenience=lenience,
    )
    return weight, accept.to(F64), next_dist.to(F64)


def algorithm1_law(target, draft, prompt, gamma, config, lenience=1.0):
    """Law over γ+1 tokens: one Algorithm 1 step, completed to γ+1 tokens by sampling the target.

    Also returns the law of the number of accepted tokens n.
    """
    vocab = target.shape[-1]
    law = torch.zeros((vocab,) * (gamma + 1), dtype=F64)
    accepted = torch.zeros(gamma + 1, dtype=F64)
    for xs in itertools.product(range(vocab), repeat=gamma):
        weight, accept, next_dist = verify_block(target, draft, prompt, xs, config, lenience)
        if weight == 0:
            continue
        reach = weight
        for n in range(gamma + 1):
            stop = reach * (1 - accept[n]) if n < gamma else reach
            accepted[n] += stop
            for t in range(vocab):
                if stop * next_dist[n, t] == 0:
                    continue
                emitted = list(xs[:n]) + [t]
                rest = markov.continuation_law(target, prompt + emitted, gamma - n, *config)
                law[tuple(emitted)] += stop * next_dist[n, t] * rest
            if n < gamma:
                reach = reach * accept[n]
    return law, accepted


TABLE_CASES = [
    # vocab, seed, mask_prob, independent draft
    (3, 1, 0.0, False),
    (4, 2, 0.2, False),
    (5, 3, 0.0, True),
    (4, 4, 0.3, True),
]


ALGORITHM1_CASES = [
    pytest.param(gamma, config, case, id=f"g{gamma}-T{config[0]}-k{config[1]}-p{config[2]}-V{case[0]}-s{case[1]}")
    for gamma in (1, 2, 3)
    for config in SAMPLING
    for case in TABLE_CASES
    if not (case[0] == 5 and gamma == 3 and config != SAMPLING[0])  # the slowest; smaller V cover them
]


@pytest.mark.parametrize("gamma,config,case", ALGORITHM1_CASES)
def test_algorithm1_preserves_target_joint_law(gamma, config, case):
    vocab, seed, mask_prob, independent = case
    target, draft = markov.target_and_draft(vocab, seed, mask_prob=mask_prob, independent_draft=independent)
    law, accepted = algorithm1_law(target, draft, PROMPT, gamma, config)
    want = markov.continuation_law(target, PROMPT, gamma + 1, *config)
    torch.testing.assert_close(law, want, rtol=0, atol=ATOL)
    torch.testing.assert_close(accepted.sum(), torch.tensor(1.0, dtype=F64), rtol=0, atol=ATOL)


@pytest.mark.parametrize("clamp_gamma", [True, False], ids=["gamma-clamped", "gamma-fixed"])
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("config", SAMPLING[:2] + SAMPLING[4:], ids=lambda c: f"T{c[0]}-k{c[1]}-p{c[2]}")
def test_repeated_steps_preserve_target_law(gamma, config, clamp_gamma):
    """Several Algorithm 1 steps chained, cut at k = 4 tokens (what max_new_tokens does), drafting γ
    tokens every step or min(γ, tokens still due - 1) (then the last step may verify γ = 0 drafts)."""
    target, draft = markov.target_and_draft(3, 11, mask_prob=0.2)
    got = markov.speculative_law(
        target, draft, PROMPT, 4, gamma, *config, verify=sampling.verify, clamp_gamma=clamp_gamma
    )
    torch.testing.assert_close(got, markov.continuation_law(target, PROMPT, 4, *config), rtol=0, atol=ATOL)


def position_table(vocab: int, even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """Distributions that depend on the position parity only (independent of the drafted tokens)."""
    table = torch.empty(2, vocab + 1, vocab, vocab, dtype=F64)
    table[0] = even.log()
    table[1] = odd.log()
    return table


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("vocab,cp,cq", [(3, 1.0, 1.0), (4, 0.3, 3.0), (5, 10.0, 10.0)])
def test_accepted_length_law_iid(gamma, vocab, cp, cq):
    """Same p, q at every position: P(n) = α^n (1 - α) for n < γ and α^γ for n = γ, α = Σ min(p, q)."""
    gen = torch.Generator().manual_seed(100 * vocab + gamma)
    p, q = dirichlet(vocab, cp, gen), dirichlet(vocab, cq, gen)
    alpha = float(torch.minimum(p, q).sum())
    _, accepted = algorithm1_law(markov.constant_table(p), markov.constant_table(q), [0], gamma, (1.0, 0, 1.0))
    want = torch.tensor([alpha**n * (1 - alpha) for n in range(gamma)] + [alpha**gamma], dtype=F64)
    torch.testing.assert_close(accepted, want, rtol=0, atol=ATOL)


def test_accepted_length_law_position_dependent():
    """p_i, q_i depend on the position only: P(n) = [1 - a0, a0 (1 - a1), a0 a1] for γ = 2 with
    a_i = Σ min(p_i, q_i) (STYLE.md), and its γ = 3 analogue."""
    gen = torch.Generator().manual_seed(5)
    vocab = 4
    p_even, p_odd, q_even, q_odd = (dirichlet(vocab, 1.0, gen) for _ in range(4))
    target = position_table(vocab, p_even, p_odd)
    draft = position_table(vocab, q_even, q_odd)
    prompt = [0, 1]  # the first drafted token has index 2: even parity
    a_even = float(torch.minimum(p_even, q_even).sum())
    a_odd = float(torch.minimum(p_odd, q_odd).sum())
    _, accepted = algorithm1_law(target, draft, prompt, 2, (1.0, 0, 1.0))
    want = torch.tensor([1 - a_even, a_even * (1 - a_odd), a_even * a_odd], dtype=F64)
    torch.testing.assert_close(accepted, want, rtol=0, atol=ATOL)
    _, accepted = algorithm1_law(target, draft, prompt, 3, (1.0, 0, 1.0))
    a = [a_even, a_odd, a_even]
    want = torch.tensor([1 - a[0], a[0] * (1 - a[1]), a[0] * a[1] * (1 - a[2]), a[0] * a[1] * a[2]], dtype=F64)
    torch.testing.assert_close(accepted, want, rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------------------
# (c) Lenience (A.5)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lenience", [0.9, 0.5, 0.1])
@pytest.mark.parametrize("name,p,q", PAIRS[::2], ids=lambda v: v if isinstance(v, str) else None)
def test_lenient_one_position_law_is_bounded(name, p, q, lenience):
    """With lenience l no token is sampled with probability above p(x) / l (A.5)."""
    law = one_position_law(p, q, lenience)
    assert (law >= 0).all()
    assert (law <= p / lenience + 1e-9).all(), (law, p / lenience)
    torch.testing.assert_close(law.sum(), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-9)
    torch.testing.assert_close(law, reference.one_position_law(p, q, lenience), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,p,q", PAIRS[::2], ids=lambda v: v if isinstance(v, str) else None)
def test_lenience_one_is_exact(name, p, q):
    torch.testing.assert_close(one_position_law(p, q, 1.0), one_position_law(p, q), rtol=0, atol=0)
    torch.testing.assert_close(one_position_law(p, q, 1.0), p, rtol=0, atol=ATOL)


def test_lenience_changes_the_law():
    """Lenience < 1 really is lenient: with p != q the law moves towards q (else the bound above is vacuous)."""
    p = torch.tensor([0.7, 0.2, 0.1], dtype=F64)
    q = torch.tensor([0.1, 0.2, 0.7], dtype=F64)
    law = one_position_law(p, q, 0.5)
    # a(2) = min(1, 0.1 / 0.35) = 2/7, so x = 2 is emitted w.p. 0.7 * 2/7 = 0.2 = 2 p(2).
    torch.testing.assert_close(law, torch.tensor([0.6, 0.2, 0.2], dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("lenience", [0.5, 0.1])
def test_lenient_steps_match_reference(lenience):
    """Chained lenient Algorithm 1 steps through speculant's verify equal the reference's law, and the
    first token's law stays below p(x) / l."""
    target, draft = markov.target_and_draft(3, 21, independent_draft=True)
    config = (1.0, 0, 1.0)
    got = markov.speculative_law(target, draft, PROMPT, 3, 2, *config, lenience=lenience, verify=sampling.verify)
    want = markov.speculative_law(target, draft, PROMPT, 3, 2, *config, lenience=lenience)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    first = markov.marginal(got, [0])
    p_first = markov.marginal(markov.continuation_law(target, PROMPT, 1, *config), [0])
    assert (first <= p_first / lenience + 1e-9).all()
    assert (got - markov.continuation_law(target, PROMPT, 3, *config)).abs().max() > 1e-3


def test_verify_greedy_lenience_on_tables():
    """Temperature 0 through verify: l = 1 accepts exactly when the draft token is argmax p; l < 1
    accepts when p(x) >= l max p, with p = softmax(logits); the next token is argmax p."""
    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        vocab = 3 + trial % 4
        logits = torch.randn(4, vocab, generator=gen, dtype=F64) * 1.5
        tokens = torch.randint(0, vocab, (3,), generator=gen)
        q = torch.nn.functional.one_hot(tokens, vocab).to(F64)
        soft = torch.softmax(logits, -1)
        for lenience in (1.0, 0.9, 0.5, 0.1):
            accept, next_dist = sampling.verify(logits, q, tokens, temperature=0.0, lenience=lenience)
            for i, x in enumerate(tokens.tolist()):
                if lenience == 1.0:
                    want = x == int(logits[i].argmax())
                else:
                    want = bool(soft[i, x] >= lenience * soft[i].max())
                assert float(accept[i]) == float(want), (trial, lenience, i)
            assert torch.equal(next_dist.to(F64).argmax(-1), logits.argmax(-1))
            assert torch.equal(next_dist.to(F64).max(-1).values, torch.ones(4, dtype=F64))
