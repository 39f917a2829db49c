// online_twin: online.f90 in C++, step for step: the same runs (the Fortran program's integer
// formula for the squares), gray_scott.hpp's solver, model<gray_scott_surrogate_32> with AdamW
// and the Fortran program's options, the same buffer and draws. It writes every loss and the
// rollout's error and last state as their bits, in online.f90's format; the test requires the two
// files to be equal.
//   online_twin <file for the run's bits>
#include "../surrogate/gray_scott.hpp"
#include "../surrogate/network.hpp"

#include <remat/remat.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t g = 32, cells = 2 * g * g, steps = 2400, run_length = 800, burn_in = 100, sample_every = 8,
                      ahead = 4, train_every = 8, batch = 8, capacity = 96, rollout = 40, held_out_run = 1000;
constexpr double in_scale = 3;

struct solver {
  std::vector<double> u = std::vector<double>(g * g), v = std::vector<double>(g * g), nu = u, nv = v;
  void start(std::size_t run) {  // online.f90's squares
    std::fill(u.begin(), u.end(), 1.0);
    std::fill(v.begin(), v.end(), 0.0);
    for (std::size_t q = 0; q <= 3 + (run * 7 + 3) % 5; ++q) {
      std::size_t const side = 4 + (q * 5 + run * 3) % 9, i0 = (q * 13 + run * 17) % (g - side),
                        j0 = (q * 29 + run * 11) % (g - side);
      for (std::size_t i = i0; i < i0 + side; ++i)
        for (std::size_t j = j0; j < j0 + side; ++j) {
          u[i * g + j] = 0.5;
          v[i * g + j] = 0.25;
        }
    }
  }
  void step() {
    gray_scott::step(u.data(), v.data(), nu.data(), nv.data(), g);
    u.swap(nu);
    v.swap(nv);
  }
  double value(std::size_t i) const { return i < g * g ? u[i] : v[i - g * g]; }
  void state_into(float* into) const {
    for (std::size_t i = 0; i < cells; ++i) into[i] = float((i < g * g ? value(i) - 1 : value(i)) * in_scale);
  }
};

double unscaled(float xi, std::size_t i) { return double(xi) / in_scale + (i < g * g ? 1 : 0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: online_twin <file>\n"), 2;
  std::FILE* out = std::fopen(argv[1], "w");
  if (!out) return std::fprintf(stderr, "online_twin: cannot write %s\n", argv[1]), 1;
  remat::model<gray_scott_surrogate_32> m(remat::seed{7});
  remat::AdamW opt(m, {.lr = 2e-3});
  m.reserve_inference(1);
  solver s;
  s.start(0);
  std::vector<float> states(cells * capacity), increments(cells * capacity), x(cells * batch), t(cells * batch),
      pending(cells), guess(cells);
  std::size_t stored = 0, next = 0, due = 0;
  std::uint64_t draws = 0;
  double du_scale = 0;
  auto bits64 = [&](double d) {
    std::uint64_t b;
    std::memcpy(&b, &d, 8);
    std::fprintf(out, "%016" PRIX64 "\n", b);
  };
  for (std::size_t step = 1; step <= steps; ++step) {
    s.step();
    if (due == step) {
      std::memcpy(&states[next * cells], pending.data(), cells * sizeof(float));
      for (std::size_t i = 0; i < cells; ++i) increments[next * cells + i] = float(s.value(i) - unscaled(pending[i], i));
      next = (next + 1) % capacity;
      stored = std::min(stored + 1, capacity);
      due = 0;
    }
    if (step % run_length == 0) s.start(step / run_length);
    std::size_t const in_run = step % run_length;
    if (in_run >= burn_in && in_run + ahead < run_length && step % sample_every == 0 && due == 0) {
      s.state_into(pending.data());
      due = step + ahead;
    }
    if (step % train_every == 0 && stored >= batch) {
      if (du_scale == 0) {
        double sq = 0;
        for (std::size_t i = 0; i < stored * cells; ++i) sq += double(increments[i]) * double(increments[i]);
        du_scale = 1 / std::sqrt(sq / double(stored * cells));
      }
      for (std::size_t r = 0; r < batch; ++r) {
        std::size_t const k = std::size_t((draws++ * 2654435761ull) % stored);
        std::memcpy(&x[r * cells], &states[k * cells], cells * sizeof(float));
        for (std::size_t i = 0; i < cells; ++i) t[r * cells + i] = float(double(increments[k * cells + i]) * du_scale);
      }
      using view = remat::tensor_view<float const, remat::host>;
      bits64(m.train_step<remat::MSE>(view(x.data(), batch, cells), view(t.data(), batch, cells), opt));
    }
  }
  s.start(held_out_run);
  for (std::size_t i = 0; i < 2 * burn_in; ++i) s.step();
  s.state_into(pending.data());
  std::vector<double> start(cells);
  for (std::size_t i = 0; i < cells; ++i) start[i] = s.value(i);
  for (std::size_t done = ahead; done <= rollout; done += ahead) {
    m.forward(remat::tensor_view<float const, remat::host>(pending.data(), 1, cells),
              remat::tensor_view<float, remat::host>(guess.data(), 1, cells));
    for (std::size_t i = 0; i < cells; ++i)
      pending[i] = float(double(pending[i]) + (in_scale * double(guess[i])) / du_scale);
    for (std::size_t i = 0; i < ahead; ++i) s.step();
  }
  double err = 0, base = 0;
  for (std::size_t i = 0; i < cells; ++i) {
    double const truth = s.value(i);
    err += (unscaled(pending[i], i) - truth) * (unscaled(pending[i], i) - truth);
    base += (start[i] - truth) * (start[i] - truth);
  }
  err = std::sqrt(err / base);
  bits64(err);
  for (float p : pending) {
    std::uint32_t b;
    std::memcpy(&b, &p, 4);
    std::fprintf(out, "%08" PRIX32 "\n", b);
  }
  std::fclose(out);
  std::printf("rollout of %zu solver steps: error %.3f of persistence's (C++)\n", rollout, err);
  return 0;
}
