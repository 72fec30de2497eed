"""The engine's contract: determinism, statistics, stopping, model loading and every error the spec names.

Notation (paper §2): p = target, q = draft, γ = draft length, α = E[Σ min(p, q)] (Corollary 3.6).
Models are Markov tables (tests/support/markov.py) unless stated otherwise.
"""

import math

import pytest
import torch

from support import markov
import speculant
from support.engine_checks import VOCAB, check_stats, load_pair, poisoned_table, vars_of
from speculant import tiny_gpt

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

PROMPT = [1, 2, 3]


def decoder(gamma: int = 3, *, seed: int = 1, forms=("cached", "cached"), vocab: int = VOCAB,
            draft_scale: float = 0.7, **sampling):
    target, draft = load_pair(seed, vocab=vocab, forms=forms, concentration=3.0, draft_scale=draft_scale)
    return speculant.SpeculativeDecoder(target, draft, gamma=gamma, **sampling)


# ------------------------------------------------------------------------------------------------
# Determinism
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("forms", [("cached", "cached"), ("plain", "plain"), ("cached", "plain")])
def test_same_seed_same_tokens_different_seed_different_tokens(forms):
    """High-entropy model (V = 16, near-uniform rows): 32 tokens from two seeds coincide w.p. ~1e-38."""
    spec = decoder(3, forms=forms, vocab=16, temperature=1.0)
    a = spec.generate(PROMPT, max_new_tokens=32, seed=5)
    b = spec.generate(PROMPT, max_new_tokens=32, seed=6)  # in between: the caches must be reset
    a_again = spec.generate(PROMPT, max_new_tokens=32, seed=5)
    assert a.tokens == a_again.tokens
    assert [vars_of(it) for it in a.trace] == [vars_of(it) for it in a_again.trace]
    assert a.tokens != b.tokens
    assert len({tuple(spec.generate(PROMPT, max_new_tokens=32, seed=s).tokens) for s in range(10, 15)}) == 5


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_model_forms_agree_token_for_token(gamma):
    """Markov logits are table lookups, bit-identical in both contract forms, and the seed fixes every
    random draw: the cached form (with cache rollback) must then produce exactly the tokens of the plain
    form (no cache at all), in sampling mode, for every seed."""
    outputs = {}
    for forms in [("cached", "cached"), ("plain", "plain"), ("cached", "plain"), ("plain", "cached")]:
        spec = decoder(gamma, forms=forms, vocab=6, temperature=0.9, top_k=5, draft_scale=1.0)
        outputs[forms] = [spec.generate([4, 0], max_new_tokens=40, seed=s).tokens for s in range(6)]
    first = next(iter(outputs.values()))
    assert all(out == first for out in outputs.values())


def test_plain_generate_is_deterministic():
    target = speculant.load(markov.cached_model(markov.random_table(16, 3, concentration=3.0)))
    runs = [speculant.generate(target, PROMPT, max_new_tokens=32, seed=s).tokens for s in (7, 8, 7)]
    assert runs[0] == runs[2] and runs[0] != runs[1]


def test_seed_none_is_reported_and_replays():
    spec = decoder(2, vocab=16)
    first = spec.generate(PROMPT, max_new_tokens=24)
    second = spec.generate(PROMPT, max_new_tokens=24)
    assert isinstance(first.stats.seed, int) and first.stats.seed != second.stats.seed
    assert spec.generate(PROMPT, max_new_tokens=24, seed=first.stats.seed).tokens == first.tokens
    assert spec.generate(PROMPT, max_new_tokens=24, seed=123).stats.seed == 123


# ------------------------------------------------------------------------------------------------
# Statistics and trace
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 2, 5, 8])
@pytest.mark.parametrize("forms", [("cached", "cached"), ("plain", "cached"), ("cached", "plain")])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_stats_are_consistent(gamma, forms, temperature):
    target, draft = load_pair(2, forms=forms, draft_scale=1.0)
    spec = speculant.SpeculativeDecoder(target, draft, gamma=gamma, temperature=temperature)
    for max_new_tokens in (1, 2, 7, 30):
        for seed in range(4):
            result = spec.generate(PROMPT, max_new_tokens=max_new_tokens, seed=seed)
            check_stats(result, gamma, max_new_tokens, seed=seed)
    # EOS: choose the token generated at index 4 of an unstopped run.
    full = spec.generate(PROMPT, max_new_tokens=30, seed=11).tokens
    eos = full[4]
    result = spec.generate(PROMPT, max_new_tokens=30, eos_token_id=eos, seed=11)
    check_stats(result, gamma, 30, eos=eos, seed=11)
    assert result.tokens == full[: full.index(eos) + 1]


