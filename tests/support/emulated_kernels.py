"""cpp/kernels/*.cu run on the CPU: the .cu files compiled as C++ with tests/cuda_emulator (one OS thread per
CUDA thread, __syncthreads and the warp shuffles as checked barriers) and a sanitizer, AddressSanitizer for
reads and writes out of bounds, ThreadSanitizer for races on shared memory. The kernels' CUDA tests need a GPU;
these run their launchers here, on the same arguments, so that an index, barrier or race bug fails on the VM.

`launch(kernel, sanitizer, **arguments)` writes each tensor argument to a file (a buffer of exactly its bytes),
runs tests/cuda_emulator/harness.cpp on them and returns every tensor as the kernel left it.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "tests" / "cuda_emulator"
KERNELS = sorted((ROOT / "cpp" / "kernels").glob("*.cu"))
SOURCES = [EMULATOR / "emulator.cpp", EMULATOR / "harness.cpp"]
HEADERS = [EMULATOR / "cuda_emulator.h", *sorted((ROOT / "cpp" / "kernels").glob("*.h*"))]
FLAGS = {"address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], "thread": ["-fsanitize=thread"]}
# a sanitizer's report fails the run (exit status 66) instead of being printed only
ENVIRONMENT = {"ASAN_OPTIONS": "detect_leaks=0:exitcode=66", "TSAN_OPTIONS": "halt_on_error=1:exitcode=66",
               "UBSAN_OPTIONS": "print_stacktrace=1"}
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class KernelFailed(RuntimeError):
    """The emulated launch stopped: `status` 2 bad arguments, 3 a trap, 4 a launch error, else a sanitizer's
    report or an emulator's check (the message holds what it printed)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"exit status {status}: {message}")
        self.status = status


def cuda_headers() -> Path | None:
    """The CUDA toolkit's include folder (cuda_runtime.h, cuda_bf16.h), or None."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    for home in (os.environ.get("CUDA_HOME"), Path(nvcc).resolve().parents[1], "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home) / "include"
    return None


def missing() -> str | None:
    """Why the emulated kernels cannot run here, or None."""
    if shutil.which("g++") is None:
        return "no g++"
    return None if cuda_headers() else "no CUDA toolkit headers (cuda_runtime.h)"


# a test that runs emulated kernels: skipped, with the reason, where they cannot run
needed = pytest.mark.skipif(missing() is not None, reason=f"emulated kernels: {missing()}")


def harness(sanitizer: str) -> Path:
    """The harness built with `sanitizer`, once per version of its sources (cached in the temporary folder)."""
    # -fno-strict-aliasing: the kernels read their elements through 16-byte vectors, as CUDA allows
    common = ["g++", "-std=c++20", "-O1", "-g", "-fno-omit-frame-pointer", "-fno-strict-aliasing", *FLAGS[sanitizer],
              "-pthread", f"-I{cuda_headers()}", f"-I{ROOT / 'cpp'}", f"-I{EMULATOR}", "-DSPECULANT_CUDA_EMULATOR"]
    sources = b"".join(p.read_bytes() for p in [*KERNELS, *SOURCES, *HEADERS])
    digest = hashlib.sha256(sources + " ".join(common).encode()).hexdigest()[:16]
    built = Path(tempfile.gettempdir()) / f"speculant-emulator-{digest}" / "harness"
    if built.exists():
        return built
    built.parent.mkdir(parents=True, exist_ok=True)
    cu = ["-include", str(EMULATOR / "cuda_emulator.h"), "-x", "c++", *map(str, KERNELS), "-x", "none"]
    partial = built.with_name(f"harness.{os.getpid()}")  # two suites side by side may build it at once
    done = subprocess.run([*common, *cu, *map(str, SOURCES), "-o", str(partial)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the emulated kernels failed:\n{done.stderr[:6000]}")
    partial.rename(built)
    return built


def launch(kernel: str, sanitizer: str = "address", **arguments) -> dict[str, torch.Tensor]:
    """Runs `kernel`'s launcher (launch.h) on `arguments`: tensors are its buffers (None: a null pointer), ints,
    floats and strings its scalars, tuples its arrays. Returns each tensor argument after the run."""
    tensors = {name: value for name, value in arguments.items() if isinstance(value, torch.Tensor)}
    with tempfile.TemporaryDirectory() as folder:
        lines = [f"kernel {kernel}"]
        for name, value in arguments.items():
            if isinstance(value, torch.Tensor):
                lines.append(f"buffer {name}")
                Path(folder, f"{name}.bin").write_bytes(bytes_of(value))
            elif value is not None:
                values = value if isinstance(value, tuple) else (value,)
                lines.append(" ".join([name, *(DTYPES.get(v, str(v)) for v in values)]))
        Path(folder, "args.txt").write_text("\n".join(lines) + "\n")
        try:
            done = subprocess.run([str(harness(sanitizer)), folder], capture_output=True, text=True,
                                  env={**os.environ, **ENVIRONMENT}, timeout=600)
        except subprocess.TimeoutExpired:
            raise KernelFailed(-1, "the launch did not end in 600 s (a thread that never returns)") from None
        if done.returncode != 0:
            raise KernelFailed(done.returncode, done.stderr[:3000])  # a report opens with what it found
        return {name: from_bytes(Path(folder, f"{name}.out").read_bytes(), t) for name, t in tensors.items()}


def bytes_of(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().view(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def from_bytes(data: bytes, like: torch.Tensor) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return raw.view(like.dtype).view(like.shape)
