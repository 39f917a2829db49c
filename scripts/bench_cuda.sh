#!/usr/bin/env bash
# The GPU benchmarks, on a machine with an NVIDIA GPU and the CUDA toolkit (and, for the peer,
# a PyTorch built with CUDA): builds the cuda preset's nvcc targets, runs the CUDA test suite, then
# the residual MLP at d = 4096, batch 8192, N = 16 and 32, and GPT-2 blocks at batch 64, N = 8,
# every policy, fp32 and bf16, beside PyTorch on the same GPU (eager and torch.compile,
# torch.utils.checkpoint, torch.autocast bf16, F.scaled_dot_product_attention):
#   bench/results/policies-cuda.*, policies-cuda-bf16.*, gpt-cuda.*, gpt-cuda-bf16.*
# Arguments go to compare_torch.py. Record the figures, with date and GPU, in bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cmake --preset cuda >/dev/null
cmake --build --preset cuda --target remat_cuda_all -j"$(nproc)"
ctest --test-dir build/cuda -L cuda --output-on-failure
python="${PYTHON:-python3}"
for precision in fp32 bf16; do
  "$python" bench/compare_torch.py --device cuda --remat build/cuda/bench/bench_policies_cuda --precision "$precision" "$@"
  "$python" bench/compare_torch.py --device cuda --remat build/cuda/bench/bench_policies_cuda --precision "$precision" \
    --workload gpt "$@"
done