def test_plain_generate_stats():
    target = speculant.load(markov.cached_model(markov.random_table(VOCAB, 4)))
    result = speculant.generate(target, PROMPT, max_new_tokens=12, seed=3)
    assert len(result.tokens) == result.stats.new_tokens == 12
    assert result.stats.target_calls == 12 and result.stats.draft_calls == 0
    assert result.stats.tokens_per_target_call == pytest.approx(1.0)
    assert math.isnan(result.stats.acceptance_rate) and math.isnan(result.stats.alpha)
    assert result.stats.seed == 3


def test_max_new_tokens_zero():
    spec = decoder(3)
    result = spec.generate(PROMPT, max_new_tokens=0, seed=1)
    assert result.tokens == [] and len(result.trace) == 0
    assert result.stats.new_tokens == 0 and result.stats.target_calls == 0 and result.stats.draft_calls == 0
    assert math.isnan(result.stats.alpha)
    target = speculant.load(markov.cached_model(markov.random_table(VOCAB, 4)))
    assert speculant.generate(target, PROMPT, max_new_tokens=0).tokens == []


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("gamma", [1, 4])
def test_eos_stops_and_is_included(gamma, temperature):
    """With the same seed, a run with eos_token_id is the unstopped run cut just after the first EOS,
    whether the EOS is an accepted draft token, a correction or a bonus token."""
    spec = decoder(gamma, temperature=temperature, draft_scale=0.5)
    target = spec.target
    for seed in range(8):
        full = spec.generate(PROMPT, max_new_tokens=30, seed=seed).tokens
        for position in (0, 3, 9):
            eos = full[position]
            want = full[: full.index(eos) + 1]
            result = spec.generate(PROMPT, max_new_tokens=30, eos_token_id=eos, seed=seed)
            assert result.tokens == want and result.stats.new_tokens == len(want)
            check_stats(result, gamma, 30, eos=eos, seed=seed)
        plain_full = speculant.generate(target, PROMPT, max_new_tokens=30, temperature=temperature, seed=seed)
        eos = plain_full.tokens[5]
        plain = speculant.generate(target, PROMPT, max_new_tokens=30, temperature=temperature, seed=seed,
                                   eos_token_id=eos)
        assert plain.tokens == plain_full.tokens[: plain_full.tokens.index(eos) + 1]


@pytest.mark.parametrize("gamma", [1, 4])
def test_several_eos_ids_stop_at_the_first_of_any(gamma):
    """eos_token_id as a list (Llama 3 has several): the run is the unstopped run cut just after the first token
    that is any of them; a tensor or tuple of ids is the same list, and each id is checked."""
    spec = decoder(gamma, draft_scale=0.5)
    for seed in range(6):
        full = spec.generate(PROMPT, max_new_tokens=30, seed=seed).tokens
        stops = [full[9], full[3]]
        want = full[: min(full.index(e) for e in stops) + 1]
        for ids in (stops, tuple(stops), torch.tensor(stops)):
            result = spec.generate(PROMPT, max_new_tokens=30, eos_token_id=ids, seed=seed)
            assert result.tokens == want and result.stats.new_tokens == len(want)
    for bad, name in (([2, VOCAB], "eos_token_id"), ([], "eos_token_id"), ([1, -1], r"eos_token_id\[1\]"),
                      (torch.tensor([[1]]), "eos_token_id"), (1.0, "eos_token_id")):
        with pytest.raises(ValueError, match=name):
            spec.generate(PROMPT, max_new_tokens=3, eos_token_id=bad)


