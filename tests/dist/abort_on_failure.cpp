// A rank that fails in the middle of a training step (its allocator runs out after the ranks agreed
// to start) while the others wait for its gradients: dist::environment aborts every rank, so the
// job ends with an error instead of hanging. Run under mpirun; ctest matches the output.
#include <remat/dist/mpi.hpp>
#include <remat/remat.hpp>

#include <cstdio>

using namespace remat;
using Net = Seq<Linear<8, 64>, ReLU, Linear<64, 64>, ReLU, Linear<64, 4>>;

int main(int argc, char** argv) {
  try {
    dist::environment env(argc, argv);
    memory::caching_allocator<host> alloc;
    model<Net> m(seed{1}, alloc);
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 1024});
    AdamW opt(m);
    tensor<float> x(32, 8);
    tensor<std::int32_t> y(32, 1);
    for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(i % 7) * 0.1f;
    for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = std::int32_t(i % 4);
    dp.train_step<SoftmaxCrossEntropy>(x.view(), y.view(), opt);
    if (dp.rank() == dp.size() - 1) {  // no room left for activations
      m.use_planned_arena(false);        // (its arena given back: activations come as the step goes)
      alloc.release_cached();
      alloc.set_limit(alloc.stats().total.reserved + 1024);
    }
    try {
      dp.train_step<SoftmaxCrossEntropy>(x.view(), y.view(), opt);
    } catch (out_of_memory const& e) {
      std::fprintf(stderr, "rank %d failed during its step: out_of_memory\n", dp.rank());
      throw;
    }
    std::printf("rank %d finished its step (only the other ranks may)\n", dp.rank());
    return 0;
  } catch (std::exception const& e) {  // (dist::environment has aborted every rank before this)
    std::fprintf(stderr, "unreachable: %s\n", e.what());
    return 3;
  }
}
