// The budget sweep: the residual MLP of bench/policies.cpp (d = 1024, 16 blocks, batch 256, fp32,
// AdamW) trained under the budget policy's choice for budgets from the smallest feasible to the
// stored peak, beside the hand-chosen policies, in one run. Each row: the budget, what the policy
// chose, the planned and measured activation peak, the recomputed work in the cost model
// (policy/budget.hpp) and the median step time relative to the stored model measured in the same
// run (these machines are shared; ratios, not absolute times, carry over).
//
//   bench_budget [--budgets 12] [--steps 3] [--warmup 1] [--blocks 16] [--batch 256]
//
// A budget's row runs the budget policy's code (detail::budget_runner) with the choice made at run
// time, as the compile-time Budget<Bytes, Batch, S> runs it with the choice made by the compiler
// (tests/plan/test_budget.cpp checks both against each other and against the stored model, bit for
// bit): one model type measures every budget. Prints a markdown table and `json: ` lines.
#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t D = 1024, N = 16, Out = 16;
using Block = Residual<Seq<LayerNorm<D>, Linear<D, D>, GELU, Linear<D, D>>>;
template <class Middle>
using Net = Seq<Middle, Linear<D, Out>>;
using Chain = Net<Repeat<N, Block>>;
using Runner = detail::budget_runner<Chain>;

budget_choice current{};
struct RunChoice : wraps<Chain> {
  template <class St>
  static typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Chain::forward(s, p, std::move(x));
    return Runner::forward(s, p, std::move(x), current, schedule().data(), schedule().size());
  }
  template <class St>
  static typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                        typename St::act_type dy) {
    return Runner::backward(s, p, g, std::move(dy), current, schedule().data(), schedule().size());
  }
  static std::vector<revolve::action>& schedule() {
    static std::vector<revolve::action> s;
    return s;
  }
  static void choose(budget_choice c) {
    current = c;
    schedule() = c.kind == budget_choice::revolve ? revolve::schedule_list(std::uint32_t(N), c.slots)
                                                  : std::vector<revolve::action>{};
  }
};