def test_alpha_iid_equals_sum_of_min():
    """Every context has the same p and q: alpha = Σ_x min(p, q) exactly (Corollary 3.6)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(VOCAB, generator=gen, dtype=torch.float64) + 0.1
    q = torch.rand(VOCAB, generator=gen, dtype=torch.float64) + 0.1
    p, q = p / p.sum(), q / q.sum()
    target = markov.constant_table(p)
    draft = markov.constant_table(q)
    spec = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(target)), speculant.load(markov.plain_model(draft)), gamma=4
    )
    result = spec.generate(PROMPT, max_new_tokens=40, seed=0)
    want = float(torch.minimum(reference_probs(target), reference_probs(draft)).sum())
    assert result.stats.alpha == pytest.approx(want, abs=1e-6)


def reference_probs(table: torch.Tensor) -> torch.Tensor:
    return torch.softmax(table[0, 0, 0].to(torch.float32).to(torch.float64), -1)


def test_tiny_temperature_is_greedy():
    """temperature = 1e-40 is valid (finite, > 0); logits / T overflow float32, but the law is argmax:
    the output must equal temperature-0 decoding, not NaN-driven garbage."""
    spec = decoder(2, temperature=1e-40)
    greedy = decoder(2, temperature=0.0)
    want = greedy.generate(PROMPT, max_new_tokens=12).tokens
    assert spec.generate(PROMPT, max_new_tokens=12, seed=0).tokens == want
    assert speculant.generate(spec.target, PROMPT, max_new_tokens=12, temperature=1e-40, seed=0).tokens == want


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_identical_draft_is_always_accepted(temperature):
    """Draft = target (loaded twice, each handle owns its cache): p = q so every draft is accepted,
    alpha = 1 and each iteration yields γ + 1 tokens."""
    table = markov.random_table(VOCAB, 9, mask_prob=0.2)
    spec = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(table)), speculant.load(markov.cached_model(table)),
        gamma=3, temperature=temperature, top_k=4,
    )
    result = spec.generate(PROMPT, max_new_tokens=41, seed=2)
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.alpha == pytest.approx(1.0, abs=1e-6)
    assert all(it.bonus for it in result.trace)
    assert result.stats.target_calls == 41 // 4 + (41 % 4 > 0)


# ------------------------------------------------------------------------------------------------
# Models: loading and properties
# ------------------------------------------------------------------------------------------------


def test_model_properties(tmp_path):
    table = markov.random_table(VOCAB, 1)
    cached = speculant.load(markov.cached_model(table, max_length=50))
    assert (cached.form, cached.vocab_size, cached.max_length) == ("cached", VOCAB, 50)
    assert cached.device == torch.device("cpu")
    unlimited = speculant.load(markov.cached_model(table))
    assert unlimited.max_length is None
    plain = speculant.load(markov.plain_model(table))
    assert (plain.form, plain.vocab_size, plain.max_length) == ("plain", VOCAB, None)
    path = tmp_path / "model.pt"
    torch.jit.save(markov.cached_model(table), str(path))
    assert speculant.load(path).form == "cached"
    assert speculant.load(str(path), device="cpu").vocab_size == VOCAB


class NoVocabPlain(torch.nn.Module):
    """Plain form without a vocab_size attribute: the loader must probe the output width."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(1, input_ids.size(1), 7) + input_ids.unsqueeze(-1).float()


def test_plain_model_without_vocab_size_is_probed():
    model = speculant.load(torch.jit.script(NoVocabPlain()))
    assert model.vocab_size == 7 and model.form == "plain"
    assert len(speculant.generate(model, [1], max_new_tokens=3, seed=0).tokens) == 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_logit_dtypes(dtype):
    table = markov.random_table(VOCAB, 5)
    target = speculant.load(markov.cached_model(table, dtype=dtype))
    draft = speculant.load(markov.plain_model(markov.perturb(table, 1, 0.5), dtype=dtype))
    result = speculant.SpeculativeDecoder(target, draft, gamma=3).generate(PROMPT, max_new_tokens=20, seed=0)
    assert len(result.tokens) == 20
    greedy = speculant.SpeculativeDecoder(target, draft, gamma=3, temperature=0.0).generate(PROMPT, max_new_tokens=20)
    assert greedy.tokens == speculant.generate(target, PROMPT, max_new_tokens=20, temperature=0.0).tokens


def test_max_length_exactly_enough_and_too_small():
    """The cached Markov model raises on any write past max_length, so "exactly enough" proves the engine
    never uses more positions than prompt + max_new_tokens - 1 (the last token is never fed back)."""
    table = markov.random_table(VOCAB, 6)
    needed = len(PROMPT) + 10 - 1
    for gamma in (1, 4, 8):
        target = speculant.load(markov.cached_model(table, max_length=needed))
        draft = speculant.load(markov.cached_model(markov.perturb(table, 2, 0.5), max_length=needed))
        spec = speculant.SpeculativeDecoder(target, draft, gamma=gamma)
        for seed in range(5):
            assert len(spec.generate(PROMPT, max_new_tokens=10, seed=seed).tokens) == 10
        with pytest.raises(ValueError, match="max_length"):
            spec.generate(PROMPT, max_new_tokens=11, seed=0)
    small_draft = speculant.SpeculativeDecoder(
        speculant.load(markov.cached_model(table)),
        speculant.load(markov.cached_model(table, max_length=needed - 1)),
        gamma=2,
    )
    with pytest.raises(ValueError, match="max_length"):
        small_draft.generate(PROMPT, max_new_tokens=10)
    with pytest.raises(ValueError, match="max_length"):
        speculant.generate(speculant.load(markov.cached_model(table, max_length=needed - 1)), PROMPT,
                           max_new_tokens=10)


