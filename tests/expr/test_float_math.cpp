// remat's float exp, erf, tanh, GELU, GELU's derivative and the normal density
// (numeric/float_math.hpp) against double-precision libm, whose
// results are within a fraction of a float ulp of the true values: every float input (the
// exhaustive cases, labelled long), or a sample of 2^20 of them spread over every exponent (the
// quick cases, also run under the sanitizers). Also: the vectorised pass (kernels::transform, the
// widest clone this processor runs) gives the bits of a scalar call, for every input of the quick
// cases and every 7th input of the exhaustive ones. And exp_normal, which erf and tanh call on the
// arguments they have bounded, gives exp's bits on [-87, 88].
#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/numeric/float_math.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace remat;

namespace {

// The error of y in units of the last place of the float nearest to r (ulp of the binade of |r|;
// 2^-149 below the smallest normal), for finite r. The binade from r's exponent bits, the unit
// made from its own: frexp's exponent and ldexp's power exactly (r = 0 as frexp's e = 0), without
// the two library calls, which took a quarter of exp's exhaustive case (56 s of CPU, now 41).
double ulp_error(float y, double r) {
  std::uint64_t const bits = std::bit_cast<std::uint64_t>(std::fabs(r));
  // |r| = m 2^e with m in [1/2, 1) (a subnormal r's e is below -149 either way)
  int const e = bits == 0 ? 0 : int(bits >> 52) - 1022;
  double const unit = std::bit_cast<double>(std::uint64_t(std::max(e - 24, -149) + 1023) << 52);
  return std::fabs(double(y) - r) / unit;
}

struct report {
  double worst = 0;
  std::uint32_t worst_bits = 0;
  long wrong_specials = 0;  // NaN, inf or a zero's sign not as IEEE expects
  long lane_mismatches = 0;  // vector pass and scalar call disagree
  std::size_t checked = 0;
  std::string summary(char const* name) const {
    float const x = std::bit_cast<float>(worst_bits);
    return std::string(name) + ": " + std::to_string(checked) + " inputs, max error " + std::to_string(worst) +
           " ulp at " + std::to_string(x) + ", " + std::to_string(wrong_specials) + " special values wrong, " +
           std::to_string(lane_mismatches) + " vector/scalar mismatches";
  }
};

template <class Op>
struct apply_fn {
  float const* x;
  Op op;
  float operator()(std::size_t i) const { return op(x[i]); }
};

// Checks f (vectorised through kernels::transform) against ref on the inputs whose bit patterns
// are first, first + stride, ... below 2^32, and against scalar calls on every lane_stride-th of
// those.
// Where a function saturates, the correctly rounded result is a constant: at or below `lo` it is
// `at_lo`, at or above `hi` it is `at_hi` (the functions are monotone, and require_within checks
// that the reference rounds to those constants at the two ends). Those inputs (about half of all
// floats) are checked for exactly that result without a libm call, which halves the exhaustive
// test's time.
struct saturation {
  float lo, at_lo, hi, at_hi;
};

// abs_unit: 0 for errors in ulps; else errors in units of abs_unit (|y - r| / abs_unit), and a
// saturated result compared by value (so -0 and +0 agree).
template <class F, class Ref>
report check(F f, float (*scalar)(float), Ref ref, saturation sat, std::uint64_t stride, std::size_t lane_stride,
             double abs_unit = 0) {
  report rep;
  constexpr std::size_t chunk = std::size_t(1) << 22;
  std::vector<float> x(chunk), y(chunk);
  float (*volatile call)(float) = scalar;  // (through a pointer: a scalar call, never vectorised)
  for (std::uint64_t base = 0; base < (std::uint64_t(1) << 32); base += chunk * stride) {
    std::size_t const n =
        std::size_t(std::min<std::uint64_t>(chunk, ((std::uint64_t(1) << 32) - base + stride - 1) / stride));
    for (std::size_t i = 0; i < n; ++i) x[i] = std::bit_cast<float>(std::uint32_t(base + i * stride));
    kernels::transform(host{}, n, y.data(), apply_fn<F>{x.data(), f});
    double worst = 0;
    std::uint32_t worst_bits = 0;
    long specials = 0, lanes = 0;
#if defined(_OPENMP)
#pragma omp parallel
#endif
    {
      double w = 0;
      std::uint32_t wb = 0;
      long sp = 0, la = 0;
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
      for (std::ptrdiff_t k = 0; k < std::ptrdiff_t(n); ++k) {
        std::size_t const i = std::size_t(k);
        float const yi = y[i];
        if (i % lane_stride == 0 && std::bit_cast<std::uint32_t>(call(x[i])) != std::bit_cast<std::uint32_t>(yi) &&
            !(std::isnan(yi) && std::isnan(call(x[i]))))
          ++la;
        if (x[i] <= sat.lo || x[i] >= sat.hi) {
          float const want = x[i] <= sat.lo ? sat.at_lo : sat.at_hi;
          sp += abs_unit > 0 ? !(yi == want) : std::bit_cast<std::uint32_t>(yi) != std::bit_cast<std::uint32_t>(want);
          continue;
        }
        double const r = ref(double(x[i]));
        if (std::isnan(r)) {
          sp += !std::isnan(yi);
          continue;
        }
        float const rf = float(r);
        if (abs_unit > 0) {
          if (std::isnan(yi) || std::isinf(yi)) {
            ++sp;
            continue;
          }
          double const err = std::fabs(double(yi) - r) / abs_unit;
          if (err > w) w = err, wb = std::bit_cast<std::uint32_t>(x[i]);
          continue;
        }
        if (std::isinf(rf) || rf == 0.0f) {  // overflow, an exact zero, or below half the smallest subnormal
          sp += std::bit_cast<std::uint32_t>(yi) != std::bit_cast<std::uint32_t>(rf) &&
                !(rf == 0.0f && ulp_error(yi, r) <= 1.0);
          continue;
        }
        if (std::isnan(yi) || std::isinf(yi)) {
          ++sp;
          continue;
        }
        double const err = ulp_error(yi, r);
        if (err > w) w = err, wb = std::bit_cast<std::uint32_t>(x[i]);
      }
#if defined(_OPENMP)
#pragma omp critical
#endif
      {
        if (w > worst) worst = w, worst_bits = wb;
        specials += sp;
        lanes += la;
      }
    }
    if (worst > rep.worst) rep.worst = worst, rep.worst_bits = worst_bits;
    rep.wrong_specials += specials;
    rep.lane_mismatches += lanes;
    rep.checked += n;
  }
  return rep;
}

struct exp_f {
  float operator()(float x) const { return float_math::exp(x); }
};
struct erf_f {
  float operator()(float x) const { return float_math::erf(x); }
};
struct tanh_f {
  float operator()(float x) const { return float_math::tanh(x); }
};
struct gelu_f {
  float operator()(float x) const { return float_math::gelu(x); }
};
struct gelu_grad_f {
  float operator()(float x) const { return float_math::gelu_grad(x); }
};
struct normal_pdf_f {
  float operator()(float x) const { return float_math::normal_pdf(x); }
};
float exp_scalar(float x) { return float_math::exp(x); }
float gelu_scalar(float x) { return float_math::gelu(x); }
float gelu_grad_scalar(float x) { return float_math::gelu_grad(x); }
float normal_pdf_scalar(float x) { return float_math::normal_pdf(x); }
double gelu_ref(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_grad_ref(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
double normal_pdf_ref(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
float erf_scalar(float x) { return float_math::erf(x); }
float tanh_scalar(float x) { return float_math::tanh(x); }
double exp_ref(double x) { return std::exp(x); }
double erf_ref(double x) { return std::erf(x); }
double tanh_ref(double x) { return std::tanh(x); }

// The bounds the header documents.
constexpr double exp_bound = 1.0, erf_bound = 1.5, tanh_bound = 1.5, gelu_bound = 9.0, normal_pdf_bound = 3.0;
// GELU's derivative: within 2^-22 of it (4 units of 2^-24; its values lie in [-0.17, 1.13]).
constexpr double gelu_grad_unit = 0x1p-24, gelu_grad_bound = 4.0;

// exp: e^-104 is below half the smallest subnormal, e^89 above the largest float; erf(4) and
// tanh(10) are within half an ulp of 1.
constexpr saturation exp_sat{-104.0f, 0.0f, 89.0f, INFINITY}, erf_sat{-4.0f, -1.0f, 4.0f, 1.0f},
    tanh_sat{-10.0f, -1.0f, 10.0f, 1.0f};
// GELU: x Phi(x) at -14.5 is below half the smallest subnormal (-0; every positive float is checked
// against libm); its derivative is within 2^-22 of 0 and 1 beyond +-14.5, where the density is 0.
constexpr saturation gelu_sat{-14.5f, -0.0f, INFINITY, INFINITY}, gelu_grad_sat{-14.5f, 0.0f, 14.5f, 1.0f},
    normal_pdf_sat{-INFINITY, 0.0f, 14.5f, 0.0f};

template <class F>
void require_within(F f, float (*scalar)(float), double (*ref)(double), saturation sat, double bound,
                    std::uint64_t stride, char const* name, std::size_t lane_stride = 1, double abs_unit = 0) {
  INFO(name);
  if (abs_unit > 0) {
    CHECK(std::fabs(ref(double(sat.lo)) - double(sat.at_lo)) <= bound * abs_unit);
    CHECK(std::fabs(ref(double(sat.hi)) - double(sat.at_hi)) <= bound * abs_unit);
  } else {
    if (std::isfinite(sat.lo))
      CHECK(std::bit_cast<std::uint32_t>(float(ref(double(sat.lo)))) == std::bit_cast<std::uint32_t>(sat.at_lo));
    if (std::isfinite(sat.hi))
      CHECK(std::bit_cast<std::uint32_t>(float(ref(double(sat.hi)))) == std::bit_cast<std::uint32_t>(sat.at_hi));
  }
  report const r = check(f, scalar, ref, sat, stride, lane_stride, abs_unit);
  INFO(r.summary(name));
  CHECK(r.checked == ((std::uint64_t(1) << 32) + stride - 1) / stride);
  CHECK(r.worst < bound);
  CHECK(r.wrong_specials == 0);
  CHECK(r.lane_mismatches == 0);
}

}  // namespace

TEST_CASE("float_math: exp, erf, tanh, gelu, its derivative and the density on 2^20 inputs over every exponent, within their bounds", "[expr][math]") {
  std::uint64_t const stride = 4096;  // (odd patterns too: stride + 1 below)
  require_within(exp_f{}, exp_scalar, exp_ref, exp_sat, exp_bound, stride + 1, "exp");
  require_within(erf_f{}, erf_scalar, erf_ref, erf_sat, erf_bound, stride + 1, "erf");
  require_within(tanh_f{}, tanh_scalar, tanh_ref, tanh_sat, tanh_bound, stride + 1, "tanh");
  require_within(gelu_f{}, gelu_scalar, gelu_ref, gelu_sat, gelu_bound, stride + 1, "gelu");
  require_within(gelu_grad_f{}, gelu_grad_scalar, gelu_grad_ref, gelu_grad_sat, gelu_grad_bound, stride + 1,
                 "gelu_grad", 1, gelu_grad_unit);
  require_within(normal_pdf_f{}, normal_pdf_scalar, normal_pdf_ref, normal_pdf_sat, normal_pdf_bound, stride + 1,
                 "normal_pdf");
}

TEST_CASE("float_math: special values", "[expr][math]") {
  namespace fm = float_math;
  float const inf = INFINITY, nan = NAN;
  CHECK(fm::exp(inf) == inf);
  CHECK(fm::exp(-inf) == 0.0f);
  CHECK(fm::exp(0.0f) == 1.0f);
  CHECK(fm::exp(-0.0f) == 1.0f);
  CHECK(fm::exp(88.8f) == inf);
  CHECK(fm::exp(-104.0f) == 0.0f);
  float const subnormal = float(std::exp(-103.0));
  CHECK(std::bit_cast<std::uint32_t>(fm::exp(-103.0f)) == std::bit_cast<std::uint32_t>(subnormal));
  CHECK(std::isnan(fm::exp(nan)));
  // GELU: its limits at the infinities (the composite 0.5 x (1 + erf(x / sqrt 2)) is NaN at -inf)
  CHECK(fm::gelu(inf) == inf);
  CHECK(fm::gelu(-inf) == 0.0f);
  CHECK(std::signbit(fm::gelu(-inf)));
  CHECK(std::signbit(fm::gelu(-0.0f)));
  CHECK(fm::gelu(0.0f) == 0.0f);
  // Phi(1) and -Phi(-1), tabulated values to 17 digits: within 2 ulp
  CHECK(std::fabs(fm::gelu(1.0f) - 0.84134474606854293) < 0x1p-23);
  CHECK(std::fabs(fm::gelu(-1.0f) + 0.15865525393145707) < 0x1p-25);
  CHECK(std::isnan(fm::gelu(nan)));
  CHECK(fm::gelu_grad(inf) == 1.0f);
  CHECK(fm::gelu_grad(-inf) == 0.0f);
  CHECK(fm::gelu_grad(0.0f) == 0.5f);
  CHECK(std::isnan(fm::gelu_grad(nan)));
  CHECK(fm::normal_pdf(inf) == 0.0f);
  CHECK(fm::normal_pdf(-inf) == 0.0f);
  CHECK(fm::normal_pdf(0.0f) == float(0.3989422804014327));
  CHECK(std::isnan(fm::normal_pdf(nan)));
  CHECK(fm::erf(inf) == 1.0f);
  CHECK(fm::erf(-inf) == -1.0f);
  CHECK(std::signbit(fm::erf(-0.0f)));
  CHECK(fm::erf(-0.0f) == 0.0f);
  CHECK(fm::erf(5.0f) == 1.0f);
  CHECK(std::isnan(fm::erf(nan)));
  CHECK(fm::tanh(inf) == 1.0f);
  CHECK(fm::tanh(-inf) == -1.0f);
  CHECK(std::signbit(fm::tanh(-0.0f)));
  CHECK(fm::tanh(100.0f) == 1.0f);
  CHECK(std::isnan(fm::tanh(nan)));
  float const tiny = std::bit_cast<float>(std::uint32_t(1));  // the smallest subnormal
  CHECK(fm::tanh(tiny) == tiny);
  CHECK(fm::erf(tiny) == tiny);  // 2/sqrt(pi) * 2^-149 rounds to 2^-149
}

TEST_CASE("float_math: a pass gives the same bits on any number of threads", "[expr][math]") {
  std::size_t const n = std::size_t(1) << 20;
  tensor<float> x(index_t(n), 1), one(index_t(n), 1), two(index_t(n), 1);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(std::sin(double(i) * 0.001) * 12.0);
#if defined(_OPENMP)
  int const threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  evaluate(one, gelu(x) + tanh(x) * exp(-x * x));
#if defined(_OPENMP)
  omp_set_num_threads(3);
#endif
  evaluate(two, gelu(x) + tanh(x) * exp(-x * x));
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  CHECK(std::memcmp(one.data(), two.data(), n * sizeof(float)) == 0);
}

// Every float against libm; the vector pass against scalar calls on every 7th (a scalar call through
// a pointer costs more than the rest of the check together, and far more where the result is
// subnormal). 7 is prime to every vector width, so each lane position is checked in every binade.
// One case a function, each with a tag of its own, so that CI's ctest runs them on both cores
// (tests/CMakeLists.txt: one test each).
TEST_CASE("float_math: exp over all 2^32 floats, within its bound", "[expr][math][long][every_exp]") {
  require_within(exp_f{}, exp_scalar, exp_ref, exp_sat, exp_bound, 1, "exp", 7);
}
TEST_CASE("float_math: erf over all 2^32 floats, within its bound", "[expr][math][long][every_erf]") {
  require_within(erf_f{}, erf_scalar, erf_ref, erf_sat, erf_bound, 1, "erf", 7);
}
TEST_CASE("float_math: tanh over all 2^32 floats, within its bound", "[expr][math][long][every_tanh]") {
  require_within(tanh_f{}, tanh_scalar, tanh_ref, tanh_sat, tanh_bound, 1, "tanh", 7);
}
TEST_CASE("float_math: gelu over all 2^32 floats, within its bound", "[expr][math][long][every_gelu]") {
  require_within(gelu_f{}, gelu_scalar, gelu_ref, gelu_sat, gelu_bound, 1, "gelu", 7);
}
TEST_CASE("float_math: gelu's derivative over all 2^32 floats, within its bound", "[expr][math][long][every_gelu_grad]") {
  require_within(gelu_grad_f{}, gelu_grad_scalar, gelu_grad_ref, gelu_grad_sat, gelu_grad_bound, 1, "gelu_grad", 7,
                 gelu_grad_unit);
}
TEST_CASE("float_math: the normal density over all 2^32 floats, within its bound", "[expr][math][long][every_normal_pdf]") {
  require_within(normal_pdf_f{}, normal_pdf_scalar, normal_pdf_ref, normal_pdf_sat, normal_pdf_bound, 1,
                 "normal_pdf", 7);
}

namespace {
struct exp_normal_f {
  float operator()(float x) const { return float_math::exp_normal(x); }
};
// The inputs in [-87, 88] (where e^x is a normal float) whose bit patterns are 0, stride, 2 stride,
// ... on which exp_normal and exp differ in their bits.
long exp_normal_mismatches(std::uint64_t stride) {
  constexpr std::size_t chunk = std::size_t(1) << 22;
  std::vector<float> x, a(chunk), b(chunk);
  long differ = 0;
  for (std::uint64_t base = 0; base < (std::uint64_t(1) << 32); base += chunk * stride) {
    x.clear();
    for (std::uint64_t i = base; i < std::min(base + chunk * stride, std::uint64_t(1) << 32); i += stride) {
      float const v = std::bit_cast<float>(std::uint32_t(i));
      if (v >= -87.0f && v <= 88.0f) x.push_back(v);
    }
    kernels::transform(host{}, x.size(), a.data(), apply_fn<exp_f>{x.data(), {}});
    kernels::transform(host{}, x.size(), b.data(), apply_fn<exp_normal_f>{x.data(), {}});
    for (std::size_t i = 0; i < x.size(); ++i)
      differ += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
  }
  return differ;
}
}  // namespace

// erf and tanh take e^x through exp_normal on arguments they have bounded; it must give exp's bits.
TEST_CASE("float_math: exp_normal gives exp's bits on [-87, 88]", "[expr][math]") {
  CHECK(exp_normal_mismatches(257) == 0);  // (every 257th float: about 8 million in range)
  CHECK(float_math::exp_normal(-87.0f) == float_math::exp(-87.0f));
  CHECK(float_math::exp_normal(88.0f) == float_math::exp(88.0f));
}

TEST_CASE("float_math: exp_normal gives exp's bits on every float in [-87, 88]", "[expr][math][long][every_exp_normal]") {
  CHECK(exp_normal_mismatches(1) == 0);
}
