// The memory-budget example on the GPU: the same program, its model and data on remat::cuda.
#define REMAT_EXAMPLE_CUDA 1
#include "main.cpp"
