// The largest-GPT benchmark on the GPU: the same program, its model on remat::cuda.
#define REMAT_BENCH_CUDA 1
#include "offload_gpt.cpp"
