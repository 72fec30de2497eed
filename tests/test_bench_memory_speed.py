"""benchmarks/shapes.py and benchmarks/memory_speed.py (issue 48): the shapes users run have their published
parameter counts, a call's read bytes leave out an untied embedding, and the whole GPU script runs on the CPU on
tiny shapes, every part reporting and every goal in its summary table."""

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import memory_speed  # noqa: E402
import shapes  # noqa: E402


@pytest.mark.parametrize("name, count", [("llama-8b", 8_030_261_248), ("llama-1b", 1_235_814_400),
                                         ("llama-1.1b", 1_100_048_384), ("gpt2-target", 91_740_672),
                                         ("gpt2-draft", 3_808_256)])
def test_shapes_have_the_published_parameter_counts(name, count):
    """Llama-3.1-8B: 8.03B; Llama-3.2-1B: 1.24B; TinyLlama: 1.1B (counted on the meta device: no memory)."""
    assert shapes.parameters(name) == count


def test_a_call_reads_an_untied_embedding_only_at_its_rows():
    untied = shapes.build("tiny-llama", torch.device("cpu"), torch.bfloat16)
    tied = shapes.build("tiny-llama-draft", torch.device("cpu"), torch.bfloat16)
    total = sum(p.numel() * 2 for p in untied.parameters())
    assert shapes.read_weight_bytes(untied) == total - 512 * 64 * 2  # the 512 x 64 bf16 input embedding
    assert shapes.read_weight_bytes(tied) == sum(p.numel() * 2 for p in tied.parameters())
    with pytest.raises(ValueError, match="unknown model shape 'llama-9b'"):
        shapes.config("llama-9b")


def test_the_gpu_script_runs_every_part_on_tiny_shapes(tmp_path):
    out, table = tmp_path / "out.json", tmp_path / "summary.md"
    # times are differences of a 64-token run and a 16-token one: 16 and 4 tokens drowned in a loaded CI's noise
    # (a negative c, 2026-11-28)
    results = memory_speed.main(["--device", "cpu", "--models", "tiny", "--tokens", "64", "--repeats", "1",
                                 "--out", str(out), "--summary", str(table)])
    assert set(results) == {"device", "setup", "target", "draft", "verification", "buckets", "gpt2_pair", "demo"}
    target = results["target"]
    assert target["parameters"] == shapes.parameters("tiny-llama")
    assert target["ms_per_token"][1] <= target["ms_per_token"][0] <= target["ms_per_token"][2]
    assert target["floor_ms"] > 0 and target["over_floor"] == target["ms_per_token"][0] / target["floor_ms"]
    assert results["draft"]["parameter_ratio"] == pytest.approx(25696 / 139584)
    assert set(results["verification"]) == {"chain gamma 4", "tree [2, 1]"}
    assert set(results["demo"]) == {2, 4, 6} and all(v["predicted"] > 0 for v in results["demo"].values())
    assert json.loads(out.read_text())["setup"]["dtype"] == "torch.float32"
    rows = table.read_text().splitlines()
    assert rows[0] == "| goal | measured | bound | met |" and len(rows) == 2 + 15
    assert any(r.startswith("| a call at < 64 used slots, 4096-slot cache over 64-slot |") for r in rows)


def test_parts_past_the_deadline_are_skipped_and_said_so(capsys):
    results = memory_speed.main(["--device", "cpu", "--models", "tiny", "--parts", "target", "draft",
                                 "--deadline", "0"])
    assert set(results) == {"device", "setup"}
    assert "target: skipped (past the deadline)" in capsys.readouterr().out
