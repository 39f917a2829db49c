// The memory timeline: every allocation and free of a step, with its layer path and phase, adding
// up to the allocator's counts; the per-layer summary's kept and peak bytes against the plans; the
// Chrome trace; an out-of-memory error naming the layer, the phase and the plan at that point.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

using namespace remat;

namespace {

constexpr std::size_t W = 8;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, W>, GELU>>;
using Net = Seq<Linear<4, W>, Repeat<2, Checkpointed<Block>>, Linear<W, 3>>;
constexpr std::size_t Batch = 96;

struct fixture {
  memory::caching_allocator<host> alloc;
  model<Net> m{seed{4}, alloc};
  AdamW<float> opt{m};
  tensor<float> x{index_t(Batch), 4};
  tensor<std::int32_t> y{index_t(Batch), 1};
  fixture() {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.5 * double(i)));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
  }
  double step() { return m.train_step<SoftmaxCrossEntropy>(x, y, opt); }
};

bool has(memory::timeline const& t, std::string const& path, memory::phase p, bool allocation = true) {
  for (auto const& e : t.events())
    if (t.paths()[e.path] == path && e.when == p && (e.bytes > 0) == allocation) return true;
  return false;
}

}  // namespace

TEST_CASE("timeline: every allocation of a step, with its layer and phase, adds up to the allocator", "[trace]") {
  fixture f;
  f.step();  // (the allocator's cache warm)
  memory::timeline tl;
  f.alloc.attach(tl);
  f.alloc.reset_peak();
  auto const before = f.alloc.stats();
  {
    auto const on = tl.recording();
    f.step();
  }
  f.step();  // not recorded
  f.alloc.detach();
  auto const after = f.alloc.stats();
  REQUIRE(!tl.events().empty());
  // The sums per tag are what the allocator counts.
  std::array<std::int64_t, memory::tag_count> sum{};
  std::size_t most = 0;
  for (auto const& e : tl.events()) {
    sum[e.tag] += e.bytes;
    most = std::max(most, e.in_use);
    std::size_t total = 0;
    for (std::size_t b : e.in_use_by_tag) total += b;
    CHECK(total == e.in_use);
  }
  for (std::size_t t = 0; t < memory::tag_count; ++t) CHECK(sum[t] == 0);  // a step gives back what it takes
  CHECK(after.total.in_use == before.total.in_use);
  auto const plan = memory_plan<Net, fp32, AdamW, SoftmaxCrossEntropy>(Batch);
  CHECK(most == plan.peak);
  CHECK(tl.events().back().in_use == plan.persistent);
  // Paths and phases: layer 0's output in the forward; block 1's LayerNorm (layer 0 of the
  // residual's Seq) in the forward and again in its recomputation; the head's input gradient in
  // the backward; the loss's per-row values outside layers, in the loss.
  CHECK(has(tl, "0 Linear", memory::phase::forward));
  CHECK(has(tl, "1.1.0 LayerNorm", memory::phase::forward));
  CHECK(has(tl, "1.1.0 LayerNorm", memory::phase::recomputation));
  CHECK(has(tl, "1.0.1 Linear", memory::phase::recomputation));  // (with the GELU fused into it)
  CHECK(has(tl, "2 Linear", memory::phase::backward));
  CHECK(has(tl, "", memory::phase::loss));
  CHECK(!has(tl, "0 Linear", memory::phase::backward));  // the first layer computes no input gradient
  std::set<std::string> span_paths;
  std::size_t recomputed = 0;
  for (auto const& s : tl.spans()) {
    span_paths.insert(tl.paths()[s.path]);
    CHECK(s.end_us >= s.begin_us);
    if (s.when == memory::phase::recomputation) ++recomputed;
  }
  CHECK(span_paths.count("0 Linear") == 1);
  CHECK(span_paths.count("1.0.1 Linear") == 1);
  CHECK(recomputed == 2 * 3);  // each checkpointed block's three layers run again
}

