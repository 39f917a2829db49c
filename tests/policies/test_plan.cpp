// The activation plan: constexpr, and equal to the allocator's measured peak of activation bytes
// in a training step, for many models, policies, depths and batch sizes. The allocator rounds
// every request up to 256 bytes and counts rounded bytes; the plan counts the same way.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

using namespace remat;

namespace {

// (The run, for any batch: one body per model, not one per model and batch.)
template <class NetT, class Loss, class P, class Plan>
void require_measured_plan(std::size_t batch, Plan const& plan) {
  INFO("batch " << batch << ", precision " << P::name);
  memory::caching_allocator<host> alloc;
  offload_allocator_t<host> offloaded;  // where Offloaded<S> segments put activations
  model<NetT, host, P> m(seed{11}, alloc, offloaded);
  constexpr std::size_t in = model<NetT>::reads_ids ? 1 : NetT::in_width;
  constexpr std::size_t out = NetT::out_width;
  index_t const rows = index_t(batch);
  tensor<typename model<NetT>::input_element> x(rows, index_t(in));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (model<NetT>::reads_ids)
      x[i] = std::int32_t(i % 5);
    else
      x[i] = float(std::sin(0.7 * double(i)));
  }
  // Evaluated by the compiler (the caller's plan), and again at run time: the same numbers.
  auto const again = activation_plan<NetT, P>(batch);
  CHECK((again.peak_bytes == plan.peak_bytes && again.saved_bytes == plan.saved_bytes &&
         again.recomputed == plan.recomputed && again.offloaded_bytes == plan.offloaded_bytes));
  for (int step = 0; step < 2; ++step) {  // the second step runs from the allocator's cache
    std::size_t const before = alloc.stats()[memory::tag::activations].in_use;
    REQUIRE(before == 0);
    alloc.reset_peak();
    offloaded.reset_peak();
    if constexpr (std::is_same_v<Loss, MSE>) {
      tensor<float> t(rows, index_t(out));
      for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.25f;
      m.template accumulate<MSE>(x, t);
    } else {
      tensor<std::int32_t> labels(rows, 1);
      for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t(i % out);
      m.template accumulate<Loss>(x, labels);
    }
    CHECK(alloc.stats()[memory::tag::activations].peak == plan.peak_bytes);
    CHECK(m.last_pass().activation_peak == plan.peak_bytes);
    CHECK(m.last_pass().saved_bytes == plan.saved_bytes);
    CHECK(m.last_pass().recomputed == plan.recomputed);
    CHECK(offloaded.stats()[memory::tag::activations].peak == plan.offloaded_bytes);
    CHECK(offloaded.stats().total.in_use == 0);  // everything came back
  }
}

template <class NetT, std::size_t Batch, class Loss = MSE, class P = fp32>
void require_plan_matches() {
  constexpr auto plan = activation_plan<NetT, P>(Batch);
  require_measured_plan<NetT, Loss, P>(Batch, plan);
}

template <class NetT, class Loss = MSE, class P = fp32>
void require_plan_matches_for_batches() {
  require_plan_matches<NetT, 1, Loss, P>();
  require_plan_matches<NetT, 3, Loss, P>();
  require_plan_matches<NetT, 64, Loss, P>();
  require_plan_matches<NetT, 129, Loss, P>();
}

constexpr std::size_t W = 32;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 64>, GELU, Dropout<0.1>, Linear<64, W>>>;
using RmsBlock = Residual<Seq<RMSNorm<W>, Linear<W, W>, SiLU, Linear<W, W, false>, Dropout<0.2>>>;

template <class Middle>
using Net = Seq<Linear<12, W>, Middle, Linear<W, 5>>;

}  // namespace

