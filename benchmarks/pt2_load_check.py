"""Does this machine's torch load an AOTInductor package at all, and if not, where does loading fail? A reproducer
in torch alone, and the same package built as speculant's .pt2 export builds its packages.

    python benchmarks/pt2_load_check.py      # exit 0: the package loads and runs; exit 1: it crashed (the reasons)

Exports a 4 x 4 nn.Linear on the CPU with torch.export and torch._inductor.aoti_compile_and_package, then runs it
two ways, each in a process of its own (a crash there is a signal, not an exception):

* "package": torch._inductor.aoti_load_package, the route speculant's .pt2 backend takes (AOTIModelPackageLoader);
* "library": the package's compiled model library (its wrapper .so, the weights inside it) taken out of the
  archive and run by torch._C._aoti.AOTIModelContainerRunnerCpu, without the package loader. Where the package
  crashes and this runs, the fault is in the package loader, and a backend could load the library itself; where
  both crash, it is in loading the compiled code.

It builds the package twice, each time in a process of its own (torch alone) with an empty Inductor cache: with
the machine's C++ compiler as Inductor finds it ("default"), and through speculant.export.compiler's wrapper of
the same compiler, which adds -fno-gnu-unique and links with -Wl,-Bsymbolic ("bound locally": how speculant's
export_pt2 builds packages; the module's docstring says why). The library compiles its own copies of the inline
and template code it uses (std::regex's among them, in torch's header model_base.h), but the dynamic linker binds
its calls to the first copy in the process's global scope, and the function-local statics of inline code (GNU
unique symbols) to the first copy in the whole process, whichever library holds it: on the development VM the
default library's std::regex statics bind to those of libcufile.so.0 (a CUDA library that torch loads, built with
GCC 11). Bound locally, the library uses its own copies, compiled by the same compiler as the code that calls
them.

First it prints the machine's C++ compiler, the compiler torch was built with, glibc and the libstdc++ a torch
process maps, and, for each library, where the dynamic linker binds the std::regex symbols it defines, where not to
its own copies (LD_DEBUG=bindings with LD_BIND_NOW=1, so that every binding is printed before any
call runs: a crash at load still shows them).

On the GPU image of the second lease (H200, torch 2.11.0+cu130, 2026-11-26) the package's load died of a
segmentation fault (benchmarks/results/pt2-load-crash-lease2-h200.log), and again on the third to sixth leases
(same image); a debugger's backtrace ended in std::regex, in the wrapper library's torch::aot_inductor::
parse_device_str (an inline function of torch's header model_base.h, compiled into the library). The development
VM (g++ 12, torch 2.11 and 2.15, each built with GCC 13.3) loads the same packages. If "bound locally" loads where
"default" crashes, the crash is the library's use of another library's copies of that code; if both crash, it is
not.
benchmarks/gpu.sh runs this beside the .pt2 tests, which it keeps in a process of their own.
"""
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

EXPORT = ("import torch; module = torch.nn.Linear(4, 4).eval(); "
          "program = torch.export.export(module, (torch.randn(2, 4),)); "
          "torch._inductor.aoti_compile_and_package(program, package_path={path!r})")
RUN_PACKAGE = ("import torch; runner = torch._inductor.aoti_load_package({path!r}); "
               "print(tuple(runner(torch.randn(2, 4)).shape))")
RUN_LIBRARY = ("import torch; runner = torch._C._aoti.AOTIModelContainerRunnerCpu({path!r}, 1); "
               "print(tuple(runner.run([torch.randn(2, 4)])[0].shape))")
MAPPED = ("import torch, re; print(sorted({line.split()[-1] for line in open('/proc/self/maps') "
          "if re.search(r'libstdc\\+\\+', line)}))")


def run(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          env=env)


def works(result: subprocess.CompletedProcess) -> bool:
    return result.returncode == 0 and result.stdout.strip().endswith("(2, 4)")


def compiler() -> str:
    """The C++ compiler Inductor takes here: $CXX, else g++ (torch._inductor.config.cpp.cxx), as a path."""
    name = os.environ.get("CXX", "g++")
    return shutil.which(name) or name


def first_line(command) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        return f"not run ({error})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "no output"


