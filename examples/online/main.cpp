// online: a network learns the simulation while the simulation runs. The Gray–Scott solver of
// examples/surrogate (gray_scott.hpp) advances in its own time loop; every few steps it hands its
// state to a fixed-size replay buffer, the model predicts that state's future (inference, checked
// when the solver gets there: the online error), and every few steps the model trains on a batch
// drawn from the buffer. At the end the surrogate replaces the solver for a rollout, and its error
// against the solver is printed.
//
// Memory: the solver's arrays, the replay buffer and the batches are tensors in the model's own
// allocator under tags of their own (memory::tag::user1 to user3, named "solver", "replay buffer"
// and "batches"), so the whole program's memory (solver, buffer, batches, weights, gradients,
// AdamW's state, the step's and inference's arena) is planned before anything is allocated,
// refused if it exceeds --limit, and checked against the allocator, tag by tag, at the end.
//
// Restart: every --checkpoint-every solver steps the program writes the model, AdamW's state and
// a state file (the solver's fields, the replay buffer, the pending sample, the random streams'
// counters and the statistics) into --out; the state file, written last and atomically, names the
// other two, so a run killed at any instant restarts (--restart) from the last complete set, and
// ends bit for bit where the uninterrupted run ends (tests/examples/online_restart.cmake kills one).
// Every random draw is philox's, counter-based: the streams' state is their counters.
//
// Training and inference run on the solver's threads, between its steps; the end prints the time
// each part took.
//
//   online [--solver-steps 4000] [--sample-every 10] [--ahead 4] [--train-every 10] [--batch 16]
//          [--buffer 256] [--rollout 40] [--seed 1] [--limit MiB] [--out DIR] [--checkpoint-every N]
//          [--restart] [--kill-at STEP] [--quick]
//
// Exits non-zero when the rollout's error is not below half of persistence's, the memory measured
// differs from the plan, or the plan exceeds --limit (before allocating anything).
#include "../surrogate/gray_scott.hpp"
#include "../surrogate/network.hpp"

#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

using namespace remat;

namespace {

constexpr std::size_t G = 64, Width = 16, Cells = 2 * G * G;  // grid, channels, a sample's values
constexpr double in_scale = 3.0;  // the network reads (u - 1, v) times this (examples/surrogate)
constexpr std::size_t burn_in = 200;  // solver steps of a run before its first sample
constexpr std::uint64_t held_out_run = 1000;  // the rollout's run (the training runs are 0, 1, ...)

using Net = gray_scott_surrogate<G, Width, 3>::stored;  // the surrogate example's network
using Model = model<Net>;
using Optimizer = AdamW<float>;  // (what AdamW(m) deduces for an fp32 model on the host)

constexpr auto solver_tag = memory::tag::user1, buffer_tag = memory::tag::user2, batch_tag = memory::tag::user3;

struct options {
  std::size_t solver_steps = 4000, run_length = 1000, sample_every = 10, ahead = 4, train_every = 10, batch = 16,
              buffer = 256, rollout = 40, checkpoint_every = 0, kill_at = 0, limit_mib = 0;
  std::uint64_t seed = 1;
  std::string out = "online-out";
  bool restart = false;
  // What a restart must agree with (the rest may change between runs: --out, --kill-at, ...).
  std::string config() const {
    return "seed " + std::to_string(seed) + " steps " + std::to_string(solver_steps) + " run " +
           std::to_string(run_length) + " sample " +
           std::to_string(sample_every) + " ahead " + std::to_string(ahead) + " train " +
           std::to_string(train_every) + " batch " + std::to_string(batch) + " buffer " + std::to_string(buffer);
  }
};

// ---- the whole program's memory, before anything exists

struct program_plan {
  std::size_t solver = 0, buffer = 0, batches = 0;  // the program's own tags
  memory_plan_result step{};                        // the model's training step
  arena_size inference{};                           // forward(x, out) on one state
  std::size_t arena = 0;                            // the one arena: the larger layout
  std::size_t own() const { return solver + buffer + batches; }
  std::size_t model_reserved() const { return step.reserved - step.arena + arena; }
  std::size_t reserved() const { return own() + model_reserved(); }
  std::size_t peak() const { return own() + std::max(step.peak, step.persistent + inference.lower_bound); }
};

program_plan plan_of(options const& o) {
  auto const r = [](std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); };
  program_plan p;
  p.solver = 4 * r(G * G * sizeof(double));                                 // u, v and the next step's
  p.buffer = 2 * r(o.buffer * Cells * sizeof(float));                       // states and increments
  p.batches = 2 * r(o.batch * Cells * sizeof(float)) + 2 * r(Cells * sizeof(float));  // + pending, prediction
  p.step = memory_plan<Net, fp32, AdamW>(o.batch);
  p.inference = inference_plan<Net>(1);
  p.arena = std::max(p.step.arena, p.inference.bytes);
  return p;
}

