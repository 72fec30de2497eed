"""benchmarks/feature_heads.py end to end on the smoke recipe (2-layer Llamas, two training steps): trains the
pair, distills an EAGLE head and Medusa heads (two steps), and measures every draft (early exit too, sharing the
target's cache and not) at both temperatures, chains and trees, writing its record; a second run loads the cached
heads instead of training them again."""
import json
import os
import sys

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import feature_heads  # noqa: E402


def test_feature_heads_benchmark_runs(tmp_path):
    out = tmp_path / "heads.json"
    arguments = ["--prompts", "2", "--tokens", "8", "--repeats", "1", "--steps", "2", "--out", str(out)]
    record = feature_heads.main(arguments, smoke=True, cache=tmp_path)
    assert json.loads(out.read_text()) == record
    grown = [(r["draft"], r["temperature"], r["shape"]) for r in record["rows"] if r["shape"] != "best tree of 16"]
    assert grown == [
        (draft, temperature, shape) for draft in ("draft model", "EagleDraft", "MedusaDraft",
                                                  "EarlyExitDraft, layer 1", "EarlyExitDraft, layer 1, own cache")
        for temperature in (0.0, 1.0) for shape in ("chain gamma=4", "tree of 16")]
    best = [i for i, r in enumerate(record["rows"]) if r["shape"] == "best tree of 16"]
    assert len(best) >= 5  # Sequoia's tree at the grown tree's table, where anything was accepted
    for i in best:
        before = record["rows"][i - 1]
        assert before["shape"] == "tree of 16" and before["draft"] == record["rows"][i]["draft"]
        assert before["best_tree"][0] == -1 and 1 < len(before["best_tree"]) <= 17
        assert before["best_tree_expected_tokens"] > 1
    exits = [r["tokens_per_target_call"] for r in record["rows"] if r["draft"].startswith("EarlyExitDraft")
             and r["temperature"] == 0]
    assert exits[:len(exits) // 2] == exits[len(exits) // 2:]  # greedy: the same with the shared cache as without
    assert all(r["tokens_per_target_call"] >= 1 and r["c"] > 0 for r in record["rows"])
    assert all((r["predicted_speedup"] is None) == (r["shape"] != "chain gamma=4") for r in record["rows"])
    assert record["training"]["eagle"]["steps"] == 2 and record["training"]["eagle"]["parameters"] > 0
    again = feature_heads.main(arguments, smoke=True, cache=tmp_path)
    assert again["training"] == record["training"]
    eagle3 = feature_heads.main(["--drafts", "eagle3", *arguments], smoke=True, cache=tmp_path)
    assert {r["draft"] for r in eagle3["rows"]} == {"EagleDraft (EAGLE-3)"}
    assert eagle3["training"]["eagle3"]["config"]["feature_layers"] == [1]
    export = feature_heads.main(["--target", "export", *arguments], smoke=True, cache=tmp_path)
    assert export["target_form"] == "export" and export["training"] == record["training"]
    assert [r["draft"] for r in export["rows"]] == [r["draft"] for r in record["rows"] if "Exit" not in r["draft"]]
    with pytest.raises(SystemExit):
        feature_heads.main(["--target", "export", "--drafts", "early-exit", *arguments], smoke=True, cache=tmp_path)
    both = feature_heads.main(["--target", "export", "--drafts", "eagle", "--cuda-graphs", "off", "fixed",
                               "--compile", "--no-best-tree", *arguments], smoke=True, cache=tmp_path)
    assert [r["cuda_graphs"] for r in both["rows"]] == (["off"] * 4 + ["fixed"] * 4) * 2
    assert {r["draft"] for r in both["rows"]} == {"EagleDraft", "EagleDraft, compiled"}
    greedy = [r["tokens_per_target_call"] for r in both["rows"] if r["temperature"] == 0]
    assert greedy == greedy[:2] * 4  # the same tokens at T = 0, with fixed shapes as without, compiled or not
    assert all(r["tokens_per_second"] > 0 for r in both["rows"])
    gpt2 = feature_heads.main(["--pair", "gpt2-lease", "--target", "export", "--drafts", "draft", "eagle",
                               "--cuda-graphs", "auto", *arguments], smoke=True, cache=tmp_path)
    assert gpt2["pair"] == "gpt2-lease" and gpt2["target"]["config"]["n_layer"] == 1
    assert [(r["draft"], r["temperature"]) for r in gpt2["against_the_draft"]] == [("EagleDraft", 0.0),
                                                                                 ("EagleDraft", 1.0)]
    assert all(r["tree_over_draft_best"] > 0 for r in gpt2["against_the_draft"])
