"""Batched generation: `SpeculativeDecoder.generate(prompts)` and `speculant.generate(target, prompts)` with a batch.

The contract under test: row r of a batch gives exactly what a batch-1 generate of that row gives with seed
`seed + r` (mod 2^64): the same tokens, the same trace, the same counts (iterations, target / draft calls,
drafted / accepted / new tokens, the per-position lists, gamma, seed), alpha equal to 1e-6 relative (a batched
matmul may round differently in the last bits; table models are compared bit for bit).

* Backends, each greedy, at temperature 1 and with top-k + top-p, rows of prompt lengths 1, 3, 7, 2: a TinyGPT
  script_cached pair (native batched calls, the longest row filling max_length exactly), a plain-form TinyGPT
  target (row replicas), live transformers GPT-2 target and draft, Llama and GPT-2 exports (native), a .pt2
  GPT-2 (conftest.pt2_zoo; replicas reload the package), a T5 export with a live T5 draft (encoder-decoder:
  sources of different lengths, no prompt / one decoder start for all / one prompt per source / padded sources),
  and table models (tests/support/markov.py's, deep-copied replicas, and tests/support/engine_checks.py's MarkovRows:
  the same tables with the native batched methods, so that the exact laws also cover the native path).
* Every drafter (model, unigram, bigram, prompt lookup, Python drafters), every gamma policy, EOS stopping rows
  at different iterations, max_new_tokens 0 and 1, seed None and seeds that wrap at 2^64.
* Inputs: right- and left-padded [B, T] tensors and arrays with attention_mask, tokenizer-style mappings and
  BatchEncodings, lists of tensors, strings with a tokenizer; a [1, T] tensor, one list, a list of one list and a
  one-row mapping return a single Result (not a list).
* Bad inputs raise ValueError naming the row or the parameter.
* Replicas and batch caches kept across calls: batches of 3, 5 and 2 rows, then batch 1, on the same decoder.
* Exact laws: batches of N identical prompts (seeds seed .. seed + N - 1, a few big batches) against the target's
  exact law enumerated by tests/support/markov.py (temperature 1, lenience 1), the exact lenient law (lenience 0.5,
  markov.speculative_law), and a batch whose rows have different prompts, each row against its own prompt's law.
  Pearson chi-square (tests/support/chisquare.py, cells expected < 5 pooled, zero-probability cells never observed) at
  SIGNIFICANCE = 1e-3 per test, test_distribution.py's level and windows (tokens 1-3 and 4-6): 4 (one prompt,
  replica and native rows) + 2 (lenient) + 12 (three prompts, replica and native) = 18 tests that a correct engine
  fails by chance with probability at most 1.8% (Bonferroni) for a fresh draw of seeds; the seeds are fixed, so
  the outcome is deterministic. Power: the lenient rows must reject the target law by the same test.
"""

import numpy as np
import pytest
import torch
import transformers

from support import hf_families
from support import hf_models
from support import markov
import speculant
from support.chisquare import SIGNIFICANCE, chi_square_pvalue
from support.drafter_sets import every_drafter
from support.engine_checks import (GAMMA, MAX_NEW, PROMPTS, SETTINGS, TINY_MAX_LENGTH, TINY_VOCAB,
                                   assert_same_result, check_rows, check_stats, load_pair, loaded_tiny_models,
                                   markov_model, poisoned_table)
from support.laws import LAW_NEW, LAW_PROMPT, LAW_VOCAB, WINDOWS, assert_law, batched_samples
from speculant import drafters

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")


# ------------------------------------------------------------------------------------------------
# Comparing a batch with batch-1 runs
# ------------------------------------------------------------------------------------------------


def assert_mixed(results) -> None:
    """Both paths of Algorithm 1 happened somewhere in the batch: kept drafts and rejected ones."""
    accepted = sum(r.stats.accepted_tokens for r in results)
    drafted = sum(r.stats.drafted_tokens for r in results)
    assert 0 < accepted < drafted, (accepted, drafted)


def plain(target):
    """speculant.generate on `target`, with SpeculativeDecoder.generate's call shape."""
    return lambda *prompts, **kwargs: speculant.generate(target, *prompts, **kwargs)


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """(target, draft, plain-form target): TinyGPT script_cached pair (native batched) and script_plain."""
    return loaded_tiny_models(plain=True)


