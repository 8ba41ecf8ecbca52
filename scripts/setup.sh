#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install marlbuf with every extra.
# torch is installed first, pinned to the CPU build this project is tested with, so that no
# later requirement can pull a multi-GB CUDA build. Usage: bash scripts/setup.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q -e ".[all]"
if ! command -v valgrind >/dev/null 2>&1; then
  # the profiler's callgrind backend (and its tests) need valgrind; best effort where apt exists
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq valgrind) >/dev/null 2>&1 || \
      echo "setup: valgrind could not be installed; callgrind profiling tests will be skipped" >&2
  fi
fi
echo "setup: ready in $venv"