// ---- the program's state: what the files hold

struct counters {
  std::int64_t step = 0;         // solver steps done
  std::int64_t draws = 0;        // the batch stream's counter (philox stream 7)
  std::int64_t stored = 0;       // samples in the buffer
  std::int64_t next = 0;         // the slot the next sample takes (oldest first once full)
  std::int64_t pending_due = 0;  // the solver step that completes the pending sample (0: none)
  std::int64_t updates = 0;      // training steps done
};
struct statistics {
  double du_scale = 0;        // the targets are increments times this (0: training not started)
  double smooth_loss = 0;     // the loss, exponentially smoothed
  double window_error = 0;    // the online error's squared sums since the last report
  double window_base = 0;     // (persistence's)
  std::int64_t window_samples = 0;
};

struct program {
  options o;
  memory::caching_allocator<host>& alloc;
  tensor<double> u, v, nu, nv;       // the solver's fields (tag "solver")
  tensor<float> states, increments;  // the replay buffer: inputs and their raw increments (tag "replay buffer")
  tensor<float> x, t, pending, prediction;  // a batch, its targets; the sample awaiting its future, the model's guess
  counters c;
  statistics s;

  program(options const& opts, memory::caching_allocator<host>& a)
      : o(opts), alloc(a), u(G, G, solver_tag, a), v(G, G, solver_tag, a), nu(G, G, solver_tag, a),
        nv(G, G, solver_tag, a), states(index_t(o.buffer), Cells, buffer_tag, a),
        increments(index_t(o.buffer), Cells, buffer_tag, a), x(index_t(o.batch), Cells, batch_tag, a),
        t(index_t(o.batch), Cells, batch_tag, a), pending(1, Cells, batch_tag, a), prediction(1, Cells, batch_tag, a) {
    gray_scott::start(u.data(), v.data(), G, o.seed, 0);
    for (auto* b : {&states, &increments, &pending, &prediction}) std::fill_n(b->data(), b->size(), 0.0f);
  }

  void solver_step() {
    gray_scott::step(u.data(), v.data(), nu.data(), nv.data(), G);
    std::swap(u, nu);
    std::swap(v, nv);
  }
  // The network's input for the current state.
  void state_into(float* out) const {
    for (std::size_t i = 0; i < G * G; ++i) {
      out[i] = float((u[i] - 1) * in_scale);
      out[G * G + i] = float(v[i] * in_scale);
    }
  }
  // The current state's value i (of Cells: u then v), as the network's input scales it back.
  double state(std::size_t i) const { return i < G * G ? u[i] : v[i - G * G]; }
  static double unscaled(float xi, std::size_t i) { return i < G * G ? double(xi) / in_scale + 1 : double(xi) / in_scale; }
};

// ---- the files: <out>/step-N.model.safetensors, step-N.adamw.safetensors, online.state.safetensors

std::string state_path(options const& o) { return o.out + "/online.state.safetensors"; }

