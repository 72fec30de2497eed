"""Fuzzing with hypothesis: the sampling math against tests/support/reference.py, and the public API's argument checks.

Sampling (notation of the paper: p = target, q = draft, l = lenience): logits with -inf masks, huge magnitudes,
argmax ties, float64 / float32 / float16 / bfloat16, vocabularies from 1, every top-k and top-p edge. Checked:
standardize equals the reference (float64: the same support and values; below float64 the engine works in
float32, whose rounding of (logits - max) / T may tie two values: the reference then gets those float32 values),
acceptance in [0, 1], residual rows that sum to 1, no token with p = 0 ever sampled, and the lenience bound
P(y) <= p(y) / l on the output law built from verify.

API: every argument of SpeculativeDecoder, generate, speculant.generate, load and sweep, one at a time, takes
random types and values; the call either works or raises what the docstrings document (ValueError naming the
argument; FileNotFoundError for a missing path), never anything else, and does a bounded amount of work: what it
generated, counted in its own stats, stays within the tiny models' context whatever the value (a hang detector
per call reports one that never ends).

Deterministic in CI: derandomize=True (examples derived from each test's name), no example database, bounded
max_examples.
"""

import contextlib
import faulthandler
import math
import os
import signal
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support import reference
import speculant
from speculant import drafters, sampling, tiny_gpt

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=100,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
API_FUZZ = settings(FUZZ, max_examples=30)  # per argument
LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)
INF = math.inf


# ------------------------------------------------------------------------------------------------
# Strategies: logits, sampling settings, distributions
# ------------------------------------------------------------------------------------------------


@st.composite
def logits(draw, dtypes=(torch.float64, *LOW_PRECISION), max_vocab=9):
    """[n, V] logits of one dtype: small values with many exact ties, arbitrary floats, -inf masks and the dtype's
    largest finite magnitudes; every row keeps at least one finite entry."""
    dtype = draw(st.sampled_from(dtypes))
    n, vocab = draw(st.integers(1, 3)), draw(st.integers(1, max_vocab))
    big = torch.finfo(dtype).max
    element = st.one_of(st.integers(-3, 3).map(float), st.floats(-40, 40, width=16),
                        st.sampled_from([-INF, -INF, big, -big, big / 4]))
    rows = draw(st.lists(st.lists(element, min_size=vocab, max_size=vocab), min_size=n, max_size=n))
    out = torch.tensor(rows, dtype=torch.float64).to(dtype)
    for row in out:
        if torch.isinf(row).all():
            row[draw(st.integers(0, vocab - 1))] = 0.0
    return out


@st.composite
def settings_for(draw, vocab: int):
    """(temperature, top_k, top_p): argmax, tiny to large temperatures; top_k 0, 1, V - 1, V, V + 1 and beyond;
    top_p at 1, just below 1, tiny and anywhere in (0, 1)."""
    temperature = draw(st.one_of(st.sampled_from([0.0, 1.0, 0.5, 2.0, 1e-3, 1e-30, 1e3]),
                                 st.floats(1e-3, 10.0)))
    top_k = draw(st.one_of(st.sampled_from([0, 1, max(vocab - 1, 0), vocab, vocab + 1, 2**62]),
                           st.integers(0, vocab + 2)))
    top_p = draw(st.one_of(st.sampled_from([1.0, math.nextafter(1.0, 0.0), 0.5, 1e-44, 1e-300, 5e-324]),
                           st.floats(5e-324, 1.0)))
    return temperature, top_k, top_p