TEST_CASE("plan: hand-computed plans of small models", "[plan]") {
  // One Linear<4, 8>, batch 2. The input is the caller's (read in place, not counted); the output
  // (64 B), its gradient (64 B) and the input gradient (32 B) are each rounded to 256 B. Peak:
  // output gradient and input gradient, the output being freed after the loss: 2 x 256.
  constexpr auto a = activation_plan<Seq<Linear<4, 8>>>(2);
  static_assert(a.peak_bytes == 2 * 256 && a.saved_bytes == 0);
  // Linear<256, 256> fused with ReLU, batch 64: tensors of 64 KiB. The forward keeps the (caller's)
  // input and the pre-activation; with the output and its gradient that is 3 at the peak (the
  // backward writes the activation's gradient over the output gradient, then makes the input
  // gradient, after the output itself was freed).
  constexpr auto b = activation_plan<Seq<Linear<256, 256>, ReLU>>(64);
  static_assert(b.peak_bytes == 3 * 65536 && b.saved_bytes == 65536);
  // The same checkpointed: the forward keeps only the input; the peak is in the backward, where
  // the recomputation holds the pre-activation and its output next to the output gradient.
  constexpr auto c = activation_plan<Checkpointed<Seq<Linear<256, 256>, ReLU>>>(64);
  static_assert(c.saved_bytes == 0 && c.peak_bytes == 3 * 65536 && c.recomputed == 1);
  require_plan_matches<Seq<Linear<4, 8>>, 2>();
  require_plan_matches<Seq<Linear<256, 256>, ReLU>, 64>();
  require_plan_matches<Checkpointed<Seq<Linear<256, 256>, ReLU>>, 64>();
}

TEST_CASE("plan: the plan equals the measured peak for every policy, depth and batch", "[plan]") {
  require_plan_matches_for_batches<Net<Repeat<4, Block>>>();
  require_plan_matches_for_batches<Net<Repeat<4, Checkpointed<Block>>>>();
  require_plan_matches_for_batches<Net<Checkpointed<Repeat<4, Block>>>>();
  require_plan_matches_for_batches<Net<CheckpointSequential<2, Repeat<5, Block>>>>();
  require_plan_matches_for_batches<Net<CheckpointSequential<2, Repeat<5, Block>, last_run::stored>>>();
  require_plan_matches_for_batches<Net<Revolve<1, Repeat<5, Block>>>>();
  require_plan_matches_for_batches<Net<Revolve<2, Repeat<7, Block>>>>();
  require_plan_matches_for_batches<Net<Revolve<3, Repeat<12, Block>>>>();
  require_plan_matches_for_batches<Net<Repeat<4, Selective<Block>>>>();
  require_plan_matches_for_batches<Net<Selective<Repeat<4, Block>>>>();
  require_plan_matches_for_batches<Net<Repeat<3, Offloaded<Block>>>>();
  require_plan_matches_for_batches<Net<Offloaded<Repeat<3, Block>>>>();
  require_plan_matches_for_batches<Net<Offloaded<Seq<Offloaded<Block>, Block, Offloaded<RmsBlock>>>>>();
  require_plan_matches_for_batches<Net<Repeat<4, Offloaded<Selective<Block>>>>>();
  require_plan_matches_for_batches<Net<Checkpointed<Repeat<3, Offloaded<Block>>>>>();
  require_plan_matches_for_batches<Net<Revolve<2, Repeat<5, Offloaded<Block>>>>>();
  require_plan_matches_for_batches<Seq<Offloaded<Linear<12, W>>, Repeat<2, Offloaded<Block>>, Offloaded<Linear<W, 5>>>>();
  require_plan_matches_for_batches<Net<Repeat<3, RmsBlock>>>();
  require_plan_matches_for_batches<Net<Repeat<3, Selective<RmsBlock>>>>();
  require_plan_matches_for_batches<Net<Revolve<2, Repeat<6, Checkpointed<RmsBlock>>>>>();
  require_plan_matches_for_batches<Net<Revolve<2, Repeat<6, Selective<Block>>>>>();
  require_plan_matches_for_batches<CheckpointSequential<3, Seq<Linear<12, W>, GELU, LayerNorm<W>, Dropout<0.3>,
                                                             Linear<W, W>, Tanh, Linear<W, 5>>>>();
  require_plan_matches_for_batches<CheckpointSequential<3,
                                                        Seq<Linear<12, W>, GELU, LayerNorm<W>, Dropout<0.3>,
                                                            Linear<W, W>, Tanh, Linear<W, 5>>,
                                                        last_run::stored>>();
  require_plan_matches_for_batches<Seq<Linear<12, W>, Residual<Seq<Dropout<0.5>>>, Residual<Seq<Dropout<0.0>>>, Linear<W, 5>>>();
}