constexpr std::size_t root(std::size_t n) {
  std::size_t r = 1;
  while ((r + 1) * (r + 1) <= n) ++r;
  return (n - r * r > r) ? r + 1 : r;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct measured {
  double step_s = 0;
  std::size_t peak = 0;
  std::size_t planned = 0;
  std::size_t reserved = 0;  // activations and workspace reserved after the last step
  std::size_t unplanned = 0;
};

template <class NetT>
measured run(std::size_t batch, int steps, int warmup, bool arena = true) {
  memory::caching_allocator<host> alloc;
  model<NetT> m(seed{1}, alloc);
  m.use_planned_arena(arena);
  AdamW opt(m, {.lr = 1e-4});
  auto x = tensor<float>(index_t(batch), index_t(D));
  auto t = tensor<float>(index_t(batch), index_t(Out));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(2.0 * philox::uniform(3, 0, i) - 1.0);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(2.0 * philox::uniform(3, 1, i) - 1.0);
  std::vector<double> times;
  measured r;
  for (int k = 0; k < warmup + steps; ++k) {
    alloc.reset_peak();
    double const t0 = now();
    m.template train_step<MSE>(x, t, opt);
    if (k >= warmup) times.push_back(now() - t0);
    r.peak = std::max(r.peak, alloc.stats()[memory::tag::activations].peak);
    r.unplanned += m.last_pass().unplanned;
  }
  r.reserved = alloc.stats()[memory::tag::activations].reserved + alloc.stats()[memory::tag::workspace].reserved;
  std::sort(times.begin(), times.end());
  r.step_s = times[times.size() / 2];
  return r;
}

std::string describe(budget_choice const& c) {
  char buf[96];
  if (c.kind == budget_choice::revolve)
    std::snprintf(buf, sizeof buf, "revolve, %u slots", c.slots);
  else if (c.checkpointed == 0 && c.selective == 0)
    std::snprintf(buf, sizeof buf, "stored");
  else
    std::snprintf(buf, sizeof buf, "%u checkpointed, %u selective, %u stored", c.checkpointed, c.selective,
                  unsigned(N) - c.checkpointed - c.selective);
  return buf;
}

double mib(std::size_t b) {
  return double(b) / double(1 << 20);
}

// The planned arena against the caching allocator, per policy: what each reserves for activations
// and workspace beside the plan's peak, the step time in interleaved rounds (median), and the time
// to compute the layout (once per batch shape).
template <class NetT>
void arena_row(char const* name, std::size_t batch, int steps, int rounds) {
  std::vector<double> with, without;
  measured a{}, c{};
  for (int r = 0; r < rounds; ++r) {
    a = run<NetT>(batch, steps, 1, true);
    c = run<NetT>(batch, steps, 1, false);
    with.push_back(a.step_s);
    without.push_back(c.step_s);
  }
  std::sort(with.begin(), with.end());
  std::sort(without.begin(), without.end());
  double const ta = with[with.size() / 2], tc = without[without.size() / 2];
  double const t0 = now();
  arena_layout const l = detail::plan_arena<NetT, fp32>(batch, D, 1, input_gradient::none, 0);
  double const layout_s = now() - t0;
  std::printf("| %s | %.2f | %.2f | %.2f (+%.1f%%) | %zu | %.3fx | %.2f ms |\n", name, mib(l.lower_bound),
              mib(a.reserved), mib(c.reserved), 100.0 * (double(c.reserved) / double(l.lower_bound) - 1.0),
              a.unplanned, ta / tc, 1e3 * layout_s);
  std::printf(
      "json: {\"library\": \"remat\", \"kind\": \"arena\", \"policy\": \"%s\", \"planned_peak_bytes\": %zu, "
      "\"arena_bytes\": %zu, \"reserved_arena_bytes\": %zu, \"reserved_caching_bytes\": %zu, \"unplanned\": %zu, "
      "\"step_s_arena\": %.6f, \"step_s_caching\": %.6f, \"layout_s\": %.6f, \"activations\": %zu, \"batch\": %zu}\n",
      name, l.lower_bound, l.size, a.reserved, c.reserved, a.unplanned, ta, tc, layout_s, l.offset.size(), batch);
  std::fflush(stdout);
}

// What the memory timeline costs: the stored model's step with no timeline attached, attached but
// not recording, and recording, in interleaved rounds (median of each); and the layer frames every
// step keeps whether or not anything records (ns per layer call, timed alone, times the calls of a
// step, against the step).
void timeline_cost(std::size_t batch, int rounds) {
  memory::caching_allocator<host> alloc;
  model<Chain> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-4});
  auto x = tensor<float>(index_t(batch), index_t(D));
  auto t = tensor<float>(index_t(batch), index_t(Out));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(2.0 * philox::uniform(3, 0, i) - 1.0);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(2.0 * philox::uniform(3, 1, i) - 1.0);
  memory::timeline tl;
  m.train_step<MSE>(x, t, opt);  // warm
  std::vector<double> off, attached, on;
  std::size_t spans = 0, events = 0;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    m.train_step<MSE>(x, t, opt);
    off.push_back(now() - t0);
    alloc.attach(tl);
    t0 = now();
    m.train_step<MSE>(x, t, opt);
    attached.push_back(now() - t0);
    tl.clear();
    t0 = now();
    {
      auto const recording = tl.recording();
      m.train_step<MSE>(x, t, opt);
    }
    on.push_back(now() - t0);
    spans = tl.spans().size();
    events = tl.events().size();
    alloc.detach();
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The frame alone: push and pop a leaf layer's frame, many times.
  constexpr int frames = 1 << 22;
  double const f0 = now();
  for (int i = 0; i < frames; ++i) {
    memory::tracing::layer_scope const frame(std::uint32_t(i), &memory::tracing::type_name<Block>, true,
                                             memory::phase::forward);
    asm volatile("" ::: "memory");
  }
  double const frame_ns = (now() - f0) / frames * 1e9;
  // Each leaf layer call pushes a frame in the forward and one in the backward (spans count the
  // calls of leaves; composites push theirs too: counted as many again).
  double const frame_share = double(2 * spans) * frame_ns * 1e-9 / med(off);
  std::printf("\nThe memory timeline's cost on the stored model (median of %d interleaved rounds):\n\n", rounds);
  std::printf("| timeline | step time | relative |\n|---|---:|---:|\n");
  std::printf("| none attached | %.3f s | 1.000x |\n", med(off));
  std::printf("| attached, not recording | %.3f s | %.3fx |\n", med(attached), med(attached) / med(off));
  std::printf("| recording (%zu events, %zu layer spans) | %.3f s | %.3fx |\n", events, spans, med(on), med(on) / med(off));
  std::printf("\nLayer frames, kept whether or not anything records: %.1f ns per frame, about %zu a step: %.4f%% of a step.\n",
              frame_ns, 2 * spans, 100.0 * frame_share);
  std::printf("json: {\"library\": \"remat\", \"kind\": \"timeline_cost\", \"off_s\": %.6f, \"attached_s\": %.6f, "
              "\"recording_s\": %.6f, \"events\": %zu, \"spans\": %zu, \"frame_ns\": %.2f, \"frame_share\": %.8f, "
              "\"blocks\": %zu, \"batch\": %zu, \"width\": %zu}\n",
              med(off), med(attached), med(on), events, spans, frame_ns, frame_share, N, batch, D);
}

}  // namespace

