// The processor's own ceiling for products, measured: how many floating-point operations a second
// its multiply-add instructions retire when nothing else is in the way (registers only, 12 or 16
// independent accumulators, no memory), on one thread and on every thread at once. It is the
// denominator of "the products run at X% of what this processor can do": a product's GFLOP/s from
// bench_gemm_paths or a step's profile, over this table's row for its type.
//   bench_peak [SECONDS a round (default 0.2)] [ROUNDS (default 5)]
// Rows: fp32 fused multiply-add in 8 lanes (AVX2 + FMA) and in 16 (AVX-512F), and bf16 pair dot
// products into fp32 (vdpbf16ps, AVX-512 BF16: 16 lanes x 2 pairs x 2 operations an instruction);
// a row the processor lacks says so. (AMX's tile products are not measured here.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "args.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Independent accumulators a thread: more than an instruction's latency times its issue rate, so the
// chains never wait (12 of AVX2's 16 registers, 16 of AVX-512's 32).
constexpr int ymm_accumulators = 12, zmm_accumulators = 16;

#if defined(__x86_64__)
// clang-format off
// Each vector width's operations, for the kernels below (inlined into them: their targets include
// these): namespace NS, vectors VEC, intrinsics PREFIX_*_ps.
#define REMAT_PEAK_ISA(NS, TARGET, VEC, PREFIX)                                                    \
  namespace NS {                                                                                   \
  using V = VEC;                                                                                   \
  __attribute__((target(TARGET))) inline V set1(float v) { return PREFIX##_set1_ps(v); }         \
  __attribute__((target(TARGET))) inline V add(V a, V b) { return PREFIX##_add_ps(a, b); }       \
  __attribute__((target(TARGET))) inline float first(V a) { return PREFIX##_cvtss_f32(a); }      \
  }
REMAT_PEAK_ISA(ymm, "avx2,fma", __m256, _mm256)
REMAT_PEAK_ISA(zmm, "avx512f", __m512, _mm512)
#undef REMAT_PEAK_ISA

// The accumulators in named registers (an array of them, indexed in a loop, may live in memory
// and time the stores instead); OP(a, j) is a statement on accumulator a, the j-th.
#define REMAT_PEAK_12(OP)                                                         \
  OP(a0, 0) OP(a1, 1) OP(a2, 2) OP(a3, 3) OP(a4, 4) OP(a5, 5) OP(a6, 6) OP(a7, 7) \
  OP(a8, 8) OP(a9, 9) OP(a10, 10) OP(a11, 11)
#define REMAT_PEAK_16(OP) REMAT_PEAK_12(OP) OP(a12, 12) OP(a13, 13) OP(a14, 14) OP(a15, 15)
// (Different values, so no two chains merge, and none at the multiply-adds' fixed point 2, where
// a compiler may drop its chain.)
#define REMAT_PEAK_DECLARE(a, j) V a = set1(3.0f + float(j));
#define REMAT_PEAK_SUM(a, j) s = add(s, a);
// float NAME(long iters): in namespace ISA's vectors, the accumulators of ALL, each taking STEP(a, j)
// `iters` times after CONSTANTS (the operands, declared), returning a lane of their sum so that
// the loop is not dropped.
#define REMAT_PEAK_KERNEL(NAME, TARGET, ISA, ALL, CONSTANTS, STEP) \
  __attribute__((target(TARGET))) float NAME(long iters) {         \
    using namespace ISA;                                           \
    CONSTANTS                                                      \
    ALL(REMAT_PEAK_DECLARE)                                        \
    for (long i = 0; i < iters; ++i) {                             \
      ALL(STEP)                                                    \
    }                                                              \
    V s = set1(0.0f);                                              \
    ALL(REMAT_PEAK_SUM)                                            \
    return first(s);                                               \
  }

// a = a x + y with x = 0.5 and y = 1 (2 is a fixed point: nothing overflows or goes subnormal)
#define REMAT_PEAK_FMA_YMM(a, j) a = _mm256_fmadd_ps(a, x, y);
#define REMAT_PEAK_FMA_ZMM(a, j) a = _mm512_fmadd_ps(a, x, y);
// a += the dot products of 16 pairs of bf16 1e-3 (the sums stay small)
#define REMAT_PEAK_DPBF16(a, j) a = _mm512_dpbf16_ps(a, p, p);
REMAT_PEAK_KERNEL(fma_ymm, "avx2,fma", ymm, REMAT_PEAK_12,
                  V const x = set1(0.5f); V const y = set1(1.0f);, REMAT_PEAK_FMA_YMM)
REMAT_PEAK_KERNEL(fma_zmm, "avx512f", zmm, REMAT_PEAK_16,
                  V const x = set1(0.5f); V const y = set1(1.0f);, REMAT_PEAK_FMA_ZMM)
REMAT_PEAK_KERNEL(dpbf16_zmm, "avx512f,avx512bf16", zmm, REMAT_PEAK_16,
                  __m512bh const p = _mm512_cvtne2ps_pbh(set1(1e-3f), set1(1e-3f));, REMAT_PEAK_DPBF16)
#undef REMAT_PEAK_12
#undef REMAT_PEAK_16
#undef REMAT_PEAK_DECLARE
#undef REMAT_PEAK_SUM
#undef REMAT_PEAK_KERNEL
#undef REMAT_PEAK_FMA_YMM
#undef REMAT_PEAK_FMA_ZMM
#undef REMAT_PEAK_DPBF16
// clang-format on
#endif

struct kernel {
  char const* name;
  char const* instruction;
  double flops_per_iteration;  // accumulators x lanes x 2 (x 2 pairs for the bf16 dot products)
  bool supported;
  float (*run)(long);
};

std::vector<kernel> kernels() {
  std::vector<kernel> k;
#if defined(__x86_64__)
  __builtin_cpu_init();
  k.push_back({"fp32 fma, 8 lanes", "vfmadd231ps ymm", ymm_accumulators * 8 * 2.0,
               __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0, fma_ymm});
  k.push_back({"fp32 fma, 16 lanes", "vfmadd231ps zmm", zmm_accumulators * 16 * 2.0,
               __builtin_cpu_supports("avx512f") != 0, fma_zmm});
  k.push_back({"bf16 pair dot, 16 lanes", "vdpbf16ps zmm", zmm_accumulators * 16 * 2 * 2.0,
               __builtin_cpu_supports("avx512bf16") != 0, dpbf16_zmm});
#endif
  return k;
}

// The processor's name, family and model (/proc/cpuinfo), to print beside the figures.
std::string processor() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "this processor";
  std::string name = "?", family = "?", model = "?";
  char line[512];
  auto value = [&](char const* key, std::string& to) {  // (the line "KEY<tabs or spaces>: VALUE")
    std::size_t n = std::strlen(key);
    if (std::strncmp(line, key, n) != 0) return;
    while (line[n] == ' ' || line[n] == '\t') ++n;
    if (line[n] != ':') return;
    to = line + n + 1 + (line[n + 1] == ' ');
    while (!to.empty() && (to.back() == '\n' || to.back() == ' ')) to.pop_back();
  };
  while (std::fgets(line, sizeof line, f) && (name == "?" || family == "?" || model == "?")) {
    value("model name", name);
    value("cpu family", family);
    value("model", model);
  }
  std::fclose(f);
  return name + " (family " + family + " model " + model + ")";
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

volatile float sink;

// GFLOP/s of `threads` threads each running k for `iters` iterations, timed from the first start
// to the last end.
double rate(kernel const& k, int threads, long iters) {
  std::vector<std::thread> pool;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  double const t0 = now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sums[std::size_t(t)] = k.run(iters); });
  for (auto& t : pool) t.join();
  double const dt = now() - t0;
  for (float s : sums) sink = s;
  return double(threads) * double(iters) * k.flops_per_iteration / dt * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.2;
  long long rounds = 5;
  bool ok = argc <= 3;
  if (ok && argc > 1) {
    char* end = nullptr;
    seconds = std::strtod(argv[1], &end);
    ok = end != argv[1] && *end == 0 && seconds > 0 && seconds <= 60;
  }
  if (ok && argc > 2) ok = (rounds = bench_args::positive(argv[2], 1000)) != 0;
  if (!ok) {
    std::fprintf(stderr,
                 "usage: %s [SECONDS a round (above 0, at most 60; default 0.2)] [ROUNDS (1 to 1000, default 5)]\n",
                 argv[0]);
    return 2;
  }
  int const all = int(std::max(1u, std::thread::hardware_concurrency()));
  std::printf(
      "the multiply-add ceiling of %s: registers only, %d (ymm) or %d (zmm) accumulators a thread, medians "
      "of %lld rounds of %.2f s (where the last column is well under %d, other work holds a core)\n\n",
      processor().c_str(), ymm_accumulators, zmm_accumulators, rounds, seconds, all);
  std::printf(
      "| instructions | what | GFLOP/s, 1 thread | GFLOP/s, %d threads | %d threads / 1 |\n|---|---|---:|---:|---:|\n",
      all, all);
  std::vector<std::string> json;
  std::vector<kernel> const ks = kernels();
  if (ks.empty()) std::printf("| - | (not an x86-64 processor: nothing measured) | - | - | - |\n");
  for (kernel const& k : ks) {
    if (!k.supported) {
      std::printf("| %s | %s | not on this processor | - | - |\n", k.instruction, k.name);
      continue;
    }
    // Iterations for about `seconds` on one thread, from a short run.
    long iters = 1 << 16;
    double const t0 = now();
    k.run(iters);
    iters = std::max(1L << 16, long(double(iters) * seconds / std::max(now() - t0, 1e-6)));
    std::vector<double> one, every;
    for (long long r = 0; r < rounds; ++r) {  // (interleaved: one thread, then all)
      one.push_back(rate(k, 1, iters));
      every.push_back(rate(k, all, iters));
    }
    std::sort(one.begin(), one.end());
    std::sort(every.begin(), every.end());
    double const m1 = one[one.size() / 2], ma = every[every.size() / 2];
    std::printf("| %s | %s | %.1f | %.1f | %.2f |\n", k.instruction, k.name, m1, ma, ma / m1);
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"bench\": \"peak\", \"kernel\": \"%s\", \"gflops_1_thread\": %.2f, \"threads\": %d, "
                  "\"gflops_all_threads\": %.2f}",
                  k.instruction, m1, all, ma);
    json.emplace_back(line);
  }
  std::printf("\n");
  for (auto const& j : json) std::printf("%s\n", j.c_str());
  return 0;
}
