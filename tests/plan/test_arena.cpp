// The planned arena: its layout is valid (no two tensors alive at once share a byte) and meets
// the lower bound (the most bytes alive at once, counted here by a sweep of its own); the
// allocator serves it only where nothing live is; training in it is bit for bit training without
// it, and reserves exactly the plan.
#include <remat/remat.hpp>

#include "support/plan_models.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

using namespace remat;

namespace {

using plan_models::Block;
using plan_models::Net;
template <class B>
using CheckpointedRepeat = Checkpointed<B>;

// Checks the layout of a pass against the pass's own record of lifetimes.
template <class N, class P = fp32>
void require_valid_layout(std::size_t batch, std::size_t sequence = 1, std::size_t workspace = 0) {
  INFO("batch " << batch << " x " << sequence << ", workspace " << workspace);
  planning::counter mem;
  auto const pass = detail::plan_pass_into<N, P>(mem, batch, N::in_width, sequence, input_gradient::none, workspace);
  arena_layout const l = detail::lay_out(mem);
  struct interval {
    std::size_t offset, bytes, born, died;
  };
  std::vector<interval> all;
  REQUIRE(l.offset.size() == mem.made);
  for (std::size_t k = 0; k < mem.made; ++k) {
    planning::buffer const& b = mem.buffers[std::size_t(mem.made_ids[k])];
    CHECK(l.bytes[k] == b.bytes);
    all.push_back({l.offset[k], b.bytes, b.born, std::min(b.died, mem.clock)});
  }
  if (workspace) {
    CHECK(l.workspace_bytes == memory::caching_allocator<host>::rounded(workspace));
    all.push_back({l.workspace_offset, l.workspace_bytes, mem.workspace_born, mem.workspace_died});
  }
  std::size_t overlaps = 0, top = 0;  // (every pair: independent of the layout's own bookkeeping)
  for (std::size_t i = 0; i < all.size(); ++i) {
    top = std::max(top, all[i].offset + all[i].bytes);
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      bool const together = all[i].born < all[j].died && all[j].born < all[i].died;
      bool const shared = all[i].offset < all[j].offset + all[j].bytes && all[j].offset < all[i].offset + all[i].bytes;
      if (together && shared) ++overlaps;
    }
  }
  CHECK(overlaps == 0);
  CHECK(top == l.size);
  // The lower bound: the plan's own peak of activations and workspace together.
  CHECK(l.lower_bound == pass.transient_peak);
  CHECK(l.size == l.lower_bound);
}

template <class N, class P = fp32, class Loss = MSE>
std::vector<float> train(bool arena, std::size_t batch, int steps, memory::caching_allocator<host>& alloc) {
  model<N, host, P> m(seed{5}, alloc);
  m.use_planned_arena(arena);
  AdamW opt(m, {.lr = 1e-3});
  tensor<float> x{index_t(batch), index_t(N::in_width)};
  tensor<float> t{index_t(batch), index_t(N::out_width)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f * float(i % 3);
  for (int s = 0; s < steps; ++s) {
    m.template train_step<Loss>(x, t, opt);
    CHECK(m.last_pass().planned == arena);
    CHECK(m.last_pass().unplanned == 0);
  }
  return tensor_to_host(m.parameters());
}

}  // namespace

TEST_CASE("arena: layouts are valid and meet the lower bound", "[plan][arena]") {
  for (std::size_t batch : {1, 7, 64, 129}) {
    require_valid_layout<Net<Repeat<3, Block>>>(batch);
    require_valid_layout<Net<Repeat<3, Checkpointed<Block>>>>(batch);
    require_valid_layout<Net<Revolve<2, Repeat<5, Block>>>>(batch);
    require_valid_layout<Net<Revolve<3, Repeat<8, Block>>>>(batch);
    require_valid_layout<Net<Repeat<3, Selective<Block>>>>(batch);
    require_valid_layout<Net<CheckpointSequential<2, Repeat<4, Block>>>, mixed<bfloat16>>(batch);
    require_valid_layout<Net<Repeat<2, Block>>>(batch, 1, batch * 4);
    require_valid_layout<GPT<11, 16, 16, 2, 2, 0.1>>(batch, 3, batch * 12);
    require_valid_layout<StoredAttention<GPT<11, 16, 16, 2, 2, 0.1>>>(batch, 3, batch * 12);
    require_valid_layout<GPT<11, 16, 16, 2, 2, 0.1, CheckpointedRepeat>, mixed<bfloat16>>(batch, 3, batch * 12);
  }
  require_valid_layout<GPT<64, 128, 64, 4, 4, 0.1, CheckpointedRepeat>>(8, 64, 8 * 64 * 4);
  // A constant expression: the arena of a checkpointed chain is its peak.
  constexpr auto a = arena_plan<Net<Repeat<3, Checkpointed<Block>>>>(64);
  static_assert(a.bytes == a.lower_bound && a.bytes == activation_plan<Net<Repeat<3, Checkpointed<Block>>>>(64).peak_bytes);
}

