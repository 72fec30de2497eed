"""TinyGPT's contract forms against its training form, and the demo pair recipe end to end (smoke-sized)."""
import fcntl
import json
import threading

import pytest
import torch

from speculant import demo_pair
from speculant.demo_pair import DEFAULT_RECIPE, decode, default_pair, encode
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached, script_plain

CONFIG = TinyGPTConfig(vocab_size=61, n_layer=2, n_head=4, d_model=32, max_length=40)
ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    m = TinyGPT(CONFIG)
    with torch.no_grad():  # well away from the near-uniform init, so attention and positions matter
        for p in m.parameters():
            p.add_(torch.randn_like(p), alpha=0.2)
    return m.eval()


@pytest.fixture(scope="module")
def cached(model):
    return script_cached(model)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG.vocab_size, (1, CONFIG.max_length), generator=gen)  # [1, M]


def reference(model: TinyGPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)  # [1, T, V]


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


def test_logits_are_not_trivial(model, ids):
    logits = reference(model, ids)  # [1, T, V]
    assert logits.std(-1).min() > 0.5  # equality below would mean little on near-constant logits


@pytest.mark.parametrize("T", [1, 2, 9, CONFIG.max_length])
def test_prefill_matches_training_form(model, cached, ids, T):
    close(cached.prefill(ids[:, :T]), reference(model, ids[:, :T]))
    assert cached.cache_length() == T


@pytest.mark.parametrize("T", [2, 17, CONFIG.max_length])
def test_extend_one_token_at_a_time(model, cached, ids, T):
    expected = reference(model, ids[:, :T])
    close(cached.prefill(ids[:, :1]), expected[:, :1])
    for t in range(1, T):
        close(cached.extend(ids[:, t:t + 1]), expected[:, t:t + 1])
        assert cached.cache_length() == t + 1


@pytest.mark.parametrize("chunks", [[3, 1, 4, 1, 5], [1, 8, 2, 29], [20, 20]])
def test_extend_several_tokens(model, cached, ids, chunks):
    T = sum(chunks)
    expected = reference(model, ids[:, :T])
    close(cached.prefill(ids[:, :chunks[0]]), expected[:, :chunks[0]])
    start = chunks[0]
    for k in chunks[1:]:
        close(cached.extend(ids[:, start:start + k]), expected[:, start:start + k])
        start += k
    assert cached.cache_length() == T


@pytest.mark.parametrize("T, keep, new", [(10, 4, 3), (25, 24, 1), (40, 7, 33), (12, 0, 5), (8, 8, 2)])
def test_truncate_then_extend_is_a_rollback(model, cached, ids, T, keep, new):
    cached.prefill(ids[:, :T])
    cached.truncate(keep)
    assert cached.cache_length() == keep
    other = (ids[:, :new] * 7 + 3) % CONFIG.vocab_size  # [1, new], differs from what was rolled back
    close(cached.extend(other), reference(model, torch.cat([ids[:, :keep], other], 1))[:, keep:])
    assert cached.cache_length() == keep + new


def test_prefill_clears_the_cache(model, cached, ids):
    cached.prefill(ids[:, :30])
    close(cached.prefill(ids[:, 5:9]), reference(model, ids[:, 5:9]))
    assert cached.cache_length() == 4


def test_cached_form_attributes(cached):
    assert cached.vocab_size == CONFIG.vocab_size
    assert cached.max_length == CONFIG.max_length
    head_dim = CONFIG.d_model // CONFIG.n_head
    cached.prefill(torch.tensor([[1, 2]]))
    assert tuple(cached.cache.shape) == (2, CONFIG.n_layer, CONFIG.n_head, CONFIG.max_length, head_dim)
    assert all(not p.requires_grad for p in cached.parameters())
    assert not cached.training


@pytest.mark.parametrize("T", [1, 13, CONFIG.max_length])
def test_plain_form_matches_training_form(model, ids, T):
    plain = script_plain(model)
    assert plain.vocab_size == CONFIG.vocab_size
    close(plain(ids[:, :T]), reference(model, ids[:, :T]))


def test_scripted_forms_do_not_alias_the_trained_weights(model, ids):
    expected = reference(model, ids)
    trainee = TinyGPT(CONFIG)
    trainee.load_state_dict(model.state_dict())
    cached, plain = script_cached(trainee), script_plain(trainee)
    with torch.no_grad():
        trainee.tok_emb.weight.add_(1.0)  # training on after export must not change the exported models
    close(cached.prefill(ids), expected)
    close(plain(ids), expected)


def test_extend_past_max_length_is_rejected(model, cached, ids):
    cached.prefill(ids[:, :35])
    with pytest.raises(torch.jit.Error, match=r"35 cached \+ 6 new positions exceed max_length=40"):
        cached.extend(ids[:, :6])
    assert cached.cache_length() == 35  # the rejected call changed nothing
    close(cached.extend(ids[:, 35:40]), reference(model, ids)[:, 35:40])
    with pytest.raises(torch.jit.Error, match="exceed max_length=40"):
        cached.extend(ids[:, :1])
    with pytest.raises(torch.jit.Error, match=r"0 cached \+ 41 new positions exceed max_length=40"):
        cached.prefill(torch.zeros(1, 41, dtype=torch.long))


