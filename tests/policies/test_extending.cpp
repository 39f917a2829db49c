// Extending remat from outside the library: a storage policy and a matrix-product layer written
// here, against the public vocabulary only (pass/vocabulary.hpp, layers/layer.hpp), work with
// every walk over the graph (RecomputeAttention, the plan), train bit for bit like the stored
// model, and their plans equal the allocator's measured peaks. And every chain of blocks, whatever
// its policy, reports each block's gradients as final when the block is done, as Repeat does.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace remat;

namespace {

// A storage policy of our own: keeps the segment's input and dropout offset, and runs the segment
// again in backward (what Checkpointed does, written from the vocabulary alone).
template <class S>
struct KeepInput : wraps<S> {
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    std::uint64_t const offset = s.rng_offset();
    typename St::act_type y;
    {
      auto const none = s.keep_nothing();
      y = S::forward(s, p, x);
    }
    s.save(std::move(x));
    s.save_counter(offset);
    return y;
  }
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    std::uint64_t const offset = s.restore_counter();
    {
      auto const again = s.recompute_from(offset);
      S::forward(s, p, s.restore()).reset();
    }
    s.count_recomputed(1);
    return S::backward(s, p, g, std::move(dy));
  }
};

// Products that Project below has multiplied (in passes that compute).
std::size_t products_computed = 0;

// A matrix-product layer of our own: y = x W^T, W stored [Out, In]. Its product goes through
// s.product, so Selective keeps it, and a recomputation skips it when not needed, without this
// layer knowing of either.
template <std::size_t In, std::size_t Out>
struct Project {
  static constexpr std::size_t in_width = In, out_width = Out, param_count = In * Out;
  static constexpr bool handles_hollow = true;
  static std::vector<param_desc> params() { return {{"weight", 0, {Out, In}}}; }
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    init::uniform(p, param_count, global_offset, seed, 1.0 / std::sqrt(double(In)));
  }
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    s.save(x);
    return s.product(x->rows(), Out, [&](auto& y) {
      if constexpr (S::computes) {
        ++products_computed;
        kernels::gemm(typename S::device{}, kernels::lhs(x->data(), index_t(x->rows()), In),
                      kernels::rhs(p, Out, In).transposed(), kernels::result(y.data(), index_t(x->rows()), Out));
      }
    });
  }
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    typename S::act_type x = s.restore();
    typename S::act_type dx = s.make(dy->rows(), In);
    if constexpr (S::computes) {
      using D = typename S::device;
      index_t const rows = index_t(dy->rows());
      kernels::gemm(D{}, kernels::lhs(dy->data(), rows, Out).transposed(), kernels::rhs(x->data(), rows, In),
                    kernels::result(g, Out, In), {.beta = 1});  // dW += dy^T x
      kernels::gemm(D{}, kernels::lhs(dy->data(), rows, Out), kernels::rhs(p, Out, In),
                    kernels::result(dx->data(), rows, In));  // dx = dy W
    }
    return dx;
  }
};

static_assert(layer<Project<3, 4>> && layer<KeepInput<Project<3, 4>>>);
static_assert(layer_for<Project<3, 4>, pass_state<float, host>> && layer_for<Project<3, 4>, plan_state<float>>);

constexpr std::size_t W = 16, H = 4;

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct result {
  std::vector<double> losses;
  std::vector<float> params, grads;
  std::size_t peak = 0, saved = 0;
  std::uint64_t recomputed = 0;
};

// Three AdamW steps on a fixed batch of `rows` rows (sequences of `seq` rows for a sequence
// model), with the measured activation peak of the last step.
template <class NetT>
result train(std::size_t rows, std::size_t seq = 1) {
  memory::caching_allocator<host> alloc;
  model<NetT> m(seed{5}, alloc);
  if constexpr (model<NetT>::sequence_model) m.set_sequence_length(seq);
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x{index_t(rows), index_t(NetT::in_width)}, t{index_t(rows), index_t(NetT::out_width)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.31 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.17 * double(i)));
  result r;
  for (int k = 0; k < 3; ++k) {
    alloc.reset_peak();
    r.losses.push_back(m.template train_step<MSE>(x, t, opt));
  }
  r.peak = alloc.stats()[memory::tag::activations].peak;
  r.saved = m.last_pass().saved_bytes;
  r.recomputed = m.last_pass().recomputed;
  r.params = tensor_to_host(m.parameters());
  r.grads = tensor_to_host(m.gradients());
  return r;
}

