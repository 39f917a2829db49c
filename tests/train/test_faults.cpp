// Allocation failure at every point of a step. The allocator's fault injection
// (caching_allocator::fail_request) fails the k-th request of a train_step, or of an accumulate,
// for every k up to the number of requests that call makes; then:
//  - the call throws out_of_memory naming the size asked for, the phase (and the layer where there
//    is one); or it succeeds, when the request was the planned arena's (the pass then allocates
//    block by block) and memory allowed it;
//  - the parameters, gradients (zero after a failed train_step: its first act clears them),
//    optimizer moments and step, loss scale, running state, dropout stream and pass count are bit
//    for bit what they were before the call, and the allocator's in-use bytes are back where
//    they were;
//  - training goes on (the failed call repeated), and ends bit for bit where a run that never
//    failed ends.
// For the storage policies, a convolutional model with running statistics, a language model, fp32
// and mixed<bfloat16> with a dynamic loss scale, train_step and gradient accumulation (the later
// micro-batches restore their gradients from a copy in the offload allocator, whose requests are
// failed too). The number of failures injected per configuration is printed (tag [faults]).
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace remat;
using remat_test::trainer;

namespace {

constexpr std::size_t W = 16;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 32>, GELU, Dropout<0.25>, Linear<32, W>, Dropout<0.1>>>;
template <class Middle>
using Net = Seq<Linear<8, W>, Middle, Linear<W, 4>>;

constexpr std::size_t C = 3, H = 6;
using ConvNet = Seq<Conv2d<1, C, 3, H, H, 1, 1>, BatchNorm2d<C, H, H>, ReLU,
                    Checkpointed<Residual<Seq<Conv2d<C, C, 3, H, H, 1, 1, false>, BatchNorm2d<C, H, H>, GELU>>>,
                    AvgPool2d<C, H, H>, Linear<C * H * H / 4, 4>>;

constexpr std::size_t V = 11, L = 8;
using LM = Seq<Embedding<V, W>, PositionEmbedding<L, W>, Dropout<0.1>, Repeat<2, Checkpointed<GPTBlock<W, 2, 0.1>>>,
               LayerNorm<W>, Linear<W, V>>;

enum class mode { train_step, accumulate };
constexpr int steps = 2;


// One run: `steps` steps, each a train_step or two micro-batches. Call number `fail_call` (a
// train_step or a micro-batch, from 0) has request `k` of `alloc` failed (k = 0: none); the
// call is checked and then repeated. Returns the final state and, through `requests`, how many
// requests call `fail_call` made (in a run without failure). `arena`: the model's planned arena on.
template <class NetT, class P, class Space>
typename trainer<NetT, P>::snapshot run(mode how, int fail_call, std::size_t k, bool offload, std::size_t* requests,
                                        int* thrown, bool arena) {
  trainer<NetT, P> tr;
  tr.m.use_planned_arena(arena);
  auto& alloc = [&]() -> memory::caching_allocator<Space>& {
    if constexpr (std::is_same_v<Space, host>) {
      if (!offload) return tr.m.allocator();
    }
    return tr.m.offload_allocator();
  }();
  int const calls = how == mode::train_step ? steps : 2 * steps;
  for (int c = 0; c < calls; ++c) {
    auto call = [&] { how == mode::train_step ? tr.train_step(c) : tr.micro_batch(c % 2); };
    if (c != fail_call) {
      call();
      continue;
    }
    auto before = tr.state();
    std::size_t const in_use = alloc.stats().total.in_use;
    std::size_t const first = alloc.stats().requests;
    if (k == 0) {
      call();
      if (requests) *requests = alloc.stats().requests - first;
      continue;
    }
    alloc.fail_request(k);
    bool failed = false;
    try {
      call();
    } catch (out_of_memory const& e) {
      failed = true;
      ++*thrown;
      std::string const what = e.what();
      INFO(what);
      CHECK(what.find("injected") != std::string::npos);
      CHECK(what.find("bytes requested") != std::string::npos);
      bool const phase = what.find("(forward)") != std::string::npos || what.find("(backward)") != std::string::npos ||
                         what.find("(recomputation)") != std::string::npos ||
                         what.find("(loss)") != std::string::npos || what.find("(optimizer)") != std::string::npos;
      CHECK(phase);
    }
    alloc.fail_request(0);
    INFO("request " << k << " of call " << fail_call << (failed ? " failed" : " was the arena's; the call went on"));
    if (failed) {
      auto after = tr.state();
      if (how == mode::train_step)  // train_step's gradients are zero after a failure
        std::fill(before.grads.begin(), before.grads.end(), 0);
      else
        CHECK(after.grads == before.grads);
      after.grads = before.grads;
      CHECK(after == before);
      CHECK(alloc.stats().total.in_use == in_use);
      call();  // resumed
    } else {
      CHECK(alloc.stats().requests - first > 1);  // (it went on after its failed request)
    }
  }
  return tr.state(true);
}

// In the planned arena a step asks the model's allocator for little (the arena when cold, the
// products' scratch: none for small fp32 products), and a refused arena is no failure (the pass
// allocates as it goes); without it every activation is a request. Both are run.
template <class NetT, class P, class Space = host>
void fail_every_request(char const* name, mode how, std::vector<int> const& fail_calls, bool offload = false,
                        bool arena = true) {
  auto const reference = run<NetT, P, Space>(how, -1, 0, offload, nullptr, nullptr, arena);
  std::size_t injected = 0;
  int thrown = 0;
  for (int c : fail_calls) {
    std::size_t requests = 0;
    auto const again = run<NetT, P, Space>(how, c, 0, offload, &requests, nullptr, arena);
    REQUIRE(again == reference);  // (runs are deterministic)
    // (A warm step in the planned arena may ask for nothing: small fp32 products take OpenBLAS,
    // which needs no scratch. The cold one reserves the arena at least.)
    if (!offload && c == 0) REQUIRE(requests > 0);
    for (std::size_t k = 1; k <= requests; ++k) {
      INFO(name << (how == mode::train_step ? ", train_step " : ", micro-batch ") << c << ", request " << k << " of "
                << requests << (offload ? " (offload allocator)" : ""));
      auto const resumed = run<NetT, P, Space>(how, c, k, offload, nullptr, &thrown, arena);
      CHECK(resumed == reference);
      ++injected;
    }
  }
  std::printf("faults: %-44s %-11s %s %s %4zu requests failed, %4d thrown\n", name,
              how == mode::train_step ? "train_step" : "accumulate", offload ? "offload" : "model  ",
              arena ? "arena   " : "no arena", injected, thrown);
  if (offload || !arena) CHECK(thrown > 0);
}

// Calls whose requests are failed: the first (cold: arena, layouts, caches) and a later one, and
// for accumulation the second micro-batch (gradients holding a sum) of the first and a later step.
std::vector<int> const step_calls{0, 1}, micro_calls{0, 1, 3};

template <class NetT, class P>
void both_modes(char const* name) {
  for (bool arena : {true, false}) {
    fail_every_request<NetT, P>(name, mode::train_step, step_calls, false, arena);
    fail_every_request<NetT, P>(name, mode::accumulate, micro_calls, false, arena);
  }
}

}  // namespace

