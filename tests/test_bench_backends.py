"""benchmarks/backends.py's main path in --quick mode (2 prompts, 16 new tokens, 1 repeat) on the smoke recipe (tiny
models trained for 2 steps, as in test_bench_recipe.py), TorchScript and live backends: the results file, the
printed tables, the ratios, and greedy equality of every speculant method with transformers' greedy generate.
With --tree, the same on token trees (TorchScript, live and compiled).
pt2 is left out here: exporting the two smoke models compiles C++ for about a minute on the 2-core VM
(tests/test_pt2_*.py cover the backend)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import backends  # noqa: E402

METHODS = ["ts_plain", "ts_speculative", "live_plain", "live_speculative", "hf_plain", "hf_assisted"]
RATIOS = ["live_speculative / hf_assisted", "ts_speculative / ts_plain", "live_speculative / live_plain",
          "hf_assisted / hf_plain"]


@pytest.mark.parametrize("kind", ["gpt2", "t5"])
def test_quick_backends(kind, tmp_path, capsys):
    for temperature in ("0", "1"):
        path = backends.main(["--pair", kind, "--temperature", temperature, "--smoke", "--quick", "--threads", "1",
                              "--backends", "ts", "live", "--cache", str(tmp_path), "--out", str(tmp_path / "out")])
        assert path == tmp_path / "out" / f"backends-{kind}-T{temperature}-quick.json"
        result = json.loads(path.read_text())
        assert result["prompts"] == 2 and result["max_new_tokens"] == 16 and result["repeats"] == 1
        assert result["backends"] == ["ts", "live"] and result["skipped"] == {} and result["machine"]["cpus"]
        tps = result["tokens_per_second"]
        assert list(tps) == METHODS
        for t in tps.values():
            assert len(t["per_repeat"]) == 1 and t["min"] <= t["median"] <= t["max"] and t["median"] > 0
            assert t["new_tokens"] > 0
        assert list(result["ratios"]) == RATIOS
        assert result["ratios"]["live_speculative / hf_assisted"]["goal"] == 1.3
        printed = capsys.readouterr().out
        assert "| method | tokens/s (median) | min-max | × its plain |" in printed
        assert "| ratio | median | min-max | goal |" in printed
        assert all(f"| {name} |" in printed for name in METHODS + RATIOS)
        if temperature == "0":  # every speculant method gave transformers' greedy tokens on every prompt
            assert result["greedy_mismatches"] == {name: 0 for name in METHODS if name != "hf_plain"}
            assert "greedy sanity: every speculant method equals" in printed
        else:
            assert result["greedy_mismatches"] == {}


def test_quick_backends_with_a_tree(tmp_path, capsys):
    """--tree: the speculative methods draft a token tree (here on the TorchScript files, the live objects and the
    compiled ones), greedy equal to transformers' on every prompt; the file and the table say which tree."""
    path = backends.main(["--pair", "gpt2", "--temperature", "0", "--smoke", "--quick", "--threads", "1",
                          "--tree", "2,1", "--backends", "ts", "live", "compiled", "--cache", str(tmp_path),
                          "--out", str(tmp_path / "out")])
    assert path == tmp_path / "out" / "backends-gpt2-T0-tree21-quick.json"
    result = json.loads(path.read_text())
    assert result["tree"] == [2, 1] and result["backends"] == ["ts", "live", "compiled"]
    assert result["greedy_mismatches"] == {name: 0 for name in result["tokens_per_second"] if name != "hf_plain"}
    assert "tree=[2, 1] (assisted: gamma=4)" in capsys.readouterr().out
