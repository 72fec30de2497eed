"""benchmarks/hierarchy.py end to end on the smoke-sized demo pair: two- and three-level settings timed against
plain decoding, each with its levels and its prediction, written to its record."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import hierarchy as bench  # noqa: E402

from speculant import analysis, demo_pair  # noqa: E402


def test_hierarchy_benchmark_runs(smoke_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    out = tmp_path / "hierarchy.json"
    bench.main(["--quick", "--repeats", "1", "--tokens", "8", "--prompts", "1", "--temperatures", "1",
                "--calls", "3", "--out", str(out)])
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert len(record["target_widths"]) == len(record["draft_widths"]) == 6 and record["target_widths"][0] == 1.0
    assert [r["depth"] for r in rows] == [2, 2, 3, 3]
    assert [r["levels"] is None for r in rows] == [True, True, False, False]
    for row in rows:
        assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
        if len(row["gammas"]) == 2:
            assert row["draft_calls"] == 0  # the top's drafter calls no model itself: its level does
    three = rows[2]  # the prediction is Theorem 3.8 composed at the row's own alphas and costs
    assert three["gammas"] == [4, 2]
    alphas = [three["alpha"], three["levels"][0]["alpha"]]
    costs = [level["c"] for level in three["levels"]]
    assert three["predicted_speedup"] == pytest.approx(analysis.hierarchical_improvement(alphas, [4, 2], costs))
    assert three["predicted_width_aware"] == pytest.approx(analysis.hierarchical_improvement(
        alphas, [4, 2], [record["c"], costs[1] * costs[0] / record["c"]],
        verify_costs=[record["target_widths"], record["draft_widths"]]))
    # the cost model: the same composition at the costs the engine timed in the row's rounds (in the record)
    costs = three["costs"]
    assert costs["c"] > 0 and costs["bottom_c"] > 0 and costs["overhead"] >= 0 and costs["level_overhead"] >= 0
    assert costs["alpha_level"] == pytest.approx(alphas[1]) and costs["gamma_level"] == 2
    assert three["cost_model_speedup"] == pytest.approx(analysis.hierarchical_improvement(
        alphas, [4, 2], [costs["c"], costs["bottom_c"]], verify_costs=[lambda w: 1 + costs["slope"] * (w - 1), None],
        overheads=[costs["overhead"], costs["level_overhead"]], plain_overhead=costs["plain_overhead"]))
    two = rows[0]["costs"]
    assert rows[0]["cost_model_speedup"] == pytest.approx(analysis.hierarchical_improvement(
        [rows[0]["acceptance"]], rows[0]["gammas"], [two["c"]], verify_costs=[lambda w: 1 + two["slope"] * (w - 1)],
        overheads=[two["overhead"]], plain_overhead=two["plain_overhead"]))
    (duel,) = record["head_to_head"]  # the best of each depth timed against each other
    assert duel["rounds"] == len(duel["ratios"]) == 4 and duel["ratio_min"] <= duel["ratio"] <= duel["ratio_max"]
    assert duel["three_faster"] == sum(r > 1 for r in duel["ratios"]) and 0 < duel["sign_test_p"] <= 1
    assert duel["three"] in ([4, 2], [3, 1]) and duel["two"] in ([3], [4])
    printed = capsys.readouterr().out
    assert "measured/cost model" in printed and "timed against each other" in printed