def engine_values(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """The float32 values the engine standardizes below float64: (logits - row max) / T, rounded to float32
    (the law is unchanged by the shift; rounding may tie two logits, which the reference then sees too)."""
    x = x.to(torch.float32)
    x = x - x.amax(-1, keepdim=True)
    return x if temperature in (0.0, 1.0) else x / temperature


def near_top_p_boundary(x: torch.Tensor, top_k: int, top_p: float) -> bool:
    """Whether top_p lies within float32 rounding of the mass of some most-probable set (after top-k), where
    float32 and float64 may keep different sets."""
    if top_p >= 1.0:
        return False
    probs = reference.standardize(x, 1.0, top_k, 1.0)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    return bool(((sorted_probs.cumsum(-1) - sorted_probs - top_p).abs() < 1e-5).any())


@st.composite
def distributions(draw, n: int, vocab: int, dtype=torch.float64):
    """[n, V] probability rows with exact zeros, point masses and tiny entries."""
    weight = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0), st.sampled_from([1e-30, 1e-300]))
    rows = draw(st.lists(st.lists(weight, min_size=vocab, max_size=vocab), min_size=n, max_size=n))
    x = torch.tensor(rows, dtype=torch.float64)
    x[x.sum(-1) == 0, draw(st.integers(0, vocab - 1))] = 1.0
    return (x / x.sum(-1, keepdim=True)).to(dtype)


# ------------------------------------------------------------------------------------------------
# standardize (§2.2) and sample
# ------------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data(), x=logits())
@example(data=None, x=torch.tensor([[0.0]]))  # vocabulary 1
def test_standardize_matches_reference(data, x):
    temperature, top_k, top_p = data.draw(settings_for(x.shape[1])) if data else (1.0, 1, 0.5)
    got = sampling.standardize(x, temperature=temperature, top_k=top_k, top_p=top_p)
    assert got.shape == x.shape and got.dtype == (torch.float64 if x.dtype == torch.float64 else torch.float32)
    assert torch.isfinite(got).all() and (got >= 0).all()
    torch.testing.assert_close(got.sum(-1).double(), torch.ones(x.shape[0], dtype=torch.float64), rtol=0,
                               atol=1e-12 if x.dtype == torch.float64 else 1e-5)
    assert (got[x == -INF] == 0).all(), "a masked (-inf) token has probability > 0"
    if x.dtype == torch.float64:
        want = reference.standardize(x, temperature, top_k, top_p)
        assert torch.equal(got > 0, want > 0)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        return
    values = engine_values(x, temperature)
    want = reference.standardize(values, temperature if temperature == 0 else 1.0, top_k, top_p)
    if temperature == 0 or not near_top_p_boundary(values, top_k, top_p):
        assert torch.equal(got > 0, want > 0)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)


def test_top_p_below_the_float32_range_keeps_the_mode():
    for dtype in LOW_PRECISION:
        for top_p in (1e-46, 1e-300, 5e-324):
            x = torch.tensor([[0.0, -1.0, 2.0, 1.0]], dtype=dtype)
            assert torch.equal(sampling.standardize(x, top_p=top_p), torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_float64_logits_beyond_the_float32_range():
    for big in (1e39, 1e300, torch.finfo(torch.float64).max):
        x = torch.tensor([[big, 0.0, -big]], dtype=torch.float64)
        assert torch.equal(sampling.standardize(x), reference.standardize(x))


@FUZZ
@given(data=st.data(), x=logits(), seed=st.integers(0, 2**64 - 1))
def test_no_token_with_zero_probability_is_ever_sampled(data, x, seed):
    temperature, top_k, top_p = data.draw(settings_for(x.shape[1]))
    probs = sampling.standardize(x, temperature=temperature, top_k=top_k, top_p=top_p)
    rows = probs.repeat(64, 1)  # [64 n, V]
    for table in (rows, rows.to(x.dtype)):  # the engine's probabilities, and the same in the logits' dtype
        drawn = sampling.sample(table, seed)
        assert (table.gather(1, drawn[:, None]) > 0).all(), "a token of probability 0 was sampled"
        assert not (x.repeat(64, 1).gather(1, drawn[:, None]) == -INF).any(), "a masked token was sampled"


@FUZZ
@given(x=logits(max_vocab=5), bad=st.sampled_from([math.nan, INF]), where=st.integers(0, 4))
def test_nan_or_positive_infinity_raises_value_error(x, bad, where):
    x = x.clone()
    x[0, where % x.shape[1]] = bad
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        sampling.standardize(x)


# ------------------------------------------------------------------------------------------------
# acceptance (§2.3, A.5), residual (§2.3), verify (Algorithm 1) and the lenience bound
# ------------------------------------------------------------------------------------------------

LENIENCE = st.one_of(st.sampled_from([1.0, 0.5, 1e-3, 1e-300]), st.floats(0.0, 1.0, exclude_min=True))
PROBABILITY = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0.0, 1.0))


