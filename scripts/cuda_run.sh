#!/usr/bin/env bash
# On a GPU machine, the binaries scripts/cuda_pack.sh built elsewhere (copied to .gpu/run.sh
# beside .gpu/pack.tar.xz; run it from there): unpacks them, finds CUDA's libraries (the toolkit's,
# or those of a PyTorch install), and runs
#   tests     every case of the CUDA suite in a process of its own (a crash or a sticky CUDA error
#             fails that case only), the NCCL data-parallel test under mpirun -np 1 and the
#             GPU example;
#   bench     the product peak, the optimizer pass against a copy, the MLP (batch 8192, 16
#             blocks) and the GPT (batch 64, 8 blocks; remat's policies with `stored_attention`, the
#             stored GPT with AttentionCore, beside PyTorch's SDPA; then the stored GPT with its
#             attention's products as pointer-array batches and as strided ones, --strided-batches,
#             timed and profiled) beside the machine's PyTorch, eager and
#             torch.compile (bench/compare_torch.py --device cuda; PRECISIONS="bf16 fp32" for both
#             precisions, CONFIGS for other MLP sizes, TORCH_POLICIES for more PyTorch policies
#             than plain and checkpoint: each compiled run costs about a minute; remat's selective
#             has a ratio only with TORCH_POLICIES=plain,checkpoint,selective, its peer being
#             PyTorch's selective activation checkpointing);
#   inference the surrogates' inference latency (bench_inference_cuda: forward(x, out), an
#             inference_graph's run and replay) beside PyTorch's eager and CUDA-graph calls
#             (bench/inference_torch_cuda.py), in two interleaved rounds;
#   conv      where the convolutional surrogate's time goes: every cuDNN algorithm for its shapes
#             beside remat's choice (bench/conv_algos_cuda.cu), remat's profile by kind of work
#             (REMAT_BENCH_PROFILE), PyTorch's kernels (inference_torch_cuda.py --profile).
#   offload   a GPT of Llama-7B's size (32 blocks of width 4096, 6.7 billion parameters, one
#             sequence of 2048) trained 3 steps with its master weights on the host, its storage
#             the budget policy's for 80 GB (every block stored, 16.3 GiB of activations)
#             (bench_offload_gpt_cuda --train 7b): its plan per place printed and checked against
#             80 GB of device and 120 GiB of host memory before anything is allocated, then every
#             measured peak against the plan, and the step's time split; about 4 minutes, most of
#             it building the host state (not part of `all`).
#   offload-gradients   the same GPT with its gradients on the host as well (--gradients-on-host:
#             the device holds the bf16 weights, two spans of gradients and the activations,
#             29.3 GiB planned; the host 100.2 GiB); its peaks against the plan, the gradient
#             granules included, and the time split (not part of `all`).
# Several modes may be named; they run in the order above. A 15-minute lease's plan, two calls
# back to back (the machine stays warm 30 s): `.gpu/run.sh tests offload-gradients`, then
# `MLP_POLICIES=stored,checkpoint,selective .gpu/run.sh bench` (estimated 7 and 6 minutes; the
# 7B run has not yet run on a GPU). Results go to $OUT (or /tmp/out).
#   .gpu/run.sh [tests|bench|inference|conv|offload|offload-gradients|all]...
set -uo pipefail
cd "$(dirname "$0")"
here=$PWD
[ -d bin ] || tar xJf pack.tar.xz
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
libs=$(for n in libcudnn.so.9 libcublasLt.so.13 libnccl.so.2; do
         find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1
       done | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$here/lib:$libs${LD_LIBRARY_PATH:-}
ldd bin/test_cuda | grep 'not found' && exit 1
modes=" ${*:-all} "
# Whether one of these modes was asked for.
want() { for m in "$@"; do [[ $modes == *" $m "* ]] && return 0; done; return 1; }
out=${OUT:-/tmp/out}
mkdir -p "$out"
status=0
if want tests all; then
  bin/test_cuda --list-test-names-only | grep -v -e '^$' -e 'test cases' > /tmp/remat-cases.txt
  pass=0 fail=0
  while IFS= read -r name; do
    t0=$(date +%s%N)
    # (Catch splits a filter at commas: they are escaped.)
    timeout 300 bin/test_cuda -w NoTests "${name//,/\\,}" > /tmp/remat-case.log 2>&1
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    if [[ $rc == 0 ]]; then
      pass=$((pass + 1)); echo "PASS ${ms} ms  $name"
    else
      fail=$((fail + 1)); echo "FAIL (exit $rc) ${ms} ms  $name"; tail -c 3000 /tmp/remat-case.log
    fi
    { echo "=== $name: exit $rc"; cat /tmp/remat-case.log; } >> "$out/test_cuda.log"
  done < /tmp/remat-cases.txt
  echo "test_cuda: $pass passed, $fail failed"
  [[ $fail == 0 ]] || status=1
  if [ -x bin/test_dist_cuda ] && command -v mpirun > /dev/null; then
    echo "=== test_dist_cuda under mpirun -np 1"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --oversubscribe -np 1 bin/test_dist_cuda \
      || status=1
  fi
  if [ -x bin/capi_cuda ]; then
    echo "=== capi_cuda (a GPU model library's C interface)"
    LD_LIBRARY_PATH=$here/bin:$LD_LIBRARY_PATH timeout 120 bin/capi_cuda || status=1
  fi
  if [ -x bin/bench_offload_gpt_cuda ]; then
    echo "=== bench_offload_gpt_cuda --train tiny (the master weights on the host; every peak against its plan)"
    timeout 120 bin/bench_offload_gpt_cuda --train tiny --steps 3 > "$out/offload-tiny.log" 2>&1 || status=1
    grep -v '^json' "$out/offload-tiny.log" | tail -25
    echo "=== bench_offload_gpt_cuda --train tiny --gradients-on-host (the gradients' granules against the plan)"
    timeout 120 bin/bench_offload_gpt_cuda --train tiny --steps 3 --gradients-on-host > "$out/offload-tiny-gradients.log" \
      2>&1 || status=1
    grep -v '^json' "$out/offload-tiny-gradients.log" | tail -25
  fi
  echo "=== memory_budget_cuda"
  timeout 300 bin/memory_budget_cuda > "$out/memory_budget_cuda.log" 2>&1 || status=1
  tail -12 "$out/memory_budget_cuda.log"
fi
if want inference all; then
  for model in mlp conv; do
    for round in 1 2; do
      timeout 120 bin/bench_inference_cuda --model "$model" --rounds 5 --seconds 0.1 >> "$out/inference-cuda.log" 2>&1 \
        || status=1
      PYTHONUNBUFFERED=1 timeout 120 python3 ../bench/inference_torch_cuda.py --model "$model" --rounds 5 --seconds 0.1 \
        >> "$out/inference-cuda.log" 2>&1 || status=1
    done
  done
  grep -v '^json' "$out/inference-cuda.log"
fi
if want conv; then
  [ -x bin/conv_algos_cuda ] && { timeout 150 bin/conv_algos_cuda > "$out/conv-algos.log" 2>&1 || status=1; }
  cat "$out/conv-algos.log"
  REMAT_BENCH_PROFILE=1 timeout 90 bin/bench_inference_cuda --model conv --rounds 3 --seconds 0.1 \
    > "$out/conv-profile.log" 2>&1 || status=1
  PYTHONUNBUFFERED=1 timeout 120 python3 ../bench/inference_torch_cuda.py --model conv --profile \
    >> "$out/conv-profile.log" 2>&1 || status=1
  grep -v '^json' "$out/conv-profile.log"
fi
if want offload; then
  free -g | head -2
  timeout 480 bin/bench_offload_gpt_cuda --train 7b --steps 3 --device-gb 80 --host-gib 120 > "$out/offload-7b.log" 2>&1 \
    || status=1
  grep -v '^json' "$out/offload-7b.log"
fi
if want offload-gradients; then
  free -g | head -2
  timeout 480 bin/bench_offload_gpt_cuda --train 7b --steps 3 --device-gb 80 --host-gib 120 --gradients-on-host \
    > "$out/offload-7b-gradients.log" 2>&1 || status=1
  grep -v '^json' "$out/offload-7b-gradients.log"
fi
if want bench all; then
  cd "$here/.."
  for precision in ${PRECISIONS:-bf16}; do
    suffix=$([[ $precision == bf16 ]] && echo -bf16)
    common=(--device cuda --remat .gpu/bin/bench_policies_cuda --steps 5 --warmup 2 --precision "$precision"
            --torch-policies "${TORCH_POLICIES:-plain,checkpoint}")
    PYTHONUNBUFFERED=1 python3 bench/compare_torch.py "${common[@]}" --configs "${CONFIGS:-8192x16}" \
      ${MLP_POLICIES:+--policies "$MLP_POLICIES"} \
      --out "$out/policies-cuda$suffix" || status=1
    PYTHONUNBUFFERED=1 python3 bench/compare_torch.py "${common[@]}" --workload gpt --configs 64x8 \
      --policies stored,checkpoint,selective,recompute_attention,stored_attention --out "$out/gpt-cuda$suffix" || status=1
    # The attention's batched products as one pointer-array product each (the default) against
    # strided batches, one per head: the stored GPT's step and its profile, interleaved, twice.
    for round in 1 2; do
      for how in "" --strided-batches; do
        echo "=== GPT stored $precision ${how:-(pointer arrays)} round $round" >> "$out/gpt-cuda-batches$suffix.log"
        timeout 120 .gpu/bin/bench_policies_cuda --workload gpt --batch 64 --blocks 8 --policy stored \
          --precision "$precision" --steps 5 --warmup 2 $how $([ $round = 2 ] && echo --profile) \
          >> "$out/gpt-cuda-batches$suffix.log" 2>&1 || status=1
      done
    done
    tail -n 40 "$out/gpt-cuda-batches$suffix.log"
  done
fi
exit $status
