#!/usr/bin/env bash
# Fuzzes remat's readers of untrusted bytes (safetensors::read, load of a model and of an AdamW
# state, fp32 and mixed precision) with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer (tests/fuzz/):
#   scripts/fuzz.sh [SECONDS] [JOBS]     (default: 60 seconds, 1 job)
# It first replays the committed regression corpus (tests/fuzz/regressions/: files that once broke a
# reader), then fuzzes from a seed corpus that remat's own save() writes plus hand-made edge cases,
# for SECONDS, and prints libFuzzer's totals (executions, coverage). A finding (a crash, an exception
# that is not a remat::error, a sanitizer report, a leak, a refused load that changed the model)
# stops it with the input saved as build/fuzz/crash-*; add that file to tests/fuzz/regressions/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
jobs="${2:-1}"
bash scripts/setup.sh demo clang-19 libclang-rt-19-dev libomp-19-dev
cmake -S tests/fuzz -B build/fuzz -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/fuzz -j"$(nproc)"
corpus=build/fuzz/corpus
mkdir -p "$corpus"
build/fuzz/fuzz_seeds "$corpus"
if [ -d /dev/shm ]; then export REMAT_FUZZ_DIR=/dev/shm; fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" OMP_NUM_THREADS=1
echo "=== replaying tests/fuzz/regressions ($(ls tests/fuzz/regressions | wc -l) files)"
build/fuzz/fuzz_readers tests/fuzz/regressions/* 2>&1 | tail -n 3
echo "=== fuzzing for ${seconds} s with ${jobs} job(s)"
cd build/fuzz
if [ "$jobs" -gt 1 ]; then
  ./fuzz_readers -max_total_time="$seconds" -fork="$jobs" -print_final_stats=1 corpus ../../tests/fuzz/regressions
else
  ./fuzz_readers -max_total_time="$seconds" -print_final_stats=1 corpus ../../tests/fuzz/regressions
fi
