#!/usr/bin/env bash
# The GPU checks and measurements (issue 21) in two calls of the lent machine, sized for a lease of 15 minutes
# of device time (a machine starts in about 30 s; each call at most 10 minutes). Run from the repository root
# there, with the image's python3 (torch 2.11+cu130, transformers, pytest-xdist):
#
#   bash benchmarks/gpu.sh lease   # within LEASE_SECONDS (default 570): the build (a wheel, kept in $OUT for
#                                  # `again`); the CUDA tests, the rest of the suite, the .pt2 tests (a process
#                                  # of their own: torch's loader has crashed on two leases' images) and the
#                                  # "lease" preset's GPT-2 pair training side by side (a test run cut off at its
#                                  # limit is interrupted, so that its summary names the failures so far); then,
#                                  # on the trained pair, graphs.py at
#                                  # T = 1 (chains and trees, graphs off / on, each one's time per iteration by
#                                  # phase), batch.py (B = 1..32, graphs on) and assisted.py (against
#                                  # transformers' assisted generation), each cut off at the deadline, saved as
#                                  # it ends (the first lease, 2026-11-26, measured T = 0 and transformers'
#                                  # compiled generate: BENCHMARKS.md)
#   bash benchmarks/gpu.sh again   # a second call, no build: lease's wheel (copied from its $OUT into .whl/,
#                                  # listed in .git/info/exclude, and named in the call's carry) with this tree's
#                                  # Python over it (so C++ must not have changed since lease's build);
#                                  # kernels.py first (where a model call's time goes: kernels per call,
#                                  # the device's busy time, the call uncaptured and replayed from a CUDA
#                                  # graph, the largest kernels, for the pair's shapes and the 1.1B Llama;
#                                  # then the target's own forward compiled by Inductor beside its export),
#                                  # then graphs.py --untrained within LEASE_SECONDS (default 280):
#                                  # per-call times beside the TorchScript graphs, then the pair as live
#                                  # objects eager (never reached on leases 1-5), compiled (compile=True),
#                                  # and as .pt2 packages (their CUDA export compiles for minutes: last); the
#                                  # 1.1B bf16 Llama against its read floor, measured on leases 1,
#                                  # 4 and 5, is left to `graphs.py --big`
#
# Results and logs go to $OUT when it is set (the device tool brings back 8 files: no more), else
# benchmarks/results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONPATH="$PWD/benchmarks"
# within RESERVE CMD...: CMD under a limit that leaves RESERVE seconds before the deadline, skipped (and said so)
# where that leaves under 20 s (`timeout 0` would mean no limit at all)
within() {
  local limit=$((deadline - SECONDS - $1)); shift
  if ((limit < 20)); then echo "[$SECONDS s] skipped, $limit s left: ${*:1:3}"; return 0; fi
  timeout "$limit" "$@"
}
# pytest under a limit, interrupted (SIGINT) at it so that its summary names the failures so far
pytest_for() { local limit=$1; shift; timeout -s INT -k 20 "$limit" python3 -m pytest -p no:benchmark "$@"; }
case "${1:-}" in
  lease)
    deadline=$((SECONDS + ${LEASE_SECONDS:-570}))
    exec > >(tee -a "$out/lease.log") 2>&1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
    python3 -c "import sys, torch, transformers as t; print(sys.version.split()[0], torch.__version__, t.__version__)"
    { CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wheel . &&
      python3 -m pip install --no-deps /tmp/wheel/speculant-*.whl; } >/tmp/build.log 2>&1 \
      || { tail -40 /tmp/build.log; exit 1; }
    cp /tmp/wheel/speculant-*.whl "$out/"
    echo "[$SECONDS s] built"
    within 150 python3 benchmarks/train_pairs.py --preset lease --device cuda --stage gpt2 >/tmp/train.log 2>&1 &
    train=$!
    # .pt2 tests in a process of their own, CPU and CUDA: two leases' images crashed in torch's own loader of any
    # .pt2 package (pt2_load_check.py, run beside them), and each crash took a test worker with its tests
    # (each step `|| rc=$?`: these subshells inherit set -e, which ended the fourth lease's at the check's crash,
    # silently)
    (rc=0; python3 benchmarks/pt2_load_check.py >/tmp/pt2-check.log 2>&1 || rc=$?
     echo "[$SECONDS s] pt2_load_check rc $rc:"; grep -E "^(compiler|torch|default|bound)" /tmp/pt2-check.log || true
     grep -A12 "failed (exit" /tmp/pt2-check.log | head -30 || true
     rc=0; PYTHONFAULTHANDLER=1 pytest_for 200 -k pt2 tests -q -rfE --basetemp /tmp/pt-pt2 >/tmp/pt2-tests.log 2>&1 \
       || rc=$?
     echo "[$SECONDS s] .pt2 tests, rc $rc: $(grep -E "passed|failed|Segmentation" /tmp/pt2-tests.log | tail -1)"
     grep -E "^(FAILED|ERROR) |Fatal Python|^  File" /tmp/pt2-tests.log | head -20 || true) &
    pt2=$!
    (pytest_for 200 -m cuda -k "not pt2" tests -q -rfEs --basetemp /tmp/pt-cuda >"$out/cuda-tests.log" 2>&1 || true
     echo "[$SECONDS s] cuda tests: $(tail -1 "$out/cuda-tests.log")") &
    cuda=$!
    pytest_for 230 -n 12 -m "not cuda" -k "not pt2" tests -q -rfE --basetemp /tmp/pt-all >"$out/all-tests.log" 2>&1 \
      || echo "suite rc $?"
    echo "[$SECONDS s] suite: $(tail -1 "$out/all-tests.log")"; grep -E "^(FAILED|ERROR) " "$out/all-tests.log" || true
    wait $cuda $pt2 || true
    wait $train || echo "training rc $?"
    echo "[$SECONDS s] trained: $(grep -E "parameters|Error" /tmp/train.log | tr '\n' ' ')"
    cp ~/.cache/speculant/bench/gpt2-*/pair.json "$out/" 2>/dev/null || true
    within 110 python3 benchmarks/graphs.py --pair gpt2 --preset lease --device cuda \
      --temperature 1 --gammas 2 4 6 --trees 2,1,1 3,2,1 --prompts 4 --repeats 3 \
      --out "$out/graphs-lease-cuda.json" 2>&1 | grep -v "Loading weights" || true
    within 55 python3 benchmarks/batch.py --pair gpt2 --preset lease --device cuda --cuda-graphs auto \
      --sizes 1,4,16,32 --repeats 2 --out "$out/batch-lease-cuda.json" || true
    within 3 python3 benchmarks/assisted.py run --pair gpt2 --preset lease --device cuda \
      --cuda-graphs auto --temperature 0 --gammas 2 4 --prompts 4 --repeats 2 --threads 16 --quiet \
      --out /tmp/assisted || true
    cp /tmp/assisted/*.csv "$out/" 2>/dev/null || true
    echo "[$SECONDS s] done" ;;
  again)
    deadline=$((SECONDS + ${LEASE_SECONDS:-280}))
    exec > >(tee -a "$out/again.log") 2>&1
    python3 -m pip install -q --no-deps .whl/speculant-*.whl
    cp -r python/speculant/. "$(python3 -c "import os, speculant; print(os.path.dirname(speculant.__file__))")/"
    within 130 python3 benchmarks/kernels.py --device cuda --models gpt2-target gpt2-draft llama-1b --widths 1 5 \
      --out "$out/kernels-cuda.json" || true
    within 60 python3 benchmarks/kernels.py --device cuda --models gpt2-target --widths 1 --no-engine \
      --inductor gpt2-target --out "$out/kernels-inductor-cuda.json" || true
    within 3 python3 benchmarks/graphs.py --untrained --preset lease --device cuda --gammas 2 4 6 8 \
      --backends live compiled pt2 --out "$out/graphs-untrained-cuda.json" 2>&1 | grep -v "Loading weights" \
      || true
    echo "[$SECONDS s] done" ;;
  *) echo "usage: bash benchmarks/gpu.sh lease|again" >&2; exit 2 ;;
esac