# ------------------------------------------------------------------------------------------------
# Bad parameters: ValueError naming the parameter
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    return load_pair(3)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=-2), "gamma"),
        (dict(gamma=1, temperature=-1.0), "temperature"),
        (dict(gamma=1, temperature=float("nan")), "temperature"),
        (dict(gamma=1, temperature=float("inf")), "temperature"),
        (dict(gamma=1, top_k=-1), "top_k"),
        (dict(gamma=1, top_p=0.0), "top_p"),
        (dict(gamma=1, top_p=1.5), "top_p"),
        (dict(gamma=1, top_p=float("nan")), "top_p"),
        (dict(gamma=1, lenience=0.0), "lenience"),
        (dict(gamma=1, lenience=1.5), "lenience"),
        (dict(gamma=1, lenience=float("nan")), "lenience"),
    ],
)
def test_decoder_rejects_bad_parameters(pair, kwargs, name):
    with pytest.raises(ValueError, match=name):
        speculant.SpeculativeDecoder(*pair, **kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(prompt_ids=[]), "prompt_ids"),
        (dict(prompt_ids=[1, VOCAB]), "prompt_ids"),
        (dict(prompt_ids=[-1, 2]), "prompt_ids"),
        (dict(eos_token_id=VOCAB), "eos_token_id"),
        (dict(eos_token_id=-1), "eos_token_id"),
    ],
)
def test_generate_rejects_bad_parameters(pair, kwargs, name):
    args = dict(prompt_ids=PROMPT, max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        speculant.generate(pair[0], args.pop("prompt_ids"), **args)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(prompt_ids=[]), "prompt_ids"),
        (dict(prompt_ids=torch.tensor([], dtype=torch.long)), "prompt_ids"),
        (dict(prompt_ids=[1, VOCAB]), "prompt_ids"),
        (dict(prompt_ids=[-1]), "prompt_ids"),
        (dict(prompt_ids=torch.tensor([[[1, 2], [3, 4]]])), "prompt_ids"),
        (dict(eos_token_id=VOCAB), "eos_token_id"),
        (dict(eos_token_id=-3), "eos_token_id"),
    ],
)
def test_speculative_generate_rejects_bad_inputs(pair, kwargs, name):
    spec = speculant.SpeculativeDecoder(*pair, gamma=2)
    args = dict(prompt_ids=PROMPT, max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        spec.generate(args.pop("prompt_ids"), **args)


def test_vocab_mismatch_is_rejected():
    target = speculant.load(markov.cached_model(markov.random_table(5, 1)))
    draft = speculant.load(markov.cached_model(markov.random_table(4, 1)))
    with pytest.raises(ValueError, match="vocab"):
        speculant.SpeculativeDecoder(target, draft, gamma=2)


@pytest.mark.cuda
def test_device_mismatch_is_rejected():
    table = markov.random_table(VOCAB, 1)
    target = speculant.load(markov.cached_model(table), device="cpu")
    draft = speculant.load(markov.cached_model(table), device="cuda")
    with pytest.raises(ValueError, match="device"):
        speculant.SpeculativeDecoder(target, draft, gamma=2)


# ------------------------------------------------------------------------------------------------
# Bad models
# ------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        speculant.load(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError):
        speculant.load(str(tmp_path / "nope.pt"))


def test_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"this is not a TorchScript archive\n" * 10)
    with pytest.raises(ValueError):
        speculant.load(path)
    torch.save({"weights": torch.zeros(3)}, str(path))  # a pickle, not TorchScript
    with pytest.raises(ValueError):
        speculant.load(path)


def test_unscripted_module_is_rejected():
    with pytest.raises(ValueError):
        speculant.load(markov.MarkovPlain(markov.random_table(VOCAB, 1).float()))


class NoTruncate(torch.nn.Module):
    """Cached form without truncate (and without forward)."""

    vocab_size: int

    def __init__(self):
        super().__init__()
        self.vocab_size = 3
        self.n = 0

    @torch.jit.export
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n = input_ids.size(1)
        return torch.zeros(1, input_ids.size(1), 3)

    @torch.jit.export
    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n += input_ids.size(1)
        return torch.zeros(1, input_ids.size(1), 3)

    @torch.jit.export
    def cache_length(self) -> int:
        return self.n


class NoContract(torch.nn.Module):
    """Neither form: no forward and no cache methods."""

    @torch.jit.export
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(1, input_ids.size(1), 3)


