// Inference latency of the surrogates a simulation code calls every time step, fp32, in eval mode,
// through model::forward(x, out) after reserve_inference (the call that allocates nothing):
//   mlp   a per-cell closure model, 5 -> 256 -> 256 -> 256 -> 5 with GELU (batches up to 4096)
//   conv  examples/surrogate's network on its 64 x 64 grid: 2 -> 16 channels, three residual
//         blocks of two 3 x 3 convolutions with BatchNorm (running statistics) and GELU, 16 -> 2
//         (planned for batch 256, or the largest batch asked for when larger)
// For each batch it prints the median latency of a call over `--rounds` rounds, rows per second,
// and the system allocations per call counted by the model's allocator and the default one (the
// kernels' scratch), as JSON lines that bench/compare_inference.py puts beside libtorch's
// (bench/inference_libtorch.cpp) and torch.compile's.
// bench_inference_cuda (inference_cuda.cu) runs the same on the GPU, each call waited for, three
// ways: forward(x, out); an inference_graph's run(x, out) (copies in and out of its staging, one
// CUDA graph launch); and its replay() alone (the caller writes input() and reads output()).
// bench/inference_torch_cuda.py is PyTorch's side: eager, and a torch.cuda.CUDAGraph.
//
//   bench_inference [--model mlp|conv] [--batches 1,16,256,4096] [--rounds 7] [--seconds 0.2]
//                   [--split-k on|off]   (the GPU's small products: kernels::set_small_product_split_k)
#include <remat/remat.hpp>

#include "timing.hpp"
#if !REMAT_BENCH_CUDA
#include "heap_count.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace remat;

namespace {

using Mlp = Seq<Linear<5, 256>, GELU, Linear<256, 256>, GELU, Linear<256, 256>, GELU, Linear<256, 5>>;
constexpr std::size_t G = 64, Width = 16;
using ConvBlock = Residual<Seq<Conv2d<Width, Width, 3, G, G, 1, 1, false>, BatchNorm2d<Width, G, G>, GELU,
                               Conv2d<Width, Width, 3, G, G, 1, 1>>>;
using Conv = Seq<Conv2d<2, Width, 3, G, G, 1, 1>, GELU, Repeat<3, ConvBlock>, Conv2d<Width, 2, 3, G, G, 1, 1>>;

#if REMAT_BENCH_CUDA
using D = remat::cuda;
// Each call is waited for: its latency.
void wait() { REMAT_CUDA_CHECK(cudaDeviceSynchronize()); }
#else
using D = host;
void wait() {}
#endif

}  // namespace

// Times call() at batch b and prints its line and JSON line ("mode": how it was called).
template <class Net, class F>
void report(char const* name, char const* mode, std::size_t b, memory::caching_allocator<D>& alloc, int rounds,
            double seconds, F&& call) {
  bench_timing::warm_up([&] {  // the products' first use
    call();
    wait();
  });
  auto const asked = [&] {
    return alloc.stats().system_allocations + memory::default_allocator<D>().stats().system_allocations;
  };
  auto const before = asked();
  if (std::getenv("REMAT_BENCH_PROFILE")) profile::enable(), profile::reset();
  auto const [t, calls] = bench_timing::per_call(
      [&] {
        call();
        wait();
      },
      rounds, seconds);
  if (std::getenv("REMAT_BENCH_PROFILE")) {
    profile::report const r = profile::read();
    std::printf("profile (us per call): forward wall %.2f, products %.2f, point-wise %.2f, row passes %.2f, "
                "reductions %.2f\n",
                r.wall(memory::phase::forward) * 1e6 / double(calls),
                r.seconds(memory::phase::forward, profile::work::product) * 1e6 / double(calls),
                r.seconds(memory::phase::forward, profile::work::pointwise) * 1e6 / double(calls),
                r.seconds(memory::phase::forward, profile::work::rows) * 1e6 / double(calls),
                r.seconds(memory::phase::forward, profile::work::reduction) * 1e6 / double(calls));
    profile::enable(false);
  }
  double const allocs = double(asked() - before) / double(calls);
  double heap = -1;  // malloc and its kin per call, over up to 100 more calls (host only)
#if !REMAT_BENCH_CUDA
  std::uint64_t const heap_before = heap_count::calls.load();
  int const more = bench_timing::count_calls(t);
  for (int i = 0; i < more; ++i) call();
  heap = double(heap_count::calls.load() - heap_before) / double(more);
#endif
  std::printf("batch %5zu %-8s: %10.2f us per call, %12.0f rows/s, %.3f system allocations per call, %.2f heap "
              "allocations per call (%zu calls)\n",
              b, mode, t * 1e6, double(b) / t, allocs, heap, calls);
  std::printf("json: {\"library\": \"remat\", \"model\": \"%s\", \"device\": \"%s\", \"mode\": \"%s\", "
              "\"batch\": %zu, \"latency_us\": %.3f, \"rows_per_s\": %.1f, \"allocations_per_call\": %.4f, "
              "\"heap_allocations_per_call\": %.2f, \"calls\": %zu, \"rounds\": %d}\n",
              name, std::is_same_v<D, host> ? "host" : "cuda", mode, b, t * 1e6, double(b) / t, allocs, heap, calls,
              rounds);
}

