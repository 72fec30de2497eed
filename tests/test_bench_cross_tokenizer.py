"""benchmarks/cross_tokenizer.py end to end on the smoke recipes (two training steps, tiny BPE vocabularies of 300
and 280): trains both models, checks every method's output against transformers' greedy output (the script
asserts it), times them against universal assisted generation and writes its record."""
import json
import os
import sys

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import cross_tokenizer  # noqa: E402


def test_cross_tokenizer_benchmark_runs(tmp_path):
    out = tmp_path / "cross.json"
    record = cross_tokenizer.main(["--prompts", "2", "--tokens", "8", "--repeats", "1", "--gammas", "2",
                                   "--out", str(out)], smoke=True, cache=tmp_path)
    assert json.loads(out.read_text()) == record
    names = [row["method"] for row in record["rows"]]
    assert names == ["transformers greedy", "transformers UAG", "speculant plain",
                     "speculant cross-tokenizer gamma=2"]
    assert record["rows"][1]["speedup_over_uag"] == 1.0 and record["gammas"]["2"]["tokens_per_target_call"] >= 1
