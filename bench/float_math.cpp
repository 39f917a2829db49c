// The evidence behind remat's own float exp, erf and tanh (numeric/float_math.hpp): time on 16M
// floats in one thread, against glibc's scalar libm, SLEEF's AVX-512 functions (u10: 1-ulp
// versions) and glibc's libmvec (what GCC calls under -ffast-math), and whether each vector
// version gives the bits of its own scalar version on every input (what keeps a fused pass, its
// op-by-op evaluation and a recomputation bit for bit whatever the thread count or the tail).
// Built when SLEEF (Debian: libsleef-dev) is found; run by scripts/bench.sh.
#include <remat/numeric/float_math.hpp>
#include <remat/kernels/pointwise.hpp>

#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

void libmvec_exp(float* y, float const* x, std::size_t n);  // float_math_libmvec.cpp, -ffast-math
void libmvec_erf(float* y, float const* x, std::size_t n);
void libmvec_tanh(float* y, float const* x, std::size_t n);

namespace {

std::size_t const n = std::size_t(1) << 24;

template <class F>
double best_ms(F const& f) {
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto const t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
  }
  return best;
}

long differing(std::vector<float> const& a, std::vector<float> const& b) {
  long d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

template <class Remat, class Glibc, class SleefV, class SleefS, class Mvec>
void row(char const* name, std::vector<float> const& x, Remat remat_f, float (*remat_scalar)(float), Glibc glibc_f,
         SleefV sleef_v, SleefS sleef_s, Mvec mvec) {
  std::vector<float> y(n), scalar(n);
  float const* xp = x.data();
  double const t_glibc = best_ms([&] {
    for (std::size_t i = 0; i < n; ++i) scalar[i] = glibc_f(xp[i]);
  });
  double const t_mvec = best_ms([&] { mvec(y.data(), xp, n); });
  long const d_mvec = differing(y, scalar);
  double const t_sleef = best_ms([&] {
    for (std::size_t i = 0; i < n; i += 16) _mm512_storeu_ps(&y[i], sleef_v(_mm512_loadu_ps(&xp[i])));
  });
  for (std::size_t i = 0; i < n; ++i) scalar[i] = sleef_s(xp[i]);
  long const d_sleef = differing(y, scalar);
  double const t_remat = best_ms([&] {
    remat::kernels::detail::host_transform(y.data(), 0, n, [=](std::size_t i) { return remat_f(xp[i]); });
  });
  float (*volatile one)(float) = remat_scalar;  // a scalar call
  for (std::size_t i = 0; i < n; ++i) scalar[i] = one(xp[i]);
  long const d_remat = differing(y, scalar);
  std::printf("| %s | %.2f | %.2f (%ld) | %.2f (%ld) | %.2f (%ld) |\n", name, t_glibc, t_mvec, d_mvec, t_sleef, d_sleef,
              t_remat, d_remat);
  std::printf("json: {\"function\": \"%s\", \"n\": %zu, \"glibc_ms\": %.3f, \"libmvec_ms\": %.3f, "
              "\"libmvec_differing\": %ld, \"sleef_ms\": %.3f, \"sleef_differing\": %ld, \"remat_ms\": %.3f, "
              "\"remat_differing\": %ld}\n",
              name, n, t_glibc, t_mvec, d_mvec, t_sleef, d_sleef, t_remat, d_remat);
}

float remat_exp(float x) { return remat::float_math::exp(x); }
float remat_erf(float x) { return remat::float_math::erf(x); }
float remat_tanh(float x) { return remat::float_math::tanh(x); }
// (functors, so the loop inlines and vectorises them)
auto const exp_f = [](float v) { return remat::float_math::exp(v); };
auto const erf_f = [](float v) { return remat::float_math::erf(v); };
auto const tanh_f = [](float v) { return remat::float_math::tanh(v); };

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("bench_float_math: this processor has no AVX-512 (SLEEF's 16-lane functions); skipped\n");
    return 0;
  }
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(std::sin(double(i) * 0.37) * 6.0);
  std::printf("float exp/erf/tanh on %zu floats in [-6, 6], one thread, best of 7, ms (in brackets: inputs whose "
              "vector result differs from the same library's scalar one)\n\n",
              n);
  std::printf("| function | glibc scalar | libmvec (-ffast-math) | SLEEF AVX-512 u10 | remat float_math |\n");
  std::printf("|---|---|---|---|---|\n");
  row("exp", x, exp_f, remat_exp, [](float v) { return expf(v); }, [](__m512 v) { return Sleef_expf16_u10(v); },
      [](float v) { return Sleef_expf_u10(v); }, libmvec_exp);
  row("erf", x, erf_f, remat_erf, [](float v) { return erff(v); }, [](__m512 v) { return Sleef_erff16_u10(v); },
      [](float v) { return Sleef_erff_u10(v); }, libmvec_erf);
  row("tanh", x, tanh_f, remat_tanh, [](float v) { return tanhf(v); }, [](__m512 v) { return Sleef_tanhf16_u10(v); },
      [](float v) { return Sleef_tanhf_u10(v); }, libmvec_tanh);
}
