// Fusion across layer boundaries: a Residual whose branch ends in a Linear adds the shortcut in the
// Linear's bias pass, and one whose branch starts with a norm adds the shortcut's gradient in the
// norm's dx pass. Both promise the same bits as the separate passes. The reference here is the
// same model with the branch wrapped in a second Seq, which hides both from the Residual (so it
// runs the add as a pass of its own); the parameters are the same flat buffer, initialised the
// same. Checked in fp32, bf16 and half, under every policy, with dropout on, for losses,
// parameters after three AdamW steps, their gradients and the input's gradient.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t W = 16;
// A block whose add is fused both ways (forward past an identity Dropout<0>), and its reference.
template <template <class...> class Wrap>
using Block = Residual<Wrap<LayerNorm<W>, Linear<W, 32>, GELU, Dropout<0.25>, Linear<32, W>, Dropout<0.0>>>;
// RMSNorm, and a product without a bias.
template <template <class...> class Wrap>
using RmsBlock = Residual<Wrap<RMSNorm<W>, Linear<W, W>, SiLU, Linear<W, W, false>>>;

template <class... L>
using Fused = Seq<L...>;
template <class... L>
using Apart = Seq<Seq<L...>>;  // the branch one level down: no fusion

static_assert(Block<Fused>::fused_add && Block<Fused>::fused_add_gradient);
static_assert(RmsBlock<Fused>::fused_add && RmsBlock<Fused>::fused_add_gradient);
static_assert(!Block<Apart>::fused_add && !Block<Apart>::fused_add_gradient);
// Where the branch ends in another layer (a dropout that drops) or starts with a product, no fusion.
static_assert(!Residual<Seq<LayerNorm<W>, Linear<W, W>, Dropout<0.1>>>::fused_add);
static_assert(!Residual<Seq<Linear<W, W>, GELU, LayerNorm<W>>>::fused_add_gradient);
// A Linear fused with a following point-wise layer ends no branch: that pair runs as one pass.
static_assert(!Residual<Seq<LayerNorm<W>, Linear<W, W>, GELU>>::fused_add);

template <class Middle>
using Net = Seq<Linear<8, W>, Middle, Linear<W, 4>>;

struct result {
  std::vector<double> losses;
  std::vector<float> params, grads, dx;
};

template <class NetT, class P>
result train() {
  memory::caching_allocator<host> alloc;
  offload_allocator_t<host> offloaded;
  model<NetT, host, P> m(seed{7}, alloc, offloaded);
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x(24, 8), t(24, 4), dx(24, 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.11 * double(i)));
  result r;
  for (int k = 0; k < 3; ++k) r.losses.push_back(m.template train_step<MSE>(x, t, opt));
  m.zero_grad();
  r.losses.push_back(m.template accumulate<MSE>(x, t, 1.0, &dx));
  // The plan still equals the measured peak with the fusions in.
  CHECK(m.last_pass().activation_peak == activation_plan<NetT, P>(24, 8, 1, input_gradient::wanted).peak_bytes);
  r.params = tensor_to_host(m.parameters());
  r.grads = tensor_to_host(m.gradients());
  r.dx = dx.to_vector();
  return r;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class NetT, class P>
void require_same(result const& ref) {
  result const r = train<NetT, P>();
  REQUIRE(r.losses.size() == ref.losses.size());
  for (std::size_t k = 0; k < r.losses.size(); ++k) CHECK(r.losses[k] == ref.losses[k]);
  CHECK(same_bits(r.params, ref.params));
  CHECK(same_bits(r.grads, ref.grads));
  CHECK(same_bits(r.dx, ref.dx));
}

// The fusion frees and makes nothing the separate add did not: the same plan, tensor for tensor.
template <class Fused_, class Apart_, class P>
void require_same_plan() {
  for (std::size_t batch : {1, 7, 24, 129}) {
    auto const a = activation_plan<Fused_, P>(batch, 8, 1, input_gradient::wanted);
    auto const b = activation_plan<Apart_, P>(batch, 8, 1, input_gradient::wanted);
    CHECK(a.peak_bytes == b.peak_bytes);
    CHECK(a.saved_bytes == b.saved_bytes);
    CHECK(a.offloaded_bytes == b.offloaded_bytes);
    auto const la = arena_plan<Fused_, P>(batch), lb = arena_plan<Apart_, P>(batch);
    CHECK(la.bytes == lb.bytes);
    CHECK(la.lower_bound == lb.lower_bound);
  }
}

template <class P, template <template <class...> class> class B>
void check_every_policy() {
  constexpr std::size_t N = 4;
  result const ref = train<Net<Repeat<N, B<Apart>>>, P>();
  REQUIRE(ref.losses[2] < ref.losses[0]);  // it trains
  require_same<Net<Repeat<N, B<Fused>>>, P>(ref);
  require_same<Net<Repeat<N, Checkpointed<B<Fused>>>>, P>(ref);
  require_same<Net<CheckpointSequential<2, Repeat<N, B<Fused>>>>, P>(ref);
  require_same<Net<Revolve<2, Repeat<N, B<Fused>>>>, P>(ref);
  require_same<Net<Repeat<N, Selective<B<Fused>>>>, P>(ref);
  require_same<Net<Selective<Repeat<N, Checkpointed<B<Fused>>>>>, P>(ref);
  require_same<Net<Repeat<N, Offloaded<B<Fused>>>>, P>(ref);
  require_same_plan<Net<Repeat<N, B<Fused>>>, Net<Repeat<N, B<Apart>>>, P>();
  require_same_plan<Net<Repeat<N, Checkpointed<B<Fused>>>>, Net<Repeat<N, Checkpointed<B<Apart>>>>, P>();
  require_same_plan<Net<Revolve<3, Repeat<8, B<Fused>>>>, Net<Revolve<3, Repeat<8, B<Apart>>>>, P>();
  require_same_plan<Net<Repeat<N, Selective<B<Fused>>>>, Net<Repeat<N, Selective<B<Apart>>>>, P>();
  require_same_plan<Net<Repeat<N, Offloaded<B<Fused>>>>, Net<Repeat<N, Offloaded<B<Apart>>>>, P>();
}

}  // namespace

TEST_CASE("fusion: a Residual's add in the last product's pass and its gradient in the norm's, bit for bit",
          "[policies][fusion]") {
  SECTION("fp32") {
    check_every_policy<fp32, Block>();
    check_every_policy<fp32, RmsBlock>();
  }
  SECTION("bf16") {
    check_every_policy<mixed<bfloat16>, Block>();
    check_every_policy<mixed<bfloat16>, RmsBlock>();
  }
  SECTION("half") {
    check_every_policy<mixed<half, StaticLossScale<256>>, Block>();
    check_every_policy<mixed<half, StaticLossScale<256>>, RmsBlock>();
  }
}
