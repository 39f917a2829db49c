// The C++ side of the Fortran test: trains model<capi_surrogate_net> with AdamW on the data of
// data.h, with the Fortran program's seed and settings, and compares each step's loss and the last
// outputs with what test_capi_fortran wrote (their bits), which must be equal bit for bit.
//   capi_fortran_check <dir holding fortran_run.txt>
#include "data.h"
#include "surrogate_mlp.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: capi_fortran_check <dir>\n"), 2;
  std::ifstream in(std::string(argv[1]) + "/fortran_run.txt");
  if (!in) return std::fprintf(stderr, "no %s/fortran_run.txt (run test_capi_fortran first)\n", argv[1]), 1;
  remat::model<capi_surrogate_net> m(remat::seed{5});
  remat::AdamW opt(m, {.lr = 3e-3, .weight_decay = 0.02});
  std::size_t const rows = 24, steps = 25;
  std::vector<float> x(rows * 5), t(rows * 5);
  int failures = 0;
  for (std::size_t step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(std::int64_t(step), std::int64_t(i));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = capi_target(std::int64_t(step), std::int64_t(i));
    double const l = m.train_step<remat::MSE>(remat::tensor_view<float const, remat::host>(x.data(), rows, 5),
                                              remat::tensor_view<float const, remat::host>(t.data(), rows, 5), opt);
    std::string line;
    std::getline(in, line);
    std::uint64_t bits = 0;
    std::memcpy(&bits, &l, sizeof bits);
    if (std::strtoull(line.c_str(), nullptr, 16) != bits) {
      std::fprintf(stderr, "step %zu: Fortran's loss %s, C++'s %016" PRIX64 " (%.17g)\n", step, line.c_str(), bits, l);
      ++failures;
    }
  }
  std::vector<float> const y = m.forward(remat::tensor_view<float const, remat::host>(x.data(), rows, 5)).to_vector();
  for (std::size_t i = 0; i < y.size(); ++i) {
    std::string line;
    std::getline(in, line);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &y[i], sizeof bits);
    if (std::strtoul(line.c_str(), nullptr, 16) != bits) {
      std::fprintf(stderr, "output %zu: Fortran's %s, C++'s %08" PRIX32 "\n", i, line.c_str(), bits);
      ++failures;
    }
  }
  if (failures) return std::fprintf(stderr, "%d values differ\n", failures), 1;
  std::printf("the Fortran time loop equals C++ bit for bit: %zu losses and %zu outputs\n", steps, y.size());
  return 0;
}
