"""Does this machine's torch load an AOTInductor package at all, and if not, where does loading fail? A torch-only
reproducer, no speculant.

    python benchmarks/pt2_load_check.py      # exit 0: the package loads and runs; exit 1: it crashed (the reasons)

Exports a 4 x 4 nn.Linear on the CPU with torch.export and torch._inductor.aoti_compile_and_package, then runs it
two ways, each in a process of its own (a crash there is a signal, not an exception):

* "package": torch._inductor.aoti_load_package, the route speculant's .pt2 backend takes (AOTIModelPackageLoader);
* "library": the package's compiled model library (its wrapper .so, the weights inside it) taken out of the
  archive and run by torch._C._aoti.AOTIModelContainerRunnerCpu, without the package loader. Where the package
  crashes and this runs, the fault is in the package loader, and a backend could load the library itself; where
  both crash, it is in loading the compiled code.

On the GPU image of the second lease (H200, torch 2.11.0+cu130, 2026-11-26) the package's load died of a
segmentation fault (benchmarks/results/pt2-load-crash-lease2-h200.log), and again on the third to sixth leases
(same image); benchmarks/gpu.sh runs this beside the .pt2 tests, which it keeps in a process of their own.
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

RUN_PACKAGE = ("import torch; runner = torch._inductor.aoti_load_package({path!r}); "
               "print(tuple(runner(torch.randn(2, 4)).shape))")
RUN_LIBRARY = ("import torch; runner = torch._C._aoti.AOTIModelContainerRunnerCpu({path!r}, 1); "
               "print(tuple(runner.run([torch.randn(2, 4)])[0].shape))")


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True)


def works(result: subprocess.CompletedProcess) -> bool:
    return result.returncode == 0 and result.stdout.strip().endswith("(2, 4)")


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        package = Path(scratch) / "linear.pt2"
        module = torch.nn.Linear(4, 4).eval()
        program = torch.export.export(module, (torch.randn(2, 4),))
        torch._inductor.aoti_compile_and_package(program, package_path=str(package))
        routes = {"package": run(RUN_PACKAGE.format(path=str(package)))}
        with zipfile.ZipFile(package) as archive:
            libraries = [name for name in archive.namelist() if name.endswith(".so") and "/aotinductor/" in name]
            if len(libraries) == 1:
                library = Path(archive.extract(libraries[0], scratch))
                routes["library"] = run(RUN_LIBRARY.format(path=str(library)))
            else:
                print(f"library: not run, the archive holds {len(libraries)} model libraries: {libraries}")
    for route, result in routes.items():
        said = "loads and runs" if works(result) else f"failed (exit {result.returncode}):\n" + (
            result.stdout + result.stderr)[-1500:]
        print(f"torch {torch.__version__}, {route}: a CPU AOTInductor {route} {said}")
    return 0 if works(routes["package"]) else 1


if __name__ == "__main__":
    sys.exit(main())
