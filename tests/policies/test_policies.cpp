// Storage policies: every policy trains bit for bit like the stored model (dropout on, several
// AdamW steps), side effects run once, block forwards run exactly as often as the schedule says,
// and the revolve schedule is checked against an independent search.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

using namespace remat;

namespace {

// An instrumented layer y = 1.5 x that counts its forwards, and its side effects (what a layer
// with a running statistic would update), which must happen once per block and step.
struct counts {
  static inline std::uint64_t forwards = 0;
  static inline std::uint64_t effects = 0;
  static void reset() { forwards = effects = 0; }
};
struct counted {
  static constexpr std::size_t in_width = any_width, out_width = any_width, param_count = 0;
  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    if constexpr (S::computes) {
      ++counts::forwards;
      if (s.training() && !s.recomputing()) ++counts::effects;
    }
    typename S::act_type y = s.make(x->rows(), x->cols());
    if constexpr (S::computes) evaluate(*y, *x * 1.5);
    return y;
  }
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    typename S::act_type dx = s.reuse_or_make(dy, dy->cols());
    if constexpr (S::computes) evaluate(*dx, *dy * 1.5);
    return dx;
  }
};

constexpr std::size_t W = 16;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 32>, GELU, Dropout<0.25>, Linear<32, W>, counted, Dropout<0.1>>>;
constexpr std::size_t N = 6;

template <class Middle>
using Net = Seq<Linear<8, W>, Middle, Linear<W, 4>>;

struct run_result {
  std::vector<double> losses;
  std::vector<float> params, grads;
  std::uint64_t forwards = 0, effects = 0, recomputed = 0;
};

template <class NetT>
run_result train(int steps = 3) {
  model<NetT> m(seed{7});
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x(24, 8), t(24, 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.11 * double(i)));
  run_result r;
  counts::reset();
  for (int k = 0; k < steps; ++k) {
    r.losses.push_back(m.template train_step<MSE>(x, t, opt));
    r.recomputed += m.last_pass().recomputed;
  }
  r.params = tensor_to_host(m.parameters());
  r.grads = tensor_to_host(m.gradients());
  r.forwards = counts::forwards;
  r.effects = counts::effects;
  return r;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `counted_per_step`: how many of the recomputed forwards run the instrumented layer (all of them
// when every recomputed segment is a block that holds one).
template <class NetT>
void require_same_training_as(run_result const& stored, std::uint64_t recomputed_per_step,
                              std::uint64_t counted_per_step = ~std::uint64_t(0)) {
  if (counted_per_step == ~std::uint64_t(0)) counted_per_step = recomputed_per_step;
  run_result const r = train<NetT>();
  REQUIRE(r.losses.size() == stored.losses.size());
  for (std::size_t k = 0; k < r.losses.size(); ++k) CHECK(r.losses[k] == stored.losses[k]);
  CHECK(same_bits(r.params, stored.params));
  CHECK(same_bits(r.grads, stored.grads));
  // Side effects once per block and step; forwards as the schedule says.
  CHECK(r.effects == stored.effects);
  CHECK(r.recomputed == 3 * recomputed_per_step);
  CHECK(r.forwards == stored.forwards + 3 * counted_per_step);
}

}  // namespace