# ------------------------------------------------------------------------------------------------
# 1. Every backend: row r of a batch is batch 1 with seed + r
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tiny-cached", "tiny-plain", "live-gpt2", "export-llama", "export-gpt2"])
def backend(request, tiny, tmp_path_factory):
    """(target, draft, whether the target runs batches natively)."""
    if request.param == "tiny-cached":
        return tiny[0], tiny[1], True
    if request.param == "tiny-plain":
        return tiny[2], tiny[1], False
    arch = request.param.split("-")[1]
    model = hf_models.make(arch, seed=0)
    draft = hf_models.drafted(model, noise=0.01, seed=1)
    if request.param == "live-gpt2":
        return speculant.load(model), speculant.load(draft), False
    folder = tmp_path_factory.mktemp(arch)
    speculant.export(model, folder / "target.pt", max_length=64)
    speculant.export(draft, folder / "draft.pt", max_length=64)
    return speculant.load(folder / "target.pt"), speculant.load(folder / "draft.pt"), True


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_rows_equal_batch_one(backend, setting):
    target, draft, native = backend
    assert target._core.batched == native
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    batch = check_rows(decoder.generate, PROMPTS, seed=40, max_new_tokens=MAX_NEW, **SETTINGS[setting])
    for r, result in enumerate(batch):
        check_stats(result, GAMMA, MAX_NEW, vocab=target.vocab_size, seed=40 + r)
    assert_mixed(batch)
    if setting != "greedy":  # rows draw with their own seeds
        assert len({tuple(result.tokens) for result in batch}) == len(batch)
    check_rows(plain(target), PROMPTS, seed=50, max_new_tokens=MAX_NEW, **SETTINGS[setting])


def test_pt2_rows_equal_batch_one(pt2_zoo):
    """A .pt2 target (its replicas load the package again) with a live draft; a second, smaller batch reuses them."""
    model, path = pt2_zoo("gpt2")
    target = speculant.load(path)
    assert target.form == "pt2" and not target._core.batched
    draft = speculant.load(hf_families.drafted(model, noise=4 * hf_families.NOISE["gpt2"], seed=11))
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    assert_mixed(check_rows(decoder.generate, PROMPTS[:3], seed=7, max_new_tokens=12))
    check_rows(decoder.generate, PROMPTS[2:], seed=9, max_new_tokens=12, temperature=0.0)


# ------------------------------------------------------------------------------------------------
# Encoder-decoder: a batch of sources
# ------------------------------------------------------------------------------------------------

SOURCES = [[4, 8, 15], [16], [23, 42, 7, 9, 11, 3, 5], [6, 6]]  # lengths 3, 1, 7, 2
T5_MAX_NEW = 12


@pytest.fixture(scope="module")
def t5_pair(tmp_path_factory):
    """(target, draft): a T5 export (encoder-decoder: row replicas) and a live noisy copy."""
    model = hf_models.make("t5", seed=0)
    path = tmp_path_factory.mktemp("t5") / "t5.pt"
    speculant.export(model, path, max_length=48, max_source_length=16)
    target = speculant.load(path)
    assert target.encoder_decoder and not target._core.batched and target.decoder_start_token_id == 0
    return target, speculant.load(hf_models.drafted(model, noise=0.01, seed=1))


@pytest.mark.parametrize("setting", ["greedy", "T1"])
def test_encoder_decoder_sources_of_different_lengths(t5_pair, setting):
    target, draft = t5_pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    options = dict(max_new_tokens=T5_MAX_NEW, **SETTINGS[setting])

    def by_source(sources, **kwargs):  # prompt_ids omitted: each row starts at the decoder start
        return decoder.generate(encoder_input_ids=sources, **kwargs)

    batch = check_rows(by_source, SOURCES, seed=21, **options)
    assert_mixed(batch)
    # one decoder start for every source, and one prompt per source, give the same rows
    one_start = decoder.generate([0], encoder_input_ids=SOURCES, seed=21, **options)
    for r in range(len(SOURCES)):
        assert_same_result(one_start[r], batch[r], f"one start, row {r}", alpha_rel=0)
    starts = decoder.generate([[0]] * len(SOURCES), encoder_input_ids=SOURCES, seed=21, **options)
    for r in range(len(SOURCES)):
        assert_same_result(starts[r], batch[r], f"one start per source, row {r}", alpha_rel=0)
    # prompts of different lengths, one per source
    prompts = [[0], [0, 5], [0, 7, 9], [0, 3, 3, 8]]
    batch = decoder.generate(prompts, encoder_input_ids=SOURCES, seed=30, **options)
    for r in range(len(SOURCES)):
        alone = decoder.generate(prompts[r], encoder_input_ids=SOURCES[r], seed=30 + r, **options)
        assert_same_result(batch[r], alone, f"prompt per source, row {r}")
    check_rows(lambda sources, **kwargs: speculant.generate(target, encoder_input_ids=sources, **kwargs), SOURCES,
               seed=33, **options)


