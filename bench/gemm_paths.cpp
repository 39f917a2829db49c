// Which fp32 matrix product is fastest for the shapes of a training step, on this processor:
// OpenBLAS's cblas_sgemm (remat's host path) against oneDNN's f32 matmul (which would also carry
// fused epilogues), with the same row-major layouts and transposes. Each shape is timed interleaved
// (one call of each per round, medians over the rounds) so drift on a shared machine hits both.
//
//   bench_gemm_paths [rounds]
//
// The shapes: the residual MLP of bench_policies (d = 1024) at batch 256 and 2048 (forward
// y = x W^T, backward dx = dy W, dW = dy^T x), and GPTBlock<512, 8> at 8 x 256 tokens (the
// attention projections and the 4d MLP). Prints a table and one JSON line per shape.
//
// With oneDNN, and AVX-512 for its bf16 matmul, a second table times the same shapes in bf16
// (remat's bf16 host path): the products' outputs in bf16 as the layers write them, the weight
// gradients in fp32 as remat accumulates them (dW += dy^T x, oneDNN's sum post-op), beside the
// same product written over (beta = 0) and with dy^T read row-major (as if stored transposed), so
// a layout or an accumulation that costs more than the product itself shows. (oneDNN 2.6 has no
// fast kernel for a transposed output: dW^T = x^T dy written through dW's strides runs its
// reference code.)
//
// A third table times a product with its epilogue (bias + GELU) run after the whole product,
// against the same in panels of rows, each panel's pass right after its product (while it is in
// cache): whether the epilogue's cost is memory traffic that a panel saves.
//
// A fourth (with oneDNN; bf16 where it has a bf16 matmul) times the forward x W^T with operands
// that stay in cache (one set) against a cycle of 16 sets, as a step's 16 blocks read theirs, and
// with the weights prepacked in the layout oneDNN prefers (a reorder made once), beside that
// reorder's own time: what a weight copy cast straight into oneDNN's layout could gain.
#include <remat/remat.hpp>

#include "args.hpp"

#if defined(REMAT_HAS_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

struct shape {
  char const* workload;
  char const* product;
  int m, n, k;
  bool ta, tb;  // C (m x n) = op(A) (m x k) op(B) (k x n), row-major
};

double seconds(auto&& f) {
  auto const t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}


#if defined(REMAT_HAS_ONEDNN)
// One oneDNN matmul C (m x n) = A (m x k) B (k x n) + beta C over strides of one's choosing,
// timed a call at a time.
struct dnnl_product {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul prim;
  dnnl::memory am, bm, cm;
  std::vector<char> a, b, c;

  dnnl_product(int m, int n, int k, dims as, dims bs, dims cs, dt in, dt out, float beta) {
    dnnl::memory::desc const ad({m, k}, in, as), bd({k, n}, in, bs), cd({m, n}, out, cs);
    dnnl::primitive_attr attr;
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    prim = dnnl::matmul(remat::kernels::detail::onednn_matmul_desc(eng, ad, bd, cd, attr));
    a.assign(ad.get_size(), 0);
    b.assign(bd.get_size(), 0);
    c.assign(cd.get_size(), 0);
    am = dnnl::memory(ad, eng, a.data());
    bm = dnnl::memory(bd, eng, b.data());
    cm = dnnl::memory(cd, eng, c.data());
  }
  void operator()() {
    prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  }
};

// The shapes in bf16: remat's layout and, for each weight gradient, written over and with dy^T
// read row-major.
void bf16_table(std::vector<shape> const& shapes, int rounds, std::vector<std::string>& json) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  std::printf("bf16 matrix products, oneDNN bf16 matmul, median of %d interleaved rounds (GFLOP/s)\n\n", rounds);
  std::printf("| workload | product | m x n x k | as remat runs it | dW written over | dy^T row-major |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (shape const& s : shapes) {
    int const lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    dims const as = s.ta ? dims{1, lda} : dims{lda, 1}, bs = s.tb ? dims{1, ldb} : dims{ldb, 1};
    // A weight gradient (dy^T x) accumulates in fp32; the other products write bf16.
    bool const weight = s.ta;
    std::vector<dnnl_product> variants;
    variants.emplace_back(s.m, s.n, s.k, as, bs, dims{s.n, 1}, dt::bf16, weight ? dt::f32 : dt::bf16,
                          weight ? 1.0f : 0.0f);
    if (weight) {
      variants.emplace_back(s.m, s.n, s.k, as, bs, dims{s.n, 1}, dt::bf16, dt::f32, 0.0f);
      // dy^T as if stored row-major (what a layer that kept its output transposed would give).
      variants.emplace_back(s.m, s.n, s.k, dims{s.k, 1}, bs, dims{s.n, 1}, dt::bf16, dt::f32, 1.0f);
    }
    std::vector<std::vector<double>> t(variants.size());
    for (auto& v : variants) v();
    for (int r = 0; r < rounds; ++r)
      for (std::size_t i = 0; i < variants.size(); ++i) t[i].push_back(seconds(variants[i]));
    double const flop = 2.0 * s.m * s.n * s.k;
    double g[3] = {0, 0, 0};
    for (std::size_t i = 0; i < variants.size(); ++i) g[i] = flop / median(t[i]) / 1e9;
    if (weight)
      std::printf("| %s | %s | %d x %d x %d | %.0f | %.0f | %.0f |\n", s.workload, s.product, s.m, s.n, s.k, g[0],
                  g[1], g[2]);
    else
      std::printf("| %s | %s | %d x %d x %d | %.0f | | |\n", s.workload, s.product, s.m, s.n, s.k, g[0]);
    char line[512];
    std::snprintf(line, sizeof line,
                  "json: {\"bench\":\"gemm_paths_bf16\",\"workload\":\"%s\",\"product\":\"%s\",\"m\":%d,"
                  "\"n\":%d,\"k\":%d,\"onednn_gflops\":%.1f,\"written_over_gflops\":%.1f,"
                  "\"dyt_rowmajor_gflops\":%.1f}",
                  s.workload, s.product, s.m, s.n, s.k, g[0], g[1], g[2]);
    json.push_back(line);
  }
  std::printf("\n");
}

