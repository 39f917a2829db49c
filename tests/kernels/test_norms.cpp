// kernels::layer_norm_backward and rms_norm_backward on the host, which read x and dy once: a
// chunk of rows at a time, each row's parameter terms added to its chunk's column sums before its
// dx is written, the chunks' sums then added onto dgamma (and dbeta) in chunk order. Checked
// against the formulas in double precision, over row counts that end inside a chunk, for fp64,
// fp32 and bf16 data; bit for bit on one thread and on two, with dx over dy, without dx, and
// with a residual's gradient added (to the rounded dx, as the separate add would). And the sums'
// order, bit for bit: the chunks' column sums added in chunk order, a row's two sums of
// LayerNorm's dx each as row_sum adds it (16 lanes).
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/values.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace remat;

namespace {

template <class T>
double d(T v) {
  return double(to_compute<float>(v));
}
template <>
double d(double v) {
  return v;
}

// What one backward call gives.
template <class T, class G>
struct norm_grads {
  std::vector<T> dx;
  std::vector<G> dgamma, dbeta;
};

// The inputs of one case, and the statistics of its forward.
template <class T>
struct norm_case {
  using V = compute_type_t<T>;
  std::size_t rows, w;
  std::vector<T> x, gamma, beta, dy, add;
  std::vector<V> mean, rstd;
  norm_case(std::size_t r, std::size_t width, bool rms) : rows(r), w(width) {
    x = random_values<T>(rows * w, 1);
    gamma = random_values<T>(w, 2, 0.5f, 1.5f);
    beta = random_values<T>(w, 3);
    dy = random_values<T>(rows * w, 4);
    add = random_values<T>(rows * w, 5);
    mean.resize(rows);
    rstd.resize(rows);
    std::vector<T> y(rows * w);
    if (rms)
      kernels::rms_norm_forward(host{}, x.data(), gamma.data(), rows, w, 1e-5, y.data(), rstd.data());
    else
      kernels::layer_norm_forward(host{}, x.data(), gamma.data(), beta.data(), rows, w, 1e-5, y.data(), mean.data(),
                                  rstd.data());
  }
  double xhat(std::size_t r, std::size_t c, bool rms) const {
    return rms ? d(x[r * w + c]) * double(rstd[r]) : (d(x[r * w + c]) - double(mean[r])) * double(rstd[r]);
  }
};

// One call: dx apart (or over a copy of dy, or none) and the parameter gradients starting from
// 0.25 (so the call's sums are added onto what is there).
template <class G, class T>
norm_grads<T, G> run(norm_case<T> const& k, bool rms, int threads, bool dx_over_dy = false, bool with_dx = true,
                     bool with_add = false) {
  norm_grads<T, G> g{std::vector<T>(k.rows * k.w), std::vector<G>(k.w, G(0.25f)), std::vector<G>(k.w, G(0.25f))};
  std::vector<T> dy = k.dy;
  T* dx = !with_dx ? nullptr : dx_over_dy ? dy.data() : g.dx.data();
  T const* add = with_add ? k.add.data() : nullptr;
  int const before = omp_get_max_threads();
  omp_set_num_threads(threads);
  if (rms)
    kernels::rms_norm_backward(host{}, k.x.data(), k.gamma.data(), k.rstd.data(), dy.data(), k.rows, k.w, dx,
                               g.dgamma.data(), add);
  else
    kernels::layer_norm_backward(host{}, k.x.data(), k.gamma.data(), k.mean.data(), k.rstd.data(), dy.data(), k.rows,
                                 k.w, dx, g.dgamma.data(), g.dbeta.data(), add);
  omp_set_num_threads(before);
  if (dx_over_dy) g.dx = dy;
  if (!with_dx) g.dx.clear();
  return g;
}

template <class T, class G>
void check_norm(bool rms, double tol) {
  for (std::size_t rows : {std::size_t(1), std::size_t(31), std::size_t(32), std::size_t(70), std::size_t(200)})
    for (std::size_t w : {std::size_t(5), std::size_t(64), std::size_t(130)}) {
      INFO((rms ? "RMSNorm" : "LayerNorm") << ", " << rows << " rows of " << w);
      norm_case<T> const k(rows, w, rms);
      norm_grads<T, G> const one = run<G>(k, rms, 1), two = run<G>(k, rms, 2);
      CHECK(same_bits(one.dx, two.dx));
      CHECK(same_bits(one.dgamma, two.dgamma));
      CHECK(same_bits(one.dbeta, two.dbeta));
      // Against the formulas in double: dgamma = 0.25 + sum_r dy xhat, dbeta = 0.25 + sum_r dy;
      // LayerNorm's dx = rstd (g - mean(g) - xhat mean(g xhat)), RMSNorm's
      // rstd (g - xhat mean(g xhat)), g = dy gamma.
      double worst_param = 0, worst_dx = 0;
      for (std::size_t c = 0; c < w; ++c) {
        double sg = 0.25, sb = 0.25;
        for (std::size_t r = 0; r < rows; ++r) {
          sg += d(k.dy[r * w + c]) * k.xhat(r, c, rms);
          sb += d(k.dy[r * w + c]);
        }
        worst_param = std::max(worst_param, std::abs(d(one.dgamma[c]) - sg) / (1 + std::abs(sg)));
        if (!rms) worst_param = std::max(worst_param, std::abs(d(one.dbeta[c]) - sb) / (1 + std::abs(sb)));
      }
      for (std::size_t r = 0; r < rows; ++r) {
        double mg = 0, mgx = 0;
        for (std::size_t c = 0; c < w; ++c) {
          double const g = d(k.dy[r * w + c]) * d(k.gamma[c]);
          mg += g / double(w);
          mgx += g * k.xhat(r, c, rms) / double(w);
        }
        for (std::size_t c = 0; c < w; ++c) {
          double const g = d(k.dy[r * w + c]) * d(k.gamma[c]);
          double const want = double(k.rstd[r]) * (g - (rms ? 0.0 : mg) - k.xhat(r, c, rms) * mgx);
          worst_dx = std::max(worst_dx, std::abs(d(one.dx[r * w + c]) - want) / (1 + std::abs(want)));
        }
      }
      CHECK(worst_param < tol);
      CHECK(worst_dx < tol);
      // dx written over dy, and no dx at all: the same bits.
      norm_grads<T, G> const over = run<G>(k, rms, 2, true), none = run<G>(k, rms, 2, false, false);
      CHECK(same_bits(over.dx, one.dx));
      CHECK(same_bits(over.dgamma, one.dgamma));
      CHECK(same_bits(none.dgamma, one.dgamma));
      CHECK(same_bits(none.dbeta, one.dbeta));
      // A residual's gradient added in the pass: round(round(dx) + add), element by element.
      norm_grads<T, G> const added = run<G>(k, rms, 2, false, true, true);
      std::vector<T> want(rows * w);
      using V = compute_type_t<T>;
      for (std::size_t i = 0; i < want.size(); ++i)
        want[i] = from_compute<T>(to_compute<V>(one.dx[i]) + to_compute<V>(k.add[i]));
      CHECK(same_bits(added.dx, want));
      CHECK(same_bits(added.dgamma, one.dgamma));
    }
}

}  // namespace

