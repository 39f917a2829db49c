#!/usr/bin/env bash
# Installs what remat's build, tests and examples need, and nothing that is already there.
# As root it installs Debian packages itself; otherwise it uses sudo if it can, or says what to
# install. Sourced or run by scripts/demo.sh and scripts/test.sh.
set -euo pipefail

cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
packages=(cmake make g++ catch2 libopenblas-dev libopenblas0-openmp libdnnl-dev libopenmpi-dev openmpi-bin python3-torch
          fortunes)
# Thrust and CUB: the CUDA toolkit's CCCL when it is here, Debian's otherwise.
if [ ! -f "$cuda_root/include/cccl/thrust/version.h" ] && [ ! -f "$cuda_root/include/thrust/version.h" ]; then
  packages+=(libthrust-dev libcub-dev)
fi
packages+=("$@")  # callers may ask for more

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "remat setup: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "remat setup: please install these Debian packages first: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "remat setup: done"