// x W^T through oneDNN (m x 1024 x 1024, fp32 and, where it has them, bf16): one operand set, a
// cycle of 16, the 16 with W prepacked in oneDNN's own layout, and the reorder into it (each the
// median of `rounds` interleaved cycles).
void prepacked_table(int rounds, bool bf16, std::vector<std::string>& json) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  int const n = 1024, k = 1024, sets = 16;
  std::printf("x W^T with operands in and out of cache, and W prepacked in oneDNN's layout: median of %d "
              "interleaved rounds\n\n",
              rounds);
  std::printf("| type | m x n x k | one operand set (GFLOP/s) | 16 sets | 16 sets, W prepacked | the reorder into that "
              "layout (us) |\n|---|---|---|---|---|---|\n");
  for (int row = 0; row < 4; ++row) {
    dt const type = row < 2 ? dt::f32 : dt::bf16;
    int const m = row % 2 == 0 ? 256 : 2048;
    if (type == dt::bf16 && !bf16) continue;
    char const* name = type == dt::f32 ? "fp32" : "bf16";
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(eng);
    dnnl::memory::desc const ad({m, k}, type, dims{k, 1}), cd({m, n}, type, dims{n, 1});
    dnnl::memory::desc const wd({k, n}, type, dims{1, k});  // W^T: W is n x k, row-major
    dnnl::matmul::primitive_desc const plain = remat::kernels::detail::onednn_matmul_desc(eng, ad, wd, cd);
    dnnl::matmul::primitive_desc const packed = remat::kernels::detail::onednn_matmul_desc(
        eng, ad, dnnl::memory::desc({k, n}, type, dnnl::memory::format_tag::any), cd);
    dnnl::matmul const p_plain(plain), p_packed(packed);
    std::vector<dnnl::memory> a, w, wp, c;
    for (int i = 0; i < sets; ++i) {
      a.emplace_back(ad, eng);
      w.emplace_back(wd, eng);
      wp.emplace_back(packed.weights_desc(), eng);
      c.emplace_back(cd, eng);
      for (auto* x : {&a.back(), &w.back()}) {
        std::size_t const count = x->get_desc().get_size() / (type == dt::f32 ? 4 : 2);
        if (type == dt::f32) {
          auto* v = static_cast<float*>(x->get_data_handle());
          std::fill(v, v + count, 0.25f);
        } else {
          auto* v = static_cast<REMAT_NAMESPACE::bfloat16*>(x->get_data_handle());
          std::fill(v, v + count, REMAT_NAMESPACE::bfloat16(0.25f));
        }
      }
    }
    dnnl::reorder const pack(w[0], wp[0]);
    for (int i = 0; i < sets; ++i) pack.execute(stream, w[i], wp[i]);
    stream.wait();
    auto cycle = [&](dnnl::matmul const& p, std::vector<dnnl::memory>& weights, int count) {
      return [&, count] {
        for (int i = 0; i < count; ++i)
          p.execute(stream, {{DNNL_ARG_SRC, a[i]}, {DNNL_ARG_WEIGHTS, weights[i]}, {DNNL_ARG_DST, c[i]}});
        stream.wait();
      };
    };
    std::vector<std::function<void()>> const ways = {
        [&] {  // one set, 16 times
          for (int i = 0; i < sets; ++i)
            p_plain.execute(stream, {{DNNL_ARG_SRC, a[0]}, {DNNL_ARG_WEIGHTS, w[0]}, {DNNL_ARG_DST, c[0]}});
          stream.wait();
        },
        cycle(p_plain, w, sets), cycle(p_packed, wp, sets), [&] {
          for (int i = 0; i < sets; ++i) pack.execute(stream, w[i], wp[i]);
          stream.wait();
        }};
    std::vector<std::vector<double>> t(ways.size());
    for (auto const& f : ways) f();
    for (int r = 0; r < rounds; ++r)
      for (std::size_t i = 0; i < ways.size(); ++i) t[i].push_back(seconds(ways[i]) / sets);
    double const flop = 2.0 * m * n * k;
    double const hot = flop / median(t[0]) / 1e9, cold = flop / median(t[1]) / 1e9, pre = flop / median(t[2]) / 1e9,
                 reorder_us = median(t[3]) * 1e6;
    std::printf("| %s | %d x %d x %d | %.0f | %.0f | %.0f | %.0f |\n", name, m, n, k, hot, cold, pre, reorder_us);
    char line[512];
    std::snprintf(line, sizeof line,
                  "json: {\"bench\":\"gemm_prepacked\",\"type\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,"
                  "\"one_set_gflops\":%.1f,\"sets16_gflops\":%.1f,\"sets16_prepacked_gflops\":%.1f,"
                  "\"reorder_us\":%.1f}",
                  name, m, n, k, hot, cold, pre, reorder_us);
    json.push_back(line);
  }
  std::printf("\n");
}
#endif

