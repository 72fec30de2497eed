#!/usr/bin/env bash
# One entry point for a fresh machine: installs everything (idempotently), then runs `demo` or `test`.
#
#   bash scripts/run.sh demo [demo options]   # speculative decoding with the default pair, trace + stats
#   bash scripts/run.sh test [pytest options] # the whole test suite
#
# torch is a multi-GB download, so it goes into a virtual environment outside the clone that later clones
# and CI runs reuse: $SPECULANT_VENV (default ~/.cache/speculant/venv). $SPECULANT_TORCH says which torch
# (default "torch>=2.11": PyPI's newest on a fresh machine, tested with 2.15.0; "torch==2.11.0" is the GPU
# machines' release). PyPI's regular build carries the full C++ headers. The extension is built against the
# torch installed there with --no-build-isolation (an isolated build would fetch another torch), and
# importing it under another torch says so and how to rebuild.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECULANT_VENV:-$HOME/.cache/speculant/venv}"
torch_req="${SPECULANT_TORCH:-torch>=2.11}"
python="$venv/bin/python"

if [ ! -x "$python" ]; then
  python3 -m venv "$venv"
fi
# Quiet when everything is already there; pip only downloads what is missing.
# transformers is pinned to the release the exporters were checked against (speculant[export] allows 5.x).
"$python" -m pip install --disable-pip-version-check --progress-bar off -q \
  "$torch_req" "scikit-build-core>=0.10" "cmake>=3.26" ninja numpy tqdm pytest "hypothesis==6.170.15" scipy \
  "transformers==5.23.0" "tokenizers==0.23.3" "pandas==3.1.1" "matplotlib==3.11.2" \
  "nbclient==0.11.0" "nbformat==5.11.1" "ipykernel==7.4.0" "dask[distributed]==2026.8.0" "distributed==2026.8.0"
CMAKE_BUILD_PARALLEL_LEVEL=2 "$python" -m pip install --disable-pip-version-check --progress-bar off -q --no-build-isolation \
  "$root"

cmd="${1:-demo}"
shift || true
case "$cmd" in
  demo) exec "$python" -m speculant demo "$@" ;;
  test) cd "$root" && exec "$python" -m pytest tests "$@" ;;
  *) echo "usage: bash scripts/run.sh demo|test [options]" >&2; exit 2 ;;
esac
