"""benchmarks/fused_ops.py runs end to end on the CPU (where the fused operations are the ATen composites): a row
per shape and cache length, per norm width and per fused linear operation of a layer, each with both timings, their
ratio and its floor."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import fused_ops  # noqa: E402


def test_fused_ops_benchmark_times_both_forms_of_each_operation(tmp_path):
    out = tmp_path / "fused.json"
    result = fused_ops.main(["--device", "cpu", "--shapes", "llama-1.1b", "gpt2", "--keys", "17", "64",
                             "--widths", "256", "--tokens", "2", "--calls", "2", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = result["rows"]
    assert [(r["op"], r.get("shape"), r.get("keys", r.get("width"))) for r in rows] == [
        ("decode_attention", "llama-1.1b", 17), ("decode_attention", "llama-1.1b", 64),
        ("decode_attention", "gpt2", 17), ("decode_attention", "gpt2", 64), ("rms_norm", None, 256)] + [
        ("linear", shape, None) for shape in ("llama-1.1b", "gpt2") for _ in range(4)]
    linear = [r for r in rows if r["op"] == "linear"]
    assert [(r["part"], r["input"], r["tokens"]) for r in linear[4:]] == [
        ("qkv", "layer_norm", 2), ("proj", "none", 2), ("fc", "layer_norm", 2), ("fc_proj", "gelu_tanh", 2)]
    down = linear[3]  # the weights and the gated input [gate | up] it reads
    assert down["input"] == "gated_silu" and down["floor_ms"] == 1e3 * 4 * (2048 * 5632 + 2 * 2 * 5632) / result[
        "read_bytes_per_s"]
    for row in rows:
        for key in ("speculant_ms", "torch_ms"):
            median, low, high = row[key]
            assert 0 < low <= median <= high
        assert row["ratio"] == row["speculant_ms"][0] / row["torch_ms"][0] and row["floor_ms"] > 0
    assert fused_ops.table(rows).count("\n") == len(rows) + 1
