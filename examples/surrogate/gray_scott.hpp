// The Gray–Scott solver of the surrogate examples (examples/surrogate, examples/online): the state
// lives in the caller's arrays (std::vector in one, remat's allocator under a tag of its own in the
// other), so both run the same arithmetic.
//
// Reaction–diffusion of two species u and v on a g x g grid,
//   du/dt = Du ∇²u - u v² + F (1 - u),   dv/dt = Dv ∇²v + u v² - (F + k) v,
// Du = 0.16, Dv = 0.08, F = 0.035, k = 0.065 (spots that grow and split), explicit Euler with
// dt = 1 on a unit grid, five-point Laplacian; the domain sits in a reservoir of fresh feed
// (u = 1, v = 0 outside the grid). A run starts from u = 1, v = 0 with 4 to 8 random squares of
// u = 0.5, v = 0.25.
#pragma once

#include <remat/numeric/philox.hpp>

#include <cstddef>
#include <cstdint>

namespace gray_scott {

inline constexpr double Du = 0.16, Dv = 0.08, F = 0.035, K = 0.065;

// A run's first state in u and v (g² values each): feed everywhere, then the run's squares, drawn
// from the counter-based stream (seed, 1000 + run).
inline void start(double* u, double* v, std::size_t g, std::uint64_t seed, std::uint64_t run) {
  for (std::size_t i = 0; i < g * g; ++i) {
    u[i] = 1.0;
    v[i] = 0.0;
  }
  std::uint64_t k = 0;
  auto rnd = [&] { return remat::philox::uniform(seed, 1000 + run, k++); };  // (a float)
  std::size_t const squares = 4 + std::size_t(rnd() * 5);
  for (std::size_t q = 0; q < squares; ++q) {
    std::size_t const side = 4 + std::size_t(rnd() * 9);
    std::size_t const i0 = std::size_t(rnd() * double(g - side)), j0 = std::size_t(rnd() * double(g - side));
    for (std::size_t i = i0; i < i0 + side; ++i)
      for (std::size_t j = j0; j < j0 + side; ++j) {
        u[i * g + j] = 0.5 + 0.02 * (rnd() - 0.5);
        v[i * g + j] = 0.25 + 0.02 * (rnd() - 0.5);
      }
  }
}

// One step from (u, v) into (nu, nv), which must not alias them.
inline void step(double const* u, double const* v, double* nu, double* nv, std::size_t g) {
  auto const n = std::ptrdiff_t(g);
  auto at = [&](double const* a, std::ptrdiff_t i, std::ptrdiff_t j, double outside) {
    return i < 0 || j < 0 || i >= n || j >= n ? outside : a[i * n + j];
  };
  for (std::ptrdiff_t i = 0; i < n; ++i)
    for (std::ptrdiff_t j = 0; j < n; ++j) {
      double const uc = u[i * n + j], vc = v[i * n + j];
      double const lu = at(u, i - 1, j, 1) + at(u, i + 1, j, 1) + at(u, i, j - 1, 1) + at(u, i, j + 1, 1) - 4 * uc;
      double const lv = at(v, i - 1, j, 0) + at(v, i + 1, j, 0) + at(v, i, j - 1, 0) + at(v, i, j + 1, 0) - 4 * vc;
      double const r = uc * vc * vc;
      nu[i * n + j] = uc + Du * lu - r + F * (1 - uc);
      nv[i * n + j] = vc + Dv * lv + r - (F + K) * vc;
    }
}

}  // namespace gray_scott