template <class NetT>
void require_same_as(result const& stored, std::size_t rows, std::size_t seq = 1) {
  result const r = train<NetT>(rows, seq);
  CHECK(r.losses == stored.losses);
  CHECK(same_bits(r.params, stored.params));
  CHECK(same_bits(r.grads, stored.grads));
  constexpr auto plan = activation_plan<NetT>(1);  // (constexpr: the walk runs in the compiler)
  static_assert(plan.peak_bytes > 0);
  auto const p = activation_plan<NetT>(rows / seq, NetT::in_width, seq);
  CHECK(r.peak == p.peak_bytes);
  CHECK(r.saved == p.saved_bytes);
  CHECK(r.recomputed == p.recomputed);
}

}  // namespace

TEST_CASE("extending: a product layer of our own has right gradients and is kept by Selective", "[extending]") {
  using Block = Residual<Seq<LayerNorm<W>, Project<W, 2 * W>, GELU, Project<2 * W, W>>>;
  using Stored = Seq<Project<5, W>, Block, Project<W, 3>>;
  using Kept = Seq<Project<5, W>, Selective<Block>, Project<W, 3>>;
  require_gradients<Stored>({.batch = 3});
  require_gradients<Kept>({.batch = 3});
  result const stored = train<Stored>(24);
  require_same_as<Stored>(stored, 24);
  require_same_as<Kept>(stored, 24);
  // Selective keeps the block's input and the first product (GELU's input), and recomputes the
  // norm and the activation; storing keeps the norm's input and statistics and every layer's input.
  constexpr auto s = activation_plan<Stored>(24), k = activation_plan<Kept>(24);
  static_assert(k.saved_bytes < s.saved_bytes && k.recomputed == 1 && s.recomputed == 0);
}

// Products multiplied per training step (forward, recomputations and backward's forwards; the
// backward's own products are not counted: they do not go through s.product).
template <class NetT>
std::size_t products_per_step(result const& stored, std::size_t rows) {
  products_computed = 0;
  require_same_as<NetT>(stored, rows);  // three steps, bit for bit, plan = measured
  CHECK(products_computed % 3 == 0);
  return products_computed / 3;
}

TEST_CASE("extending: a recomputation multiplies only the products its backward needs", "[extending][policies]") {
  // A product's backward reads its input and weights, not its output; what follows the last
  // product of a branch (the residual add) needs no values when the output is thrown away.
  using Branch = Residual<Seq<LayerNorm<W>, Project<W, 2 * W>, GELU, Project<2 * W, W>>>;
  using Head = Project<5, W>;
  using Tail = Project<W, 3>;
  result const stored = train<Seq<Head, Branch, Tail>>(24);
  CHECK(products_per_step<Seq<Head, Branch, Tail>>(stored, 24) == 4);
  // GELU's input (the first product) is needed again; the second only feeds the residual add.
  CHECK(products_per_step<Seq<Head, Checkpointed<Branch>, Tail>>(stored, 24) == 4 + 1);
  // The same for KeepInput, a policy written without the skip: it multiplies both again.
  CHECK(products_per_step<Seq<Head, KeepInput<Branch>, Tail>>(stored, 24) == 4 + 2);
  // Selective takes the first back and skips the second.
  CHECK(products_per_step<Seq<Head, Selective<Branch>, Tail>>(stored, 24) == 4);

  // Two blocks per checkpointed run: the first block's last product feeds the second block's norm.
  result const chain = train<Seq<Head, Repeat<4, Branch>, Tail>>(24);
  CHECK(products_per_step<Seq<Head, CheckpointSequential<2, Repeat<4, Branch>>, Tail>>(chain, 24) == 10 + 2 * 3);
  CHECK(products_per_step<Seq<Head, Repeat<4, Checkpointed<Branch>>, Tail>>(chain, 24) == 10 + 4 * 1);
  // Nested: the outer recomputation runs the inner segment's forward (both products: the second
  // feeds the next branch) and skips the outer's last product; the inner one recomputes its first.
  result const two = train<Seq<Head, Repeat<2, Branch>, Tail>>(24);
  CHECK(products_per_step<Seq<Head, Checkpointed<Seq<Checkpointed<Branch>, Branch>>, Tail>>(two, 24) == 6 + 3 + 1);
  // A segment that ends in a product: the last one is not needed; one followed by dropout, or by
  // another product that saves its input, is.
  using Plain = Seq<Project<W, W>, Dropout<0.25>, Project<W, W>, Dropout<0.25>>;
  result const plain = train<Seq<Head, Plain, Tail>>(24);
  CHECK(products_per_step<Seq<Head, Checkpointed<Plain>, Tail>>(plain, 24) == 4 + 1);
  // Revolve runs every block forward in full (N + its recomputed block forwards).
  using Rev = Revolve<1, Repeat<4, Branch>>;
  CHECK(products_per_step<Seq<Head, Rev, Tail>>(chain, 24) == 2 + 2 * (4 + Rev::recomputed_forwards));
}

