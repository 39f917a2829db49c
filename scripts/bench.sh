#!/usr/bin/env bash
# Builds remat with optimisation and runs the benchmarks in bench/; each writes a markdown table
# to stdout and machine-readable lines ("json: {...}") that are collected in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target bench_expr -j"$(nproc)"
mkdir -p bench/results
stamp="$(date -u +%Y-%m-%d)"
raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
./build/default/bench/bench_expr "$@" | tee "$raw"
{
  echo "<!-- $stamp, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; scripts/bench.sh -->"
  grep -v '^json: ' "$raw"
} > bench/results/expr-host.md
sed -n 's/^json: //p' "$raw" > bench/results/expr-host.jsonl
echo "wrote bench/results/expr-host.md and bench/results/expr-host.jsonl"