TEST_CASE("allocation failure at every request of a step: storage policies, fp32", "[faults]") {
  both_modes<Net<Repeat<3, Block>>, fp32>("stored");
  both_modes<Net<Repeat<3, Checkpointed<Block>>>, fp32>("Checkpointed blocks");
  both_modes<Net<Revolve<2, Repeat<4, Block>>>, fp32>("Revolve<2> of 4 blocks");
  both_modes<Net<Repeat<3, Selective<Block>>>, fp32>("Selective blocks");
  both_modes<Net<Repeat<3, Offloaded<Block>>>, fp32>("Offloaded blocks");
  both_modes<Net<Budget<24 * 1024, 6, Repeat<4, Block>>>, fp32>("Budget<24 KiB> of 4 blocks");
  // The offload allocator's requests: Offloaded's copies, and accumulate's copy of the gradients.
  fail_every_request<Net<Repeat<3, Offloaded<Block>>>, fp32>("Offloaded blocks", mode::train_step, step_calls, true);
  fail_every_request<Net<Repeat<3, Offloaded<Block>>>, fp32>("Offloaded blocks", mode::accumulate, micro_calls, true);
  fail_every_request<Net<Repeat<3, Block>>, fp32>("stored", mode::accumulate, micro_calls, true);
}

TEST_CASE("allocation failure at every request of a step: mixed<bfloat16> with a dynamic loss scale",
          "[faults]") {
  using P = mixed<bfloat16, DynamicLossScale>;
  both_modes<Net<Repeat<3, Block>>, P>("stored, bf16");
  both_modes<Net<Repeat<3, Checkpointed<Block>>>, P>("Checkpointed blocks, bf16");
  both_modes<Net<Revolve<2, Repeat<4, Block>>>, P>("Revolve<2> of 4 blocks, bf16");
}