// A product and the epilogue after it (the bias and GELU, as Linear<..., GELU> runs them): the
// whole product, then one pass over it; against a panel of rows at a time, each panel's pass
// right after its product, while the panel is in cache (the GPT's MLP up projection, 16 x 256
// tokens, 512 -> 2048). Times in ms: the product alone, the product then the pass, in panels.
template <class T>
void epilogue_row(char const* type, int rounds, std::vector<std::string>& json) {
  using namespace REMAT_NAMESPACE;
  index_t const m = 16 * 256, n = 4 * 512, k = 512;
  std::vector<T> x(std::size_t(m) * k, T(0.5f)), w(std::size_t(n) * k, T(0.25f)), y(std::size_t(m) * n),
      b(std::size_t(n), T(0.125f));
  auto product = [&](index_t r0, index_t rows) {
    kernels::gemm(host{}, kernels::lhs(x.data() + r0 * k, rows, k), kernels::rhs(w.data(), n, k).transposed(),
                  kernels::result(y.data() + r0 * n, rows, n));
  };
  auto pass = [&](index_t r0, index_t rows) {
    tensor_view<T, host> v(y.data() + r0 * n, rows, n);
    evaluate(v, fn::gelu::apply(to_expr(v) + broadcast_rows(tensor_view<T const, host>(b.data(), 1, n), rows)));
  };
  auto in_panels = [&](index_t panel, bool with_pass) {
    return [&, panel, with_pass] {
      for (index_t r = 0; r < m; r += panel) {
        product(r, std::min(panel, m - r));
        if (with_pass) pass(r, std::min(panel, m - r));
      }
    };
  };
  std::vector<std::function<void()>> const ways = {in_panels(m, false), in_panels(m, true), in_panels(256, false),
                                                   in_panels(256, true), in_panels(1024, true)};
  std::vector<std::vector<double>> t(ways.size());
  for (auto const& f : ways) f();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < ways.size(); ++i) t[i].push_back(seconds(ways[i]) * 1e3);
  double ms[5];
  for (std::size_t i = 0; i < ways.size(); ++i) ms[i] = median(t[i]);
  std::printf("| %s | %d x %d x %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", type, int(m), int(n), int(k), ms[0], ms[1],
              ms[2], ms[3], ms[4]);
  char line[512];
  std::snprintf(line, sizeof line,
                "json: {\"bench\":\"gemm_epilogue\",\"type\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"product_ms\":%.3f,"
                "\"then_pass_ms\":%.3f,\"panels256_product_ms\":%.3f,\"panels256_ms\":%.3f,\"panels1024_ms\":%.3f}",
                type, int(m), int(n), int(k), ms[0], ms[1], ms[2], ms[3], ms[4]);
  json.push_back(line);
}
}  // namespace