def test_encoder_decoder_padded_sources(t5_pair):
    """Padded sources with attention_mask (the mask is the source's), or a tokenizer-style mapping, give the rows
    of the unpadded sources."""
    target, draft = t5_pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    want = decoder.generate(encoder_input_ids=SOURCES, max_new_tokens=T5_MAX_NEW, seed=5)
    for side in ("right", "left"):
        ids, mask = padded(SOURCES, side, pad=0)
        for got in (decoder.generate(encoder_input_ids=ids, attention_mask=mask, max_new_tokens=T5_MAX_NEW, seed=5),
                    decoder.generate(encoder_input_ids={"input_ids": ids, "attention_mask": mask},
                                     max_new_tokens=T5_MAX_NEW, seed=5)):
            for r in range(len(SOURCES)):
                assert_same_result(got[r], want[r], f"{side} row {r}", alpha_rel=0)


# ------------------------------------------------------------------------------------------------
# 2. Every drafter
# ------------------------------------------------------------------------------------------------


def ragged_python_drafter(vocab: int):
    """A Python drafter that proposes a context-dependent number of tokens (0 .. gamma) from a non-degenerate q
    fixed by the context (deterministic, so that a row proposes the same alone and in a batch)."""
    logits = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2

    def propose(context, gamma):
        k = (context[-1] + len(context)) % (gamma + 1)
        tokens, q = [], []
        last = context[-1]
        for _ in range(k):
            row = torch.softmax(logits[last], -1)
            last = int(row.argmax())  # a token q gives positive probability
            tokens.append(last)
            q.append(row)
        return tokens, (torch.stack(q) if tokens else None)

    return drafters.PythonDrafter(propose, vocab)


@pytest.mark.parametrize("kind", ["model", "unigram", "bigram", "prompt_lookup", "python", "python-ragged"])
@pytest.mark.parametrize("setting", ["greedy", "T1"])
def test_every_drafter(tiny, kind, setting):
    target, draft, _ = tiny
    if kind == "model":
        drafter = draft
    elif kind == "python-ragged":
        drafter = ragged_python_drafter(TINY_VOCAB)
    else:
        drafter = every_drafter()[kind]
    decoder = speculant.SpeculativeDecoder(target, drafter, gamma=GAMMA)
    prompts = PROMPTS[:3] + [[3, 7, 3, 7, 1, 3]]  # prompt lookup finds matches in some rows, none in others
    batch = check_rows(decoder.generate, prompts, seed=60, max_new_tokens=MAX_NEW, **SETTINGS[setting])
    assert sum(r.stats.drafted_tokens for r in batch) > 0


# ------------------------------------------------------------------------------------------------
# 3. Gamma policies, EOS, max_new_tokens 0 and 1, seeds
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tiny-native", "markov-replica"])
def pair(request, tiny):
    """(target, draft, vocabulary, prompts): a native pair and a replica pair."""
    if request.param == "tiny-native":
        return tiny[0], tiny[1], TINY_VOCAB, PROMPTS
    target, draft = load_pair(4, vocab=6, concentration=3.0, draft_scale=0.7)
    return target, draft, 6, [[5], [1, 2, 3], [4, 5, 0, 1, 2, 3, 4], [1, 1]]


@pytest.mark.parametrize("policy", [dict(gamma_policy="fixed"), dict(gamma_policy="heuristic", max_gamma=6),
                                    dict(gamma_policy="alpha", cost=0.1, max_gamma=6)],
                         ids=["fixed", "heuristic", "alpha"])
