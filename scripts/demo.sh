#!/usr/bin/env bash
# The main example from a fresh machine: installs only what it needs (scripts/setup.sh demo: a
# compiler, CMake, OpenBLAS), builds the examples' preset, and trains the digits classifier
# (weights land in build/demo/examples/digits.safetensors). Arguments go to digits (--help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
# Configure, showing remat's own lines: what it found, and what it leaves out without (MPI, say).
cmake --preset demo | sed -n 's/^-- remat/remat/p'
cmake --build --preset demo --target digits -j"$(nproc)"
cd build/demo/examples
./digits "$@"
