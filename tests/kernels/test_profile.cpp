// remat::profile: which kernels a step runs, counted by phase and kind (the counts are the
// model's, worked out by hand below), and that a thread not profiling counts nothing.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <vector>

using namespace remat;
using memory::phase;
using profile::work;

namespace {

using Net = Seq<Linear<4, 8>, ReLU, Linear<8, 2>>;

struct fixture {
  model<Net> m{seed{1}};
  SGD<float> opt{m, {.lr = 0.1}};
  tensor<float> x{6, 4}, t{6, 2};
  fixture() {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.25f - 0.5f;
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i % 3) * 0.5f;
  }
};

}  // namespace

TEST_CASE("profile: a step's kernels counted by phase and kind", "[profile]") {
  fixture f;
  (void)f.m.train_step<MSE>(f.x, f.t, f.opt);  // (the first step sets up what later steps reuse)
  profile::enable();
  REQUIRE(profile::enabled());
  (void)f.m.train_step<MSE>(f.x, f.t, f.opt);
  (void)f.m.train_step<MSE>(f.x, f.t, f.opt);
  profile::report const r = profile::read();
  profile::enable(false);
  // Forward: one product per Linear (ReLU runs in the first one's pass).
  CHECK(r.calls[std::size_t(phase::forward)][std::size_t(work::product)] == 2 * 2);
  // Backward: dW for both Linears, dx for the second only (nobody wants the input's gradient).
  CHECK(r.calls[std::size_t(phase::backward)][std::size_t(work::product)] == 2 * 3);
  // The biases' gradients: one column sum per Linear.
  CHECK(r.calls[std::size_t(phase::backward)][std::size_t(work::reduction)] == 2 * 2);
  // No product outside forward and backward; the optimizer's update is point-wise work.
  for (phase p : {phase::loss, phase::optimizer, phase::recomputation, phase::none})
    CHECK(r.calls[std::size_t(p)][std::size_t(work::product)] == 0);
  CHECK(r.calls[std::size_t(phase::optimizer)][std::size_t(work::pointwise)] >= 2);
  for (phase p : {phase::forward, phase::backward, phase::optimizer}) {
    CHECK(r.wall(p) > 0);
    CHECK(r.outside_kernels(p) >= -1e-9);  // the kernels ran inside their phase's wall time
  }
}

TEST_CASE("profile: off, nothing is counted; reset starts from zero", "[profile]") {
  fixture f;
  profile::enable();
  profile::enable(false);
  CHECK_FALSE(profile::enabled());
  (void)f.m.train_step<MSE>(f.x, f.t, f.opt);
  profile::report const off = profile::read();
  for (auto const& row : off.calls)
    for (auto c : row) CHECK(c == 0);
  profile::enable();
  (void)f.m.train_step<MSE>(f.x, f.t, f.opt);
  CHECK(profile::read().calls[std::size_t(phase::forward)][std::size_t(work::product)] == 2);
  profile::reset();
  CHECK(profile::read().calls[std::size_t(phase::forward)][std::size_t(work::product)] == 0);
  profile::enable(false);
}

TEST_CASE("profile: causal attention's tiles count their softmax rows as row passes, the rest as products",
          "[profile][attention]") {
  // causal_attention_forward makes each tile's scores, their softmax and its rows of the output one
  // after the other in each thread; its time goes to both kinds, one call each. (Outside a model
  // the phase is phase::none.) Two sequences of 96 positions (two tiles), 2 heads of 8.
  constexpr std::size_t batch = 2, heads = 2, hw = 8, W = heads * hw, seq = 96, count = batch * heads;
  std::vector<float> x(batch * seq * 3 * W), y(batch * seq * W), probs(count * seq * seq);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 11) * 0.1f - 0.5f;
  kernels::matrix_layout const qkv{index_t(seq), index_t(hw), index_t(3 * W), {index_t(seq * 3 * W), index_t(hw)}};
  kernels::matrix_layout const out{index_t(seq), index_t(hw), index_t(W), {index_t(seq * W), index_t(hw)}};
  float const* q = x.data();
  kernels::attention_blocks<float> const b{{count, heads}, 64, kernels::lhs(q, qkv), kernels::rhs(q + W, qkv),
                                           kernels::rhs(q + 2 * W, qkv), kernels::result(y.data(), out)};
  profile::enable();
  kernels::causal_attention_forward(host{}, b, static_cast<float*>(nullptr), probs.data(), 0.25f);
  profile::report const r = profile::read();
  profile::enable(false);
  std::size_t const p = std::size_t(memory::current_phase());
  CHECK(r.calls[p][std::size_t(work::product)] == 1);
  CHECK(r.calls[p][std::size_t(work::rows)] == 1);
  CHECK(r.seconds(memory::current_phase(), work::product) > 0);
  CHECK(r.seconds(memory::current_phase(), work::rows) > 0);
  CHECK(probs[seq * seq - 1] > 0);  // (the last row's last probability: the call did its work)
}
