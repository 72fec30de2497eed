"""benchmarks/distill.py end to end on the smoke-sized demo pair (two training steps): it distills, sweeps both
drafts, compares distillation from scratch with ordinary training, and writes its record."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
pytest.importorskip("pandas")
import distill as bench  # noqa: E402

from speculant import demo_pair  # noqa: E402


def test_distill_benchmark_runs(smoke_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    out = tmp_path / "distill.json"
    bench.main(["--steps", "2", "--repeats", "1", "--tokens", "8", "--prompts", "1", "--batch", "2", "--out", str(out)])
    record = json.loads(out.read_text())
    assert len(record["distill"]["first_losses"]) == 2
    assert {r["gamma"] for r in record["sweeps"]["before"]} == {2, 4} == {r["gamma"] for r in record["sweeps"]["after"]}
    for alpha in (record["distill"]["alpha_before"], record["distill"]["alpha_after"],
                  record["from_scratch"]["ordinary"]):
        assert 0 < alpha["mean"] < 1 and len(alpha["per_prompt"]) == 24
    assert not (tmp_path / "distilled-draft.pt").exists()  # the distilled draft is removed after the sweep
    assert "held-out alpha (T = 1)" in capsys.readouterr().out


def test_distill_benchmark_runs_on_the_gpt2_pair(tmp_path, monkeypatch, capsys):
    """--pair gpt2 on the smoke recipe's GPT-2 pair: a save_pretrained draft distilled, exported for the sweep,
    and both written files removed afterwards."""
    import train_pairs
    recipe = train_pairs.GPT2_CPU.smoke()
    pair = train_pairs.build(recipe, cache=tmp_path, progress=False)
    monkeypatch.setattr(train_pairs, "GPT2_CPU", recipe)
    monkeypatch.setattr(train_pairs, "pair_dir", lambda recipe, cache=None: pair)
    out = tmp_path / "distill.json"
    bench.main(["--pair", "gpt2", "--steps", "2", "--repeats", "1", "--tokens", "4", "--prompts", "1", "--batch",
                "2", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["pair"] == str(pair) and len(record["distill"]["first_losses"]) == 2
    assert {r["gamma"] for r in record["sweeps"]["after"]} == {2, 4}
    for alpha in (record["distill"]["alpha_after"], record["from_scratch"]["ordinary"]):
        assert 0 < alpha["mean"] < 1 and len(alpha["per_prompt"]) == 24
    assert not any(tmp_path.glob("distilled-draft-gpt2*"))
    assert "gpt2 draft distilled 2 steps" in capsys.readouterr().out