template <class Net>
int measure(char const* name, char const* what, std::size_t max_batch, std::vector<std::size_t> const& batches,
            int rounds, double seconds) {
  memory::caching_allocator<D> alloc;
  model<Net, D> m(seed{1}, alloc);
  m.reserve_inference(max_batch);
  std::vector<float> xv(max_batch * Net::in_width);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::sin(0.01 * double(i)));
  tensor<float, D> x(index_t(max_batch), index_t(Net::in_width), memory::tag::activations, alloc),
      y(index_t(max_batch), index_t(Net::out_width), memory::tag::activations, alloc);
  x.copy_from(std::span<float const>(xv));
  std::printf("remat: %s, fp32, inference arena %s (planned for %zu rows)\n", what,
              memory::format_bytes(m.arena_bytes()).c_str(), max_batch);
  for (std::size_t b : batches) {
    if (b == 0 || b > max_batch) continue;
    auto const xb = x.view().row_range(0, b);
    auto const yb = y.view().row_range(0, b);
    report<Net>(name, "forward", b, alloc, rounds, seconds, [&] { m.forward(xb, yb); });
    if constexpr (!std::is_same_v<D, host>) {
      inference_graph g(m, b);
      report<Net>(name, "graph", b, alloc, rounds, seconds, [&] { g.run(xb, yb); });
      report<Net>(name, "replay", b, alloc, rounds, seconds, [&] { g.replay(); });
      std::printf("  the graph of batch %zu holds %s of its own (staging and captured scratch)\n", b,
                  memory::format_bytes(g.bytes()).c_str());
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::size_t> batches{1, 16, 256, 4096};
  int rounds = 7;
  double seconds = 0.2;  // per round and batch
  std::string which = "mlp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--model")) which = argv[i + 1];
    if (!std::strcmp(argv[i], "--split-k")) kernels::set_small_product_split_k(!std::strcmp(argv[i + 1], "on"));
    if (!std::strcmp(argv[i], "--gemm32"))
      kernels::set_gemm32_path(!std::strcmp(argv[i + 1], "openblas") ? kernels::gemm32_path::openblas
                                                                       : kernels::gemm32_path::onednn);
    if (!std::strcmp(argv[i], "--batches")) {
      batches.clear();
      for (char const* p = argv[i + 1]; *p;) {
        char* end = nullptr;
        batches.push_back(std::strtoull(p, &end, 10));
        p = *end ? end + 1 : end;
      }
    }
  }
  if (which == "conv")
    return measure<Conv>("conv", "the convolutional surrogate of examples/surrogate (64 x 64, 3 blocks of 16 channels)",
                         std::max<std::size_t>(256, *std::max_element(batches.begin(), batches.end())), batches, rounds,
                         seconds);
  return measure<Mlp>("mlp", "MLP surrogate 5-256-256-256-5 GELU", 4096, batches, rounds, seconds);
}
