"""benchmarks/overhead.py --trees at toy sizes: the chain and a tree on the host kernels and on the accelerators'
tensor path (speculant.testing.tensor_path), for one prompt, a batch, and one prompt through the fixed-shape buffers
of CUDA graphs: each row of the printed table filled, the tensor path counting more operations per iteration than
the host kernels, and counting them by phase; through the buffers, the launches a GPU would make with the graphs
captured estimated below the operations run uncaptured."""

import os
import re
import sys

import pytest

from speculant import _core

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import overhead  # noqa: E402


@pytest.mark.parametrize("batch, graphs", [(1, "off"), (3, "off"), (1, "fixed")])
def test_trees_on_both_paths(batch, graphs, capsys):
    overhead.main(["--trees", "2,1", "--gamma", "2", "--threads", "1", "--generations", "2", "--tokens", "12",
                   "--vocab", "64", "--batch", str(batch), "--cuda-graphs", graphs])
    out = capsys.readouterr().out
    assert f"batch {batch}, cuda_graphs {graphs}" in out
    rows = re.findall(r"^\| (chain gamma = 2|tree 2,1 coupled) \| (host kernels|tensor path) \| (\d+) \[(\d+)-(\d+)\] "
                      r"\| ([\d.]+) \| ([\d.]+), ([\d.]+), ([\d.]+), ([\d.]+) \| ([\d.]+|-) \| ([\d.]+) "
                      r"\| ([\d.]+) \|$", out, re.MULTILINE)
    assert sorted((name, path) for name, path, *_ in rows) == [
        ("chain gamma = 2", "host kernels"), ("chain gamma = 2", "tensor path"),
        ("tree 2,1 coupled", "host kernels"), ("tree 2,1 coupled", "tensor path")]
    operations = {}
    for name, path, median, low, high, count, draft, verify, accept, other, captured, iteration, tokens in rows:
        assert 0 < int(low) <= int(median) <= int(high) and float(iteration) > 0 and 1 <= float(tokens) <= 3
        operations[name, path] = float(count)
        # with graphs captured the verification's work is one replay: fewer launches than through the buffers alone
        assert (captured != "-") == (graphs == "fixed" and path == "tensor path")
        if captured != "-":
            assert float(captured) < float(count)
        phases = [float(v) for v in (draft, verify, accept, other)]
        assert sum(phases) == pytest.approx(float(count), abs=0.2)  # each printed to 0.1
        if path == "tensor path":  # every phase launches operations there: the engine's scopes are seen
            assert min(phases[:3]) > 0
    for name in ("chain gamma = 2", "tree 2,1 coupled"):  # the host kernels run a row's math as one operation
        assert 0 < operations[name, "host kernels"] < operations[name, "tensor path"]
    assert _core.set_host_kernels(True)  # the host kernels are back after the tensor path's block
