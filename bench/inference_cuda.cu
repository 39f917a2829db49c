// The inference benchmark on the GPU: the same program, its model on remat::cuda, with an
// inference_graph's run and replay beside forward(x, out).
#define REMAT_BENCH_CUDA 1
#include "inference.cpp"
