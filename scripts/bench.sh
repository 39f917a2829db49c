#!/usr/bin/env bash
# Builds remat with optimisation and runs the benchmarks in bench/, writing markdown tables and
# JSON lines (one per configuration) to bench/results/:
#   expr-host.*      fused expressions against op-by-op evaluation and copy bandwidth, the
#                    optimizer passes' bytes per parameter and fraction of copy, and the row
#                    passes (causal softmax, LayerNorm) against copy
#   gemm-paths-host.* OpenBLAS against oneDNN's f32 matmul for the shapes of a step, the bf16 products, an epilogue in panels
#   float-math-host.* remat's float exp/erf/tanh beside glibc, libmvec and SLEEF (AVX-512 machines)
#   policies-host.*  the residual-MLP training step under every storage policy, interleaved with
#                    today's PyTorch from PyPI on the same model (bench/compare_torch.py), and a
#                    plot (.png); gpt-host.* the same for GPT-2 blocks; profile-host.md where the
#                    step's time goes (bench_policies --profile)
#   budget-host.*    the budget policy's choice and step time per activation budget, beside the
#                    hand-chosen policies, and a plot (.png); the memory timeline's cost
#   memory-trace-charlm.* charlm's checkpointed step as a memory timeline (JSON for Perfetto, PNG, table)
#   conv-host.*      the ResNet stack, stored and checkpointed, interleaved with PyTorch (bench/compare_conv.py)
#   attention-host.* one attention core (stored, recomputed, blocked) at sequences of 512 to 4096 beside
#                    PyTorch's nanoGPT attention, and a plot (.png) (bench/compare_attention.py)
#   dist-host.*      data-parallel scaling from 1 to 2 MPI ranks beside PyTorch DDP (bench/dist_scaling.sh)
#   inference-host.*, inference-conv-host.*  the surrogates' inference latency beside libtorch
#                    from C++ and torch.compile (bench/compare_inference.py)
# Arguments go to compare_torch.py (e.g. --quick for a smoke run, --steps 9).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
cmake --preset default >/dev/null
cmake --build --preset default --target bench_expr bench_gemm_paths bench_policies bench_budget bench_dist bench_float_math bench_conv bench_attention -j"$(nproc)"
mkdir -p bench/results
stamp="$(date -u +%Y-%m-%d)"
raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
export OMP_NUM_THREADS=2
./build/default/bench/bench_expr | tee "$raw"
{
  echo "<!-- $stamp, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; scripts/bench.sh -->"
  grep -v '^json: ' "$raw"
} > bench/results/expr-host.md
sed -n 's/^json: //p' "$raw" > bench/results/expr-host.jsonl
echo "wrote bench/results/expr-host.md and bench/results/expr-host.jsonl"
./build/default/bench/bench_gemm_paths | tee "$raw"
{
  echo "<!-- $stamp, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; scripts/bench.sh -->"
  grep -v '^json: ' "$raw"
} > bench/results/gemm-paths-host.md
sed -n 's/^json: //p' "$raw" > bench/results/gemm-paths-host.jsonl
./build/default/bench/bench_float_math | tee "$raw"
{
  echo "<!-- $stamp, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; scripts/bench.sh -->"
  grep -v '^json: ' "$raw"
} > bench/results/float-math-host.md
sed -n 's/^json: //p' "$raw" > bench/results/float-math-host.jsonl
./build/default/bench/bench_budget | tee "$raw"
{
  echo "<!-- $stamp, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; scripts/bench.sh -->"
  grep -v '^json: ' "$raw"
} > bench/results/budget-host.md
sed -n 's/^json: //p' "$raw" > bench/results/budget-host.jsonl
/usr/bin/python3 bench/plot_budget.py bench/results/budget-host.jsonl bench/results/budget-host.png
# The memory timeline of docs/memory.md: charlm's second step with every block checkpointed (three steps
# are far from charlm's loss bar, so its exit status is not this script's concern).
cmake --build --preset default --target charlm -j"$(nproc)"
./build/default/examples/charlm --checkpoint --steps 3 --memory-trace bench/results/memory-trace-charlm.json \
  | sed -n '/per layer/,/^$/p' > bench/results/memory-trace-charlm.md || true
/usr/bin/python3 bench/plot_memory_trace.py bench/results/memory-trace-charlm.json bench/results/memory-trace-charlm.png \
  --title "charlm --checkpoint: one training step (4 blocks, batch 32 x 128)"
# The ResNet stack (64 channels, 64 x 64, batch 32; 8 and 16 blocks) beside PyTorch's oneDNN convolutions.
/usr/bin/python3 bench/compare_conv.py --remat build/default/bench/bench_conv --out bench/results/conv-host --rounds 2 --steps 2
# Attention at long sequences: the three cores beside PyTorch's written-out attention.
/usr/bin/python3 bench/compare_attention.py --remat build/default/bench/bench_attention --out bench/results/attention-host
# Against today's PyTorch from PyPI (.venv-bench, made above) at its best: eager or torch.compile,
# either malloc setting, whichever is faster; Debian's 1.13 as one more row. ROUNDS interleaved
# rounds (default 5), medians; the configurations of issue 49's targets.
rounds="${ROUNDS:-5}"
for precision in fp32 bf16; do
  suffix=$([[ $precision == bf16 ]] && echo -bf16 || true)
  /usr/bin/python3 bench/compare_torch.py --remat build/default/bench/bench_policies --precision "$precision" \
    --configs 256x8,256x16,2048x16 --rounds "$rounds" --out "bench/results/policies-host$suffix" "$@"
  # Transformers: GPT-2 blocks (width 512, 8 heads, 256 tokens, batch 16, N = 4, 8) with every policy.
  /usr/bin/python3 bench/compare_torch.py --remat build/default/bench/bench_policies --workload gpt \
    --precision "$precision" --configs 16x4,16x8 --rounds "$rounds" --out "bench/results/gpt-host$suffix" "$@"
done
# Inference latency of the two surrogates against libtorch from C++ and torch.compile (issue 50).
cmake --build --preset default --target bench_inference -j"$(nproc)"
/usr/bin/python3 bench/compare_inference.py --remat build/default/bench/bench_inference --rounds "$rounds"
/usr/bin/python3 bench/compare_inference.py --model conv --remat build/default/bench/bench_inference --rounds "$rounds" --inner 3
# Where a step's time goes (remat::profile): products, point-wise and row passes, per phase.
for precision in fp32 bf16; do
  for cfg in "mlp 256 16" "mlp 2048 16" "gpt 16 4"; do
    read -r workload batch blocks <<< "$cfg"
    OMP_NUM_THREADS=2 ./build/default/bench/bench_policies --workload "$workload" --batch "$batch" --blocks "$blocks" \
      --policy stored --precision "$precision" --steps 3 --warmup 1 --profile 2>&1 >/dev/null
  done
done | tee bench/results/profile-host.md
# Data parallelism: 1 process against 2 MPI ranks, remat::dist beside PyTorch DDP over gloo.
bash bench/dist_scaling.sh build/default/bench/bench_dist