def environment() -> None:
    torch_build = run("import torch; print(torch.__config__.show())").stdout
    built = re.search(r"GCC \d+\.\d+|clang \d+\.\d+", torch_build)
    print(f"compiler: {compiler()}: {first_line([compiler(), '--version'])}")
    print(f"torch built with: {built.group(0) if built else 'not stated'}; glibc {platform.libc_ver()[1]}; "
          f"libstdc++ mapped by a torch process: {run(MAPPED).stdout.strip()}")


def bindings(label: str, library: Path) -> None:
    """Prints where the dynamic linker binds the std::regex symbols that the library defines itself (nm -D) to
    another library's copy."""
    if not shutil.which("nm"):
        print(f"{label}: bindings not checked (nm not found)")
        return
    defined = set(subprocess.run(["nm", "-D", "--defined-only", "--format=just-symbols", str(library)],
                                 capture_output=True, text=True).stdout.split())
    env = {**os.environ, "LD_DEBUG": "bindings", "LD_BIND_NOW": "1"}
    lines = run(RUN_LIBRARY.format(path=str(library)), env).stderr.splitlines()
    found = {}
    for line in lines:
        match = re.search(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \w+ symbol `([^']+)'", line)
        if match and match.group(1) == str(library) and match.group(2) != str(library) \
                and match.group(3) in defined and re.search(r"regex|8__detail", match.group(3)):
            found.setdefault(match.group(2), []).append(match.group(3))
    if not found:
        print(f"{label}: the {sum(bool(re.search(r'regex|8__detail', d)) for d in defined)} std::regex symbols the "
              "library defines all bind to its own copies")
    for where, symbols in found.items():
        names = subprocess.run(["c++filt"], input="\n".join(symbols[:3]), capture_output=True, text=True).stdout \
            if shutil.which("c++filt") else "\n".join(symbols[:3])
        print(f"{label}: {len(symbols)} std::regex symbols the library defines bind to {where}'s copies, e.g. "
              + "; ".join(name[:160] for name in names.splitlines()))


def check(label: str, scratch: Path, cxx=None) -> dict:
    """Builds the package in a process of its own (an empty Inductor cache, CXX = cxx) and runs both routes."""
    folder = scratch / label.replace(" ", "-")
    folder.mkdir()
    package = folder / "linear.pt2"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "cache")}
    if cxx is not None:
        env["CXX"] = str(cxx)
    built = run(EXPORT.format(path=str(package)), env)
    if built.returncode != 0 or not package.exists():
        return {"build": built}
    routes = {"package": run(RUN_PACKAGE.format(path=str(package)))}
    with zipfile.ZipFile(package) as archive:
        libraries = [name for name in archive.namelist() if name.endswith(".so") and "/aotinductor/" in name]
        if len(libraries) == 1:
            library = Path(archive.extract(libraries[0], folder))
            dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout \
                if shutil.which("readelf") else ""
            print(f"{label}: the library's dynamic section "
                  + ("(readelf not found)" if not dynamic else "says SYMBOLIC" if "SYMBOLIC" in dynamic
                     else "has no SYMBOLIC flag"))
            routes["library"] = run(RUN_LIBRARY.format(path=str(library)))
            bindings(label, library)
        else:
            print(f"{label}, library: not run, the archive holds {len(libraries)} model libraries: {libraries}")
    return routes


def main() -> int:
    import torch

    environment()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        results["default"] = check("default", scratch)
        from speculant.export import compiler as export_compiler

        results["bound locally"] = check("bound locally", scratch, export_compiler.bound_locally(compiler()))
    for label, routes in results.items():
        prefix = "" if label == "default" else f"{label} (-fno-gnu-unique -Wl,-Bsymbolic), "
        for route, result in routes.items():
            said = "loads and runs" if works(result) else f"failed (exit {result.returncode}):\n" + (
                result.stdout + result.stderr)[-1500:]
            what = "build" if route == "build" else f"a CPU AOTInductor {route}"
            print(f"torch {torch.__version__}, {prefix}{route}: {what} {said}")
    return 0 if works(results["default"].get("package", results["default"].get("build"))) else 1


if __name__ == "__main__":
    sys.exit(main())