@FUZZ
@given(p=st.lists(PROBABILITY, min_size=1, max_size=8), q=st.lists(PROBABILITY, min_size=8, max_size=8),
       lenience=LENIENCE, dtype=st.sampled_from([torch.float64, torch.float32]))
def test_acceptance_in_unit_interval_and_matches_reference(p, q, lenience, dtype):
    """Probabilities of normal magnitude (0 or >= the dtype's smallest normal number, and l q too): see
    test_acceptance_with_subnormal_or_half_precision_inputs for the others."""
    tiny = torch.finfo(dtype).tiny
    p_x = torch.tensor(p, dtype=torch.float64).to(dtype)
    q_x = torch.tensor(q[:len(p)], dtype=torch.float64).to(dtype)
    p_x[p_x < tiny] = 0.0
    q_x[q_x.double() * lenience < tiny] = 0.0
    got = sampling.acceptance_probability(p_x, q_x, lenience=lenience)
    assert ((got >= 0) & (got <= 1)).all(), got
    want = reference.acceptance_probability(p_x.double(), q_x.double(), lenience)
    torch.testing.assert_close(got.double(), want, rtol=1e-6 if dtype == torch.float32 else 1e-15, atol=0)


@FUZZ
@given(p=st.lists(st.sampled_from([0.0, 1e-45, 1e-40, 1e-310, 6e-8, 0.5]), min_size=1, max_size=6),
       q=st.lists(st.sampled_from([0.0, 1e-45, 1e-40, 1e-310, 6e-8, 0.5]), min_size=6, max_size=6),
       lenience=LENIENCE, dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
@example(p=[0.0], q=[0.0] * 6, lenience=1.0, dtype=torch.float16)
def test_acceptance_with_subnormal_or_half_precision_inputs(p, q, lenience, dtype):
    p_x = torch.tensor(p, dtype=torch.float64).to(dtype)
    q_x = torch.tensor(q[:len(p)], dtype=torch.float64).to(dtype)
    got = sampling.acceptance_probability(p_x, q_x, lenience=lenience)
    want = reference.acceptance_probability(p_x.double(), q_x.double(), lenience)
    # a subnormal result is rounded to the output dtype's spacing there (float32: 1.4e-45)
    spacing = 1e-44 if got.dtype == torch.float32 else 1e-322
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=spacing)


@FUZZ
@given(data=st.data(), vocab=st.integers(1, 9), n=st.integers(1, 4),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]))
def test_residual_rows_are_distributions_within_p_support(data, vocab, n, dtype):
    p = data.draw(distributions(n, vocab, dtype))
    q = data.draw(st.one_of(distributions(n, vocab, dtype), st.just(p.clone())))
    got = sampling.residual(p, q)
    atol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    assert torch.isfinite(got).all() and (got >= 0).all()
    torch.testing.assert_close(got.double().sum(-1), p.double().sum(-1), rtol=0, atol=atol)
    assert (got[p == 0] == 0).all(), "the residual gives mass to a token with p = 0"
    torch.testing.assert_close(got.double(), reference.residual(p, q), rtol=0, atol=atol)