void save_all(program const& p, Model const& m, Optimizer const& opt) {
  std::filesystem::create_directories(p.o.out);
  std::string const stem = "step-" + std::to_string(p.c.step);
  save(m, p.o.out + "/" + stem + ".model.safetensors");
  save(opt, p.o.out + "/" + stem + ".adamw.safetensors");
  std::map<std::string, std::string> meta{{"remat.online.config", p.o.config()},
                                          {"remat.online.model", stem + ".model.safetensors"},
                                          {"remat.online.optimizer", stem + ".adamw.safetensors"}};
  std::string previous;  // the set this one replaces, removed once this one is whole
  if (std::filesystem::exists(state_path(p.o)))
    previous = safetensors::read(state_path(p.o)).metadata["remat.online.model"];
  std::int64_t const cs[] = {p.c.step, p.c.draws, p.c.stored, p.c.next, p.c.pending_due, p.c.updates};
  double const ss[] = {p.s.du_scale, p.s.smooth_loss, p.s.window_error, p.s.window_base, double(p.s.window_samples)};
  auto entry = [](char const* name, auto const& tn) {
    using T = std::remove_cvref_t<decltype(*tn.data())>;
    return safetensors::entry{name, safetensors::dtype_name<T>(), {tn.rows(), tn.cols()}, tn.data(), tn.bytes()};
  };
  safetensors::write(state_path(p.o),
                     {entry("solver.u", p.u), entry("solver.v", p.v), entry("buffer.states", p.states),
                      entry("buffer.increments", p.increments), entry("pending.state", p.pending),
                      entry("pending.prediction", p.prediction),
                      {"counters", "I64", {std::size(cs)}, cs, sizeof cs},
                      {"statistics", "F64", {std::size(ss)}, ss, sizeof ss}},
                     meta);
  std::string const stale = previous.substr(0, previous.find(".model."));
  if (!previous.empty() && stale != stem) {
    std::filesystem::remove(p.o.out + "/" + stale + ".model.safetensors");
    std::filesystem::remove(p.o.out + "/" + stale + ".adamw.safetensors");
  }
}

// Everything save_all wrote, checked against this run's configuration before anything changes.
void load_all(program& p, Model& m, Optimizer& opt) {
  if (!std::filesystem::exists(state_path(p.o)))
    throw io_error("--restart: expected an earlier run's files in '" + p.o.out + "', found no " +
                   "online.state.safetensors there");
  safetensors::file const f = safetensors::read(state_path(p.o));
  auto meta = [&](char const* key) {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) throw io_error("online: " + state_path(p.o) + " has no " + key);
    return it->second;
  };
  if (meta("remat.online.config") != p.o.config())
    throw io_error("online: " + state_path(p.o) + " was written by a run of '" + meta("remat.online.config") +
                   "', expected '" + p.o.config() + "'");
  auto take = [&](char const* name, void* into, std::size_t bytes) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end() || it->second.end - it->second.begin != bytes)
      throw io_error("online: " + state_path(p.o) + ": tensor " + name + " missing or of another size");
    return [into, src = f.data.data() + it->second.begin, bytes] { std::memcpy(into, src, bytes); };
  };
  std::int64_t cs[6];
  double ss[5];
  auto const copies = {take("solver.u", p.u.data(), p.u.bytes()), take("solver.v", p.v.data(), p.v.bytes()),
                       take("buffer.states", p.states.data(), p.states.bytes()),
                       take("buffer.increments", p.increments.data(), p.increments.bytes()),
                       take("pending.state", p.pending.data(), p.pending.bytes()),
                       take("pending.prediction", p.prediction.data(), p.prediction.bytes()),
                       take("counters", cs, sizeof cs), take("statistics", ss, sizeof ss)};
  load(m, p.o.out + "/" + meta("remat.online.model"));  // (each checks everything before it changes a value)
  load(opt, p.o.out + "/" + meta("remat.online.optimizer"));
  for (auto const& copy : copies) copy();
  p.c = {cs[0], cs[1], cs[2], cs[3], cs[4], cs[5]};
  p.s = {ss[0], ss[1], ss[2], ss[3], std::int64_t(ss[4])};
}

// ---- the time loop

struct timer {
  double seconds = 0;
  std::size_t calls = 0;
};
struct clocks {
  timer solver, inference, training, files;
};

template <class F>
void timed(timer& c, F&& f) {
  auto const t0 = std::chrono::steady_clock::now();
  f();
  c.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++c.calls;
}