TEST_CASE("a norm's backward reads x and dy once, the same bits on any thread count", "[kernels][norms]") {
  for (bool rms : {false, true}) {
    check_norm<double, double>(rms, 1e-12);
    check_norm<float, float>(rms, 2e-5);
    // bf16 data with fp32 parameter gradients (a mixed-precision model's); dx rounds to bf16.
    check_norm<bfloat16, float>(rms, 1e-2);
  }
}

TEST_CASE("a norm's backward adds in its stated order: rows within a chunk, then the chunks in order",
          "[kernels][norms]") {
  // The order written out here in fp32 (chunks of kernels::detail::norm_chunk rows): each
  // chunk's column sums from 0, row by row, then dgamma = 0.25 + chunk 0 + chunk 1 + ..., whatever
  // the columns' blocking and the thread count. LayerNorm's term dy ((x - mean) rstd), RMSNorm's
  // (dy x) rstd.
  for (bool rms : {false, true})
    for (std::size_t rows : {std::size_t(200), std::size_t(33)})
      for (std::size_t w : {std::size_t(130), std::size_t(7)}) {
        INFO((rms ? "RMSNorm, " : "LayerNorm, ") << rows << " rows of " << w);
        norm_case<float> const k(rows, w, rms);
        for (int threads : {1, 2}) {
          norm_grads<float, float> const got = run<float>(k, rms, threads);
          std::size_t const chunk = kernels::detail::norm_chunk;
          for (std::size_t c = 0; c < w; ++c) {
            float g = 0.25f, b = 0.25f;
            for (std::size_t r0 = 0; r0 < rows; r0 += chunk) {
              float pg = 0, pb = 0;
              for (std::size_t r = r0; r < std::min(rows, r0 + chunk); ++r) {
                float const dy = k.dy[r * w + c];
                pg += rms ? dy * k.x[r * w + c] * k.rstd[r] : dy * ((k.x[r * w + c] - k.mean[r]) * k.rstd[r]);
                pb += dy;
              }
              g += pg;
              b += pb;
            }
            CHECK(same_bits(std::vector<float>{got.dgamma[c]}, std::vector<float>{g}));
            if (!rms) CHECK(same_bits(std::vector<float>{got.dbeta[c]}, std::vector<float>{b}));
          }
        }
      }
}

TEST_CASE("row_sum_pair gives the bits of two row_sum calls", "[kernels][norms]") {
  // Values of mixed magnitudes, so that a different order of additions gives different bits.
  std::vector<float> const a = random_values<float>(1100, 7, -1e4f, 1e4f), b = random_values<float>(1100, 8);
  for (std::size_t n : {std::size_t(1), std::size_t(15), std::size_t(16), std::size_t(17), std::size_t(100),
                        std::size_t(1024), std::size_t(1100)}) {
    INFO(n << " values");
    auto const pair = kernels::detail::row_sum_pair<float>(n, [&](std::size_t i) {
      return kernels::detail::value_pair<float>{a[i] * b[i], a[i] - b[i]};
    });
    float const sa = kernels::detail::row_sum<float>(n, [&](std::size_t i) { return a[i] * b[i]; });
    float const sb = kernels::detail::row_sum<float>(n, [&](std::size_t i) { return a[i] - b[i]; });
    CHECK(same_bits(std::vector<float>{pair.a, pair.b}, std::vector<float>{sa, sb}));
  }
}