def output_law(x: torch.Tensor, q: torch.Tensor, config: tuple, lenience: float) -> torch.Tensor:
    """One speculative step's law of the emitted token, from the engine's verify for every draft token x:
    P(y) = sum_x q(x) [a(x) 1{y = x} + (1 - a(x)) r(y)]. x [2, V] target logits, q [1, V]."""
    temperature, top_k, top_p = config
    law = torch.zeros(x.shape[1], dtype=torch.float64)
    for token in range(x.shape[1]):
        if q[0, token] == 0:
            continue
        accept, next_dist = sampling.verify(x, q, torch.tensor([token]), temperature=temperature, top_k=top_k,
                                            top_p=top_p, lenience=lenience)
        a = float(accept[0])
        assert 0 <= a <= 1, a
        assert torch.isfinite(next_dist).all() and (next_dist >= 0).all()
        torch.testing.assert_close(next_dist.double().sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-5)
        law[token] += float(q[0, token]) * a
        law += float(q[0, token]) * (1 - a) * next_dist[0].double()
    return law


@FUZZ
@given(data=st.data(), x=logits(dtypes=(torch.float64, torch.float32)), lenience=LENIENCE)
def test_verify_matches_reference_and_keeps_the_lenience_bound(data, x, lenience):
    vocab = x.shape[1]
    x = torch.cat([x, x.flip(0)])[:2]  # [2, V]: gamma = 1
    temperature, top_k, top_p = data.draw(settings_for(vocab))
    temperature = temperature or 1.0  # the bound is for sampling; argmax: test_verify_greedy_matches_reference
    draft_logits = data.draw(logits(dtypes=(x.dtype,), max_vocab=vocab).filter(lambda d: d.shape[1] == vocab))
    q = sampling.standardize(draft_logits[:1], temperature=temperature, top_k=top_k, top_p=top_p)
    token = int(sampling.sample(q, data.draw(st.integers(0, 2**32)))[0])
    accept, next_dist = sampling.verify(x, q, torch.tensor([token]), temperature=temperature, top_k=top_k,
                                        top_p=top_p, lenience=lenience)
    if x.dtype == torch.float64:
        want_accept, want_next = reference.verify(x, q, [token], temperature, top_k, top_p, lenience)
        torch.testing.assert_close(accept, want_accept, rtol=1e-12, atol=1e-300)
        torch.testing.assert_close(next_dist, want_next, rtol=0, atol=1e-12)
    p = sampling.standardize(x, temperature=temperature, top_k=top_k, top_p=top_p)[0].double()
    law = output_law(x, q, (temperature, top_k, top_p), lenience)
    torch.testing.assert_close(law.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-5)
    assert (law[p == 0] == 0).all(), "the output law gives mass to a token with p = 0"
    assert (law <= p / lenience + 1e-5).all(), (law, p, lenience)
    if lenience == 1.0:
        torch.testing.assert_close(law, p, rtol=0, atol=1e-5)  # exact (Theorem 3.5's premise, A.1)


@FUZZ
@given(data=st.data(), x=logits(dtypes=(torch.float64, torch.float32)), lenience=LENIENCE)
def test_verify_greedy_matches_reference(data, x, lenience):
    vocab = x.shape[1]
    x = torch.cat([x, x.flip(0)])[:2]
    token = data.draw(st.integers(0, vocab - 1))
    q = torch.nn.functional.one_hot(torch.tensor([token]), vocab).to(x.dtype)
    accept, next_dist = sampling.verify(x, q, torch.tensor([token]), temperature=0.0, lenience=lenience)
    want_accept, want_next = reference.verify(x, q, [token], 0.0, 0, 1.0, lenience)
    margin = float(x[0, token].double() - x[0].double().max())
    if abs(margin - math.log(lenience)) > 1e-5:  # away from float rounding of the A.5 threshold
        assert accept.tolist() == want_accept.tolist()
    assert torch.equal(next_dist.double(), want_next)


