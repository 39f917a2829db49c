// The storage-policy benchmark on the GPU: the same program, its models on remat::cuda.
#define REMAT_BENCH_CUDA 1
#include "policies.cpp"
