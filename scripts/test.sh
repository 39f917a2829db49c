#!/usr/bin/env bash
# The whole test suite from a fresh machine: sets up what is missing, then
#   1. builds and runs the tests (ctest) with optimisation,
#   2. builds and runs them again under AddressSanitizer and UndefinedBehaviorSanitizer (all but
#      the tests labelled "long": 20-epoch runs of the digits example in emulated 16-bit, and
#      exp, erf and tanh over every float); that
#      build keeps line tables only (-g1: a quarter less compile time than -g, the same symbolized
#      reports), compiles the tests at -O0 and the examples at -O1 (their training runs are that
#      stage's long tests), and leaves out what it would not run (the header self-containment
#      check, charlm),
#   3. installs remat into a temporary prefix and builds and runs tests/consumer against it
#      with find_package(remat CONFIG REQUIRED) (and its remat::dist program under mpirun -np 2),
#   4. when nvcc is here, compiles and links the CUDA backend for sm_90 (every public header, the
#      CUDA test suite, the GPU example and benchmark; the cuda preset itself builds sm_90 and
#      sm_80, whose code paths are the same as sm_90's: here it would add a second device compile
#      of every file), and runs `ctest -L cuda` when
#      a GPU is here (on a machine without one the CUDA tests are built, not run: see
#      scripts/bench_cuda.sh for the run on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
bash scripts/setup.sh python3-matplotlib  # (the plot scripts' tests draw with it)

# Each stage's start, in seconds since the script began (CI's time is watched: under 45 minutes on
# 2 cores).
step() { printf '\n=== [%4d s] %s\n' "$SECONDS" "$*"; }

step "build and test (default preset)"
cmake --preset default >/dev/null
cmake --build --preset default -j"$jobs"
ctest --preset default -j"$jobs"

step "build and test under address and undefined-behaviour sanitizers"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j"$jobs"
ctest --preset sanitize -j"$jobs"

step "install, then build a consumer project with find_package(remat CONFIG REQUIRED)"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install build/default --prefix "$prefix/install" >/dev/null
nvcc="${CUDAToolkit_ROOT:-/usr/local/cuda}/bin/nvcc"
cuda_args=()
if [ -x "$nvcc" ]; then cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc"); fi
cmake -S tests/consumer -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/install" -DCMAKE_BUILD_TYPE=Release \
  "${cuda_args[@]}" >/dev/null
cmake --build "$prefix/consumer" -j"$jobs"
"$prefix/consumer/consumer"
if [ -x "$prefix/consumer/consumer_cuda" ]; then
  # (77: built and linked, no GPU here to run it)
  status=0
  "$prefix/consumer/consumer_cuda" || status=$?
  if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then exit "$status"; fi
fi
if [ -x "$prefix/consumer/consumer_dist" ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    timeout 120 mpirun -np 2 "$prefix/consumer/consumer_dist"
fi

if [ -x "$nvcc" ] || command -v nvcc >/dev/null 2>&1; then
  step "nvcc: compile and link the CUDA backend, its tests, example and benchmark (sm_90)"
  cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build --preset cuda --target remat_cuda_all -j"$jobs"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ctest --test-dir build/cuda -L cuda --output-on-failure
  else
    echo "no GPU here: the CUDA tests are built and linked, not run (ctest --test-dir build/cuda -L cuda runs them on a GPU)"
  fi
else
  step "nvcc not found: CUDA compile check skipped"
fi

step "all test stages passed"