@FUZZ
@given(vocab=st.integers(1, 6), token=st.one_of(st.integers(-2**63, -1), st.integers(6, 2**63 - 1)))
def test_verify_rejects_draft_tokens_outside_the_vocabulary(vocab, token):
    with pytest.raises(ValueError, match="draft_tokens"):
        sampling.verify(torch.zeros(2, vocab), torch.full((1, vocab), 1 / vocab), torch.tensor([token]))


# ------------------------------------------------------------------------------------------------
# The public API: random arguments raise only the documented exceptions, naming the argument
# ------------------------------------------------------------------------------------------------

ODD = [object(), torch.float32, torch.device("cpu"), np.int64(3), np.float32(0.5), np.array([1, 2]),
       np.array(2.5), 1 + 2j, Fraction(1, 2), Decimal("0.5"), math.nan, INF, -INF, 2**63, 2**64, -2**63 - 1,
       10**400, slice(1), Ellipsis, b"\x00", "\x00", "", "cpu", "cuda:0", "float16", [[]], [[1, 2]], {}, set(),
       torch.tensor([1, 2]), torch.tensor(1.5), torch.zeros(1, 2, dtype=torch.long), torch.empty(0)]
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6), st.binary(max_size=6),
    st.lists(st.integers(-2, 40), max_size=4), st.tuples(st.floats()), st.sampled_from(ODD),
    st.dictionaries(st.sampled_from(["input_ids", "attention_mask", "x"]), st.lists(st.integers(0, 3), max_size=3),
                    max_size=2),
)
# A hang detector only, never a bound on the work (that is counted: bounded_work): a call that validates, or
# generates a few tokens from the tiny models, takes milliseconds, a loop sized by a huge value hours or ever.
HANG = 120
CONTEXT = 32  # the tiny models' max_length (the pair fixture): no generation holds more tokens


@pytest.fixture(scope="module", autouse=True)
def empty_directory(tmp_path_factory):
    """Random relative paths (load's model, a target given as a string) resolve in an empty directory."""
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(cwd)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = tiny_gpt.TinyGPTConfig(32, 1, 1, 8, 32)
    return [speculant.load(tiny_gpt.script_cached(tiny_gpt.TinyGPT(config).eval())) for _ in range(2)]


class Hung(BaseException):
    """Raised by hang_detector (a BaseException: no ``except Exception`` on the way swallows it)."""


@contextlib.contextmanager
def hang_detector(what: str):
    """Fails the test when the body is still running after HANG seconds: SIGALRM raises Hung where Python runs
    (the engine runs Python's signal handlers before every model call, cpp/loop/interrupt.h), and where none runs
    (a C++ loop that never returns) faulthandler dumps every thread's stack and ends the process at 2 * HANG
    (under pytest's capture the dump shows with -s). It bounds no work: it fires only on a real hang."""
    def hung(signum, frame):
        raise Hung(f"{what}: still running after {HANG} s, a hang")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, HANG)
    faulthandler.dump_traceback_later(2 * HANG, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def bounded_work(out, what: str) -> None:
    """What a call returned did a bounded amount of work, by its own counts: every generation (a Result, a batch
    of them, or a sweep's rows, which sum their prompts' and ran at most 3 timed rounds) made at most CONTEXT
    tokens per prompt in at most CONTEXT target calls, drafted fewer than CONTEXT tokens per target call, and
    sized its per-position counts by what it could draft, not by an argument. A value that sized or looped the
    work (a gamma of 2^62 drafted, a per-position table of max_gamma entries, a float taken for a count of
    rounds) fails here, or, where the call never ends, in hang_detector; no machine's load changes a count."""
    if type(out).__name__ == "DataFrame":  # a sweep's rows
        prompts = out.attrs["prompts"]
        assert out.attrs["repeats"] <= 3, f"{what}: {out.attrs['repeats']} timed rounds"
        assert (out.new_tokens <= prompts * CONTEXT).all() and (out.target_calls <= prompts * CONTEXT).all(), what
        assert (out.draft_calls <= CONTEXT * out.target_calls).all(), what
        return
    for result in out if isinstance(out, list) else [out]:
        if not isinstance(result, speculant.Result):
            continue  # a loaded model: nothing generated
        stats = result.stats
        assert stats.new_tokens <= CONTEXT and stats.target_calls <= CONTEXT, f"{what}: {stats.as_dict()}"
        assert stats.draft_calls <= CONTEXT * stats.target_calls, f"{what}: {stats.as_dict()}"
        assert len(stats.drafted_per_position) <= CONTEXT, f"{what}: {len(stats.drafted_per_position)} positions"


def only_documented(call, name, value, allowed=(ValueError,)):
    """Runs call(); an exception must be one of `allowed` and name the argument (`name`, or one of a tuple of
    names); what it returns must have done a bounded amount of work (bounded_work), and it must end
    (hang_detector)."""
    what = f"{name}={value!r}"
    try:
        with hang_detector(what), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sweep's noisy-timing warnings; not what this checks
            out = call()
    except allowed as error:
        names = name if isinstance(name, tuple) else (name,)
        assert any(n in str(error) for n in names), f"{what}: the message does not name {name}: {error}"
        return
    except Hung as error:
        pytest.fail(str(error))
    except Exception as error:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what} raised {type(error).__name__}: {error}")
    bounded_work(out, what)


