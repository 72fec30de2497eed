"""Does this machine's torch load an AOTInductor package at all? A torch-only reproducer, no speculant.

    python benchmarks/pt2_load_check.py      # exit 0: it loads and runs; exit 1: the load crashed (the reason)

Exports a 4 x 4 nn.Linear on the CPU with torch.export and torch._inductor.aoti_compile_and_package, then loads it
with torch._inductor.aoti_load_package in a process of its own (a crash there is a signal, not an exception).
On the GPU image of the second lease (H200, torch 2.11.0+cu130, 2026-11-26) the load died of a segmentation
fault (benchmarks/results/pt2-load-crash-lease2-h200.log), and again on the third lease's H100 (same image);
benchmarks/gpu.sh runs this beside the .pt2 tests, which it keeps in a process of their own.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        package = Path(scratch) / "linear.pt2"
        module = torch.nn.Linear(4, 4).eval()
        program = torch.export.export(module, (torch.randn(2, 4),))
        torch._inductor.aoti_compile_and_package(program, package_path=str(package))
        load = (f"import torch; runner = torch._inductor.aoti_load_package({str(package)!r}); "
                "print(tuple(runner(torch.randn(2, 4)).shape))")
        result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", load], capture_output=True, text=True)
    if result.returncode == 0 and result.stdout.strip() == "(2, 4)":
        print(f"torch {torch.__version__}: a CPU AOTInductor package loads and runs")
        return 0
    print(f"torch {torch.__version__}: loading a CPU AOTInductor package failed (exit {result.returncode}):\n"
          + (result.stdout + result.stderr)[-1500:])
    return 1


if __name__ == "__main__":
    sys.exit(main())
