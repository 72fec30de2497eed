#!/usr/bin/env bash
# One entry point for a fresh machine: installs everything (idempotently), then runs `demo` or `test`.
#
#   bash scripts/run.sh demo [demo options]   # speculative decoding with the default pair, trace + stats
#   bash scripts/run.sh test [pytest options] # the whole test suite, on the newest torch and on torch 2.11
#
# torch is a multi-GB download, so it goes into virtual environments outside the clone that later clones and
# CI runs reuse: $SPECULANT_VENV (default ~/.cache/speculant/venv) with $SPECULANT_TORCH (default
# "torch>=2.11": PyPI's newest), and for `test` also $SPECULANT_OLDEST_VENV (default
# ~/.cache/speculant/venv-oldest) with $SPECULANT_OLDEST_TORCH (default "torch==2.11.0", the oldest supported
# torch and the GPU machines' release, with their transformers 5.17.0; set it to "" to test the newest torch
# only). PyPI's regular build carries the full C++ headers. The extension is built against each environment's
# torch with --no-build-isolation (an isolated build would fetch another torch), in build/torch-<version>/. The
# two suites run side by side (2 cores: one each).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECULANT_VENV:-$HOME/.cache/speculant/venv}"
torch_req="${SPECULANT_TORCH:-torch>=2.11}"
oldest_venv="${SPECULANT_OLDEST_VENV:-$HOME/.cache/speculant/venv-oldest}"
oldest_req="${SPECULANT_OLDEST_TORCH-torch==2.11.0}"
# transformers per environment: the release the exporters were checked against, and the GPU image's beside 2.11
newest_transformers="transformers==5.23.0"
oldest_transformers="transformers==5.17.0"

say() { printf 'speculant setup: %s\n' "$*" >&2; }

# setup VENV TORCH TRANSFORMERS: the environment with torch, the tools and speculant built against that torch.
setup() {
  local env="$1" requirement="$2" transformers="$3" python="$1/bin/python" quiet=(-q --progress-bar off)
  if [ ! -x "$python" ]; then
    python3 -m venv "$env"
  fi
  if ! "$python" -c "import torch" >/dev/null 2>&1; then
    say "installing $requirement and the tools into $env (later runs reuse it)."
    say "torch comes with its CUDA libraries: about 3 GB to download and 6 GB on disk, 5 to 30 minutes" \
        "depending on the network; pip shows each download below."
    quiet=(--progress-bar on)
  fi
  # pip only downloads what is missing. transformers is pinned (speculant[export] allows 5.x); ipywidgets draws
  # tqdm's bars in Jupyter.
  "$python" -m pip install --disable-pip-version-check "${quiet[@]}" \
    "$requirement" "scikit-build-core>=0.10" "cmake>=3.26" ninja numpy tqdm "safetensors>=0.4" pytest \
    "hypothesis==6.170.15" scipy "$transformers" "tokenizers==0.23.3" "pandas==3.1.1" \
    "matplotlib==3.11.2" "nbclient==0.11.0" "nbformat==5.11.1" "ipykernel==7.4.0" "ipywidgets==8.1.9" \
    "dask[distributed]==2026.8.0" "distributed==2026.8.0"
  local version
  version="$("$python" -c "import torch; print(torch.__version__)")"
  say "building speculant's C++ extension against torch $version in build/torch-$version" \
      "(3 to 10 minutes on 2 cores the first time, seconds when nothing changed)."
  build "$python" "$version"
}

# build PYTHON VERSION: speculant built and installed against that torch, its progress shown as it goes (each
# compile step as ninja finishes it: steps done of the total, seconds since the build started), the whole log
# kept in a file and its end printed if the build fails.
build() {
  local python="$1" version="$2" log status=0
  log="$(mktemp "${TMPDIR:-/tmp}/speculant-build.XXXXXX")"
  NINJA_STATUS="[%f/%t %es] " CMAKE_BUILD_PARALLEL_LEVEL=2 "$python" -m pip install --disable-pip-version-check \
    -v --progress-bar off --no-build-isolation --config-settings="build-dir=build/torch-$version" "$root" \
    2>&1 | tee "$log" | progress || status=$?
  if [ "$status" -ne 0 ]; then
    say "the build failed (exit $status). Its last 60 lines follow; the whole log is $log."
    tail -n 60 "$log" >&2
    exit "$status"
  fi
  rm -f "$log"
}

# progress: ninja's status lines from a build's output, one line each ("build: 12/58 steps, 130 s, cpp/loop/batch.cpp"),
# and what says the build has nothing to do; the rest of the output stays in the log.
progress() {
  sed -nu \
    -e 's#^ *\[\([0-9]*\)/\([0-9]*\) \([0-9]*\)[.0-9]*s\] .* \([^ ]*\)$#speculant build: \1/\2 steps, \3 s, \4#' \
    -e 's#, [^ ]*CMakeFiles/[^/]*\.dir/#, #' -e 's#\.o$##' -e '/^speculant build: /p' \
    -e 's#^.*ninja: no work to do.*$#speculant build: up to date#p' >&2
}

cmd="${1:-demo}"
shift || true
case "$cmd" in
  demo)
    setup "$venv" "$torch_req" "$newest_transformers"
    say "ready. To use this environment yourself: source $venv/bin/activate (then speculant --help, or python)."
    exec "$venv/bin/python" -m speculant demo "$@" ;;
  test)
    # Both environments are built first, one build at a time; then the two suites run side by side, each in one
    # torch thread (two threads per suite on 2 cores wait for each other's cores), the newest torch's shown as
    # it runs and the oldest's printed when it ends. The exit status is the worst of the two.
    setup "$venv" "$torch_req" "$newest_transformers"
    [ -z "$oldest_req" ] || setup "$oldest_venv" "$oldest_req" "$oldest_transformers"
    export OMP_NUM_THREADS=1
    status=0 oldest_log="" oldest=""
    if [ -n "$oldest_req" ]; then
      oldest_log="$(mktemp)"
      say "the suite on $oldest_req with $oldest_transformers (the GPU machines' image) runs beside the newest's;" \
          "its output follows the newest's."
      # its own temporary folder and no cache folder: nothing shared with the newest's run
      (cd "$root" && "$oldest_venv/bin/python" -m pytest tests "$@" --durations=20 -p no:cacheprovider \
        --basetemp "$oldest_log.tmp") \
        >"$oldest_log" 2>"$oldest_log.err" &
      oldest=$!
      trap 'kill "$oldest" 2>/dev/null || true' EXIT  # an interrupted run leaves no suite behind
    fi
    (cd "$root" && "$venv/bin/python" -m pytest tests "$@" --durations=20) || status=$?
    if [ -n "$oldest" ]; then
      oldest_status=0
      wait "$oldest" || oldest_status=$?
      say "the suite on $oldest_req with $oldest_transformers:"
      cat "$oldest_log"
      cat "$oldest_log.err" >&2
      rm -rf "$oldest_log" "$oldest_log.err" "$oldest_log.tmp"
      status=$((status ? status : oldest_status))
    fi
    exit "$status" ;;
  *) echo "usage: bash scripts/run.sh demo|test [options]" >&2; exit 2 ;;
esac