TEST_CASE("allocation failure at every request of a step: convolutions with running statistics, a language model",
          "[faults]") {
  both_modes<ConvNet, fp32>("conv + BatchNorm2d, Checkpointed");
  both_modes<LM, fp32>("GPT blocks, Checkpointed");
  both_modes<LM, mixed<bfloat16, DynamicLossScale>>("GPT blocks, Checkpointed, bf16");
  both_modes<StoredAttention<LM>, fp32>("GPT blocks, AttentionCore, Checkpointed");
}

TEST_CASE("accumulate restores summed gradients from its copy, and without the copy its error says they are torn",
          "[faults]") {
  trainer<Net<Repeat<2, Block>>, fp32> tr;
  tr.m.use_planned_arena(false);  // (every activation a request of the allocator's, one to fail)
  auto& a = tr.m.allocator();
  auto& o = tr.m.offload_allocator();
  tr.m.zero_grad();
  tr.accumulate(0);
  // The copy is made in the offload allocator, and given back after the pass; zeroed gradients
  // need none.
  std::size_t const offload_in_use = o.stats().total.in_use, offload_requests = o.stats().requests;
  tr.accumulate(1);
  CHECK(o.stats().requests == offload_requests + 1);
  CHECK(o.stats().total.in_use == offload_in_use);
  tr.m.zero_grad();
  tr.accumulate(0);
  CHECK(o.stats().requests == offload_requests + 1);
  auto const before = tr.state();

  tr.m.set_failure_backup(false);
  CHECK_FALSE(tr.m.failure_backup());
  a.fail_request(3);
  try {
    tr.accumulate(1);
    FAIL("the injected failure did not throw");
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), Catch::Contains("the gradients hold part of this pass's contribution"));
  }
  a.fail_request(0);
  CHECK(tr.m.passes() == before.passes);
  CHECK(o.stats().requests == offload_requests + 1);

  tr.m.set_failure_backup(true);
  tr.m.zero_grad();
  tr.accumulate(0);
  auto const again = tr.state();
  a.fail_request(3);
  try {
    tr.accumulate(1);
    FAIL("the injected failure did not throw");
  } catch (out_of_memory const& e) {
    CHECK_THAT(e.what(), !Catch::Contains("the gradients hold part"));
  }
  a.fail_request(0);
  CHECK(tr.state() == again);
}

TEST_CASE("fail_request fails one request, then none, and 0 disarms", "[faults][memory]") {
  memory::caching_allocator<host> a;
  std::size_t const r0 = a.stats().requests;
  a.fail_request(2);
  void* p = a.allocate(100, memory::tag::workspace);
  CHECK_THROWS_AS(a.allocate(100, memory::tag::workspace), out_of_memory);
  void* q = a.allocate(100, memory::tag::workspace);  // (once)
  CHECK(a.stats().requests == r0 + 3);
  a.fail_request(1);
  CHECK(a.reserve_arena(1024) == nullptr);
  void* arena = a.reserve_arena(1024);
  CHECK(arena != nullptr);
  a.fail_request(1);
  a.fail_request(0);
  void* r = a.allocate(100, memory::tag::workspace);
  CHECK(a.stats().total.in_use == 3 * 256);
  a.deallocate(p);
  a.deallocate(q);
  a.deallocate(r);
  a.release_arena(arena);
  CHECK(a.stats().total.in_use == 0);
  // A request the cache would have served fails too, and counts.
  a.fail_request(1);
  CHECK_THROWS_WITH(a.allocate(100, memory::tag::workspace), Catch::Contains("injected") && Catch::Contains("100 bytes requested"));
}
