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
  *) echo "usage: bash benchmarks/gpu.sh build|test|train|measure|trees" >&2; exit 2 ;;
esac