TEST_CASE("policies: every policy trains bit for bit like the stored model, dropout on", "[policies]") {
  run_result const stored = train<Net<Repeat<N, Block>>>();
  REQUIRE(stored.effects == 3 * N);
  REQUIRE(stored.forwards == 3 * N);
  REQUIRE(stored.losses[2] < stored.losses[0]);

  SECTION("Checkpointed on every block") { require_same_training_as<Net<Repeat<N, Checkpointed<Block>>>>(stored, N); }
  SECTION("Checkpointed around the whole chain") {
    require_same_training_as<Net<Checkpointed<Repeat<N, Block>>>>(stored, N);
  }
  SECTION("CheckpointSequential over the blocks, even and uneven cuts") {
    require_same_training_as<Net<CheckpointSequential<2, Repeat<N, Block>>>>(stored, N);
    require_same_training_as<Net<CheckpointSequential<4, Repeat<N, Block>>>>(stored, N);
    require_same_training_as<Net<CheckpointSequential<N, Repeat<N, Block>>>>(stored, N);
  }
  SECTION("CheckpointSequential with its last run stored (PyTorch's): that run's blocks never run again") {
    // (PyTorch's cut of 6 blocks, 6 / K to each checkpointed run and the rest to the stored last
    // one: 3 + 3; 1 + 1 + 1 + 3; six runs of 1; one run, stored: no recomputation)
    require_same_training_as<Net<CheckpointSequential<2, Repeat<N, Block>, last_run::stored>>>(stored, 3);
    require_same_training_as<Net<CheckpointSequential<4, Repeat<N, Block>, last_run::stored>>>(stored, 3);
    require_same_training_as<Net<CheckpointSequential<N, Repeat<N, Block>, last_run::stored>>>(stored, N - 1);
    require_same_training_as<Net<CheckpointSequential<1, Repeat<N, Block>, last_run::stored>>>(stored, 0);
  }
  SECTION("Revolve with every number of slots") {
    require_same_training_as<Net<Revolve<1, Repeat<N, Block>>>>(stored, revolve::cost(N, 1));
    require_same_training_as<Net<Revolve<2, Repeat<N, Block>>>>(stored, revolve::cost(N, 2));
    require_same_training_as<Net<Revolve<3, Repeat<N, Block>>>>(stored, revolve::cost(N, 3));
    require_same_training_as<Net<Revolve<5, Repeat<N, Block>>>>(stored, revolve::cost(N, 5));
    require_same_training_as<Net<Revolve<9, Repeat<N, Block>>>>(stored, revolve::cost(N, 9));
  }
  SECTION("Selective per block and around the chain") {
    require_same_training_as<Net<Repeat<N, Selective<Block>>>>(stored, N);
    require_same_training_as<Net<Selective<Repeat<N, Block>>>>(stored, N);
  }
  SECTION("Offloaded: per block, around the chain, nested, and inside other policies") {
    require_same_training_as<Net<Repeat<N, Offloaded<Block>>>>(stored, 0);
    require_same_training_as<Net<Offloaded<Repeat<N, Block>>>>(stored, 0);
    require_same_training_as<Net<Offloaded<Repeat<N, Offloaded<Block>>>>>(stored, 0);
    require_same_training_as<Net<Repeat<N, Offloaded<Selective<Block>>>>>(stored, N);
    require_same_training_as<Net<Checkpointed<Repeat<N, Offloaded<Block>>>>>(stored, N);
    require_same_training_as<Net<Revolve<2, Repeat<N, Offloaded<Block>>>>>(stored, revolve::cost(N, 2));
    require_same_training_as<Seq<Offloaded<Linear<8, W>>, Repeat<N, Offloaded<Block>>, Offloaded<Linear<W, 4>>>>(stored, 0);
  }
  SECTION("nested policies") {
    require_same_training_as<Net<Revolve<2, Repeat<N, Checkpointed<Block>>>>>(stored, revolve::cost(N, 2) + N);
    require_same_training_as<Net<Checkpointed<Repeat<N, Checkpointed<Block>>>>>(stored, 2 * N);
    require_same_training_as<Net<Revolve<3, Repeat<N, Selective<Block>>>>>(stored, revolve::cost(N, 3) + N);
    require_same_training_as<Net<Selective<Repeat<N, Checkpointed<Block>>>>>(stored, 2 * N);
  }
}

TEST_CASE("policies: CheckpointSequential on a Seq, and names that do not change", "[policies]") {
  using Layers = Seq<Linear<8, W>, GELU, Dropout<0.2>, LayerNorm<W>, Linear<W, W>, counted, Linear<W, 4>>;
  run_result const stored = train<Layers>();
  require_same_training_as<CheckpointSequential<1, Layers>>(stored, 1, 1);
  require_same_training_as<CheckpointSequential<3, Layers>>(stored, 3, 1);
  require_same_training_as<CheckpointSequential<7, Layers>>(stored, 7, 1);
  // The last run stored, PyTorch's cut: runs of 2, 2 and 3 layers (the counted layer, the sixth, in
  // the stored last one), or 1, 1, 1 and 4 (the even cut, 2, 2, 2 and 1, would run the counted one
  // again), or of one layer each (the counted one in the sixth of seven), or one run.
  require_same_training_as<CheckpointSequential<3, Layers, last_run::stored>>(stored, 2, 0);
  require_same_training_as<CheckpointSequential<4, Layers, last_run::stored>>(stored, 3, 0);
  require_same_training_as<CheckpointSequential<7, Layers, last_run::stored>>(stored, 6, 1);
  require_same_training_as<CheckpointSequential<1, Layers, last_run::stored>>(stored, 0, 0);
  require_same_training_as<Selective<Layers>>(stored, 1, 1);

  auto const a = model<Layers>::parameter_table(), b = model<CheckpointSequential<3, Layers>>::parameter_table();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK((a[i].name == b[i].name && a[i].offset == b[i].offset));
}