void run(program& p, Model& m, Optimizer& opt, clocks& time) {
  options const& o = p.o;
  std::size_t const planned_updates = (o.solver_steps - burn_in) / o.train_every;
  warmup_cosine const schedule{.base_lr = 1e-2, .warmup = planned_updates / 20 + 1, .total = planned_updates,
                               .min_lr = 1e-5};
  std::size_t const report_every = std::max<std::size_t>(o.sample_every, o.solver_steps / 10);
  while (std::size_t(p.c.step) < o.solver_steps) {
    timed(time.solver, [&] { p.solver_step(); });
    std::size_t const now = std::size_t(++p.c.step);
    if (p.c.pending_due == std::int64_t(now)) {  // the pending sample's future: into the buffer
      std::size_t const slot = std::size_t(p.c.next);
      float* xs = p.states.data() + slot * Cells;
      float* dy = p.increments.data() + slot * Cells;
      std::memcpy(xs, p.pending.data(), Cells * sizeof(float));
      for (std::size_t i = 0; i < Cells; ++i) {
        double const was = program::unscaled(xs[i], i), is = p.state(i);
        dy[i] = float(is - was);
        if (p.s.du_scale > 0) {  // the online error: the model's guess, made before the solver got here
          double const guess = was + double(p.prediction[i]) / p.s.du_scale;
          p.s.window_error += (guess - is) * (guess - is);
          p.s.window_base += (was - is) * (was - is);
        }
      }
      p.s.window_samples += p.s.du_scale > 0;
      p.c.next = std::int64_t((slot + 1) % o.buffer);
      p.c.stored = std::min<std::int64_t>(p.c.stored + 1, std::int64_t(o.buffer));
      p.c.pending_due = 0;
    }
    if (now % o.run_length == 0)  // the campaign's next run: new random squares
      gray_scott::start(p.u.data(), p.v.data(), G, o.seed, now / o.run_length);
    std::size_t const in_run = now % o.run_length;
    if (in_run >= burn_in && in_run + o.ahead < o.run_length && now % o.sample_every == 0 &&
        p.c.pending_due == 0) {  // a new sample
      p.state_into(p.pending.data());
      p.c.pending_due = std::int64_t(now + o.ahead);
      if (p.s.du_scale > 0) timed(time.inference, [&] { m.forward(p.pending, p.prediction); });
    }
    if (now % o.train_every == 0 && std::size_t(p.c.stored) >= o.batch) {
      if (p.s.du_scale == 0) {  // the targets' scale: 1 / the RMS increment of the first samples
        double sq = 0;
        for (std::size_t i = 0; i < std::size_t(p.c.stored) * Cells; ++i) sq += double(p.increments[i]) * p.increments[i];
        p.s.du_scale = 1 / std::sqrt(sq / double(std::size_t(p.c.stored) * Cells));
      }
      timed(time.training, [&] {
        for (std::size_t r = 0; r < o.batch; ++r) {
          auto const k = std::size_t(double(philox::uniform(o.seed, 7, std::uint64_t(p.c.draws++))) * double(p.c.stored));
          std::memcpy(p.x.data() + r * Cells, p.states.data() + k * Cells, Cells * sizeof(float));
          for (std::size_t i = 0; i < Cells; ++i)
            p.t[r * Cells + i] = float(double(p.increments[k * Cells + i]) * p.s.du_scale);
        }
        opt.set_lr(schedule(opt.steps()));
        double const l = m.train_step<MSE>(p.x, p.t, opt);
        p.s.smooth_loss = p.c.updates++ == 0 ? l : 0.95 * p.s.smooth_loss + 0.05 * l;
      });
    }
    if (now % report_every == 0 || now == o.solver_steps) {
      std::printf("step %5zu  buffer %3lld/%zu  updates %4lld  loss %.4f  online error %s\n", now,
                  static_cast<long long>(p.c.stored), o.buffer, static_cast<long long>(p.c.updates), p.s.smooth_loss,
                  p.s.window_samples ? std::to_string(std::sqrt(p.s.window_error / p.s.window_base)).c_str() : "-");
      p.s.window_error = p.s.window_base = 0;
      p.s.window_samples = 0;
    }
    if (o.checkpoint_every && (now % o.checkpoint_every == 0 || now == o.solver_steps))
      timed(time.files, [&] { save_all(p, m, opt); });
    if (o.kill_at == now) {
      std::printf("killed at solver step %zu (--kill-at)\n", now);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }
}

// The surrogate replaces the solver on a run it never saw (after the run's burn-in and as many
// steps again): o.rollout solver steps in applications of `ahead` each; the error after each,
// relative to persistence's over the same horizon.
double rollout(program& p, Model const& m, clocks& time) {
  options const& o = p.o;
  gray_scott::start(p.u.data(), p.v.data(), G, o.seed, held_out_run);
  for (std::size_t k = 0; k < 2 * burn_in; ++k) timed(time.solver, [&] { p.solver_step(); });
  p.state_into(p.pending.data());  // the surrogate's state, as the network reads it
  std::vector<double> start(Cells);
  for (std::size_t i = 0; i < Cells; ++i) start[i] = p.state(i);
  double e = 0;
  for (std::size_t done = 0; done < o.rollout; done += o.ahead) {
    timed(time.inference, [&] { m.forward(p.pending, p.prediction); });
    for (std::size_t i = 0; i < Cells; ++i)
      p.pending[i] = float(double(p.pending[i]) + in_scale * double(p.prediction[i]) / p.s.du_scale);
    for (std::size_t k = 0; k < o.ahead; ++k) timed(time.solver, [&] { p.solver_step(); });
    double err = 0, base = 0;
    for (std::size_t i = 0; i < Cells; ++i) {
      double const is = p.state(i), guess = program::unscaled(p.pending[i], i);
      err += (guess - is) * (guess - is);
      base += (start[i] - is) * (start[i] - is);
    }
    e = std::sqrt(err / base);
    std::printf("rollout %3zu solver steps: error %.3f of persistence's\n", done + o.ahead, e);
  }
  return e;
}

int train_online(options const& o, program_plan const& plan, std::size_t limit);

bool check_memory(program_plan const& plan, memory::caching_allocator<host> const& alloc) {
  memory::statistics const st = alloc.stats();
  struct row {
    char const* what;
    std::size_t planned, measured;
  };
  row const rows[] = {{"solver", plan.solver, st[solver_tag].reserved},
                      {"replay buffer", plan.buffer, st[buffer_tag].reserved},
                      {"batches", plan.batches, st[batch_tag].reserved},
                      {"parameters", plan.step.parameters(), st[memory::tag::parameters].reserved},
                      {"gradients", plan.step.gradients, st[memory::tag::gradients].reserved},
                      {"optimizer state", plan.step.optimizer_state, st[memory::tag::optimizer_state].reserved},
                      {"activations (arena)", plan.arena, st[memory::tag::activations].reserved},
                      {"workspace", plan.step.workspace, st[memory::tag::workspace].reserved},
                      {"reserved in all", plan.reserved(), st.total.reserved},
                      {"peak in use", plan.peak(), st.total.peak}};
  bool same = true;
  std::printf("\nmemory, planned before the run and measured by the allocator:\n");
  for (row const& r : rows) {
    std::printf("  %-20s %12s %12s%s\n", r.what, memory::format_bytes(r.planned).c_str(),
                memory::format_bytes(r.measured).c_str(), r.planned == r.measured ? "" : "  DIFFERS");
    same = same && r.planned == r.measured;
  }
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto number = [&] {
      if (i + 1 >= argc) return std::size_t(0);
      return std::size_t(std::stoull(argv[++i]));
    };
    if (a == "--solver-steps") o.solver_steps = number();
    else if (a == "--run-length") o.run_length = number();
    else if (a == "--sample-every") o.sample_every = number();
    else if (a == "--ahead") o.ahead = number();
    else if (a == "--train-every") o.train_every = number();
    else if (a == "--batch") o.batch = number();
    else if (a == "--buffer") o.buffer = number();
    else if (a == "--rollout") o.rollout = number();
    else if (a == "--seed") o.seed = number();
    else if (a == "--limit") o.limit_mib = number();
    else if (a == "--checkpoint-every") o.checkpoint_every = number();
    else if (a == "--kill-at") o.kill_at = number();
    else if (a == "--out" && i + 1 < argc) o.out = argv[++i];
    else if (a == "--restart") o.restart = true;
    else if (a == "--quick") o.solver_steps = 3000;
    else {
      std::fprintf(stderr,
                   "usage: %s [--solver-steps 4000] [--run-length 1000] [--sample-every 10] [--ahead 4] [--train-every 10] [--batch 16]\n"
                   "       [--buffer 256] [--rollout 40] [--seed 1] [--limit MiB] [--out DIR] [--checkpoint-every N]\n"
                   "       [--restart] [--kill-at STEP] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!o.sample_every || !o.ahead || o.ahead >= o.sample_every || !o.train_every || !o.batch || o.buffer < o.batch ||
      !o.rollout || o.rollout % o.ahead || o.run_length <= burn_in + o.sample_every ||
      o.solver_steps < burn_in + o.train_every) {
    std::fprintf(stderr, "online: expected 0 < ahead < sample-every, batch <= buffer, rollout a multiple of ahead, "
                         "run-length above %zu + sample-every and more than %zu + train-every solver steps\n",
                 burn_in, burn_in);
    return 2;
  }
  program_plan const plan = plan_of(o);
  std::printf("Gray-Scott on a %zu² grid, %zu solver steps in runs of %zu; a sample every %zu steps after %zu, its "
              "future %zu steps later; a training step every %zu solver steps on %zu samples of a %zu-sample replay "
              "buffer\n",
              G, o.solver_steps, o.run_length, o.sample_every, burn_in, o.ahead, o.train_every, o.batch, o.buffer);
  std::printf("the whole program's memory, planned: solver %s, replay buffer %s, batches %s; model %s "
              "(weights, gradients, AdamW, one arena of %s for training and inference); in all %s, peak %s\n",
              memory::format_bytes(plan.solver).c_str(), memory::format_bytes(plan.buffer).c_str(),
              memory::format_bytes(plan.batches).c_str(), memory::format_bytes(plan.model_reserved()).c_str(),
              memory::format_bytes(plan.arena).c_str(), memory::format_bytes(plan.reserved()).c_str(),
              memory::format_bytes(plan.peak()).c_str());
  std::size_t const limit = o.limit_mib ? o.limit_mib << 20 : memory::unlimited;
  if (plan.reserved() > limit) {
    std::fprintf(stderr, "online: the program needs %s, more than --limit %s; nothing was allocated\n",
                 memory::format_bytes(plan.reserved()).c_str(), memory::format_bytes(limit).c_str());
    return 3;
  }
  try {
    return train_online(o, plan, limit);
  } catch (remat::error const& e) {  // (a restart from files of another run, a full disk, ...)
    std::fprintf(stderr, "online: %s\n", e.what());
    return 1;
  }
}

namespace {

int train_online(options const& o, program_plan const& plan, std::size_t limit) {
  memory::caching_allocator<host> alloc(limit);
  alloc.name_tag(solver_tag, "solver");
  alloc.name_tag(buffer_tag, "replay buffer");
  alloc.name_tag(batch_tag, "batches");
  program p(o, alloc);
  Model m(seed{o.seed}, alloc);
  AdamW opt(m, {.lr = 1e-2, .weight_decay = 1e-4});
  m.reserve_inference(1);
  if (o.restart) {
    load_all(p, m, opt);
    std::printf("restarted from %s at solver step %lld (%lld training steps done)\n", state_path(o).c_str(),
                static_cast<long long>(p.c.step), static_cast<long long>(p.c.updates));
  }
  clocks time;
  auto const t0 = std::chrono::steady_clock::now();
  run(p, m, opt, time);
  double const e = rollout(p, m, time);
  double const wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("time %.1f s: solver %.2f s (%zu steps), inference %.2f s (%zu calls), training %.1f s (%zu steps), "
              "files %.2f s (%zu sets)\n",
              wall, time.solver.seconds, time.solver.calls, time.inference.seconds, time.inference.calls,
              time.training.seconds, time.training.calls, time.files.seconds, time.files.calls);
  std::printf("fingerprint %a %a\n", e, p.s.smooth_loss);  // (what the restart test compares)
  bool const memory_ok = check_memory(plan, alloc);
  if (!memory_ok) std::printf("FAILED: the memory measured differs from the plan\n%s", alloc.summary().c_str());
  constexpr double bar = 0.5;
  if (e >= bar) std::printf("FAILED: the rollout's error %.3f is not below %.2f of persistence's\n", e, bar);
  return memory_ok && e < bar ? 0 : 1;
}

}  // namespace
