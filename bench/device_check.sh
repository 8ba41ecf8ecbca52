#!/usr/bin/env bash
# The device check, one command on a machine with a CUDA GPU, offline, in one run:
#   1. the torch store's tests (the CUDA tests and the CPU ones, under that machine's torch):
#      tests/storages/test_torch_store.py, test_stores.py, test_protocol.py (every sampler and
#      format on every store), the store-parametrised tests/storages/test_half.py and
#      tests/buffer/test_buffer.py, and the device priority tests
#      (tests/storages/test_torch_priority.py, tests/storages/test_device_priorities.py: whichever exist);
#   2. `marlbuf bench device`: CN-24 and PP-24+8 rounds at B = 1024 on the GPU, prioritized
#      sample + update of 8 trainers at capacities 1e5, 1e6, 1e7 (marlbuf's host and device
#      priority indexes against TorchRL's prioritized sampler), seconds per 100 env steps at
#      CN-24, and the CPU comparison;
#   3. `marlbuf bench dropin --device cuda`: both consumers with their networks on the GPU, their
#      own host buffers + copies against marlbuf on the device, at 3, 12 and 24 agents;
#   4. `marlbuf bench distributed --actors 1 2 4 8`: rounds, global PER, collection and training
#      with 1, 2, 4 and 8 rollout actors on a local Ray instance (skipped without Ray).
# Each step has a time limit (180 + 480 + 300 + 480 s: under 25 minutes in all with the
# set-up, on an H200 with 16 cores; expected well under that). Everything goes into $OUT
# (default: bench/results/device-check/), eight files at most:
#   environment.txt       python, numpy, numba, torch, CUDA device, optional packages
#   cuda-tests.txt/.xml   the tests' output and JUnit report
#   device.json dropin.json distributed.json   the suites' results (rows, targets, summary,
#                         machine; *-quick.json with DEVICE_CHECK_QUICK=1)
#   REPORT.md             the three suites as tables (REPORT-quick.md); figures are not kept
#                         (rebuild them with: marlbuf bench report --out $OUT)
#   suites.txt            the suites' console output, then each step's exit status and seconds
#
# Needs a python (PYTHON=..., default python3) with torch (a CUDA build), numpy and numba, and
# pytest for the tests (scipy optional). Optional packages come as wheels: every *.whl in
# $WHEELS (default .whl/, filled by bench/device_wheels.sh on a machine with a package index) is
# installed into a temporary folder first. Without them the check still runs: the TorchRL cases,
# the parts that need mpe2 (end to end, dropin) and the distributed suite (Ray) are recorded as
# not measured or skipped, with the reason. matplotlib is never needed.
# Exit status 0 when the tests passed, CUDA was available and every suite ran to its end (a
# suite skipped or a case not measured for a missing optional package still counts as run);
# 1 otherwise (on a machine without CUDA always 1, after running everything it can).
# DEVICE_CHECK_QUICK=1 runs the suites at their quick sizes (a smoke test of this script), with
# actors 1 2 unless DEVICE_CHECK_ACTORS says otherwise (default 1 2 4 8 without it).
#     OUT=/some/folder bash bench/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/device-check}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_WAIT_POLICY=PASSIVE
export PYTHONUNBUFFERED=1
quick="${DEVICE_CHECK_QUICK:+--quick}"
if [ -n "$quick" ]; then actors="${DEVICE_CHECK_ACTORS:-1 2}"; else actors="${DEVICE_CHECK_ACTORS:-1 2 4 8}"; fi
log="$out/suites.txt"
: >"$log"
status=0
start_all=$SECONDS

wheels="${WHEELS:-.whl}"
if compgen -G "$wheels/*.whl" >/dev/null; then
  site="$(mktemp -d)"
  if "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$wheels"/*.whl; then
    export PYTHONPATH="$PYTHONPATH:$site"
    echo "device_check: installed $(ls "$wheels"/*.whl | wc -l) wheels from $wheels"
  else
    echo "device_check: the wheels in $wheels did not install; going on without them"
  fi
fi

"$python" - >"$out/environment.txt" 2>&1 <<'PY'
import os
import platform

import numba
import numpy
import torch

print("python", platform.python_version(), "numpy", numpy.__version__, "numba", numba.__version__)
print("torch", torch.__version__, "cuda build", torch.version.cuda, "cores", os.cpu_count())
for name in ("torchrl", "tensordict", "mpe2", "pettingzoo", "ray"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:  # optional: recorded, never fatal
        print(name, "not available:", type(exc).__name__, exc)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    print("device", torch.cuda.get_device_name(0), f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
else:
    print("device_check: no CUDA device here: the CUDA tests are skipped and the GPU cases are "
          "recorded as not measured")
    raise SystemExit(3)
PY
[ $? -eq 0 ] || status=1
cat "$out/environment.txt"

# step NAME SECONDS COMMAND...: run COMMAND with a time limit, its output to the console and to
# the log (or to the file STEP_OUT names), then its exit status and seconds to the log
step() {
  local name="$1" limit="$2" started=$SECONDS code
  shift 2
  timeout "$limit" "$@" 2>&1 | tee -a "${STEP_OUT:-$log}"
  code="${PIPESTATUS[0]}"
  if [ "$code" -eq 124 ]; then
    echo "device_check: $name stopped at its time limit of $limit s" | tee -a "$log"
  fi
  echo "device_check: step $name: exit status $code, $((SECONDS - started)) s" | tee -a "$log"
  [ "$code" -eq 0 ] || status=1
}

echo "== 1/4 torch store tests (CUDA and CPU)"
tests=(tests/storages/test_torch_store.py tests/storages/test_stores.py tests/storages/test_protocol.py
  tests/storages/test_half.py tests/buffer/test_buffer.py)
for extra in tests/storages/test_torch_priority.py tests/storages/test_device_priorities.py; do
  [ -f "$extra" ] && tests+=("$extra")
done
if "$python" -c "import pytest" 2>/dev/null; then
  : >"$out/cuda-tests.txt"
  STEP_OUT="$out/cuda-tests.txt" step tests 180 "$python" -m pytest "${tests[@]}" -q \
    -p no:cacheprovider -k "not device_check_script" --junitxml="$out/cuda-tests.xml"
else
  echo "device_check: pytest is not installed: the CUDA tests were NOT run" | tee "$out/cuda-tests.txt"
  status=1
fi

echo "== 2/4 device suite"
step device 480 "$python" -m marlbuf bench device $quick --out "$out"

echo "== 3/4 dropin suite, networks on the GPU"
step dropin 300 "$python" -m marlbuf bench dropin --device cuda $quick --out "$out"

echo "== 4/4 distributed suite, actors $actors"
# shellcheck disable=SC2086 - the actor counts are separate arguments
step distributed 480 "$python" -m marlbuf bench distributed $quick --out "$out" --actors $actors

# figures need matplotlib and would make the folder too many files to carry back
rm -rf "$out"/figures "$out"/figures-quick
echo "device_check: results in $out, $((SECONDS - start_all)) s (exit status $status)" | tee -a "$log"
exit $status