int main(int argc, char** argv) {
  int budgets = 12, steps = 3, warmup = 1;
  std::size_t batch = 256;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--budgets")
      budgets = next();
    else if (a == "--steps")
      steps = next();
    else if (a == "--warmup")
      warmup = next();
    else if (a == "--batch")
      batch = std::size_t(next());
    else {
      std::fprintf(stderr, "usage: %s [--budgets B] [--steps S] [--warmup W] [--batch B]\n", argv[0]);
      return 2;
    }
  }
  if (budgets < 2 || steps < 1 || batch < 1) return 2;
  auto const all = Runner::candidates<float>(batch, 1);
  std::size_t const lowest = Runner::smallest_peak(all);
  std::size_t const stored_peak = all[0].peak;
  std::uint64_t const stored_work = all[0].work;
  measured const stored = run<Chain>(batch, steps, warmup);
  std::printf("# The budget policy's choice per activation budget, %zu blocks of width %zu, batch %zu, fp32, AdamW\n\n",
              N, D, batch);
  std::printf(
      "Step time relative to the stored model (%.3f s a step in this run). Recomputed work: the cost\n"
      "model's (policy/budget.hpp), as a fraction of the stored step's counted work (its forward's\n"
      "multiply-adds and one per element made in the step: about one forward).\n\n",
      stored.step_s);
  std::printf(
      "| budget (MiB) | chosen storage | planned peak (MiB) | measured peak (MiB) | recomputed work | step time |\n");
  std::printf("|---:|---|---:|---:|---:|---:|\n");
  auto row = [&](char const* label, std::size_t budget, budget_choice const& c, measured const& m) {
    double const extra = double(c.work - stored_work) / double(stored_work);
    std::printf("| %s | %s | %.1f | %.1f | +%.1f%% | %.3fx |\n", label, describe(c).c_str(), mib(c.peak), mib(m.peak),
                100.0 * extra, m.step_s / stored.step_s);
    std::printf(
        "json: {\"library\": \"remat\", \"kind\": \"budget\", \"row\": \"%s\", \"budget_bytes\": %zu, "
        "\"choice\": \"%s\", \"planned_peak_bytes\": %zu, \"peak_activation_bytes\": %zu, "
        "\"recomputed_work_fraction\": %.6f, \"step_s\": %.6f, \"stored_step_s\": %.6f, \"blocks\": %zu, "
        "\"batch\": %zu, \"width\": %zu}\n",
        budget ? "budget" : label, budget, describe(c).c_str(), c.peak, m.peak, extra, m.step_s, stored.step_s, N,
        batch, D);
    std::fflush(stdout);
  };
  budget_choice previous{};
  measured last{};
  for (int i = 0; i < budgets; ++i) {
    std::size_t const bytes = lowest + (stored_peak - lowest) * std::size_t(i) / std::size_t(budgets - 1);
    budget_choice const c = Runner::cheapest(all, bytes);
    if (i == 0 || !(c == previous)) {
      RunChoice::choose(c);
      last = run<RunChoice>(batch, steps, warmup);
    }
    previous = c;
    char label[32];
    std::snprintf(label, sizeof label, "%.1f", mib(bytes));
    row(label, bytes, c, last);
  }
  // The hand-chosen policies, each also a candidate of the budget policy (same plan, same code).
  auto hand = [&]<class NetT>(char const* name, budget_choice c) {
    measured const m = run<NetT>(batch, steps, warmup);
    for (auto const& k : all)
      if (k.kind == c.kind && k.checkpointed == c.checkpointed && k.selective == c.selective && k.slots == c.slots)
        c = k;
    row(name, 0, c, m);
  };
  std::printf("\nHand-chosen policies in the same run:\n\n");
  std::printf("| policy | storage | planned peak (MiB) | measured peak (MiB) | recomputed work | step time |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  hand.template operator()<Net<Repeat<N, Checkpointed<Block>>>>("Checkpointed every block", {.checkpointed = N});
  hand.template operator()<Net<Repeat<N, Selective<Block>>>>("Selective every block", {.selective = N});
  hand.template operator()<Net<Revolve<root(N), Repeat<N, Block>>>>("Revolve<4>",
                                                                    {.kind = budget_choice::revolve, .slots = root(N)});
  hand.template operator()<Net<Revolve<1, Repeat<N, Block>>>>("Revolve<1>",
                                                              {.kind = budget_choice::revolve, .slots = 1});
  measured const stored_again = run<Chain>(batch, steps, warmup);
  std::printf("\nThe stored model again at the end: %.3fx of its first time (the machine's drift over the run).\n",
              stored_again.step_s / stored.step_s);
  std::printf(
      "\nThe planned arena (activations and workspace at offsets computed from the plan) against the caching\n"
      "allocator alone: bytes reserved for activations and workspace after the steps, step time (median of %d\n"
      "interleaved rounds) and the time to lay the arena out (once per batch shape):\n\n",
      3);
  std::printf(
      "| policy | planned peak (MiB) | reserved, arena (MiB) | reserved, caching allocator (MiB) | unplanned | step "
      "time, arena / caching | layout |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  arena_row<Chain>("stored", batch, steps, 3);
  arena_row<Net<Repeat<N, Checkpointed<Block>>>>("Checkpointed every block", batch, steps, 3);
  arena_row<Net<Repeat<N, Selective<Block>>>>("Selective every block", batch, steps, 3);
  arena_row<Net<Revolve<root(N), Repeat<N, Block>>>>("Revolve<4>", batch, steps, 3);
  arena_row<Net<Revolve<1, Repeat<N, Block>>>>("Revolve<1>", batch, steps, 3);
  timeline_cost(batch, std::max(steps, 5));
  return 0;
}
