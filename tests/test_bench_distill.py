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


@pytest.mark.filterwarnings("ignore:.*settings are flagged:RuntimeWarning")
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
