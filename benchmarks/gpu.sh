#!/usr/bin/env bash
# The GPU checks and measurements of CUDA graphs, in steps that each fit one call of the lent GPU machine
# (10 minutes a command; the machine keeps its files while calls follow each other within 30 s). Run from the
# repository root there, with the image's python3 (torch 2.11+cu130, transformers, pytest-xdist):
#
#   bash benchmarks/gpu.sh build    # pip install --no-build-isolation --no-deps . (about 60 s)
#   bash benchmarks/gpu.sh test     # the CUDA tests (-m cuda), then the whole suite on 8 workers
#   bash benchmarks/gpu.sh train    # the cuda-preset GPT-2 pair (benchmarks/train_pairs.py, TF32)
#   bash benchmarks/gpu.sh measure  # benchmarks/graphs.py: graphs off / on, transformers compiled, 1.1B Llama
#   bash benchmarks/gpu.sh trees    # benchmarks/graphs.py at T = 1: chains and token trees, graphs off / on
#   bash benchmarks/gpu.sh lease    # all of it in one call of at most LEASE_SECONDS (default 570): build; the
#                                   # CUDA tests and the rest of the suite while the "lease" preset trains;
#                                   # then graphs.py at T 0 and 1 with trees, the 1.1B Llama, transformers'
#                                   # compiled generate, live and .pt2 backends, each part saved as it ends
#   bash benchmarks/gpu.sh again    # a later call without a build: lease's wheel (carried in .whl/) with this
#                                   # tree's Python over it; the CUDA graph tests, then graphs.py --untrained
#                                   # (per-call times: TorchScript graphs off / on, compiled transformers, live
#                                   # and .pt2), within LEASE_SECONDS (default 280)
#
# Results and logs go to $OUT (the device tool brings them back) when it is set, else benchmarks/results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONPATH="$PWD/benchmarks"
case "${1:-}" in
  build) python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -5 ;;
  test)
    python3 -m pytest -p no:benchmark -m cuda tests -q -rs 2>&1 | tee "$out/cuda-tests.log" | tail -40
    python3 -m pytest -p no:benchmark -n 8 tests -q 2>&1 | tee "$out/all-tests.log" | tail -15 ;;
  train) python3 benchmarks/train_pairs.py --preset cuda --device cuda --stage gpt2 2>&1 | tail -5 ;;
  measure)
    python3 benchmarks/graphs.py --pair gpt2 --preset cuda --device cuda --hf-compiled --big \
      --out "$out/graphs-gpt2-cuda.json" 2>&1 | grep -v "Loading weights" | tee "$out/graphs.log" ;;
  trees)
    python3 benchmarks/graphs.py --pair gpt2 --preset cuda --device cuda --temperature 1 --gammas 2 4 6 \
      --trees 2,1,1 3,1,1,1 3,2,1 --out "$out/graphs-trees-gpt2-cuda.json" 2>&1 | tee "$out/graphs-trees.log" ;;
  lease)
    deadline=$((SECONDS + ${LEASE_SECONDS:-570}))
    exec > >(tee -a "$out/lease.log") 2>&1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
    { CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wheel . &&
      python3 -m pip install --no-deps /tmp/wheel/speculant-*.whl; } >"$out/build.log" 2>&1 \
      || { tail -40 "$out/build.log"; exit 1; }
    cp /tmp/wheel/speculant-*.whl "$out/"  # for a later call of the same lease: install it instead of building
    echo "[$SECONDS s] built"
    timeout $((deadline - SECONDS - 150)) python3 benchmarks/train_pairs.py --preset lease --device cuda --stage gpt2 \
      >"$out/train.log" 2>&1 &
    train=$!
    (timeout 220 python3 -m pytest -p no:benchmark -m cuda tests -q -rfEs --basetemp /tmp/pt-cuda >"$out/cuda-tests.log" 2>&1
     echo "[$SECONDS s] cuda tests rc $?") &
    cuda=$!
    timeout 250 python3 -m pytest -p no:benchmark -n 10 -m "not cuda" tests -q -rfE --basetemp /tmp/pt-all >"$out/all-tests.log" 2>&1 \
      || echo "suite rc $?"
    echo "[$SECONDS s] suite: $(tail -1 "$out/all-tests.log")"
    wait $cuda || true
    grep -E "passed|failed|error" "$out/cuda-tests.log" | tail -3 || true
    wait $train || echo "training rc $?"
    echo "[$SECONDS s] trained: $(grep -E "parameters|Error" "$out/train.log" | tr '\n' ' ')"
    cp ~/.cache/speculant/bench/gpt2-*/pair.json "$out/" 2>/dev/null || true
    timeout $((deadline - SECONDS - 3)) python3 benchmarks/graphs.py --pair gpt2 --preset lease --device cuda \
      --temperature 0 1 --gammas 2 4 6 --trees 2,1,1 3,2,1 --prompts 4 --repeats 3 --big --hf-compiled \
      --backends live pt2 --out "$out/graphs-lease-cuda.json" 2>&1 | grep -v "Loading weights" || true
    echo "[$SECONDS s] done" ;;
  again)
    deadline=$((SECONDS + ${LEASE_SECONDS:-280}))
    exec > >(tee -a "$out/again.log") 2>&1
    python3 -m pip install -q --no-deps .whl/speculant-*.whl
    cp -r python/speculant/. "$(python3 -c "import os, speculant; print(os.path.dirname(speculant.__file__))")/"
    # CPU .pt2 packages of T5 crashed at load in the lease's suite (10 workers): one process, under a debugger
    (timeout 100 cuda-gdb -q -batch -ex run -ex bt --args python3 -X faulthandler -m pytest -p no:benchmark \
       -p no:cacheprovider tests/test_pt2_export.py -x -q -k t5 >"$out/t5-pt2.log" 2>&1
     echo "[$SECONDS s] t5 pt2: $(grep -E "passed|failed|SIGSEGV" "$out/t5-pt2.log" | tail -2 | tr '\n' ' ')") &
    diag=$!
    timeout 100 python3 -m pytest -p no:benchmark -m cuda tests/test_graphs.py -q -rfEs \
      -k "equal_the_calls_they_capture or pt2_runs_uncaptured" >"$out/cuda-tests.log" 2>&1 || true
    echo "[$SECONDS s] $(tail -1 "$out/cuda-tests.log")"
    wait $diag || true
    timeout $((deadline - SECONDS - 3)) python3 benchmarks/graphs.py --untrained --preset lease --device cuda \
      --gammas 2 4 6 8 --hf-compiled --backends live pt2 --out "$out/graphs-untrained-cuda.json" 2>&1 \
      | grep -v "Loading weights" || true
    echo "[$SECONDS s] done" ;;
  *) echo "usage: bash benchmarks/gpu.sh build|test|train|measure|trees|lease|again" >&2; exit 2 ;;
esac