class CachedNoVocab(torch.nn.Module):
    """All four cache methods but no vocab_size attribute."""

    def __init__(self):
        super().__init__()
        self.n = 0

    @torch.jit.export
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n = input_ids.size(1)
        return torch.zeros(1, input_ids.size(1), 3)

    @torch.jit.export
    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n += input_ids.size(1)
        return torch.zeros(1, input_ids.size(1), 3)

    @torch.jit.export
    def truncate(self, length: int) -> None:
        self.n = length

    @torch.jit.export
    def cache_length(self) -> int:
        return self.n


def test_modules_breaking_the_contract():
    with pytest.raises(ValueError, match="truncate"):
        speculant.load(torch.jit.script(NoTruncate()))
    with pytest.raises(ValueError, match="forward"):
        speculant.load(torch.jit.script(NoContract()))
    with pytest.raises(ValueError, match="vocab_size"):
        speculant.load(torch.jit.script(CachedNoVocab()))


class LastPositionOnly(torch.nn.Module):
    """Plain form returning only the last position's logits [1, 1, V]: right for one token (the load
    probe), wrong for longer inputs."""

    vocab_size: int

    def __init__(self):
        super().__init__()
        self.vocab_size = 4

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(1, 1, 4)


class WideAfter(torch.nn.Module):
    """Plain form whose logits get one column too many once the sequence is longer than 4."""

    vocab_size: int

    def __init__(self):
        super().__init__()
        self.vocab_size = 4

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        width = 5 if input_ids.size(1) > 4 else 4
        return torch.zeros(1, input_ids.size(1), width)


class CachedFlat(torch.nn.Module):
    """Cached form whose extend returns 2-D logits [k, V]."""

    vocab_size: int

    def __init__(self):
        super().__init__()
        self.vocab_size = 4
        self.n = 0

    @torch.jit.export
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n = input_ids.size(1)
        return torch.zeros(1, input_ids.size(1), 4)

    @torch.jit.export
    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.n += input_ids.size(1)
        if self.n > 4:
            return torch.zeros(input_ids.size(1), 4)
        return torch.zeros(1, input_ids.size(1), 4)

    @torch.jit.export
    def truncate(self, length: int) -> None:
        self.n = length

    @torch.jit.export
    def cache_length(self) -> int:
        return self.n


@pytest.mark.parametrize("module", [LastPositionOnly, WideAfter, CachedFlat])
@pytest.mark.parametrize("role", ["target", "draft", "plain"])
def test_wrong_output_shape_at_run_time(module, role):
    """ValueError at load (the one-token probe may catch it) or at run time, never a crash."""
    good = speculant.load(markov.cached_model(markov.random_table(4, 1)))
    with pytest.raises(ValueError, match="logits"):
        bad = speculant.load(torch.jit.script(module()))
        if role == "plain":
            speculant.generate(bad, [1, 2, 3], max_new_tokens=8, seed=0)
        else:
            pair = (bad, good) if role == "target" else (good, bad)
            speculant.SpeculativeDecoder(*pair, gamma=3).generate([1, 2, 3], max_new_tokens=8, seed=0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf], ids=["nan", "pos-inf", "all-neg-inf"])
@pytest.mark.parametrize("role", ["target", "draft", "plain"])
@pytest.mark.parametrize("form", ["cached", "plain"])
def test_non_finite_logits_at_run_time(value, role, form):
    """Token 0 (probability ~1/3 per step, never in the prompt) leads to bad logits: 30 tokens reach it."""
    bad = speculant.load(markov.script(poisoned_table(value), form))
    good = speculant.load(markov.script(markov.random_table(3, 5), "cached"))
    with pytest.raises(ValueError):
        if role == "plain":
            speculant.generate(bad, [1, 2], max_new_tokens=30, seed=0)
        else:
            pair = (bad, good) if role == "target" else (good, bad)
            speculant.SpeculativeDecoder(*pair, gamma=2).generate([1, 2], max_new_tokens=30, seed=0)
    # Sanity: a prompt ending in 0 hits the bad row at once.
    with pytest.raises(ValueError):
        speculant.generate(bad, [1, 0], max_new_tokens=1, seed=0)


def test_decoder_reports_its_gamma(tmp_path):
    target = speculant.load(tiny_gpt.script_cached(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(16, 1, 1, 8, 32))))
    draft = speculant.load(tiny_gpt.script_cached(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(16, 1, 1, 8, 32))))
    assert speculant.SpeculativeDecoder(target, draft, gamma=5).gamma == 5
