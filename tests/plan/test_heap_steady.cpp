// A surrogate called every time step touches no heap at all: after reserve_inference and a first
// call, forward(x, out) at batches whose products go to OpenBLAS (at most small_product
// multiply-adds each; oneDNN's matmul makes objects of its own per call) makes no call of malloc
// or its kin (counted by bench/heap_count.hpp, which replaces them in this program), and its
// outputs equal forward(x)'s bit for bit. What makes it so: the activations' shared_ptr blocks come
// from memory::recycling, and the caching allocator reuses the map nodes of the blocks it frees.
// Its own program (the counter replaces malloc for the whole executable); not built under the
// sanitizers, whose runtime replaces malloc itself.
#include <remat/remat.hpp>

#include "heap_count.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

using namespace remat;

namespace {

using Surrogate = Seq<Linear<5, 256>, GELU, Linear<256, 256>, GELU, Linear<256, 256>, GELU, Linear<256, 5>>;

tensor<float> input(std::size_t rows, double k) {
  tensor<float> x{index_t(rows), 5};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(k * double(i)) + 0.3 * std::cos(0.7 * double(i)));
  return x;
}

}  // namespace

TEST_CASE("heap: 1,000 inference calls at batches 1 to 4 make no heap allocation", "[plan][heap]") {
  // (each product at most 4 x 256 x 256 multiply-adds: OpenBLAS's path, see kernels::small_product)
  static_assert(4 * 256 * 256 <= kernels::small_product);
  memory::caching_allocator<host> alloc;
  model<Surrogate, host> m(seed{3}, alloc);
  m.reserve_inference(64);
  std::vector<tensor<float>> xs;
  std::vector<std::vector<float>> want;
  for (std::size_t b = 1; b <= 4; ++b) {
    xs.push_back(input(b, 0.1 * double(b)));
    tensor<float> const y = m.forward(xs.back());  // (dropped before the count: it lies in the arena)
    want.emplace_back(y.data(), y.data() + y.size());
  }
  tensor<float> y(4, 5);
  m.forward(xs[3].view(), y.view().row_range(0, 4));  // the first call at the largest batch
  auto const system_before = alloc.stats().system_allocations;
  std::uint64_t const heap_before = heap_count::calls.load();
  bool same = true;
  for (int call = 0; call < 1000; ++call) {
    std::size_t const b = std::size_t(call % 4) + 1;
    auto const out = y.view().row_range(0, b);
    m.forward(xs[b - 1].view(), out);
    same = same && std::memcmp(out.data(), want[b - 1].data(), b * 5 * sizeof(float)) == 0;
  }
  std::uint64_t const heap = heap_count::calls.load() - heap_before;
  CHECK(heap == 0);
  CHECK(alloc.stats().system_allocations == system_before);
  CHECK(same);
}

TEST_CASE("heap: the counter sees what it should (a make_shared, a vector, a posix_memalign)", "[plan][heap]") {
  // (so that the zero above is a count, not a counter that sees nothing)
  std::uint64_t const before = heap_count::calls.load();
  auto p = std::make_shared<int>(1);
  std::vector<double> v(100);
  void* q = nullptr;
  REQUIRE(posix_memalign(&q, 64, 256) == 0);
  std::free(q);
  CHECK(heap_count::calls.load() - before == 3);
  CHECK(*p + int(v.size()) == 101);
}

TEST_CASE("heap: recycled activation blocks are reused on the thread that freed them, and freed at its end",
          "[plan][heap]") {
  using A = memory::recycling<tensor<float>>;
  A a;
  tensor<float>* const p = a.allocate(1);
  a.deallocate(p, 1);
  std::uint64_t const before = heap_count::calls.load();
  tensor<float>* const q = a.allocate(1);
  CHECK(q == p);  // the kept block, no heap call
  CHECK(heap_count::calls.load() == before);
  tensor<float>* const r = a.allocate(1);  // none kept now: from the heap
  CHECK(heap_count::calls.load() == before + 1);
  a.deallocate(q, 1);
  a.deallocate(r, 1);
  bool reused = false;
  std::uint64_t calls = 0;
  std::thread([&] {  // another thread keeps its own, and frees them when it ends
    A b;
    tensor<float>* const s = b.allocate(1);
    b.deallocate(s, 1);  // (the thread's first: its shelf registers its destructor, a heap call of glibc's)
    std::uint64_t const start = heap_count::calls.load();
    reused = b.allocate(1) == s;
    b.deallocate(s, 1);
    calls = heap_count::calls.load() - start;
  }).join();
  CHECK(reused);
  CHECK(calls == 0);
  tensor<float>* const arr = a.allocate(3);  // arrays are never kept
  a.deallocate(arr, 3);
}
