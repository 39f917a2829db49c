#!/usr/bin/env bash
# The main example from a fresh machine: sets up what is missing, builds, runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target hello -j"$(nproc)"
./build/default/examples/hello "$@"