TEST_CASE("arena: the allocator serves it only where nothing live is", "[plan][arena]") {
  memory::caching_allocator<host> alloc;
  void* base = alloc.reserve_arena(1000);  // rounded to 1024
  REQUIRE(base != nullptr);
  auto s = alloc.stats();
  CHECK(s.arena == 1024);
  CHECK(s[memory::tag::activations].reserved == 1024);
  CHECK(s.total.in_use == 0);
  void* a = alloc.allocate_at(base, 0, 512, memory::tag::activations);
  CHECK(a == base);
  CHECK(alloc.allocate_at(base, 256, 256, memory::tag::activations) == nullptr);  // overlaps a
  CHECK(alloc.allocate_at(base, 768, 512, memory::tag::activations) == nullptr);  // past the end
  void* b = alloc.allocate_at(base, 512, 300, memory::tag::workspace);             // rounded to 512
  CHECK(b == static_cast<char*>(base) + 512);
  s = alloc.stats();
  CHECK(s[memory::tag::activations].in_use == 512);
  CHECK(s[memory::tag::workspace].in_use == 512);
  CHECK(s[memory::tag::workspace].reserved == 0);
  CHECK(s.planned == 2);
  alloc.deallocate(a);
  CHECK(alloc.allocate_at(base, 256, 256, memory::tag::activations) != nullptr);  // free now
  // plan_next: the next request of that tag and size comes from the arena; others do not.
  alloc.plan_next(base, 0, 256, memory::tag::workspace);
  void* other = alloc.allocate(256, memory::tag::activations);
  CHECK(other != base);
  void* planned = alloc.allocate(200, memory::tag::workspace);
  CHECK(planned == base);
  void* after = alloc.allocate(200, memory::tag::workspace);  // used once only
  CHECK(after != base);
  // An arena given back while blocks are live goes when the last one does.
  alloc.release_arena(base);
  CHECK(alloc.stats().arena == 1024);
  CHECK(alloc.allocate_at(base, 768, 256, memory::tag::activations) == nullptr);  // no new blocks
  alloc.deallocate(b);
  alloc.deallocate(planned);
  CHECK(alloc.stats().arena == 1024);
  alloc.deallocate(static_cast<char*>(base) + 256);
  CHECK(alloc.stats().arena == 0);
  alloc.deallocate(other);
  alloc.deallocate(after);
  CHECK(alloc.stats().total.in_use == 0);
  // An arena past the limit is refused, and nothing changes.
  alloc.set_limit(4096);
  auto const before = alloc.stats().total.reserved;
  CHECK(alloc.reserve_arena(8192) == nullptr);
  CHECK(alloc.stats().total.reserved <= before);
}

TEST_CASE("arena: training in it is bit for bit training without it, and reserves the plan", "[plan][arena]") {
  using N = Net<Repeat<3, Checkpointed<Block>>>;
  memory::caching_allocator<host> with, without;
  CHECK(train<N>(true, 33, 3, with) == train<N>(false, 33, 3, without));
  using R = Net<Revolve<2, Repeat<5, Block>>>;
  CHECK(train<R, mixed<bfloat16>>(true, 20, 2, with) == train<R, mixed<bfloat16>>(false, 20, 2, without));
  // Without it the caching allocator reserves more than the plan (blocks cached per size).
  memory::caching_allocator<host> a, b;
  train<N>(true, 64, 2, a);
  train<N>(false, 64, 2, b);
  auto const plan = memory_plan<N, fp32, AdamW>(64);
  CHECK(a.stats().total.peak == plan.peak);
  CHECK(b.stats().total.peak == plan.peak);
  CHECK(b.stats()[memory::tag::activations].reserved > plan.arena);
}

TEST_CASE("arena: one per batch shape, grown when a larger one comes", "[plan][arena]") {
  using N = Net<Repeat<2, Block>>;
  memory::caching_allocator<host> alloc;
  model<N> m(seed{1}, alloc);
  SGD opt(m, {.lr = 1e-2});
  std::size_t largest = 0;
  for (std::size_t batch : {16, 64, 16, 8}) {
    largest = std::max(largest, batch);
    tensor<float> x(index_t(batch), 12), t(index_t(batch), 5);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::cos(0.1 * double(i)));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
    alloc.reset_peak();
    m.train_step<MSE>(x, t, opt);
    CHECK(m.last_pass().planned);
    CHECK(m.last_pass().unplanned == 0);
    // Held at the largest batch's so far.
    CHECK(m.arena_bytes() == memory_plan<N, fp32, SGD>(largest).arena);
    CHECK(alloc.stats()[memory::tag::activations].peak == memory_plan<N, fp32, SGD>(batch).activations.peak_bytes);
    CHECK(alloc.stats().arena == m.arena_bytes());
  }
  m.use_planned_arena(false);
  CHECK(alloc.stats().arena == 0);
}
