#!/usr/bin/env bash
# The device check, one command on a machine with a CUDA GPU: the torch backend's tests (the
# CUDA tests and the CPU ones, under that machine's torch), then the `device` benchmark suite
# (CN-24 and PP-24+8 rounds at B = 1024 on the GPU, prioritized sample + update at 1e6,
# seconds per 100 env steps at CN-24, and the CPU comparison). About 3 minutes on an H200.
# Everything it writes goes into $OUT (default: bench/results/device-check/):
#   environment.txt       python, numpy, numba, torch, CUDA device
#   cuda-tests.txt/.xml   the CUDA tests' output and JUnit report
#   device.json           the suite's result (rows, summary, machine); REPORT.md; device-suite.txt
#
# Needs a python (PYTHON=..., default python3) with torch (a CUDA build), numpy and numba, and
# pytest for the tests (scipy optional). Optional packages come as wheels: every *.whl in
# $WHEELS (default .whl/, filled by bench/device_wheels.sh on a machine with a package index) is
# installed into a temporary folder first. Without them the check still runs: the TorchRL cases
# and the end-to-end part (which needs mpe2) are recorded as not measured, with the reason.
# matplotlib is never needed. Exit status 0 when the tests passed and the suite ran.
# DEVICE_CHECK_QUICK=1 runs the suite at its quick sizes (a smoke test of this script).
#     OUT=/some/folder bash bench/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/device-check}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_WAIT_POLICY=PASSIVE
status=0

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
import platform

import numba
import numpy
import torch

print("python", platform.python_version(), "numpy", numpy.__version__, "numba", numba.__version__)
print("torch", torch.__version__, "cuda build", torch.version.cuda)
for name in ("torchrl", "tensordict", "mpe2", "pettingzoo"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:  # optional: recorded, never fatal
        print(name, "not available:", type(exc).__name__, exc)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
else:
    print("device_check: no CUDA device here: the CUDA tests are skipped and the GPU cases are "
          "recorded as not measured")
    raise SystemExit(3)
PY
[ $? -eq 0 ] || status=1
cat "$out/environment.txt"

echo "== 1/2 torch store tests (CUDA and CPU)"
if "$python" -c "import pytest" 2>/dev/null; then
  timeout 180 "$python" -m pytest tests/test_torch_backend.py tests/test_stores.py -q -p no:cacheprovider -k "not device_check_script" \
    --junitxml="$out/cuda-tests.xml" 2>&1 | tee "$out/cuda-tests.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "device_check: pytest is not installed: the CUDA tests were NOT run" | tee "$out/cuda-tests.txt"
  status=1
fi

echo "== 2/2 device suite"
timeout 400 "$python" -m marlbuf bench device ${DEVICE_CHECK_QUICK:+--quick} --out "$out" 2>&1 |
  tee "$out/device-suite.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "device_check: results in $out (exit status $status)"
exit $status