TEST_CASE("policies: a checkpointed first segment, whose input needs no gradient, trains its parameters",
          "[policies]") {
  // PyTorch's reentrant checkpoint leaves these parameters without gradients.
  using Stored = Seq<Seq<Linear<8, W>, GELU, Dropout<0.3>, Linear<W, W>>, Linear<W, 4>>;
  using Ckpt = Seq<Checkpointed<Seq<Linear<8, W>, GELU, Dropout<0.3>, Linear<W, W>>>, Linear<W, 4>>;
  run_result const stored = train<Stored>(1), ckpt = train<Ckpt>(1);
  CHECK(same_bits(stored.grads, ckpt.grads));
  std::size_t const first = Linear<8, W>::param_count;
  CHECK(std::any_of(ckpt.grads.begin(), ckpt.grads.begin() + first, [](float g) { return g != 0.0f; }));
}

TEST_CASE("policies: the input gradient through checkpointed segments equals the stored one", "[policies]") {
  auto input_grad = []<class NetT>(NetT*) {
    model<NetT> m(seed{3});
    tensor<float> x(5, 8), t(5, 4), dx(5, 8);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(1.3 * double(i)));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(0.1 * double(i % 7));
    m.template accumulate<MSE>(x, t, 1.0, &dx);
    return dx.to_vector();
  };
  auto const stored = input_grad(static_cast<Net<Repeat<N, Block>>*>(nullptr));
  CHECK(same_bits(stored, input_grad(static_cast<Net<Revolve<2, Repeat<N, Block>>>*>(nullptr))));
  CHECK(same_bits(stored, input_grad(static_cast<Checkpointed<Net<Repeat<N, Block>>>*>(nullptr))));
  CHECK(same_bits(stored, input_grad(static_cast<Net<Repeat<N, Selective<Block>>>*>(nullptr))));
}

// ---- The revolve schedule ----

namespace {

// The fewest advancing block forwards, by exhaustive search over every first split: independent
// of the closed form in revolve.hpp.
std::uint64_t search_cost(std::uint64_t l, std::uint64_t s, std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t>& memo) {
  if (l <= 1) return 0;
  if (s == 1) return l * (l - 1) / 2;
  auto const key = std::make_pair(l, s);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  std::uint64_t best = ~std::uint64_t(0);
  for (std::uint64_t m = 1; m < l; ++m)
    best = std::min(best, m + search_cost(l - m, s - 1, memo) + search_cost(m, s, memo));
  return memo[key] = best;
}

// Plays a schedule on an abstract chain and checks that it is a valid reversal: every block is
// run keeping exactly once, right before its backward; backwards come in reverse order; slots
// never exceed C; advances start from the carried position. Returns the recomputed forwards.
std::uint64_t play(std::vector<revolve::action> const& sched, std::size_t n, std::size_t c) {
  std::vector<std::size_t> slots;
  std::size_t current = 0;  // the block whose input is carried
  bool have = true, in_backward = false;
  std::size_t next_reverse = n;
  std::uint64_t recomputed = 0;
  std::vector<int> taped(n, 0);
  for (auto const& a : sched) {
    switch (a.what) {
      case revolve::op::store:
        REQUIRE(have);
        slots.push_back(current);
        REQUIRE(slots.size() <= c);
        break;
      case revolve::op::advance:
        REQUIRE(have);
        REQUIRE(a.first == current);
        REQUIRE(a.last > a.first);
        current = a.last;
        if (in_backward) recomputed += a.last - a.first;
        break;
      case revolve::op::taped:
        REQUIRE(have);
        REQUIRE(a.first == current);
        ++taped[a.first];
        current = a.first + 1;
        if (in_backward) ++recomputed;
        break;
      case revolve::op::reverse:
        REQUIRE(a.first + 1 == next_reverse);
        REQUIRE(current == a.first + 1);  // its own taped forward just ran
        next_reverse = a.first;
        in_backward = true;
        have = false;
        break;
      case revolve::op::restore:
        REQUIRE(!slots.empty());
        current = slots.back();
        have = true;
        break;
      case revolve::op::drop:
        REQUIRE(!slots.empty());
        slots.pop_back();
        break;
    }
  }
  REQUIRE(next_reverse == 0);
  REQUIRE(slots.empty());
  for (int k : taped) REQUIRE(k == 1);
  return recomputed;
}

}  // namespace

