// The C interface of a GPU model library (remat_add_model_library(... DEVICE cuda)): trained through
// host pointers and through device pointers it gives the same bits, and the same bits as
// model<Net, cuda> with AdamW in C++; inference writes a host or a device output; a NaN target in
// device memory is refused with nothing changed. Exit 77 without a GPU.
#include "../capi/data.h"
#include "../capi/surrogate_mlp.hpp"
#include "capi_surrogate_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {
int failures = 0;
void check(bool ok, char const* what) {
  if (!ok) std::fprintf(stderr, "FAILED: %s (%s)\n", what, capi_surrogate_cuda_last_error()), ++failures;
}
float* to_device(std::vector<float> const& v) {
  float* p = nullptr;
  cudaMalloc(&p, v.size() * sizeof(float));
  cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  return p;
}
}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return std::puts("no GPU: skipped"), 77;
  remat_options o = capi_surrogate_cuda_default_options();
  o.seed = 5;
  o.learning_rate = 3e-3;
  capi_surrogate_cuda_model *on_host = nullptr, *on_device = nullptr;
  check(capi_surrogate_cuda_create(&on_host, &o) == REMAT_OK, "create");
  check(capi_surrogate_cuda_create(&on_device, &o) == REMAT_OK, "create");
  remat::model<capi_surrogate_net, remat::cuda> m(remat::seed{5});
  remat::AdamW opt(m, {.lr = 3e-3});
  std::size_t const rows = 24;
  std::vector<float> x(rows * 5), t(rows * 5);
  for (int step = 0; step < 20; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(step, std::int64_t(i));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = capi_target(step, std::int64_t(i));
    float *dx = to_device(x), *dt = to_device(t);
    double lh = 0, ld = 0;
    check(capi_surrogate_cuda_train_step(on_host, x.data(), t.data(), std::int64_t(rows), &lh) == REMAT_OK, "host step");
    check(capi_surrogate_cuda_train_step(on_device, dx, dt, std::int64_t(rows), &ld) == REMAT_OK, "device step");
    double const lp = m.train_step<remat::MSE>(remat::tensor_view<float const, remat::cuda>(dx, rows, 5),
                                               remat::tensor_view<float const, remat::cuda>(dt, rows, 5), opt);
    check(lh == ld && ld == lp, "the three losses are the same bits");
    cudaFree(dx), cudaFree(dt);
  }
  std::vector<float> yh(rows * 5), yd(rows * 5);
  float *dx = to_device(x), *dy = nullptr;
  cudaMalloc(&dy, yd.size() * sizeof(float));
  check(capi_surrogate_cuda_forward(on_host, x.data(), std::int64_t(rows), yh.data()) == REMAT_OK, "host forward");
  check(capi_surrogate_cuda_forward(on_device, dx, std::int64_t(rows), dy) == REMAT_OK, "device forward");
  cudaMemcpy(yd.data(), dy, yd.size() * sizeof(float), cudaMemcpyDeviceToHost);
  std::vector<float> const yp = m.forward(remat::tensor_view<float const, remat::cuda>(dx, rows, 5)).to_vector();
  check(std::memcmp(yh.data(), yd.data(), yh.size() * sizeof(float)) == 0, "host and device outputs");
  check(std::memcmp(yh.data(), yp.data(), yh.size() * sizeof(float)) == 0, "the C interface's and C++'s outputs");
  // A NaN in a device target: refused, the model's output the same bits after.
  t[7] = std::nanf("");
  float* dt = to_device(t);
  double l = 0;
  check(capi_surrogate_cuda_train_step(on_device, dx, dt, std::int64_t(rows), &l) == REMAT_ERROR_ARGUMENT, "NaN refused");
  check(capi_surrogate_cuda_forward(on_device, dx, std::int64_t(rows), dy) == REMAT_OK, "forward after");
  std::vector<float> after(yd.size());
  cudaMemcpy(after.data(), dy, after.size() * sizeof(float), cudaMemcpyDeviceToHost);
  check(std::memcmp(after.data(), yd.data(), yd.size() * sizeof(float)) == 0, "unchanged after the refusal");
  // The plan equals what the model's allocator measured.
  remat_memory_plan plan{}, measured{};
  check(capi_surrogate_cuda_memory_plan(&o, std::int64_t(rows), &plan) == REMAT_OK, "plan");
  check(capi_surrogate_cuda_memory_measured(on_device, &measured) == REMAT_OK, "measured");
  check(plan.activations == measured.activations && plan.step_peak == measured.step_peak, "plan = measured");
  cudaFree(dx), cudaFree(dy), cudaFree(dt);
  capi_surrogate_cuda_destroy(on_host);
  capi_surrogate_cuda_destroy(on_device);
  if (failures) return std::fprintf(stderr, "%d checks failed\n", failures), 1;
  std::puts("the GPU model library: host and device pointers and C++ give the same bits; plan = measured");
  return 0;
}
