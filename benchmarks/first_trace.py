"""Seconds from `bash scripts/run.sh demo` to its set-up's "ready" line and to the demo's first trace line
(README's "first trace" figure): python benchmarks/first_trace.py [CACHE_DIR] (a fresh SPECULANT_CACHE by default)."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    cache = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="speculant-cache-")
    start = time.perf_counter()
    child = subprocess.Popen(["bash", str(ROOT / "scripts" / "run.sh"), "demo", "--color", "never"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "SPECULANT_CACHE": cache})
    marks = {}
    for line in child.stdout:
        now = time.perf_counter() - start
        if "ready." in line:
            marks.setdefault("ready", now)
        if line.startswith("Trace ("):
            marks.setdefault("trace", now)
        print(f"{now:7.1f} {line.rstrip()}")
    child.wait()
    ready, trace = marks.get("ready", float("nan")), marks.get("trace", float("nan"))
    print(f"ready after {ready:.1f} s, first trace after {trace:.1f} s ({trace - ready:.1f} s after ready)")


if __name__ == "__main__":
    main()
