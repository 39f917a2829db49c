// Built by nvcc against an installed remat through remat::cuda: a small model trained one step on
// the GPU. Without a GPU it says so and exits 77 (built and linked is what CI checks there).
#include <remat/remat.hpp>

#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("consumer_cuda: built and linked; no CUDA device to run on\n");
    return 77;
  }
  using namespace remat;
  using Net = Seq<Linear<4, 16>, GELU, Checkpointed<Seq<LayerNorm<16>, Linear<16, 3>>>>;
  model<Net, remat::cuda, mixed<bfloat16, DynamicLossScale>> m(seed{1});
  AdamW opt(m);
  tensor<float, remat::cuda> x(8, 4);
  tensor<std::int32_t, remat::cuda> y(8, 1);
  x.copy_from(std::vector<float>(32, 0.5f));
  y.copy_from(std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 0, 1});
  double const first = m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  double last = first;
  for (int s = 0; s < 20; ++s) last = m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  std::printf("consumer_cuda: loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