@pytest.mark.parametrize("bad", [torch.zeros(2, 1, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long),
                                 torch.zeros(3, dtype=torch.long), torch.zeros(1, 2, 1, dtype=torch.long)])
def test_extend_rejects_bad_shapes(cached, bad):
    for method in (cached.prefill, cached.extend):
        with pytest.raises(torch.jit.Error, match=r"expected input_ids \[1, k\] with k >= 1"):
            method(bad)


def test_extend_rejects_non_integer_ids(cached):
    with pytest.raises(torch.jit.Error, match="expected int64 input_ids"):
        cached.prefill(torch.zeros(1, 3))


@pytest.mark.parametrize("length", [-1, 6, 100])
def test_truncate_out_of_range_is_rejected(cached, ids, length):
    cached.prefill(ids[:, :5])
    with pytest.raises(torch.jit.Error, match=r"truncate: length must be in \[0, cache_length\(\)=5\]"):
        cached.truncate(length)
    assert cached.cache_length() == 5


def test_demo_recipe_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path))
    recipe = DEFAULT_RECIPE.smoke(steps=2)
    target_path, draft_path = default_pair(progress=False, recipe=recipe)
    assert target_path.parent.parent == tmp_path / "models"
    files = sorted(p.name for p in target_path.parent.iterdir())
    assert files == ["draft.pt", "pair.json", "target.pt"]  # and no temp files
    for path, config in ((target_path, recipe.target), (draft_path, recipe.draft)):
        loaded = torch.jit.load(str(path))
        assert loaded.vocab_size == 256 and loaded.max_length == config.max_length
        assert loaded.prefill(torch.tensor([encode("def f(x):")])).shape == (1, 9, 256)
        assert loaded.extend(torch.tensor([encode("\n")])).shape == (1, 1, 256)
    info = json.loads((target_path.parent / "pair.json").read_text())
    assert 0.0 < info["alpha"] <= 1.0 and info["target_loss"] > 0 and info["draft_loss"] > 0
    assert info["params"]["target"] > info["params"]["draft"]
    stamp = target_path.stat().st_mtime_ns
    assert default_pair(progress=False, recipe=recipe) == (target_path, draft_path)  # cached, not retrained
    assert target_path.stat().st_mtime_ns == stamp


def test_concurrent_first_runs_train_the_pair_once(tmp_path, monkeypatch):
    """Issue 25: two first runs at once (threads here; the flock excludes processes the same way) train the pair
    once. The first holds its first training step until the second is seen blocking on the pair's lock; the
    second then returns the first's complete files. Without the lock the second trains a pair of its own."""
    recipe = DEFAULT_RECIPE.smoke(steps=1)
    real_train, real_flock = demo_pair.train, fcntl.flock
    trained, started, second_waits = [], threading.Event(), threading.Event()

    def train(*args, **kwargs):
        trained.append(threading.current_thread().name)
        if len(trained) == 1:
            started.set()
            assert second_waits.wait(timeout=120), "the second run never waited on the lock"
        return real_train(*args, **kwargs)

    def flock(f, operation):
        if threading.current_thread().name == "second" and not operation & (fcntl.LOCK_NB | fcntl.LOCK_UN):
            second_waits.set()
        return real_flock(f, operation)

    monkeypatch.setattr(demo_pair, "train", train)
    monkeypatch.setattr(fcntl, "flock", flock)
    results = {}

    def run():
        results[threading.current_thread().name] = default_pair(progress=False, recipe=recipe, cache_dir=tmp_path)

    first = threading.Thread(target=run, name="first")
    first.start()
    assert started.wait(timeout=120)
    second = threading.Thread(target=run, name="second")
    second.start()
    second.join(timeout=300)
    second_waits.set()  # without the lock the second run has finished by now: let the first one go on
    first.join(timeout=300)
    second.join(timeout=300)
    assert not first.is_alive() and not second.is_alive()
    assert trained == ["first", "first"]  # the target and the draft, once
    assert results["first"] == results["second"]
    assert sorted(p.name for p in results["first"][0].parent.iterdir()) == ["draft.pt", "pair.json", "target.pt"]
    assert (tmp_path / "models" / f"{results['first'][0].parent.name}.lock").exists()


@pytest.mark.parametrize("text", ["", "hello, world\n", "héllo ✓ 🐍 — ünïcode", "\x00\xff\tand\r\n"])
def test_encode_decode_round_trip(text):
    tokens = encode(text)
    assert all(isinstance(t, int) and 0 <= t < 256 for t in tokens)
    assert decode(tokens) == text


def test_decode_replaces_a_cut_character():
    assert decode(encode("🐍")[:2]) == "\ufffd"