TEST_CASE("revolve: the closed-form cost is the fewest possible, found by exhaustive search", "[policies][revolve]") {
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> memo;
  for (std::uint64_t l = 1; l <= 70; ++l)
    for (std::uint64_t s = 1; s <= 70; ++s) REQUIRE(revolve::cost(l, s) == search_cost(l, s, memo));
}

TEST_CASE("revolve: the schedule for 64 blocks recomputes 200, 137, 110 and 63 block forwards", "[policies][revolve]") {
  static_assert(Revolve<4, Repeat<64, Block>>::recomputed_forwards == 200);
  static_assert(Revolve<8, Repeat<64, Block>>::recomputed_forwards == 137);
  static_assert(Revolve<16, Repeat<64, Block>>::recomputed_forwards == 110);
  static_assert(Revolve<63, Repeat<64, Block>>::recomputed_forwards == 63);
  static_assert(Revolve<64, Repeat<64, Block>>::recomputed_forwards == 63);
  CHECK(play(revolve::schedule_list(64, 4), 64, 4) == 200);
  CHECK(play(revolve::schedule_list(64, 8), 64, 8) == 137);
  CHECK(play(revolve::schedule_list(64, 16), 64, 16) == 110);
  CHECK(play(revolve::schedule_list(64, 63), 64, 63) == 63);
}

TEST_CASE("revolve: every schedule is a valid reversal with the fewest recomputations", "[policies][revolve]") {
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> memo;
  for (std::uint32_t n = 1; n <= 40; ++n)
    for (std::uint32_t c = 1; c <= n + 1; ++c) {
      INFO("N = " << n << ", C = " << c);
      REQUIRE(play(revolve::schedule_list(n, c), n, c) == search_cost(n, c, memo));
    }
}

TEST_CASE("revolve: a 64-block model with 4 slots runs 64 + 200 block forwards per step", "[policies][revolve]") {
  using B = Residual<Seq<Linear<4, 4>, counted>>;
  model<Seq<Revolve<4, Repeat<64, B>>>> m(seed{1});
  tensor<float> x(2, 4), t(2, 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.1f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  counts::reset();
  m.accumulate<MSE>(x, t);
  CHECK(counts::forwards == 64 + 200);
  CHECK(counts::effects == 64);
  CHECK(m.last_pass().recomputed == 200);
}

TEST_CASE("policies: Offloaded out of host memory throws, changes nothing, and training goes on", "[policies][offload]") {
  using NetT = Net<Repeat<N, Offloaded<Block>>>;
  tensor<float> x(24, 8), t(24, 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.11 * double(i)));
  model<NetT> reference(seed{7});
  AdamW reference_opt(reference, {.lr = 1e-2});
  for (int k = 0; k < 2; ++k) reference.train_step<MSE>(x, t, reference_opt);

  memory::caching_allocator<host> alloc;
  offload_allocator_t<host> offloaded;
  model<NetT> m(seed{7}, alloc, offloaded);
  AdamW opt(m, {.lr = 1e-2});
  m.train_step<MSE>(x, t, opt);
  REQUIRE(offloaded.stats()[memory::tag::activations].peak > 0);
  auto const params = tensor_to_host(m.parameters());
  auto const moments = tensor_to_host(opt.exp_avg().view());
  offloaded.release_cached();
  offloaded.set_limit(1024);  // less than one block's tensors
  try {
    m.train_step<MSE>(x, t, opt);
    FAIL("expected remat::out_of_memory");
  } catch (out_of_memory const& e) {
    std::string const what = e.what();
    INFO(what);
    CHECK(what.find("out of memory on host") != std::string::npos);
    CHECK(what.find("of activations") != std::string::npos);
  }
  CHECK(same_bits(tensor_to_host(m.parameters()), params));
  CHECK(same_bits(tensor_to_host(opt.exp_avg().view()), moments));
  CHECK(m.passes() == 1);
  CHECK(alloc.stats()[memory::tag::activations].in_use == 0);  // nothing left behind
  CHECK(offloaded.stats().total.in_use == 0);
  offloaded.set_limit(memory::unlimited);
  m.train_step<MSE>(x, t, opt);  // and training goes on, as if the failed step never ran
  CHECK(same_bits(tensor_to_host(m.parameters()), tensor_to_host(reference.parameters())));
}
