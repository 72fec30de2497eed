"""benchmarks/feature_drafts.py end to end on the smoke recipe (a 2-layer Llama, two training steps): trains the
target, measures every exit layer, checks every method's output against transformers' greedy output (the script
asserts it), times EarlyExitDraft against transformers' early-exit assisted generation and writes its record."""
import json
import os
import sys

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import feature_drafts  # noqa: E402


def test_feature_drafts_benchmark_runs(tmp_path):
    out = tmp_path / "features.json"
    record = feature_drafts.main(["--prompts", "2", "--tokens", "8", "--repeats", "1", "--gammas", "2",
                                  "--out", str(out)], smoke=True, cache=tmp_path)
    assert json.loads(out.read_text()) == record
    assert [row["method"] for row in record["rows"]] == [
        "transformers greedy", "speculant plain", "transformers early exit gamma=2", "speculant EarlyExitDraft gamma=2",
        "speculant EarlyExitDraft gamma=2, draft_confidence=0.4", "speculant EarlyExitDraft gamma=2, own cache",
        "speculant EarlyExitDraft gamma=2, own cache, draft_confidence=0.4"]
    assert record["best_exit_layer"] == 1
    assert [(r["exit_layer"], r["temperature"]) for r in record["layers"]] == [(1, 0.0), (1, 1.0)]
    assert all(r["tokens_per_target_call"] >= 1 and r["c"] > 0 for r in record["layers"])
