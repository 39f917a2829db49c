#!/usr/bin/env bash
# For a GPU machine that cannot build (no Catch2, no OpenBLAS, no package registry): builds the
# nvcc targets here, where the CUDA toolkit compiles but no GPU runs, and packs them with the
# host libraries they need that such a machine lacks (OpenBLAS and its Fortran runtime) into
# .gpu/pack.tar.xz (about 10 MiB; .gpu/ is ignored by git: name it in what a GPU machine is
# sent, the device tool's `carry`) with scripts/cuda_run.sh as .gpu/run.sh, and run that there:
#   .gpu/run.sh [tests|bench|inference|conv|offload|all]
# The build is for sm_90 (H100, H200), without oneDNN (its 40 MB library only speeds host bf16
# products, which the CUDA tests use as a reference).
#   scripts/cuda_pack.sh [ARCH]      ARCH: CMAKE_CUDA_ARCHITECTURES (default 90)
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-90}"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DREMAT_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="${CUDAToolkit_ROOT:-/usr/local/cuda}/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DREMAT_USE_ONEDNN=OFF -DREMAT_BUILD_TESTS=ON >/dev/null
targets=(test_cuda bench_policies_cuda bench_inference_cuda bench_offload_gpt_cuda memory_budget_cuda capi_cuda)
grep -q 'build tests/cuda/test_dist_cuda:' build/gpu/build.ninja && targets+=(test_dist_cuda)
grep -q 'build bench/conv_algos_cuda:' build/gpu/build.ninja && targets+=(conv_algos_cuda)
cmake --build build/gpu --target "${targets[@]}" -j"$(nproc)"
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" .gpu
for t in tests/cuda/test_cuda bench/bench_policies_cuda bench/bench_inference_cuda bench/bench_offload_gpt_cuda \
         examples/memory_budget_cuda \
         tests/cuda/test_dist_cuda bench/conv_algos_cuda tests/cuda/capi_cuda tests/cuda/libcapi_surrogate_cuda.so.0; do
  [ -e "build/gpu/$t" ] && cp -L "build/gpu/$t" "$stage/bin/"
done
# The host libraries the binaries load that are not part of CUDA (cuBLASLt, cuDNN, NCCL and MPI
# are found on the GPU machine).
ldd "$stage/bin/test_cuda" | awk '/openblas|gfortran|quadmath|gomp/ {print $3}' | xargs -r -I{} cp -L {} "$stage/lib/"
tar -C "$stage" -cJf .gpu/pack.tar.xz bin lib
rm -rf "$stage"
cp scripts/cuda_run.sh .gpu/run.sh
ls -la .gpu
