#!/usr/bin/env bash
# Download the wheels that bench/device_check.sh installs on a GPU machine without a package
# index: TorchRL and TensorDict (the peer cases; versions built for torch 2.11) and mpe2 with
# PettingZoo, Gymnasium and pygame-ce (the end-to-end part's environments). For CPython 3.12 on
# x86-64 Linux (the GPU image's python); run it where pip can reach a package index, then carry
# the folder along with the check:
#     bash bench/device_wheels.sh [.whl]     # then: WHEELS=.whl bash bench/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl}"
python="${PYTHON:-python3}"
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
for pkg in torchrl==0.12.0 tensordict==0.12.4 pyvers==0.2.3 orjson==3.13.0 \
    importlib_metadata==8.7.0 mpe2==1.1.1 pettingzoo==1.27.0 gymnasium==1.4.0 \
    farama-notifications==0.0.6 pygame-ce==2.5.8; do
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$dest" "$pkg"
done
ls "$dest"