int main(int argc, char** argv) {
  long long const rounds_arg = argc > 1 ? bench_args::positive(argv[1], 100000) : 15;
  if (argc > 2 || rounds_arg == 0) {
    std::fprintf(stderr, "usage: %s [ROUNDS (1 to 100000, default 15)]\n", argv[0]);
    return 2;
  }
  int const rounds = int(rounds_arg);
  std::vector<shape> shapes;
  for (int batch : {256, 2048}) {
    char const* w = batch == 256 ? "mlp batch 256" : "mlp batch 2048";
    shapes.push_back({w, "forward x W^T", batch, 1024, 1024, false, true});
    shapes.push_back({w, "input grad dy W", batch, 1024, 1024, false, false});
    shapes.push_back({w, "weight grad dy^T x", 1024, 1024, batch, true, false});
  }
  int const tokens = 8 * 256;
  shapes.push_back({"gpt 8x256", "qkv forward", tokens, 3 * 512, 512, false, true});
  shapes.push_back({"gpt 8x256", "mlp up forward", tokens, 4 * 512, 512, false, true});
  shapes.push_back({"gpt 8x256", "mlp down forward", tokens, 512, 4 * 512, false, true});
  shapes.push_back({"gpt 8x256", "mlp down input grad", tokens, 4 * 512, 512, false, false});
  shapes.push_back({"gpt 8x256", "mlp up weight grad", 4 * 512, 512, tokens, true, false});

  std::printf("fp32 matrix products, OpenBLAS cblas_sgemm against oneDNN f32 matmul, median of %d interleaved "
              "rounds, %d thread(s)\n\n",
              rounds,
#if defined(_OPENMP)
              omp_get_max_threads()
#else
              1
#endif
  );
  std::printf("| workload | product | m x n x k | OpenBLAS GFLOP/s | oneDNN GFLOP/s | oneDNN / OpenBLAS |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  for (shape const& s : shapes) {
    std::vector<float> a(std::size_t(s.m) * s.k, 0.5f), b(std::size_t(s.k) * s.n, 0.25f), c(std::size_t(s.m) * s.n);
    int const lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    auto blas = [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k,
                  1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
    };
    double const flop = 2.0 * s.m * s.n * s.k;
    std::vector<double> tb, td;
    double dnnl_gflops = 0;
#if defined(REMAT_HAS_ONEDNN)
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(eng);
    dnnl::memory::desc const ad({s.m, s.k}, dt::f32, s.ta ? dims{1, lda} : dims{lda, 1});
    dnnl::memory::desc const bd({s.k, s.n}, dt::f32, s.tb ? dims{1, ldb} : dims{ldb, 1});
    dnnl::memory::desc const cd({s.m, s.n}, dt::f32, dims{s.n, 1});
    dnnl::matmul::primitive_desc const pd = remat::kernels::detail::onednn_matmul_desc(eng, ad, bd, cd);
    dnnl::matmul const prim(pd);
    dnnl::memory am(ad, eng, a.data()), bm(bd, eng, b.data()), cm(cd, eng, c.data());
    auto dnn = [&] {
      prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    };
    blas();
    dnn();
    for (int r = 0; r < rounds; ++r) {
      tb.push_back(seconds(blas));
      td.push_back(seconds(dnn));
    }
    dnnl_gflops = flop / median(td) / 1e9;
#else
    blas();
    for (int r = 0; r < rounds; ++r) tb.push_back(seconds(blas));
#endif
    double const blas_gflops = flop / median(tb) / 1e9;
    std::printf("| %s | %s | %d x %d x %d | %.0f | %.0f | %.2f |\n", s.workload, s.product, s.m, s.n, s.k, blas_gflops,
                dnnl_gflops, dnnl_gflops / blas_gflops);
    char line[512];
    std::snprintf(line, sizeof line,
                  "json: {\"bench\":\"gemm_paths\",\"workload\":\"%s\",\"product\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,"
                  "\"openblas_gflops\":%.1f,\"onednn_gflops\":%.1f}",
                  s.workload, s.product, s.m, s.n, s.k, blas_gflops, dnnl_gflops);
    json.push_back(line);
  }
  std::printf("\n");
#if defined(REMAT_HAS_ONEDNN)
  // (oneDNN 2.6's bf16 matmul needs AVX-512: without it, remat's bf16 products widen to fp32)
  if (REMAT_NAMESPACE::kernels::has_onednn_bf16())
    bf16_table(shapes, rounds, json);
  else
    std::printf("bf16 matrix products: oneDNN has no bf16 matmul for this processor (it needs AVX-512); "
                "remat's bf16 products widen to fp32 here\n\n");
  prepacked_table(rounds, REMAT_NAMESPACE::kernels::has_onednn_bf16(), json);
#endif
  std::printf("A product and its epilogue (bias + GELU), the whole product then one pass, against panels of rows each\n"
              "followed by its pass: median ms of %d interleaved rounds\n\n", rounds);
  std::printf("| type | m x n x k | product | then the pass | product in panels of 256 | panels of 256 with their passes "
              "| panels of 1024 with their passes |\n|---|---|---|---|---|---|---|\n");
  epilogue_row<float>("fp32", rounds, json);
  epilogue_row<REMAT_NAMESPACE::bfloat16>("bf16", rounds, json);
  std::printf("\n");
  for (auto const& j : json) std::printf("%s\n", j.c_str());
  return 0;
}