TEST_CASE("timeline: the per-layer summary against the plans", "[trace]") {
  fixture f;
  f.step();
  memory::timeline tl;
  f.alloc.attach(tl);
  {
    auto const on = tl.recording();
    f.step();
  }
  f.alloc.detach();
  auto const s = tl.summarize();
  auto const plan = memory_plan<Net, fp32, AdamW, SoftmaxCrossEntropy>(Batch);
  // What the forward kept, summed over layers, is the plan's saved bytes; what was in use at the
  // peak beyond the persistent buffers is the step's transient peak.
  std::size_t saved = 0, at_peak = 0;
  for (auto const& r : s.layers) {
    saved += r.saved;
    at_peak += r.at_peak;
  }
  CHECK(saved == plan.activations.saved_bytes);
  CHECK(s.peak == plan.peak);
  CHECK(s.start == plan.persistent);
  CHECK(at_peak == plan.peak - plan.persistent);
  // The head keeps nothing of its own making; the first layer's output is kept by the first
  // checkpointed block (96 x 8 floats, 3 KiB).
  for (auto const& r : s.layers) {
    INFO(r.path);
    if (r.path == "0 Linear") {
      CHECK(r.saved == 3072);
      CHECK(r.calls == 1);
    }
    if (r.path == "2 Linear") CHECK(r.saved == 0);
  }
  std::string const table = tl.table();
  CHECK(table.find("1.1.0 LayerNorm") != std::string::npos);
  CHECK(table.find("(outside layers)") != std::string::npos);
}

TEST_CASE("timeline: the Chrome trace holds every event and span", "[trace]") {
  fixture f;
  memory::timeline tl;
  f.alloc.attach(tl);
  {
    auto const on = tl.recording();
    f.step();
  }
  f.alloc.detach();
  std::string const path = "test-timeline-trace.json";
  memory_trace(tl, path);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string const text = ss.str();
  in.close();
  std::remove(path.c_str());  // (the test leaves nothing behind where it ran)
  CHECK(text.rfind("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", 0) == 0);
  CHECK(text.substr(text.size() - 4) == "\n]}\n");
  auto count = [&](std::string const& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("\"ph\": \"C\"") == tl.events().size());
  CHECK(count("\"ph\": \"i\"") == tl.events().size());
  CHECK(count("\"ph\": \"X\"") == tl.spans().size());
  CHECK(count("\"layer\": \"1.1.0 LayerNorm\"") > 0);
  // A path that cannot be written is an io_error.
  CHECK_THROWS_AS(memory_trace(tl, "/nonexistent-directory/trace.json"), io_error);
}

TEST_CASE("timeline: not recording, nothing is kept", "[trace]") {
  fixture f;
  memory::timeline tl;
  f.alloc.attach(tl);
  f.step();
  CHECK(tl.events().empty());
  CHECK(tl.spans().empty());
  f.alloc.detach();
  CHECK(memory::current_phase() == memory::phase::none);
  CHECK(memory::current_layer().empty());
}

TEST_CASE("out of memory names the layer, the phase and the plan at that point", "[trace][errors]") {
  fixture f;
  f.step();
  auto const plan = memory_plan<Net, fp32, AdamW, SoftmaxCrossEntropy>(Batch);
  // The model gives its arena back (so the next step must reserve it again), and the allocator
  // what it caches.
  f.m.use_planned_arena(false);
  f.m.use_planned_arena(true);
  f.alloc.release_cached();
  CHECK(f.alloc.stats().total.reserved == plan.persistent);
  // Room for everything but the last 256 bytes of the step's peak: the arena cannot be had, and
  // the step, allocating as usual, fails where its plan says it needs more.
  f.alloc.set_limit(plan.peak - 256);
  auto const params = tensor_to_host(f.m.parameters());
  try {
    f.step();
    FAIL("the step fitted in less than its planned peak");
  } catch (out_of_memory const& e) {
    std::string const what = e.what();
    INFO(what);
    CHECK(what.find(", in ") != std::string::npos);
    CHECK((what.find("(forward)") != std::string::npos || what.find("(backward)") != std::string::npos ||
           what.find("(recomputation)") != std::string::npos || what.find("(loss)") != std::string::npos));
    CHECK(what.find("the activation plan of this step (batch 96) has ") != std::string::npos);
    CHECK(what.find("its peak is " + memory::format_bytes(plan.activations.peak_bytes)) != std::string::npos);
  }
  CHECK(tensor_to_host(f.m.parameters()) == params);
  CHECK(memory::current_phase() == memory::phase::none);
  f.alloc.set_limit(plan.reserved);
  f.step();  // and trains on when there is room: exactly what the plan reserves
  CHECK(f.m.last_pass().planned);
  CHECK(f.alloc.stats().total.reserved == plan.reserved);
}