TEST_CASE("plan: a pass's own activation peak equals the plan when the caller's tensors share the allocator",
          "[plan]") {
  // docs/memory.md's case: the batch lives on the model's allocator, under the activations tag, so
  // the allocator's peak holds it too; last_pass().activation_peak is the pass's own.
  using N = Net<Repeat<3, Checkpointed<Block>>>;
  memory::caching_allocator<host> alloc;
  model<N> m(seed{5}, alloc);
  constexpr auto plan = activation_plan<N, fp32>(16);
  tensor<float> x(16, 12, memory::tag::activations, alloc), t(16, 5, memory::tag::activations, alloc);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::cos(0.3 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  std::size_t const batch_bytes = alloc.stats()[memory::tag::activations].in_use;
  REQUIRE(batch_bytes == 768 + 512);  // 16 x 12 floats (768 bytes) and 16 x 5 (320, rounded up to 512)
  AdamW opt(m, {.lr = 1e-3});
  for (int step = 0; step < 2; ++step) {
    alloc.reset_peak();
    m.train_step<MSE>(x, t, opt);
    CHECK(alloc.stats()[memory::tag::activations].peak == plan.peak_bytes + batch_bytes);
    CHECK(m.last_pass().activation_peak == plan.peak_bytes);
  }
  // Windows nest and stay apart from reset_peak's measurement.
  std::size_t const outer = alloc.open_peak_window(memory::tag::activations);
  {
    tensor<float> a(64, 64, memory::tag::activations, alloc);  // 16 KiB
    std::size_t const inner = alloc.open_peak_window(memory::tag::activations);
    { tensor<float> b(8, 8, memory::tag::activations, alloc); }  // 256 bytes
    CHECK(alloc.close_peak_window(inner) == 256);
    tensor<float> c(8, 8, memory::tag::workspace, alloc);  // another tag: not counted
  }
  CHECK(alloc.close_peak_window(outer) == 16384 + 256);
  CHECK(alloc.close_peak_window(outer) == 0);  // closed already
}

TEST_CASE("plan: models that read token ids, with a classification loss", "[plan]") {
  using Lm = Seq<Embedding<5, W>, Repeat<2, Block>, LayerNorm<W>, Linear<W, 7>>;
  using LmCkpt = Seq<Checkpointed<Seq<Embedding<5, W>, Repeat<2, Block>>>, LayerNorm<W>, Linear<W, 7>>;
  require_plan_matches_for_batches<Lm, SoftmaxCrossEntropy>();
  require_plan_matches_for_batches<LmCkpt, SoftmaxCrossEntropy>();
  using LmOff = Seq<Offloaded<Embedding<5, W>>, Repeat<2, Offloaded<Block>>, LayerNorm<W>, Linear<W, 7>>;
  require_plan_matches_for_batches<LmOff, SoftmaxCrossEntropy>();
}

TEST_CASE("plan: policies trade memory as designed, and a budget is a static_assert", "[plan]") {
  using Deep = Repeat<32, Block>;
  constexpr std::size_t batch = 256;
  constexpr auto stored = activation_plan<Net<Deep>>(batch);
  constexpr auto every = activation_plan<Net<Repeat<32, Checkpointed<Block>>>>(batch);
  constexpr auto sqrt_n = activation_plan<Net<CheckpointSequential<6, Deep>>>(batch);
  constexpr auto rev = activation_plan<Net<Revolve<4, Deep>>>(batch);
  constexpr auto sel = activation_plan<Net<Repeat<32, Selective<Block>>>>(batch);
  static_assert(every.saved_bytes < stored.saved_bytes / 4);
  static_assert(rev.saved_bytes < every.saved_bytes && rev.peak_bytes < every.peak_bytes);
  static_assert(sqrt_n.peak_bytes < stored.peak_bytes);
  static_assert(sel.saved_bytes < stored.saved_bytes && sel.recomputed == 32);
  static_assert(rev.recomputed == revolve::cost(32, 4));
  static_assert(stored.peak_bytes <= (std::size_t(64) << 20), "a 32-block model at batch 256 fits 64 MiB");
  // One block's tensors of width 32 at batch 256 are 32 KiB; storing keeps, per block, the norm's
  // input (32 KiB) and statistics (1 KiB each), the first product's input (32 KiB) and
  // pre-activation (64 KiB), and the second product's input (64 KiB).
  constexpr std::size_t per_block = 32768 + 2 * 1024 + 32768 + 65536 + 65536;
  static_assert(stored.saved_bytes == 32 * per_block + 32768);  // + the last Linear's input
  CHECK(every.saved_bytes == 32 * 32768 + 32768);
  // Selective keeps the block's input and the first product's pre-activation: 96 of 226 KiB.
  static_assert(sel.saved_bytes == 32 * (32768 + 65536) + 32768);
}

TEST_CASE("plan: mixed precision keeps activations in the compute type, and the plan equals the measured peak",
          "[plan][mixed]") {
  using bf = mixed<bfloat16>;
  using hf = mixed<half, DynamicLossScale>;
  require_plan_matches_for_batches<Net<Repeat<4, Block>>, MSE, bf>();
  require_plan_matches_for_batches<Net<Repeat<4, Checkpointed<Block>>>, MSE, bf>();
  require_plan_matches_for_batches<Net<Revolve<2, Repeat<7, Block>>>, MSE, hf>();
  require_plan_matches_for_batches<Net<Repeat<4, Selective<Block>>>, MSE, bf>();
  require_plan_matches_for_batches<Net<Repeat<3, Selective<RmsBlock>>>, MSE, hf>();
  require_plan_matches_for_batches<Net<CheckpointSequential<2, Repeat<5, Block>>>, MSE, hf>();
  using Lm = Seq<Embedding<5, W>, Repeat<2, Block>, LayerNorm<W>, Linear<W, 7>>;
  require_plan_matches_for_batches<Lm, SoftmaxCrossEntropy, bf>();
  require_plan_matches_for_batches<Net<Repeat<3, Offloaded<Block>>>, MSE, bf>();
  require_plan_matches_for_batches<Net<Repeat<3, Offloaded<Selective<RmsBlock>>>>, MSE, hf>();

  // The saved activations halve, exactly: every kept tensor is 16-bit except LayerNorm's two
  // statistics per row (fp32 in both, 1 KiB each at batch 256), and the mixed model keeps its input
  // converted to bf16 (256 x 12 x 2 bytes) where the fp32 model reads the caller's in place.
  using Big = Net<Repeat<8, Block>>;
  constexpr auto f32 = activation_plan<Big, fp32>(256);
  constexpr auto b16 = activation_plan<Big, bf>(256);
  constexpr auto h16 = activation_plan<Big, hf>(256);
  static_assert(b16.saved_bytes == h16.saved_bytes && b16.peak_bytes == h16.peak_bytes);
  static_assert(2 * b16.saved_bytes == f32.saved_bytes + 8 * 2 * 1024 + 2 * (256 * 12 * 2));
  static_assert(10 * b16.peak_bytes <= 6 * f32.peak_bytes);
  CHECK(b16.saved_bytes < f32.saved_bytes);
}

TEST_CASE("plan: Offloaded keeps two segments on the device, whatever the depth", "[plan][offload]") {
  // N blocks of Linear<256, 256> fused with ReLU at batch 64: every tensor is 64 KiB (one unit).
  // Block k keeps its input y(k-1) and pre-activation z(k); the first block's input is the
  // caller's (not counted, not moved). Offloaded moves each block's kept tensors off the device
  // once the next block's forward is done, and brings them back one block ahead in backward; the
  // last block's stay. Forward, before block k >= 2 settles block k-1: y(k-2), z(k-1), y(k-1) and
  // block k's z(k), y(k): 5 units. Backward of the last block: its input y(N-2), the output
  // gradient (overwritten by z(N-1)'s, after which z(N-1) goes), the block before's y(N-3), z(N-2)
  // fetched ahead, and the input gradient: 5 units. Stored: 2N kept, and the output gradient.
  // Host memory holds every kept tensor but the caller's input: 2N - 1 units at the end of forward.
  constexpr std::size_t unit = 64 * 256 * 4;
  using B = Seq<Linear<256, 256>, ReLU>;
  constexpr auto stored = activation_plan<Repeat<8, B>>(64);
  constexpr auto off8 = activation_plan<Repeat<8, Offloaded<B>>>(64);
  constexpr auto off16 = activation_plan<Repeat<16, Offloaded<B>>>(64);
  static_assert(off8.peak_bytes == 5 * unit && off16.peak_bytes == 5 * unit);
  static_assert(off8.offloaded_bytes == (2 * 8 - 1) * unit && off16.offloaded_bytes == (2 * 16 - 1) * unit);
  static_assert(stored.offloaded_bytes == 0 && stored.peak_bytes == (2 * 8 + 1) * unit);
  // What the forward leaves on the device: the last block's input and pre-activation.
  static_assert(off8.saved_bytes == 2 * unit);
  require_plan_matches<Repeat<8, Offloaded<B>>, 64>();
  require_plan_matches<Repeat<8, B>, 64>();
}
