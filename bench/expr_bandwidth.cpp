// The fused expression pass against (a) the same expression evaluated op by op through
// temporaries and (b) the memory bandwidth of a plain copy of the same number of bytes.
// For each expression: bytes that must move (inputs read once, output written once), median time
// of each variant, effective GB/s, and the fraction of copy bandwidth the fused pass reaches.
// Prints a table and one JSON line per row (prefixed "json: ").
//
//   bench_expr [ELEMENTS] [ROUNDS]   (2^24 elements and 15 rounds unless given)
#include <remat/remat.hpp>

#include "args.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace remat;
using ftensor = tensor<float>;

namespace {

double median_seconds(std::function<void()> const& f, int reps) {
  f();  // warm: first touch of pages, cache allocations
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto const t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[std::size_t(reps / 2)];
}

template <class Op, class A, class B, class A2, class B2>
auto rebuild(expr::binary<Op, A, B> const&, A2 const& a, B2 const& b) {
  return expr::binary<Op, A2, B2>(a, b);
}

// The unfused baseline: every inner node into its own fp32 tensor, as an eager framework does.
template <class E>
auto op_by_op(E const& e, std::deque<ftensor>& tmp, std::size_t& next) {
  auto slot = [&]() -> ftensor& {
    if (next == tmp.size()) tmp.emplace_back(index_t(e.size()), 1);
    return tmp[next++];
  };
  if constexpr (expr::is_unary_v<E>) {
    auto a = op_by_op(e.a, tmp, next);
    ftensor& t = slot();
    evaluate(t, expr::unary<std::remove_cv_t<decltype(e.op)>, decltype(a)>(e.op, a));
    return to_expr(t);
  } else if constexpr (requires { e.a; e.b; }) {
    auto a = op_by_op(e.a, tmp, next);
    auto b = op_by_op(e.b, tmp, next);
    ftensor& t = slot();
    evaluate(t, rebuild(e, a, b));
    return to_expr(t);
  } else {
    return e;
  }
}

struct row {
  std::string name;
  int inputs;
  std::size_t n;
  double fused_s, stepwise_s, copy_s;
};

template <class E>
row run(char const* name, int inputs, E const& e, std::size_t n, int reps) {
  ftensor out(index_t(n), 1);
  std::deque<ftensor> tmp;
  row r{name, inputs, n, 0, 0, 0};
  r.fused_s = median_seconds([&] { evaluate(out, e); }, reps);
  r.stepwise_s = median_seconds(
      [&] {
        std::size_t next = 0;
        evaluate(out, op_by_op(e, tmp, next));
      },
      reps);
  // A copy that moves the same bytes as the fused pass: (inputs + 1) * n floats, half read and
  // half written; the faster of memcpy (one thread) and a parallel copy.
  index_t const m = index_t(n) * (inputs + 1) / 2;
  ftensor src(m, 1), dst(m, 1);
  evaluate(src, expr::to_expr(1.0));
  double const memcpy_s = median_seconds([&] { std::memcpy(dst.data(), src.data(), src.bytes()); }, reps);
  double const parallel_s = median_seconds([&] { evaluate(dst, src); }, reps);
  r.copy_s = std::min(memcpy_s, parallel_s);
  return r;
}

// The optimizer passes (kernels/optimizers.hpp) on n parameters: bytes that must move per
// parameter (each array read once, each written once), median time, and the fraction of the copy
// bandwidth for the same bytes.
struct opt_row {
  std::string name;
  double bytes_per_param;
  std::size_t n;
  double s, copy_s;
};

// Median seconds of f and of a parallel copy of the same `bytes`, timed interleaved (this
// machine's bandwidth drifts between runs).
std::pair<double, double> timed_against_copy(double bytes, int reps, std::function<void()> const& f) {
  index_t const half = index_t(bytes / 2 / sizeof(float));
  ftensor src(half, 1), dst(half, 1);
  evaluate(src, expr::to_expr(1.0));
  std::vector<double> ts, cs;
  auto time = [](auto const& g) {
    auto const t0 = std::chrono::steady_clock::now();
    g();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  f();
  evaluate(dst, src);
  for (int r = 0; r < reps; ++r) {
    ts.push_back(time(f));
    cs.push_back(time([&] { evaluate(dst, src); }));
  }
  std::sort(ts.begin(), ts.end());
  std::sort(cs.begin(), cs.end());
  return {ts[ts.size() / 2], cs[cs.size() / 2]};
}

std::vector<opt_row> optimizer_rows(std::size_t n, int reps) {
  std::vector<opt_row> out;
  ftensor p(index_t(n), 1), g(index_t(n), 1), m(index_t(n), 1), v(index_t(n), 1);
  tensor<bfloat16> pc(index_t(n), 1);
  evaluate(p, expr::to_expr(0.5));
  evaluate(g, expr::to_expr(1e-3));
  evaluate(m, expr::to_expr(0.0));
  evaluate(v, expr::to_expr(0.0));
  kernels::adamw_scalars const k{1.0, 1.0 - 1e-3 * 1e-2, 0.9, 0.999, 1e-3 / 0.1, std::sqrt(1 - 0.999), 1e-8};
  auto add = [&](char const* name, double bytes_per_param, std::function<void()> const& f) {
    auto const [s, copy_s] = timed_against_copy(bytes_per_param * double(n), reps, f);
    out.push_back({name, bytes_per_param, n, s, copy_s});
  };
  // p, g, m, v read; p, m, v written.
  add("AdamW (fp32)", 28, [&] { kernels::adamw_update(host{}, n, p.data(), g.data(), m.data(), v.data(), k); });
  // ... and the bf16 compute copy written.
  add("AdamW + bf16 compute copy", 30,
      [&] { kernels::adamw_update(host{}, n, p.data(), g.data(), m.data(), v.data(), k, pc.data()); });
  // p, g, momentum read; p, momentum written.
  kernels::sgd_scalars const sk{1.0, 1e-3, 0.9, 1e-4, false, false};
  add("SGD momentum (fp32)", 20, [&] { kernels::sgd_update(host{}, n, p.data(), g.data(), m.data(), sk); });
  // g read: the check of a loss scale / clipping's norm (a reduction, before the update).
  volatile double sink = 0;
  add("gradient check (sum of squares)", 4, [&] { sink = sink + kernels::grad_check(host{}, n, g.data()); });
  return out;
}

// The row passes of a step (kernels/attention.hpp, kernels/norms.hpp): the causal softmax of the
// attention scores and LayerNorm, forward and backward, each against a copy of the bytes it must
// move (timed interleaved, medians). About n elements each.
std::vector<opt_row> row_pass_rows(std::size_t n, int reps) {
  std::vector<opt_row> out;
  auto add = [&](char const* name, double bytes, std::size_t elements, std::function<void()> const& f) {
    auto const [s, copy_s] = timed_against_copy(bytes, reps, f);
    out.push_back({name, bytes / double(elements), elements, s, copy_s});
  };
  // Causal softmax over count x seq x seq scores (GPT's attention at seq 256): the forward reads
  // the causal half of the scores and writes every probability (zeros above the diagonal); the
  // backward reads the causal half of the probabilities and of their gradient and writes every
  // score gradient.
  std::size_t const seq = 256, count = std::max<std::size_t>(1, n / (seq * seq)), total = count * seq * seq;
  double const causal = double(count) * double(seq * (seq + 1) / 2);
  ftensor scores(index_t(total), 1), probs(index_t(total), 1), dprobs(index_t(total), 1), dscores(index_t(total), 1);
  for (std::size_t i = 0; i < total; ++i) scores[i] = float(std::sin(0.001 * double(i)) * 4.0);
  evaluate(dprobs, expr::to_expr(1e-3));
  add("causal softmax forward (seq 256)", causal * 4 + double(total) * 4, total,
      [&] { kernels::causal_softmax(host{}, scores.data(), probs.data(), count, seq, 0.125f); });
  add("causal softmax backward (seq 256)", 2 * causal * 4 + double(total) * 4, total, [&] {
    kernels::causal_softmax_backward(host{}, probs.data(), dprobs.data(), dscores.data(), count, seq, 0.125f,
                                     kernels::no_mask<float>{});
  });
  // LayerNorm over rows of width 1024: the forward reads x and writes y (and two statistics per
  // row); the backward reads x, dy and the statistics and writes dx (the parameter gradients are
  // width-sized).
  std::size_t const w = 1024, rows = std::max<std::size_t>(1, n / w);
  index_t const r = index_t(rows), c = index_t(w);
  ftensor x(r, c), y(r, c), dy(r, c), dx(r, c), gamma(2 * c, 1), dgamma(2 * c, 1), mean(r, 1), rstd(r, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  evaluate(dy, expr::to_expr(1e-2));
  evaluate(gamma, expr::to_expr(1.0));
  evaluate(dgamma, expr::to_expr(0.0));
  double const elems = double(rows * w), stats = double(rows) * 2 * 4;
  add("LayerNorm forward (width 1024)", elems * 8 + stats, rows * w, [&] {
    kernels::layer_norm_forward(host{}, x.data(), gamma.data(), gamma.data() + w, rows, w, 1e-5, y.data(),
                                mean.data(), rstd.data());
  });
  add("LayerNorm backward (width 1024)", elems * 12 + stats, rows * w, [&] {
    kernels::layer_norm_backward(host{}, x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), rows, w,
                                 dx.data(), dgamma.data(), dgamma.data() + w);
  });
  // The same in bf16 (a mixed-precision model's: fp32 statistics and parameter gradients), at the
  // GPT workload's width (512) and at a 7B model's (4096).
  for (std::size_t bw : {std::size_t(512), std::size_t(4096)}) {
    std::size_t const brows = std::max<std::size_t>(1, n / bw);
    using btensor = tensor<bfloat16, host>;
    index_t const br = index_t(brows), bc = index_t(bw);
    btensor bx(br, bc), bdy(br, bc), bdx(br, bc), bgamma(bc, 1);
    for (std::size_t i = 0; i < bx.size(); ++i) bx[i] = bfloat16(float(std::sin(0.37 * double(i))));
    evaluate(bdy, expr::to_expr(1e-2));
    evaluate(bgamma, expr::to_expr(1.0));
    ftensor bmean(index_t(brows), 1), brstd(index_t(brows), 1), bdg(index_t(2 * bw), 1);
    evaluate(bmean, expr::to_expr(0.0));
    evaluate(brstd, expr::to_expr(1.0));
    evaluate(bdg, expr::to_expr(0.0));
    std::string const name = "LayerNorm backward, bf16 (width " + std::to_string(bw) + ")";
    add(name.c_str(), double(brows * bw) * 6 + double(brows) * 8, brows * bw, [&, bw, brows] {
      kernels::layer_norm_backward(host{}, bx.data(), bgamma.data(), bmean.data(), brstd.data(), bdy.data(), brows, bw,
                                   bdx.data(), bdg.data(), bdg.data() + bw);
    });
  }
  return out;
}

// What a point-wise function costs where memory does not bound it: out = f(x) over 128 x 1024
// values (512 KiB an fp32 tensor: a thread's half of x, dy and y fits a 1 MiB L2), in ns per
// element at the host's threads, median of `reps` rounds of 50 passes; each function's pass as a
// layer runs it (GELU after its bias, and GELU's backward dy * GELU'(x + b)).
// bench/pointwise_torch.py times PyTorch's ops on the same values.
struct function_row {
  std::string name, type;
  double ns;
};

template <class T>
void function_rows(char const* type, int reps, std::vector<function_row>& out) {
  index_t const rows = 128, cols = 1024;
  tensor<T> x(rows, cols), b(index_t(1), cols), dy(rows, cols), y(rows, cols);
  for (index_t i = 0; i < rows * cols; ++i) {
    x.data()[i] = T(float((i * 37) % 1000) / 250.0f - 2.0f);
    dy.data()[i] = T(0.5f);
  }
  for (index_t c = 0; c < cols; ++c) b.data()[c] = T(0.01f * float(c % 7));
  auto const bias = broadcast_rows(b, std::size_t(rows));
  auto add = [&](char const* name, auto const& e) {
    double const s = median_seconds(
        [&] {
          for (int k = 0; k < 50; ++k) evaluate(y, e);
        },
        reps);
    out.push_back({name, type, s / 50 / double(rows * cols) * 1e9});
  };
  add("copy", to_expr(x));
  add("exp", exp(x));
  add("tanh", tanh(x));
  add("sigmoid", sigmoid(x));
  add("gelu", gelu(x));
  add("gelu(x + b)", gelu(x + bias));
  add("dy * gelu'(x + b)", dy * expr::make_unary(expr::gelu_grad_op{}, x + bias));
}

}  // namespace

int main(int argc, char** argv) {
  long long const n_arg = argc > 1 ? bench_args::positive(argv[1], 1ll << 34) : (1ll << 24);
  long long const reps_arg = argc > 2 ? bench_args::positive(argv[2], 100000) : 15;
  if (argc > 3 || n_arg == 0 || reps_arg == 0) {
    std::fprintf(stderr, "usage: %s [ELEMENTS (1 to 2^34, default 2^24)] [ROUNDS (1 to 100000, default 15)]\n",
                 argv[0]);
    return 2;
  }
  std::size_t const n = std::size_t(n_arg);
  int const reps = int(reps_arg);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(0.1f, 2.0f);
  ftensor x(index_t(n), 1), y(index_t(n), 1), z(index_t(n), 1);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = d(rng);
    y[i] = d(rng);
    z[i] = d(rng);
  }
  auto X = leaf<0>(x);
  std::vector<row> rows;
  rows.push_back(run("x * y + z", 3, x * y + z, n, reps));
  rows.push_back(run("gelu(x * y + z)", 3, gelu(x * y + z), n, reps));
  rows.push_back(run("silu(x) * y - z / 2", 3, silu(x) * y - z / 2.0, n, reps));
  rows.push_back(run("d gelu(x) * dy (backward)", 2, grad(gelu(X), X, y), n, reps));
  rows.push_back(run("adamw-like update", 3, x - (y / (sqrt(z) + 1e-8) + x * 0.01) * 1e-3, n, reps));