DECODER_ARGS = ["target", "draft", "gamma", "temperature", "top_k", "top_p", "lenience", "device", "dtype",
                "cuda_graphs"]
GAMMA = st.one_of(st.integers(-3, 2**63 - 1), ANYTHING)


# A valid but large count of timed rounds runs that long.
REPEATS = ANYTHING.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v <= 3)


def argument(name: str):
    return {"gamma": GAMMA, "gammas": GAMMA, "max_gamma": GAMMA, "repeats": REPEATS}.get(
        name, ANYTHING)


@pytest.mark.parametrize("name", DECODER_ARGS)
@API_FUZZ
@given(data=st.data())
def test_decoder_arguments(pair, name, data):
    value = data.draw(argument(name))
    target, draft = pair
    kwargs = {"target": target, "draft": draft, name: value}
    # A path names the file ("model: ..."); anything else names the argument.
    named = "model" if name in ("target", "draft") and isinstance(value, (str, bytes)) else name
    only_documented(lambda: speculant.SpeculativeDecoder(**kwargs).generate([1, 2], max_new_tokens=3, seed=0),
                    named, value, (ValueError, FileNotFoundError))


GENERATE_ARGS = ["prompt_ids", "max_new_tokens", "input_ids", "encoder_input_ids", "eos_token_id", "seed",
                 "profile", "gamma_policy", "max_gamma", "cost", "do_sample", "temperature", "top_k", "top_p",
                 "tokenizer"]


@pytest.mark.parametrize("name", GENERATE_ARGS)
@API_FUZZ
@given(data=st.data())
def test_generate_arguments(pair, name, data):
    value = data.draw(argument(name))
    decoder = speculant.SpeculativeDecoder(*pair, gamma=2)
    kwargs = {"prompt_ids": [1, 2], "max_new_tokens": 3, "seed": 0, name: value}
    if name == "input_ids":
        kwargs.pop("prompt_ids")
    if name == "max_gamma":
        kwargs.update(gamma_policy=data.draw(st.sampled_from(["heuristic", "alpha"])), cost=0.1)
    # A prompt that is neither argument is named as prompt_ids; an over-long one as max_length.
    names = {"input_ids": "prompt_ids", "max_new_tokens": "max_"}
    only_documented(lambda: decoder.generate(**kwargs), names.get(name, name), value)
    if name in ("prompt_ids", "max_new_tokens", "temperature", "top_k", "top_p", "do_sample", "seed"):
        plain = {k: v for k, v in kwargs.items()}
        only_documented(lambda: speculant.generate(pair[0], **plain), names.get(name, name), value)