def test_gamma_policies(pair, policy):
    target, draft, _, prompts = pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2)
    batch = check_rows(decoder.generate, prompts, seed=70, max_new_tokens=MAX_NEW, **policy)
    assert_mixed(batch)
    if policy["gamma_policy"] != "fixed":  # each row keeps its own schedule
        schedules = {tuple(len(it.drafted) for it in result.trace) for result in batch}
        assert len(schedules) > 1


def test_eos_stops_rows_at_different_iterations(pair):
    target, draft, _, prompts = pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    max_new = 10
    for generate in (decoder.generate, plain(target)):
        # a seed and an EOS that some row emits among its first tokens and some other row never emits
        for seed in range(80, 100):
            full = generate(prompts, max_new_tokens=max_new, seed=seed)
            eos = next((t for result in full for t in result.tokens[:4]
                        if any(t not in other.tokens for other in full)), None)
            if eos is not None:
                break
        assert eos is not None
        batch = check_rows(generate, prompts, seed=seed, max_new_tokens=max_new, eos_token_id=eos)
        for r, result in enumerate(batch):
            want = full[r].tokens[:full[r].tokens.index(eos) + 1] if eos in full[r].tokens else full[r].tokens
            assert result.tokens == want, f"row {r}"
        lengths = [len(result.tokens) for result in batch]
        assert min(lengths) < max_new == max(lengths), lengths


@pytest.mark.parametrize("max_new_tokens", [0, 1])
def test_max_new_tokens_zero_and_one(pair, max_new_tokens):
    target, draft, _, prompts = pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    for generate in (decoder.generate, plain(target)):
        batch = check_rows(generate, prompts, seed=90, max_new_tokens=max_new_tokens)
        for r, result in enumerate(batch):
            assert len(result.tokens) == result.stats.new_tokens == len(result.trace) == max_new_tokens
            assert result.stats.target_calls == max_new_tokens and result.stats.draft_calls == 0
            assert result.stats.seed == 90 + r


def test_seed_none_and_seeds_that_wrap(pair):
    """seed=None: each row reports its own seed, which replays it alone; seed + r wraps at 2^64."""
    target, draft, _, prompts = pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    batch = decoder.generate(prompts, max_new_tokens=MAX_NEW)
    assert len({result.stats.seed for result in batch}) == len(batch)
    for r, result in enumerate(batch):
        assert_same_result(result, decoder.generate(prompts[r], max_new_tokens=MAX_NEW, seed=result.stats.seed),
                           f"row {r}")
    top = 2**64 - 2
    batch = decoder.generate(prompts, max_new_tokens=MAX_NEW, seed=top)
    assert [result.stats.seed for result in batch] == [top, top + 1, 0, 1]
    for r, result in enumerate(batch):
        alone = decoder.generate(prompts[r], max_new_tokens=MAX_NEW, seed=(top + r) % 2**64)
        assert_same_result(result, alone, f"row {r}")


# ------------------------------------------------------------------------------------------------
# 4. Padded and other batch inputs
# ------------------------------------------------------------------------------------------------


