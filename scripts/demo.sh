#!/usr/bin/env bash
# The main example from a fresh machine: sets up what is missing, builds, and trains the digits
# classifier (weights land in build/default/examples/digits.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target digits -j"$(nproc)"
cd build/default/examples
./digits "$@"
