// Catch's runner for the CUDA tests: without a GPU (or a driver) it exits with 77, which ctest
// reports as skipped, so a machine without a GPU builds and lists the suite without failing it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  cudaError_t const status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s): the CUDA tests are skipped\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