TEST_CASE("extending: a policy of our own trains bit for bit and is planned", "[extending]") {
  using Block = Residual<Seq<LayerNorm<W>, Linear<W, 2 * W>, GELU, Dropout<0.2>, Linear<2 * W, W>>>;
  result const stored = train<Seq<Linear<5, W>, Repeat<3, Block>, Linear<W, 3>>>(24);
  require_same_as<Seq<Linear<5, W>, Repeat<3, KeepInput<Block>>, Linear<W, 3>>>(stored, 24);
  require_same_as<Seq<Linear<5, W>, KeepInput<Repeat<3, Block>>, Linear<W, 3>>>(stored, 24);
  require_same_as<Seq<Linear<5, W>, Revolve<2, Repeat<3, KeepInput<Block>>>, Linear<W, 3>>>(stored, 24);
  require_gradients<Seq<Linear<5, W>, KeepInput<Block>, Linear<W, 3>>>({.batch = 3});
}

TEST_CASE("extending: RecomputeAttention and the graph walks go through a policy of our own", "[extending]") {
  using Block = StoredAttention<GPTBlock<W, H, 0.1>>;  // (GPTBlock's own core keeps no probabilities)
  using Stored = Seq<Linear<5, W>, Block, Linear<W, 3>>;
  using Ours = Seq<Linear<5, W>, KeepInput<Block>, Linear<W, 3>>;
  using Both = RecomputeAttention<Ours>;
  // The rewrite reaches the attention core inside our policy and leaves everything else as it was.
  using Attn = Residual<Seq<LayerNorm<W>, Linear<W, 3 * W>, Checkpointed<AttentionCore<W, H, 0.1>>, Linear<W, W>,
                            Dropout<0.1>>>;
  using Mlp = Residual<Seq<LayerNorm<W>, Linear<W, 4 * W>, GELU, Linear<4 * W, W>, Dropout<0.1>>>;
  static_assert(std::is_same_v<Both, Seq<Linear<5, W>, KeepInput<Seq<Attn, Mlp>>, Linear<W, 3>>>);
  static_assert(std::is_same_v<RecomputeAttention<Revolve<2, Repeat<3, KeepInput<Block>>>>,
                               Revolve<2, Repeat<3, KeepInput<Seq<Attn, Mlp>>>>>);
  // StoredAttention and BlockedAttention swap the cores through our policy too, and RecomputeAttention
  // leaves the blocked core (which keeps no probabilities) as it is.
  using Blocked = Residual<Seq<LayerNorm<W>, Linear<W, 3 * W>, BlockedAttentionCore<W, H, 0.1>, Linear<W, W>,
                               Dropout<0.1>>>;
  using Kept = Residual<Seq<LayerNorm<W>, Linear<W, 3 * W>, AttentionCore<W, H, 0.1>, Linear<W, W>, Dropout<0.1>>>;
  static_assert(std::is_same_v<GPTBlock<W, H, 0.1>, Seq<Blocked, Mlp>> && std::is_same_v<Block, Seq<Kept, Mlp>>);
  static_assert(std::is_same_v<StoredAttention<Revolve<2, Repeat<3, KeepInput<GPTBlock<W, H, 0.1>>>>>,
                               Revolve<2, Repeat<3, KeepInput<Seq<Kept, Mlp>>>>>);
  static_assert(std::is_same_v<BlockedAttention<Revolve<2, Repeat<3, KeepInput<Block>>>>,
                               Revolve<2, Repeat<3, KeepInput<Seq<Blocked, Mlp>>>>>);
  static_assert(std::is_same_v<RecomputeAttention<KeepInput<GPTBlock<W, H, 0.1>>>, KeepInput<Seq<Blocked, Mlp>>>);
  static_assert(is_sequence_model_v<Ours> && is_sequence_model_v<KeepInput<AttentionCore<W, H>>>);
  static_assert(std::is_same_v<first_layer_t<KeepInput<Seq<Embedding<7, W>, Linear<W, W>>>>, Embedding<7, W>>);
  static_assert(reads_ids_v<KeepInput<Seq<Embedding<7, W>, Linear<W, W>>>>);
  static_assert(max_sequence_v<KeepInput<Seq<PositionEmbedding<9, W>, Checkpointed<PositionEmbedding<6, W>>>>> == 6);
  // Attention keeps seq x seq probabilities per head; recomputing them keeps less.
  constexpr auto ours = activation_plan<Ours>(2, 5, 8), both = activation_plan<Both>(2, 5, 8);
  static_assert(both.peak_bytes < ours.peak_bytes);

  result const stored = train<Stored>(16, 8);
  require_same_as<Ours>(stored, 16, 8);
  require_same_as<Both>(stored, 16, 8);
  require_same_as<RecomputeAttention<Stored>>(stored, 16, 8);
}