def padded(rows, side: str, pad: int):
    """rows as a [B, T] tensor padded with `pad` on `side`, and its attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        where = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[r, where] = torch.tensor(row)
        mask[r, where] = 1
    return ids, mask


class CharTokenizer:
    """A tokenizer in the shape speculant takes (encode / decode): letters a.. as ids 0.. ."""

    def encode(self, text: str) -> list:
        return [(ord(c) - ord("a")) % TINY_VOCAB for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def test_padded_batches_equal_the_unpadded_prompts(tiny):
    target, draft, _ = tiny
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    options = dict(max_new_tokens=MAX_NEW, seed=11)
    for generate in (decoder.generate, plain(target)):
        want = generate(PROMPTS, **options)
        inputs = {}
        for side, pad in (("right", 0), ("left", 0), ("left", 31)):
            ids, mask = padded(PROMPTS, side, pad)
            inputs[f"{side}-pad{pad}"] = dict(prompt_ids=ids, attention_mask=mask)
            inputs[f"{side}-pad{pad}-numpy"] = dict(prompt_ids=ids.numpy(), attention_mask=mask.numpy())
            inputs[f"{side}-pad{pad}-dict"] = dict(prompt_ids={"input_ids": ids, "attention_mask": mask})
            inputs[f"{side}-pad{pad}-lists"] = dict(prompt_ids={"input_ids": ids.tolist(),
                                                                "attention_mask": mask.tolist()})
            inputs[f"{side}-pad{pad}-batch-encoding"] = dict(
                prompt_ids=transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask}))
            inputs[f"{side}-pad{pad}-input_ids"] = dict(input_ids=ids, attention_mask=mask)
            inputs[f"{side}-pad{pad}-bool-mask"] = dict(prompt_ids=ids, attention_mask=mask.bool())
        inputs["tensors"] = dict(prompt_ids=[torch.tensor(p) for p in PROMPTS])
        inputs["unpadded-dict"] = dict(prompt_ids={"input_ids": PROMPTS})
        inputs["tuple"] = dict(prompt_ids=tuple(tuple(p) for p in PROMPTS))
        for name, given in inputs.items():
            got = generate(**given, **options)
            assert isinstance(got, list) and len(got) == len(PROMPTS), name
            for r in range(len(PROMPTS)):
                assert_same_result(got[r], want[r], f"{name} row {r}", alpha_rel=0)
    # a full [B, T] tensor without padding is a batch too
    square = torch.tensor([[1, 2, 3], [4, 5, 6]])
    check_rows(decoder.generate, square, seed=3, max_new_tokens=MAX_NEW)
    # strings with a tokenizer: each row decoded
    texts = ["hello", "a", "draft"]
    batch = decoder.generate(texts, tokenizer=CharTokenizer(), **options)
    for r, text in enumerate(texts):
        alone = decoder.generate(CharTokenizer().encode(text), max_new_tokens=MAX_NEW, seed=11 + r)
        assert_same_result(batch[r], alone, f"text row {r}")
        assert batch[r].text == CharTokenizer().decode(alone.tokens)


def test_one_row_returns_one_result(tiny):
    """A [1, T] tensor, one list, a list of one list, a one-row mapping and a [1, T] tensor with padding and its
    mask are one prompt: a single Result, not a list (the documented choice)."""
    target, draft, _ = tiny
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    prompt = [4, 5, 6]
    options = dict(max_new_tokens=MAX_NEW, seed=12)
    for generate in (decoder.generate, plain(target)):
        want = generate(prompt, **options)
        assert isinstance(want, speculant.Result)
        for name, given in {
            "[1, T] tensor": dict(prompt_ids=torch.tensor([prompt])),
            "[1, T] array": dict(prompt_ids=np.array([prompt])),
            "list of one list": dict(prompt_ids=[prompt]),
            "one-row mapping": dict(prompt_ids={"input_ids": [prompt], "attention_mask": [[1, 1, 1]]}),
            "[1, T] left-padded": dict(prompt_ids=torch.tensor([[0, 0] + prompt]),
                                       attention_mask=torch.tensor([[0, 0, 1, 1, 1]])),
            "[1, T] right-padded": dict(prompt_ids=torch.tensor([prompt + [9]]),
                                        attention_mask=torch.tensor([[1, 1, 1, 0]])),
        }.items():
            got = generate(**given, **options)
            assert isinstance(got, speculant.Result), name
            assert_same_result(got, want, name, alpha_rel=0)


def test_one_prompt_from_a_tokenizer_with_its_mask(tiny):
    """What a tokenizer returns for one text without return_tensors: 1-D input_ids with a 1-D all-ones
    attention_mask (a BatchEncoding, or a plain mapping, or 1-D tensors): one prompt, a single Result."""
    target, draft, _ = tiny
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    prompt = [4, 5, 6]
    for generate in (decoder.generate, plain(target)):
        want = generate(prompt, max_new_tokens=MAX_NEW, seed=13)
        for given in ({"input_ids": prompt, "attention_mask": [1, 1, 1]},
                      transformers.BatchEncoding({"input_ids": prompt, "attention_mask": [1, 1, 1]}),
                      {"input_ids": torch.tensor(prompt), "attention_mask": torch.ones(3, dtype=torch.long)}):
            got = generate(given, max_new_tokens=MAX_NEW, seed=13)
            assert isinstance(got, speculant.Result)
            assert_same_result(got, want, type(given).__name__, alpha_rel=0)


# ------------------------------------------------------------------------------------------------
# 6. Bad input: ValueError naming the row or the parameter
# ------------------------------------------------------------------------------------------------

IDS = torch.tensor([[1, 2, 3], [4, 5, 0]])


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt_ids=[[1, 2], [], [3]]), r"prompt_ids\[1\] is empty"),
    (dict(prompt_ids=[[1, 2], torch.tensor([], dtype=torch.long)]), r"prompt_ids\[1\]"),
    (dict(prompt_ids=[[1], None, [2]]), r"prompt_ids\[1\] is None"),
    (dict(prompt_ids=[[1], [2], [3, TINY_VOCAB]]), r"prompt_ids\[2\]\[1\] = 32 is outside the vocabulary"),
    (dict(prompt_ids=[[1], [2], [-1]]), r"prompt_ids\[2\]"),
    (dict(prompt_ids=[[1], [2, 2.5]]), r"prompt_ids\[1\]\[1\] must be an integer"),
    (dict(prompt_ids=[[1] * 3, [2] * (TINY_MAX_LENGTH - MAX_NEW + 2), [1]]), r"max_length.*prompt_ids\[1\]"),
    (dict(prompt_ids=IDS, attention_mask=torch.ones(2, 4, dtype=torch.long)), "attention_mask row 0 has 4 entries"),
    (dict(prompt_ids=IDS, attention_mask=torch.ones(3, 3, dtype=torch.long)), "attention_mask must be 2-D"),
    (dict(prompt_ids=IDS, attention_mask=torch.ones(3, dtype=torch.long)), "attention_mask must be 2-D"),
    (dict(prompt_ids=IDS, attention_mask=torch.tensor([[1, 1, 1], [1, 0, 1]])), "attention_mask row 1 has 0s"),
    (dict(prompt_ids=IDS, attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]])), r"prompt_ids\[1\] is empty"),
    (dict(prompt_ids=IDS, attention_mask=torch.tensor([[1, 1, 2], [1, 1, 1]])), "only 0 and 1"),
    (dict(prompt_ids={"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}, attention_mask=torch.ones_like(IDS)),
     "attention_mask"),
    (dict(prompt_ids=[1, 2, 3], attention_mask=[1, 1]), "the mask must match its ids"),
    (dict(prompt_ids=IDS.float()), "prompt_ids must hold integer token ids"),
    (dict(prompt_ids=[[1], [2]], encoder_input_ids=[[1], [2]]), "encoder_input_ids is only for encoder-decoder"),
    (dict(prompt_ids=[[1], [2]], max_new_tokens=-1), "max_new_tokens"),
    (dict(prompt_ids=[[1], [2]], eos_token_id=TINY_VOCAB), "eos_token_id"),
])
def test_bad_batches_name_the_row(tiny, kwargs, message):
    target, draft, _ = tiny
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    kwargs = {"max_new_tokens": MAX_NEW, **kwargs}
    for generate in (decoder.generate, plain(target)):
        with pytest.raises(ValueError, match=message):
            generate(**kwargs, seed=0)
    # the decoder is free again
    assert len(decoder.generate(PROMPTS, max_new_tokens=2, seed=0)) == len(PROMPTS)


def test_draft_max_length_names_the_row():
    target = markov_model(markov.random_table(5, 1), "replica")
    draft = speculant.load(markov.cached_model(markov.random_table(5, 2), max_length=10))
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=2)
    with pytest.raises(ValueError, match=r"draft model holds at most max_length = 10.*prompt_ids\[2\]"):
        decoder.generate([[1], [2, 3], [1] * 5], max_new_tokens=7, seed=0)
    assert len(decoder.generate([[1], [2, 3], [1] * 4], max_new_tokens=7, seed=0)) == 3  # exactly enough


def test_bad_encoder_decoder_batches(t5_pair):
    target, draft = t5_pair
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    for generate in (decoder.generate, plain(target)):
        with pytest.raises(ValueError, match="prompt_ids holds 2 prompts and encoder_input_ids 3 sources"):
            generate([[0], [0]], encoder_input_ids=SOURCES[:3], max_new_tokens=4, seed=0)
        with pytest.raises(ValueError, match="prompt_ids holds 3 prompts and encoder_input_ids 1 sources"):
            generate([[0], [0, 5], [0, 6]], encoder_input_ids=SOURCES[0], max_new_tokens=4, seed=0)
        with pytest.raises(ValueError, match=r"encoder_input_ids\[1\] is empty"):
            generate(encoder_input_ids=[[4], [], [5]], max_new_tokens=4, seed=0)
        with pytest.raises(ValueError, match=r"encoder_input_ids\[2\]\[0\] = 64 is outside the vocabulary"):
            generate(encoder_input_ids=[[4], [5], [64]], max_new_tokens=4, seed=0)
        with pytest.raises(ValueError, match=r"max_source_length = 16 tokens, encoder_input_ids\[1\] has 17"):
            generate(encoder_input_ids=[[4], [5] * 17], max_new_tokens=4, seed=0)
        with pytest.raises(ValueError, match="encoder-decoder model: pass encoder_input_ids"):
            generate([[0], [0]], max_new_tokens=4, seed=0)
    assert len(decoder.generate(encoder_input_ids=SOURCES[:2], max_new_tokens=2, seed=0)) == 2


@pytest.mark.parametrize("kind", ["replica", "native"])
@pytest.mark.parametrize("role", ["target", "draft", "plain"])
def test_non_finite_logits_name_the_row(kind, role):
    """Row 1's prompt ends in token 0, after which the table's logits are NaN (engine_checks.poisoned_table); row 0
    never reaches them within max_new_tokens (1 token; 2 with a draft of gamma 1, which drafts one)."""
    bad = markov_model(poisoned_table(float("nan")), kind)
    good = markov_model(markov.random_table(3, 5), kind)
    prompts = [[1, 2], [1, 0], [2, 1]]
    with pytest.raises(ValueError, match="NaN or \\+inf logits.* of row 1 "):
        if role == "plain":
            speculant.generate(bad, prompts, max_new_tokens=1, seed=0)
        elif role == "target":
            speculant.SpeculativeDecoder(bad, good, gamma=1).generate(prompts, max_new_tokens=1, seed=0)
        else:
            speculant.SpeculativeDecoder(good, bad, gamma=1).generate(prompts[:2], max_new_tokens=2, seed=0)


# ------------------------------------------------------------------------------------------------
# 7. Replicas and batch caches kept across calls
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tiny-native", "tiny-plain", "markov-replica", "live-gpt2"])
def test_batches_of_other_sizes_reuse_the_decoder(tiny, kind):
    """Batches of 3, 5 and 2 rows on one decoder (a native batch cache reallocated, replicas made and kept), then
    batch 1: every row is still its batch-1 run, and batch 1 is what it was before any batch."""
    if kind == "live-gpt2":
        model = hf_models.make("gpt2", seed=0)
        target, draft = speculant.load(model), speculant.load(hf_models.drafted(model, noise=0.01, seed=1))
        prompts, max_new = PROMPTS + [[7, 7]], 8
    elif kind == "markov-replica":
        target, draft = load_pair(5, vocab=6, concentration=3.0)
        prompts, max_new = [[5], [1, 2, 3], [4, 5, 0, 1, 2, 3, 4], [1, 1], [0, 3]], MAX_NEW
    else:
        target = tiny[0] if kind == "tiny-native" else tiny[2]
        draft = tiny[1]
        prompts, max_new = PROMPTS + [[7, 7]], MAX_NEW
    decoder = speculant.SpeculativeDecoder(target, draft, gamma=GAMMA)
    seed = 100
    before = [decoder.generate(p, max_new_tokens=max_new, seed=seed + r) for r, p in enumerate(prompts)]
    for size in (3, 5, 2):
        batch = decoder.generate(prompts[:size], max_new_tokens=max_new, seed=seed)
        assert len(batch) == size
        for r in range(size):
            assert_same_result(batch[r], before[r], f"batch of {size}, row {r}")
        plain_batch = speculant.generate(target, prompts[:size], max_new_tokens=max_new, seed=seed)
        for r in range(size):
            alone = speculant.generate(target, prompts[r], max_new_tokens=max_new, seed=seed + r)
            assert_same_result(plain_batch[r], alone, f"plain batch of {size}, row {r}")
    for r, p in enumerate(prompts):
        assert_same_result(decoder.generate(p, max_new_tokens=max_new, seed=seed + r), before[r], f"after, row {r}",
                           alpha_rel=0)


# ------------------------------------------------------------------------------------------------
# 5. Exact laws of batched rows (chi-square at SIGNIFICANCE, as test_distribution.py)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["replica", "native"])
def test_batched_law_equals_target_law(kind):
    """5,000 rows with one prompt at temperature 1, lenience 1: the rows' law is the target's."""
    target, draft = markov.target_and_draft(LAW_VOCAB, 41, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(markov_model(target, kind), markov_model(draft, kind), gamma=3,
                                           temperature=1.0, lenience=1.0)
    samples = batched_samples(decoder, [LAW_PROMPT], 5000, seed=41000)
    assert_law(samples, markov.continuation_law(target, LAW_PROMPT, LAW_NEW), f"batched {kind}")


def test_batched_lenient_law():
    """Lenience 0.5 with an unrelated draft (native rows): the rows follow the exact lenient law (which is not
    the target's: the same test rejects the target law, so it has power here)."""
    lenience, gamma = 0.5, 2
    target, draft = markov.target_and_draft(LAW_VOCAB, 42, independent_draft=True, concentration=0.5)
    decoder = speculant.SpeculativeDecoder(markov_model(target, "native"), markov_model(draft, "native"),
                                           gamma=gamma, lenience=lenience)
    samples = batched_samples(decoder, [LAW_PROMPT], 5000, seed=42000)
    lenient = markov.speculative_law(target, draft, LAW_PROMPT, LAW_NEW, gamma, lenience=lenience)
    assert_law(samples, lenient, "batched lenience 0.5")
    law = markov.continuation_law(target, LAW_PROMPT, LAW_NEW)
    assert chi_square_pvalue(markov.marginal(law, list(WINDOWS[0])), samples[:, list(WINDOWS[0])]) < SIGNIFICANCE


@pytest.mark.parametrize("kind", ["replica", "native"])
def test_batched_rows_with_different_prompts_follow_their_own_laws(kind):
    """Rows cycling through three prompts of lengths 1, 2, 4 in the same batches (2,000 rows each): each row's law
    is its own prompt's target law."""
    prompts = [[0], [3, 1], [1, 1, 2, 0]]
    target, draft = markov.target_and_draft(LAW_VOCAB, 43, mask_prob=0.1)
    decoder = speculant.SpeculativeDecoder(markov_model(target, kind), markov_model(draft, kind), gamma=3)
    samples = batched_samples(decoder, prompts, 2000 * len(prompts), seed=43000)
    for i, prompt in enumerate(prompts):
        assert_law(samples[i::len(prompts)], markov.continuation_law(target, prompt, LAW_NEW),
                   f"batched {kind}, prompt {prompt}")


def test_native_table_rows_equal_batch_one_bit_for_bit():
    """MarkovRows (native) against itself at batch 1, and every mix of native and replica target and draft against
    markov.py's replicas: table lookups are exact, so alpha agrees bit for bit too; rows of different lengths that
    stop at different times, adaptive gamma, profiling."""
    target, draft = markov.target_and_draft(5, 44, mask_prob=0.1)
    prompts = [[4], [1, 0, 3], [3, 3, 3, 3, 3, 3, 0], [1, 2]]
    exactly = 7 + MAX_NEW - 1
    models = {(role, kind): markov_model(table, kind, max_length=exactly)
              for role, table in (("target", target), ("draft", draft)) for kind in ("native", "replica")}
    native = speculant.SpeculativeDecoder(models["target", "native"], models["draft", "native"], gamma=GAMMA)
    mixes = [speculant.SpeculativeDecoder(models["target", t], models["draft", d], gamma=GAMMA)
             for t, d in (("replica", "replica"), ("native", "replica"), ("replica", "native"))]
    for options in (dict(), dict(eos_token_id=2), dict(gamma_policy="heuristic", max_gamma=5), dict(profile=True)):
        got = check_rows(native.generate, prompts, seed=44, alpha_rel=0, max_new_tokens=MAX_NEW, **options)
        for mix in mixes:
            want = mix.generate(prompts, seed=44, max_new_tokens=MAX_NEW, **options)
            for r in range(len(prompts)):
                assert_same_result(got[r], want[r], f"native vs {mix}, row {r}", alpha_rel=0)
        if "eos_token_id" in options:
            assert len({len(result.tokens) for result in got}) > 1
