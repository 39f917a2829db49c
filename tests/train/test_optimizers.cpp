// The optimizers against PyTorch's own updates (optimizer_reference.txt, made by
// make_optimizer_reference.py with Debian's python3-torch), the schedule and clipping by hand, and
// gradient accumulation against one large batch.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace remat;

namespace {

std::map<std::string, std::vector<float>> read_reference() {
  std::ifstream in(REMAT_TEST_DATA_DIR "/train/optimizer_reference.txt");
  REQUIRE(in.good());
  std::map<std::string, std::vector<float>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    double v;
    while (ls >> v) out[name].push_back(float(v));
  }
  return out;
}

template <class Make>
void replay(std::string const& name, Make make) {
  auto ref = read_reference();
  std::vector<float> const& p0 = ref.at("p0");
  tensor<float> p(index_t(p0.size()), 1), g(index_t(p0.size()), 1);
  p.copy_from(p0);
  auto opt = make(p.view(), g.view());
  auto key = [](std::string prefix, int t) {  // (not operator+: GCC 12 warns falsely on it, -Wrestrict)
    prefix.append(std::to_string(t));
    return prefix;
  };
  for (int t = 0; ref.count(key("g", t)); ++t) {
    g.copy_from(ref.at(key("g", t)));
    opt.step();
    std::vector<float> const& want = ref.at(key(name + ".", t));
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO(name << " step " << t << " parameter " << i);
      REQUIRE(p[i] == Approx(want[i]).epsilon(2e-6).margin(1e-7));
    }
  }
}

}  // namespace

