"""The demo pair ships with the package (issue 51): its weights are what the recorded recipe produced, they turn
into the engine's files without training, a missing or altered file is named with the way to make it again, and
the recipe itself still runs (smoke-sized, through its command line)."""

import dataclasses
import json
import shutil

import pytest
import torch

from speculant import demo_pair, load

# On the corpus the record names (this Python's standard library) the held-out figures are a deterministic
# evaluation of the shipped weights: only the summation order (threads) can move them, by far less than this.
SAME_CORPUS_TOLERANCE = 1e-3


def test_the_shipped_weights_are_what_the_recorded_recipe_produced():
    record = demo_pair.read_record()  # also checks each file's sha256 against the record
    assert record["recipe"] == dataclasses.asdict(demo_pair.DEFAULT_RECIPE)
    models, _ = demo_pair.load_models()
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    assert params == record["params"]
    _, held_out, corpus_sha = demo_pair.load_corpus(demo_pair.DEFAULT_RECIPE.holdout_every)
    if corpus_sha != record["corpus_sha256"]:
        pytest.skip(f"this Python's standard library is not the corpus the pair was trained on (Python "
                    f"{record['python']}); the recorded held-out figures are measured on that one")
    measured = demo_pair.evaluate(models["target"], models["draft"], held_out, demo_pair.DEFAULT_RECIPE.eval_windows)
    for key in ("target_loss", "draft_loss", "alpha", "greedy_agreement"):
        assert measured[key] == pytest.approx(record[key], abs=SAME_CORPUS_TOLERANCE), key
    # a trained pair, not an untrained one: held-out losses far below a uniform byte's log(256) = 5.55 nats
    assert record["target_loss"] < 2.2 and record["draft_loss"] < 2.8 and record["alpha"] > 0.6


def test_default_pair_converts_the_shipped_weights_without_training(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_pair, "train", lambda *args, **kwargs: pytest.fail("default_pair trained"))
    target_path, draft_path = demo_pair.default_pair(progress=False, cache_dir=tmp_path)
    assert target_path.parent.name.startswith("shipped-")
    assert sorted(p.name for p in target_path.parent.iterdir()) == ["draft.pt", "pair.json", "target.pt"]
    models, record = demo_pair.load_models()
    ids = torch.tensor([demo_pair.encode("def __init__(self")])
    for path, name in ((target_path, "target"), (draft_path, "draft")):
        model = load(path)
        assert model.vocab_size == 256
        scripted = torch.jit.load(str(path))
        torch.testing.assert_close(scripted.prefill(ids), models[name](ids), rtol=1e-5, atol=1e-5)
    assert json.loads((target_path.parent / "pair.json").read_text()) == record
    stamp = target_path.stat().st_mtime_ns
    assert demo_pair.default_pair(progress=False, cache_dir=tmp_path) == (target_path, draft_path)
    assert target_path.stat().st_mtime_ns == stamp  # cached, not converted again


def test_missing_weights_are_named_with_the_way_to_make_them(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"target.safetensors.*python -m speculant.demo.pair --train"):
        demo_pair.default_pair(progress=False, cache_dir=tmp_path / "cache", weights=tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(demo_pair.WEIGHTS, copy)
    data = bytearray((copy / "draft.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "draft.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"draft.safetensors is not the file .*pair.json records"):
        demo_pair.default_pair(progress=False, cache_dir=tmp_path / "cache", weights=copy)
    with pytest.raises(ValueError, match="weights= .* or recipe= .* not both"):
        demo_pair.default_pair(weights=copy, recipe=demo_pair.DEFAULT_RECIPE.smoke())


def test_the_recipe_trains_through_its_command_line(tmp_path, capsys):
    """`python -m speculant.demo.pair --train` in smoke mode: the same code as the full recipe, 2 steps."""
    assert demo_pair.main(["--train", "--smoke", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["recipe"] == dataclasses.asdict(demo_pair.DEFAULT_RECIPE.smoke())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.safetensors", "pair.json", "target.safetensors"]
    target_path, _ = demo_pair.default_pair(progress=False, cache_dir=tmp_path / "cache", weights=tmp_path)
    assert load(target_path).vocab_size == 256
    with pytest.raises(SystemExit):
        demo_pair.main(["--smoke"])
