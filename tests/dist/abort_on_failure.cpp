// A rank that leaves by an exception outside remat (the caller's own code fails between steps)
// while the others wait for it in a training step: dist::environment aborts every rank, so the job
// ends with an error instead of hanging. (A pass that fails inside remat, out of memory say, is
// agreed instead: every rank throws and may go on; test_dist.cpp tests that.) Run under mpirun;
// ctest matches the output.
#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include <cstdio>
#include <stdexcept>

using namespace remat;
using Net = Seq<Linear<8, 64>, ReLU, Linear<64, 64>, ReLU, Linear<64, 4>>;

int main(int argc, char** argv) {
  try {
    dist::environment env(argc, argv);
    model<Net> m(seed{1});
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 1024});
    AdamW opt(m);
    tensor<float> x(32, 8);
    tensor<std::int32_t> y(32, 1);
    for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(i % 7) * 0.1f;
    for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = std::int32_t(i % 4);
    dp.train_step<SoftmaxCrossEntropy>(x.view(), y.view(), opt);
    if (dp.rank() == dp.size() - 1) {
      std::fprintf(stderr, "rank %d failed between its steps\n", dp.rank());
      throw std::runtime_error("the caller's own failure");
    }
    dp.train_step<SoftmaxCrossEntropy>(x.view(), y.view(), opt);  // waits for the rank that left
    std::printf("rank %d finished its step: unreachable\n", dp.rank());
    return 0;
  } catch (std::exception const& e) {  // (dist::environment has aborted every rank before this)
    std::fprintf(stderr, "unreachable: %s\n", e.what());
    return 3;
  }
}
