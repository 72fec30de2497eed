"""benchmarks/beams.py end to end on the smoke recipe's GPT-2 pair (train_pairs' code path on tiny models): every
method timed against transformers' beam search, the best beams compared with transformers' prompt for prompt."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import beams as bench  # noqa: E402
import train_pairs  # noqa: E402


def test_beams_benchmark_runs(tmp_path, monkeypatch, capsys):
    recipe = train_pairs.GPT2_CPU.smoke()
    train_pairs.build(recipe, cache=tmp_path, progress=False)
    monkeypatch.setitem(train_pairs.PRESETS["cpu"], "gpt2", recipe)
    out = tmp_path / "beams.json"
    bench.main(["--widths", "2", "--gammas", "2", "--prompts", "2", "--prompt-tokens", "8", "--tokens", "6",
                "--repeats", "1", "--threads", "1", "--cache", str(tmp_path), "--out", str(out), "--live"])
    record = json.loads(out.read_text())
    rows = {row["method"]: row for row in record["rows"]}
    assert list(rows) == ["hf_w2", "plain_w2", "spec_w2_u2_g2", "spec_w2_u4_g2", "live_plain_w2", "live_spec_w2_u4_g2"]
    assert all(row["mismatches"] == 0 for row in rows.values())
    assert rows["hf_w2"]["vs_hf"] == pytest.approx(1.0) and "steps_per_call" not in rows["hf_w2"]
    assert rows["plain_w2"]["steps_per_call"] == pytest.approx(1.0)
    assert 1 < rows["plain_w2"]["target_tokens_per_step"] <= 2  # at most w nodes per step
    assert rows["spec_w2_u4_g2"]["target_tokens_per_step"] > rows["plain_w2"]["target_tokens_per_step"]
    for row in rows.values():
        assert row["vs_hf_min"] <= row["vs_hf"] <= row["vs_hf_max"]
    assert rows["spec_w2_u4_g2"]["draft_beams"] == 4 and rows["spec_w2_u4_g2"]["gamma"] == 2
    # the live objects search as the exports do: the same steps per call on the same weights
    assert rows["live_spec_w2_u4_g2"]["steps_per_call"] == pytest.approx(rows["spec_w2_u4_g2"]["steps_per_call"])
    assert "equals transformers' on all 2 prompts" in capsys.readouterr().out