TEST_CASE("AdamW matches torch.optim.AdamW step by step", "[train][optim]") {
  replay("adamw", [](auto p, auto g) {
    return AdamW<float>(p, g, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  });
  replay("adamw_b", [](auto p, auto g) {
    return AdamW<float>(p, g, {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.0});
  });
}

TEST_CASE("SGD, with momentum and Nesterov, matches torch.optim.SGD", "[train][optim]") {
  replay("sgd", [](auto p, auto g) { return SGD<float>(p, g, {.lr = 0.05}); });
  replay("sgd_momentum",
         [](auto p, auto g) { return SGD<float>(p, g, {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}); });
  replay("sgd_nesterov", [](auto p, auto g) {
    return SGD<float>(p, g, {.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.02});
  });
}

TEST_CASE("AdamW by hand: the first step moves every parameter by lr against its gradient's sign", "[train][optim]") {
  tensor<double> p(3, 1), g(3, 1);
  double const p0[] = {1.0, -2.0, 0.5}, g0[] = {0.3, -4.0, 1e-3};
  p.copy_from(p0);
  g.copy_from(g0);
  AdamW<double> opt(p.view(), g.view(), {.lr = 0.1, .eps = 0.0, .weight_decay = 0.5});
  opt.step();
  // m = 0.1 g, v = 0.001 g^2; bias-corrected m / sqrt(v) = sign(g); decay first: p (1 - 0.05)
  for (int i = 0; i < 3; ++i) CHECK(p[std::size_t(i)] == Approx(p0[i] * 0.95 - 0.1 * (g0[i] > 0 ? 1 : -1)));
}

TEST_CASE("gradient clipping scales by max_norm / (norm + 1e-6)", "[train][optim]") {
  tensor<double> p(2, 1), g(2, 1);
  double const g0[] = {3.0, 4.0};  // norm 5
  p.copy_from(std::vector<double>{0.0, 0.0});
  g.copy_from(g0);
  SGD<double> opt(p.view(), g.view(), {.lr = 1.0, .clip_norm = 1.0});
  opt.step();
  double const c = 1.0 / (5.0 + 1e-6);
  CHECK(opt.last_grad_norm() == Approx(5.0));
  CHECK(p[0] == Approx(-3.0 * c).epsilon(1e-12));
  CHECK(p[1] == Approx(-4.0 * c).epsilon(1e-12));
  SGD<double> loose(p.view(), g.view(), {.lr = 1.0, .clip_norm = 10.0});  // below the limit: untouched
  loose.step();
  CHECK(p[0] == Approx(-3.0 * c - 3.0).epsilon(1e-12));
}

namespace {

// make() must throw argument_error saying `says`, with the model's allocator as before.
template <class Model, class Make>
void refused(Model& m, Make make, std::string const& says) {
  std::size_t const in_use = m.allocator().stats().total.in_use;
  try {
    make();
    FAIL("accepted; expected an argument_error saying: " << says);
  } catch (argument_error const& e) {
    CHECK_THAT(e.what(), Catch::Contains(says));
  }
  CHECK(m.allocator().stats().total.in_use == in_use);
}

}  // namespace

TEST_CASE("settings out of torch.optim's ranges are refused by name, built or set, and change nothing",
          "[train][optim][errors]") {
  using Net = Seq<Linear<6, 16>, GELU, LayerNorm<16>, Linear<16, 4>>;
  using M = model<Net>;
  M m{seed{3}}, twin{seed{3}};
  double const nan = std::nan(""), inf = HUGE_VAL;
  refused(m, [&] { (void)AdamW(m, {.lr = -1}); }, "AdamW: expected lr finite and >= 0, found -1");
  refused(m, [&] { (void)AdamW(m, {.lr = nan}); }, "AdamW: expected lr finite and >= 0, found nan");
  refused(m, [&] { (void)AdamW(m, {.lr = inf}); }, "AdamW: expected lr finite and >= 0, found inf");
  refused(m, [&] { (void)AdamW(m, {.beta1 = 1.0}); }, "AdamW: expected beta1 in [0, 1), found 1");
  refused(m, [&] { (void)AdamW(m, {.beta1 = -0.5}); }, "AdamW: expected beta1 in [0, 1), found -0.5");
  refused(m, [&] { (void)AdamW(m, {.beta2 = 1.5}); }, "AdamW: expected beta2 in [0, 1), found 1.5");
  refused(m, [&] { (void)AdamW(m, {.eps = -1e-8}); }, "AdamW: expected eps finite and >= 0, found -1e-08");
  refused(m, [&] { (void)AdamW(m, {.weight_decay = -0.25}); }, "AdamW: expected weight_decay finite and >= 0, found -0.25");
  refused(m, [&] { (void)AdamW(m, {.clip_norm = -1}); }, "AdamW: expected clip_norm finite and >= 0, found -1");
  refused(m, [&] { (void)SGD(m, {.lr = -0.5}); }, "SGD: expected lr finite and >= 0, found -0.5");
  refused(m, [&] { (void)SGD(m, {.momentum = -0.9}); }, "SGD: expected momentum finite and >= 0, found -0.9");
  refused(m, [&] { (void)SGD(m, {.weight_decay = -1}); }, "SGD: expected weight_decay finite and >= 0, found -1");
  refused(m, [&] { (void)SGD(m, {.clip_norm = nan}); }, "SGD: expected clip_norm finite and >= 0, found nan");
  refused(m, [&] { (void)SGD(m, {.nesterov = true}); }, "SGD: Nesterov momentum needs a momentum > 0, found 0");
  refused(m, [&] { (void)OffloadedAdamW<M>(m, {.lr = -1}); }, "OffloadedAdamW: expected lr finite and >= 0, found -1");
  refused(m, [&] { (void)OffloadedAdamW<M>(m, {.beta2 = 1}); }, "OffloadedAdamW: expected beta2 in [0, 1), found 1");
  // Each end of a range that is in it is taken.
  AdamW edges(m, {.lr = 0, .beta1 = 0, .beta2 = 0, .eps = 0, .weight_decay = 0, .clip_norm = 0});
  CHECK(edges.lr() == 0);

  // set_lr refuses a rate out of range and keeps the one it had: the next steps are a twin's that
  // was never given it, bit for bit.
  tensor<float> x(8, 6);
  tensor<std::int32_t> y(8, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.3f);
  for (std::size_t i = 0; i < 8; ++i) y[i] = std::int32_t(i % 4);
  auto twice = [&](auto& opt, auto& twin_opt, char const* who) {
    for (double bad : {-1e-3, nan, inf}) {
      refused(m, [&] { opt.set_lr(bad); }, std::string(who) + ": expected lr finite and >= 0, found ");
      CHECK(opt.lr() == 1e-2);
    }
    for (int step = 0; step < 2; ++step) {
      m.train_step<SoftmaxCrossEntropy>(x, y, opt);
      twin.train_step<SoftmaxCrossEntropy>(x, y, twin_opt);
    }
    CHECK(tensor_to_host(m.parameters()) == tensor_to_host(twin.parameters()));
  };
  {
    AdamW a(m, {.lr = 1e-2}), b(twin, {.lr = 1e-2});
    twice(a, b, "AdamW");
  }
  {
    SGD a(m, {.lr = 1e-2, .momentum = 0.9}), b(twin, {.lr = 1e-2, .momentum = 0.9});
    twice(a, b, "SGD");
  }
  {
    OffloadedAdamW a(m, {.lr = 1e-2}), b(twin, {.lr = 1e-2});
    twice(a, b, "OffloadedAdamW");
  }
}

TEST_CASE("warm-up then cosine", "[train][schedule]") {
  warmup_cosine s{.base_lr = 1.0, .warmup = 10, .total = 110, .min_lr = 0.1};
  CHECK(s(0) == Approx(0.1));
  CHECK(s(4) == Approx(0.5));
  CHECK(s(9) == Approx(1.0));
  CHECK(s(10) == Approx(1.0));
  CHECK(s(60) == Approx(0.1 + 0.45));  // half way: cos(pi/2) = 0
  CHECK(s(110) == Approx(0.1));
  CHECK(s(1000) == Approx(0.1));

  // No decay phase: warm-up to the end, then min_lr.
  warmup_cosine const edge{.base_lr = 1.0, .warmup = 4, .total = 4, .min_lr = 0.1};
  CHECK(edge(3) == Approx(1.0));
  CHECK(edge(4) == Approx(0.1));
  // A warm-up past the end is refused by name, at any step.
  warmup_cosine const late{.base_lr = 1.0, .warmup = 20, .total = 10};
  CHECK_THROWS_WITH(late(0), Catch::Contains("expected warmup <= total, found warmup 20 and total 10"));
  CHECK_THROWS_AS(late(15), argument_error);
}

TEST_CASE("gradient accumulation over k micro-batches equals one k-times-larger batch", "[train][accumulate]") {
  using Net = Seq<Linear<6, 16>, GELU, LayerNorm<16>, Linear<16, 4>>;
  model<Net> big{seed{3}}, small{seed{3}};
  tensor<float> x(12, 6);
  tensor<std::int32_t> y(12, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.7f);
  for (std::size_t i = 0; i < 12; ++i) y[i] = std::int32_t(i % 4);
  big.zero_grad();
  double const l_big = big.accumulate<SoftmaxCrossEntropy>(x, y);
  small.zero_grad();
  double l_small = 0;
  for (std::size_t k = 0; k < 3; ++k)
    l_small += small.accumulate<SoftmaxCrossEntropy>(x.row_range(4 * k, 4), y.row_range(4 * k, 4), 1.0 / 3.0) / 3.0;
  CHECK(l_small == Approx(l_big).epsilon(1e-6));
  auto gb = big.gradients(), gs = small.gradients();
  double max_g = 0;
  for (std::size_t i = 0; i < gb.size(); ++i) max_g = std::max(max_g, double(std::fabs(gb[i])));
  for (std::size_t i = 0; i < gb.size(); ++i) REQUIRE(gs[i] == Approx(gb[i]).margin(1e-6 * max_g));
  // and the optimizer steps that follow agree
  AdamW ob(big), os(small);
  ob.step();
  os.step();
  for (std::size_t i = 0; i < gb.size(); ++i) REQUIRE(small.parameters()[i] == Approx(big.parameters()[i]).margin(1e-6));
}

TEST_CASE("a model whose buffers moved to the caller's memory trains bit for bit, and moves back intact",
          "[train][relocate]") {
  using Net = Seq<Linear<6, 16>, GELU, LayerNorm<16>, Linear<16, 4>>;
  using P = mixed<bfloat16, DynamicLossScale>;
  model<Net, host, P> stay{seed{5}}, moved{seed{5}};
  std::size_t const n = decltype(moved)::parameter_count;
  std::vector<float> grads(n, -1.0f), master(n, -1.0f);
  std::vector<bfloat16> compute(n);
  moved.relocate_gradients(grads.data());
  moved.relocate_parameters(master.data(), compute.data());
  // (the values moved with them, and the model reads and writes there from now on)
  CHECK(moved.parameters().data() == master.data());
  CHECK(moved.gradients().data() == grads.data());
  CHECK(moved.compute_parameters().data() == compute.data());
  CHECK(master == tensor_to_host(stay.parameters()));
  tensor<float> x(8, 6);
  tensor<std::int32_t> y(8, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.3f);
  for (std::size_t i = 0; i < 8; ++i) y[i] = std::int32_t(i % 4);
  AdamW a(stay), b(moved);  // (built after the move: an optimizer keeps where the buffers are)
  for (int step = 0; step < 3; ++step) {
    stay.train_step<SoftmaxCrossEntropy>(x, y, a);
    moved.train_step<SoftmaxCrossEntropy>(x, y, b);
  }
  CHECK(master == tensor_to_host(stay.parameters()));
  CHECK(grads == tensor_to_host(stay.gradients()));
  // Back into the model's allocator: the same values, elsewhere; the caller's memory is free.
  moved.relocate_gradients(nullptr);
  moved.relocate_parameters(nullptr, nullptr);
  CHECK(moved.parameters().data() != master.data());
  CHECK(moved.gradients().data() != grads.data());
  CHECK(moved.compute_parameters().data() != compute.data());
  std::fill(master.begin(), master.end(), 0.0f);
  std::fill(grads.begin(), grads.end(), 0.0f);
  CHECK(tensor_to_host(moved.parameters()) == tensor_to_host(stay.parameters()));
  CHECK(tensor_to_host(moved.gradients()) == tensor_to_host(stay.gradients()));
  CHECK(moved.forward(x).to_vector() == stay.forward(x).to_vector());
}