namespace {

// Records the offsets backward reports as final (gradients from there to the end), as a
// data-parallel wrapper would be told.
struct report_recorder final : detail::gradient_sync {
  std::vector<std::size_t> offsets;
  void check_pass() const override {}
  void pass_starting() override {}
  void gradients_ready(std::size_t offset) override {
    if (offsets.empty() || offsets.back() != offset) offsets.push_back(offset);
  }
  void zeroing_gradients() override {}
  param_range shard() const override { return {}; }
  void finish() override {}
  double agree_squares(double local) override { return local; }
  void after_update(bool) override {}
};

template <class NetT>
std::vector<std::size_t> reported_offsets() {
  model<NetT> m(seed{2});
  report_recorder r;
  m.link().set_gradient_sync(&r);
  tensor<float> x(4, 5), t(4, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.25f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  m.template accumulate<MSE>(x, t);
  m.link().set_gradient_sync(nullptr);
  return r.offsets;
}

}  // namespace

TEST_CASE("every chain of blocks reports each block's gradients when the block is done", "[policies][dist]") {
  // Blocks that are single layers (no Seq inside to report them): only the chain's loop can.
  using B = Residual<Linear<W, W>>;
  constexpr std::size_t first = Linear<5, W>::param_count, block = B::param_count;
  auto const repeat = reported_offsets<Seq<Linear<5, W>, Repeat<5, B>, Linear<W, 3>>>();
  std::vector<std::size_t> expected{first + 5 * block};
  for (std::size_t k = 5; k-- > 0;) expected.push_back(first + k * block);
  expected.push_back(0);
  CHECK(repeat == expected);
  CHECK(reported_offsets<Seq<Linear<5, W>, CheckpointSequential<2, Repeat<5, B>>, Linear<W, 3>>>() == expected);
  CHECK(reported_offsets<Seq<Linear<5, W>, Revolve<1, Repeat<5, B>>, Linear<W, 3>>>() == expected);
  CHECK(reported_offsets<Seq<Linear<5, W>, Revolve<2, Repeat<5, B>>, Linear<W, 3>>>() == expected);
  CHECK(reported_offsets<Seq<Linear<5, W>, Revolve<3, Repeat<5, Checkpointed<B>>>, Linear<W, 3>>>() == expected);
}