  std::printf("remat expression bench: %zu fp32 elements, median of %d, host, %d thread(s)\n\n", n, reps,
#if defined(_OPENMP)
              omp_get_max_threads()
#else
              1
#endif
  );
  std::printf("| expression | bytes moved | fused ms | op-by-op ms | fused speed-up | fused GB/s | copy GB/s | fused / copy |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto const& r : rows) {
    double const bytes = double(r.n) * sizeof(float) * (r.inputs + 1);
    double const fused_gbs = bytes / r.fused_s / 1e9, copy_gbs = bytes / r.copy_s / 1e9;
    std::printf("| %s | %.0f MB | %.2f | %.2f | %.2fx | %.1f | %.1f | %.0f%% |\n", r.name.c_str(), bytes / 1e6,
                r.fused_s * 1e3, r.stepwise_s * 1e3, r.stepwise_s / r.fused_s, fused_gbs, copy_gbs,
                100 * fused_gbs / copy_gbs);
  }
  std::printf("\n");
  for (auto const& r : rows) {
    double const bytes = double(r.n) * sizeof(float) * (r.inputs + 1);
    std::printf("json: {\"bench\":\"expr\",\"expression\":\"%s\",\"elements\":%zu,\"bytes\":%.0f,\"fused_s\":%.6g,"
                "\"op_by_op_s\":%.6g,\"copy_s\":%.6g,\"speedup\":%.4g,\"fraction_of_copy\":%.4g}\n",
                r.name.c_str(), r.n, bytes, r.fused_s, r.stepwise_s, r.copy_s, r.stepwise_s / r.fused_s,
                r.copy_s / r.fused_s);
  }
  std::vector<opt_row> const opt = optimizer_rows(n, reps);
  std::printf("optimizer passes: %zu fp32 parameters\n\n", n);
  std::printf("| pass | bytes per parameter | ms | GB/s | copy GB/s | fraction of copy |\n|---|---|---|---|---|---|\n");
  for (auto const& r : opt) {
    double const bytes = r.bytes_per_param * double(r.n);
    std::printf("| %s | %.0f | %.2f | %.1f | %.1f | %.0f%% |\n", r.name.c_str(), r.bytes_per_param, r.s * 1e3,
                bytes / r.s / 1e9, bytes / r.copy_s / 1e9, 100 * r.copy_s / r.s);
  }
  std::printf("\n");
  for (auto const& r : opt)
    std::printf("json: {\"bench\":\"optimizer\",\"pass\":\"%s\",\"parameters\":%zu,\"bytes_per_parameter\":%.0f,"
                "\"s\":%.6g,\"copy_s\":%.6g,\"fraction_of_copy\":%.4g}\n",
                r.name.c_str(), r.n, r.bytes_per_param, r.s, r.copy_s, r.copy_s / r.s);
  std::vector<opt_row> const passes = row_pass_rows(n, reps);
  std::printf("\nrow passes: about %zu fp32 elements each\n\n", n);
  std::printf("| pass | bytes per element | ms | GB/s | copy GB/s | fraction of copy |\n|---|---|---|---|---|---|\n");
  for (auto const& r : passes) {
    double const bytes = r.bytes_per_param * double(r.n);
    std::printf("| %s | %.1f | %.2f | %.1f | %.1f | %.0f%% |\n", r.name.c_str(), r.bytes_per_param, r.s * 1e3,
                bytes / r.s / 1e9, bytes / r.copy_s / 1e9, 100 * r.copy_s / r.s);
  }
  std::printf("\n");
  for (auto const& r : passes)
    std::printf("json: {\"bench\":\"row_pass\",\"pass\":\"%s\",\"elements\":%zu,\"bytes_per_element\":%.3f,"
                "\"s\":%.6g,\"copy_s\":%.6g,\"fraction_of_copy\":%.4g}\n",
                r.name.c_str(), r.n, r.bytes_per_param, r.s, r.copy_s, r.copy_s / r.s);
  std::vector<function_row> fns;
  function_rows<float>("fp32", reps, fns);
  function_rows<bfloat16>("bf16", reps, fns);
  std::printf("\npoint-wise functions in cache: 128 x 1024 values, ns per element\n\n| function | fp32 | bf16 |\n"
              "|---|---|---|\n");
  for (std::size_t i = 0; i < fns.size() / 2; ++i)
    std::printf("| %s | %.3f | %.3f |\n", fns[i].name.c_str(), fns[i].ns, fns[i + fns.size() / 2].ns);
  std::printf("\n");
  for (auto const& r : fns)
    std::printf("json: {\"bench\":\"function\",\"function\":\"%s\",\"type\":\"%s\",\"ns_per_element\":%.4g}\n",
                r.name.c_str(), r.type.c_str(), r.ns);
  return 0;
}