LOAD_ARGS = ["model", "device", "dtype", "vocab_size"]


@pytest.mark.parametrize("name", LOAD_ARGS)
@API_FUZZ
@given(data=st.data())
def test_load_arguments(pair, name, data):
    value = data.draw(ANYTHING)
    kwargs = {"model": pair[0], name: value} if name != "model" else {"model": value}
    only_documented(lambda: speculant.load(**kwargs), name, value, (ValueError, FileNotFoundError))


SWEEP_ARGS = ["prompts", "gammas", "temperatures", "lenience", "top_k", "top_p", "max_new_tokens", "seed",
              "repeats", "spread_threshold", "progress", "generate_kwargs"]


@pytest.mark.parametrize("name", SWEEP_ARGS)
@API_FUZZ
@given(data=st.data())
def test_sweep_arguments(pair, name, data):
    pytest.importorskip("pandas")
    if name == "generate_kwargs":
        value = data.draw(st.one_of(ANYTHING, st.dictionaries(st.sampled_from(GENERATE_ARGS), ANYTHING, max_size=2)))
    else:
        value = data.draw(st.one_of(argument(name), st.lists(argument(name), max_size=2))
                          if name in ("gammas", "top_p") else argument(name))
    kwargs = {"prompts": [[1, 2]], "gammas": [1], "max_new_tokens": 2, "repeats": 1, "progress": False, name: value}
    names = {"prompts": "prompt", "max_new_tokens": "max_", "gammas": "gamma", "temperatures": "temperature"}
    allowed = (ValueError, TypeError) if name == "generate_kwargs" else (ValueError,)
    call = lambda: speculant.sweep(*pair, **kwargs)  # noqa: E731
    if name == "generate_kwargs" and isinstance(value, dict) and value:
        names[name] = tuple(value)  # the message names the keyword that is wrong
    only_documented(call, names.get(name, name), value, allowed)


def test_huge_gamma_drafts_at_most_the_tokens_still_wanted(pair):
    """No iteration drafts more than max_new_tokens - 1 tokens, so a huge gamma costs nothing extra."""
    for policy in ("fixed", "heuristic", "alpha"):
        result = speculant.SpeculativeDecoder(*pair, gamma=2**62).generate(
            [1, 2], max_new_tokens=5, seed=0, gamma_policy=policy, cost=0.1)
        assert len(result.tokens) == 5 and len(result.stats.drafted_per_position) <= 4


def test_huge_max_gamma_is_handled_promptly(pair):
    """Nothing is sized or looped by max_gamma: at 2^40 an allocation or a pass over it would fail (MemoryError,
    or a per-position table of 2^40 entries) or run for hours (hang_detector ends it). Counted, not timed: the
    generation drafts what the tokens still wanted allow (none for one token; at most 7 per iteration for 8), the
    same work as at max_gamma 8, since those bound max_gamma first (cpp/drafting/gamma_policy.h)."""
    decoder = speculant.SpeculativeDecoder(*pair, gamma=1)
    with hang_detector("max_gamma=2**40"):
        result = decoder.generate([1, 2], max_new_tokens=1, seed=0, gamma_policy="alpha", cost=0.1, max_gamma=2**40)
        assert len(result.stats.drafted_per_position) <= 1 and result.stats.draft_calls == 0
        assert result.stats.target_calls == 1
        longer = decoder.generate([1, 2], max_new_tokens=8, seed=0, gamma_policy="alpha", cost=0.1, max_gamma=2**40)
        capped = decoder.generate([1, 2], max_new_tokens=8, seed=0, gamma_policy="alpha", cost=0.1, max_gamma=8)
    assert len(longer.stats.drafted_per_position) <= 7 and longer.stats.draft_calls <= 7 * longer.stats.target_calls
    assert (longer.tokens, longer.stats.target_calls, longer.stats.draft_calls) == \
        (capped.tokens, capped.stats.target_calls, capped.stats.draft_calls)
