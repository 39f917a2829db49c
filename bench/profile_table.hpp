// The per-phase profile table bench_policies and bench_conv print after their timed steps (with
// --profile): where a training step's time goes, per phase (forward, recomputation, loss, backward,
// optimizer) and within each phase per kind of work (products, point-wise passes, row passes,
// reductions, the rest), as a table on stderr and a JSON line ("kind": "profile") on stdout.
#pragma once

#include <remat/remat.hpp>

#include <cstddef>
#include <cstdio>
#include <string>

namespace bench_profile {

inline void print(remat::profile::report const& r, int steps, char const* policy, std::size_t blocks, std::size_t batch,
                  char const* workload) {
  using remat::memory::phase;
  phase const phases[] = {phase::forward, phase::recomputation, phase::loss, phase::backward, phase::optimizer};
  double const per = 1.0 / double(steps);
  double total = 0, products = 0;
  for (phase p : phases) {
    total += r.wall(p) * per;
    products += r.seconds(p, remat::profile::work::product) * per;
  }
  std::fprintf(stderr, "%s %s, %zu blocks, batch %zu: ms per step (%d profiled steps)\n", workload, policy, blocks,
               batch, steps);
  std::fprintf(stderr, "%-14s %9s %9s %11s %11s %11s %9s\n", "phase", "wall", "products", "point-wise", "row passes",
               "reductions", "other");
  std::string json = std::string("{\"library\": \"remat\", \"kind\": \"profile\", \"workload\": \"") + workload +
                     "\", \"policy\": \"" + policy + "\", \"blocks\": " + std::to_string(blocks) +
                     ", \"batch\": " + std::to_string(batch) + ", \"phases\": {";
  bool first = true;
  for (phase p : phases) {
    double const wall = r.wall(p) * per;
    if (wall == 0) continue;
    double k[remat::profile::work_count];
    for (std::size_t w = 0; w < remat::profile::work_count; ++w) k[w] = r.seconds(p, remat::profile::work(w)) * per;
    double const other = r.outside_kernels(p) * per;
    std::fprintf(stderr, "%-14s %9.2f %9.2f %11.2f %11.2f %11.2f %9.2f\n", remat::memory::name(p), wall * 1e3,
                 k[0] * 1e3, k[1] * 1e3, k[2] * 1e3, k[3] * 1e3, other * 1e3);
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\": {\"wall_s\": %.6f, \"product_s\": %.6f, \"pointwise_s\": %.6f, \"rows_s\": %.6f, "
                  "\"reduction_s\": %.6f, \"other_s\": %.6f}",
                  first ? "" : ", ", remat::memory::name(p), wall, k[0], k[1], k[2], k[3], other);
    json += buf;
    first = false;
  }
  std::fprintf(stderr, "%-14s %9.2f %9.2f  (products %.0f%% of the step)\n", "step", total * 1e3, products * 1e3,
               total > 0 ? 100.0 * products / total : 0.0);
  char buf[160];
  std::snprintf(buf, sizeof buf, "}, \"step_s\": %.6f, \"product_share\": %.4f}", total,
                total > 0 ? products / total : 0.0);
  std::printf("%s%s\n", json.c_str(), buf);
}

}  // namespace bench_profile
