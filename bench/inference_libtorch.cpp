// The same surrogates as bench/inference.cpp through libtorch from C++ (what an embedding code
// would otherwise call): torch::nn modules (GELU in the erf form, remat's GELU; BatchNorm in eval
// mode), fp32, under torch::InferenceMode, 2 threads unless told. Built by
// bench/compare_inference.py against the libtorch of the PyPI wheel in .venv-bench (its headers
// and libraries), not by the project's CMake. Same flags and JSON lines as bench_inference.
#include <torch/torch.h>

#include "heap_count.hpp"
#include "timing.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// examples/surrogate's residual block: conv, BatchNorm, GELU, conv, plus the input.
struct BlockImpl : torch::nn::Module {
  torch::nn::Conv2d a{nullptr}, b{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  BlockImpl() {
    a = register_module("a", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(16));
    b = register_module("b", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  }
  torch::Tensor forward(torch::Tensor x) { return x + b(torch::gelu(bn(a(x)))); }
};
TORCH_MODULE(Block);


}  // namespace

int main(int argc, char** argv) {
  std::vector<long> batches{1, 16, 256, 4096};
  int rounds = 7;
  double seconds = 0.2;
  int threads = 2;
  std::string which = "mlp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) which = argv[i + 1];
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batches")) {
      batches.clear();
      for (char const* p = argv[i + 1]; *p;) {
        char* end = nullptr;
        batches.push_back(std::strtol(p, &end, 10));
        p = *end ? end + 1 : end;
      }
    }
  }
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  bool const conv = which == "conv";
  torch::nn::Sequential net;
  if (conv) {
    net = torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 16, 3).padding(1)), torch::nn::GELU(),
                                Block(), Block(), Block(),
                                torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 2, 3).padding(1)));
  } else {
    net = torch::nn::Sequential(torch::nn::Linear(5, 256), torch::nn::GELU(), torch::nn::Linear(256, 256),
                                torch::nn::GELU(), torch::nn::Linear(256, 256), torch::nn::GELU(),
                                torch::nn::Linear(256, 5));
  }
  net->eval();
  torch::InferenceMode guard;
  long const max_batch = conv ? std::max(256L, *std::max_element(batches.begin(), batches.end())) : 4096;
  std::vector<long> const shape = conv ? std::vector<long>{max_batch, 2, 64, 64} : std::vector<long>{max_batch, 5};
  long elements = 1;
  for (long d : shape) elements *= d;
  torch::Tensor const x = torch::sin(0.01 * torch::arange(elements, torch::kFloat32)).reshape(shape);
  std::printf("libtorch %s: the same surrogate, fp32, InferenceMode, %d threads\n", TORCH_VERSION, threads);
  for (long b : batches) {
    if (b < 1 || b > max_batch) continue;
    torch::Tensor const xb = x.narrow(0, 0, b).contiguous();
    torch::Tensor y;
    bench_timing::warm_up([&] { y = net->forward(xb); });
    auto const [t, calls] = bench_timing::per_call([&] { y = net->forward(xb); }, rounds, seconds);
    std::uint64_t const heap_before = heap_count::calls.load();  // malloc and its kin, over up to 100 more calls
    int const more = bench_timing::count_calls(t);
    for (int i = 0; i < more; ++i) y = net->forward(xb);
    double const heap = double(heap_count::calls.load() - heap_before) / double(more);
    std::printf("batch %5ld: %10.2f us per call, %12.0f rows/s, %.2f heap allocations per call (%zu calls)\n", b,
                t * 1e6, double(b) / t, heap, calls);
    std::printf("json: {\"library\": \"libtorch %s\", \"model\": \"%s\", \"batch\": %ld, \"latency_us\": %.3f, \"rows_per_s\": %.1f, "
                "\"heap_allocations_per_call\": %.2f, \"calls\": %zu, \"rounds\": %d}\n",
                TORCH_VERSION, which.c_str(), b, t * 1e6, double(b) / t, heap, calls, rounds);
  }
  return 0;
}
