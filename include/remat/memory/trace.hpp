// Where memory goes during a step: the layer and phase that is running (always known, at the cost
// of a few stores per layer call), and, when a memory::timeline is attached to an allocator and
// recording, every allocation and free with its tag, bytes, layer path and phase, and the time
// of each layer's forward, recomputation and backward.
//
//   memory::timeline tl;
//   m.allocator().attach(tl);
//   { auto on = tl.recording(); m.train_step<MSE>(x, t, opt); }
//   remat::memory_trace(tl, "step.json");   // Chrome trace event format: Perfetto, chrome://tracing
//   std::printf("%s", tl.table().c_str());  // per layer, like the profiler's key_averages
//
// A layer's path is its place in the graph, as in parameter names: a Seq adds the layer's index,
// a Repeat the block's (Residual and storage policies add nothing), then the innermost layer's
// type: "2.3.1 Linear" is layer 1 of block 3 of layer 2. Allocations outside any layer (the
// caller's input converted, the loss, the optimizer) have the path "" and their phase.
#pragma once

#include "../config.hpp"
#include "tags.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace REMAT_NAMESPACE {
namespace memory {

// The part of a training step running: what out_of_memory messages and timelines report.
enum class phase : std::uint8_t { none, forward, recomputation, loss, backward, optimizer };
inline constexpr std::size_t phase_count = 6;  // the number of phases

// A phase's name in messages and tables ("outside a step" for none).
constexpr char const* name(phase p) {
  switch (p) {
    case phase::none:
      return "outside a step";
    case phase::forward:
      return "forward";
    case phase::recomputation:
      return "recomputation";
    case phase::loss:
      return "loss";
    case phase::backward:
      return "backward";
    case phase::optimizer:
      return "optimizer";
  }
  return "?";
}

class timeline;

namespace tracing {

// A layer type's short name: "Linear", "LayerNorm", "gelu" for Pointwise<fn::gelu>.
inline std::string short_type_name(std::string_view pretty) {
  // "... [with L = remat::Linear<8, 16, true>; ...]" (GCC) or "... [L = remat::Linear<8, 16, true>]" (clang)
  std::size_t b = pretty.find("L = ");
  if (b == std::string_view::npos) return "?";
  b += 4;
  std::size_t depth = 0, e = b;
  for (; e < pretty.size(); ++e) {
    char const c = pretty[e];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth == 0 && (c == ';' || c == ']')) break;
  }
  std::string_view full = pretty.substr(b, e - b);
  std::size_t const args = full.find('<');
  std::string_view head = full.substr(0, args);
  std::size_t const colon = head.rfind("::");
  if (colon != std::string_view::npos) head = head.substr(colon + 2);
  if (head == "Pointwise" && args != std::string_view::npos) {  // the function's name
    std::string_view inner = full.substr(args + 1);
    inner = inner.substr(0, inner.find_first_of(",>"));
    std::size_t const c2 = inner.rfind("::");
    if (c2 != std::string_view::npos) inner = inner.substr(c2 + 2);
    return std::string(inner);
  }
  return std::string(head);
}

// L's name as a trace shows it, without namespaces (Linear<784, 128>; a Pointwise by its
// function's name), worked out once per type.
template <class L>
char const* type_name() {
#if defined(__GNUC__) || defined(__clang__)
  static std::string const n = short_type_name(__PRETTY_FUNCTION__);
#else
  static std::string const n = short_type_name(__FUNCSIG__);
#endif
  return n.c_str();
}

// One layer call on a thread's stack of calls.
struct trace_frame {
  std::uint32_t index = 0;           // its position in its parent (~0: none, the model's graph)
  char const* (*name)() = nullptr;   // its short type name
  bool leaf = false;                 // a layer that computes (not a container)
};

// What is running on this thread: the layer frames (a path) and the phase.
struct trace_context {
  static constexpr std::uint32_t max_depth = 32;  // frames kept (deeper calls are counted only)
  std::array<trace_frame, max_depth> frames{};    // the calls, outermost first
  std::uint32_t depth = 0;                        // calls open now
  phase current = phase::none;                    // the phase now
  timeline* recording = nullptr;  // a timeline recording layer times on this thread
  bool timing = false;            // whether phase changes add up wall time (remat::profile)
  double since = 0;               // when timing: the time (s) the current phase was entered
  std::array<double, phase_count> wall{};  // when timing: seconds spent in each phase

  // Enters phase p; when timing, the time since the last change goes to the phase being left.
  void enter(phase p) {
    if (timing) {
      double const t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      wall[std::size_t(current)] += t - since;
      since = t;
    }
    current = p;
  }

  // "2.3.1 Linear" (or "" outside any layer).
  std::string path() const {
    std::string out;
    std::uint32_t const n = depth < max_depth ? depth : max_depth;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (frames[i].index == ~std::uint32_t(0)) continue;  // a frame without an index (the model's graph)
      if (!out.empty()) out += '.';
      out += std::to_string(frames[i].index);
    }
    if (n > 0 && frames[n - 1].name) {
      if (!out.empty()) out += ' ';
      out += frames[n - 1].name();
    }
    return out;
  }
};

// This thread's context.
inline trace_context& current_trace() {
  thread_local trace_context c;
  return c;
}

}  // namespace tracing

// The path and phase of what is running on this thread ("2.3.1 Linear", backward).
inline std::string current_layer() {
  return tracing::current_trace().path();
}
// The phase of the step running on this thread.
inline phase current_phase() {
  return tracing::current_trace().current;
}

// A recording of allocations, frees and layer times (attach it to allocators with
// caching_allocator::attach). Thread-safe for allocations; layer times are those of the thread
// that called recording().
class timeline {
 public:
  // One allocation or free.
  struct event {
    double time_us = 0;                // since the recording started
    std::int64_t bytes = 0;            // + allocated, - freed (rounded as the allocator counts)
    std::uint8_t tag = 0;              // memory::tag
    phase when = phase::none;          // the phase at the time of the event
    phase allocated_in = phase::none;  // for a free: the phase its block was allocated in
    std::uint32_t path = 0;            // index into paths(): the layer that allocated the block
    std::size_t in_use = 0;            // the allocator's total in use after it
    std::array<std::size_t, tag_count> in_use_by_tag{};  // the allocator's in use per tag after it
  };
  // One leaf layer call.
  struct span {
    double begin_us = 0;       // since the recording started
    double end_us = 0;         // since the recording started
    std::uint32_t path = 0;    // index into paths(): the layer
    phase when = phase::none;  // the phase it ran in
  };

  timeline() { paths_.push_back(""); }
  timeline(timeline const&) = delete;
  timeline& operator=(timeline const&) = delete;

  // Records on this thread until the end of the returned scope.
  class scope {
   public:
    // Starts recording t on this thread (the first scope starts its clock).
    explicit scope(timeline& t) : t_(t), was_(tracing::current_trace().recording) {
      std::lock_guard<std::mutex> lock(t_.mutex_);
      if (!t_.started_) {
        t_.start_ = std::chrono::steady_clock::now();
        t_.started_ = true;
      }
      t_.on_ = true;
      tracing::current_trace().recording = &t_;
    }
    ~scope() {
      tracing::current_trace().recording = was_;
      std::lock_guard<std::mutex> lock(t_.mutex_);
      t_.on_ = false;
    }
    scope(scope const&) = delete;
    scope& operator=(scope const&) = delete;

   private:
    timeline& t_;
    timeline* was_;
  };
  [[nodiscard]] scope recording() { return scope(*this); }  // auto rec = tl.recording();
  // Whether a recording scope is open.
  bool is_recording() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return on_;
  }

  // Called by an attached allocator (under its lock) for every allocation and free.
  void on_allocation(void const* p, std::int64_t bytes, std::uint8_t tag, std::size_t in_use,
                     std::array<std::size_t, tag_count> const& by_tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!on_) return;
    tracing::trace_context const& c = tracing::current_trace();
    event e;
    e.time_us = now_us();
    e.bytes = bytes;
    e.tag = tag;
    e.when = c.current;
    e.in_use = in_use;
    e.in_use_by_tag = by_tag;
    if (bytes > 0) {
      e.path = intern(c.path());
      e.allocated_in = e.when;
      live_[p] = {e.path, e.when, std::size_t(bytes)};
    } else {
      auto it = live_.find(p);
      if (it == live_.end()) return;  // allocated before the recording: not ours to report
      e.path = it->second.path;       // a free is reported against the layer that allocated the block
      e.allocated_in = it->second.when;
      live_.erase(it);
    }
    events_.push_back(e);
  }

  // Called by a leaf layer's call when it ends (this thread records).
  void on_span(double begin_us, double end_us, std::string const& path, phase when) {
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.push_back({begin_us, end_us, intern(path), when});
  }
  // Microseconds since the recording started.
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  }

  std::vector<event> const& events() const { return events_; }       // in the order they came
  std::vector<span> const& spans() const { return spans_; }          // in the order they ended
  std::vector<std::string> const& paths() const { return paths_; }   // the layers, "" first
  // Forgets what was recorded (the next recording restarts the clock).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.clear();
    spans_.clear();
    live_.clear();
    started_ = false;
  }

  // Per layer (path), like the profiler's key_averages: forward calls; milliseconds of forward,
  // recomputation and backward; bytes its forward allocated that were still in use when the
  // backward began (what the forward kept for it); bytes it had allocated that were in use at the
  // recording's peak of all tags together; all bytes it allocated.
  struct layer_row {
    std::string path;  // "" for what runs outside layers
    std::size_t calls = 0;                 // forward calls
    std::array<double, phase_count> ms{};  // milliseconds per phase
    std::size_t saved = 0;                 // bytes its forward kept for the backward
    std::size_t at_peak = 0;               // bytes of its in use at the peak
    std::size_t allocated = 0;             // bytes it allocated, in all
  };
  // What summarize() finds.
  struct summary {
    std::vector<layer_row> layers;  // in the order their paths first appeared
    std::size_t peak = 0;           // the most in use (all tags) in the recording
    std::size_t start = 0;          // in use when the recording's first event came (before it)
    phase peak_phase = phase::none; // the phase the peak came in
  };
  summary summarize() const;
  // summarize() as a text table.
  std::string table() const;

 private:
  struct live_block {
    std::uint32_t path;
    phase when;
    std::size_t bytes;
  };
  std::uint32_t intern(std::string const& p) {
    auto it = index_.find(p);
    if (it != index_.end()) return it->second;
    paths_.push_back(p);
    return index_[p] = std::uint32_t(paths_.size() - 1);
  }

  mutable std::mutex mutex_;
  bool on_ = false, started_ = false;
  std::chrono::steady_clock::time_point start_{};
  std::vector<event> events_;
  std::vector<span> spans_;
  std::vector<std::string> paths_;
  std::unordered_map<std::string, std::uint32_t> index_;
  std::unordered_map<void const*, live_block> live_;
};

namespace tracing {

// Entered by every layer call of a pass that computes (Seq, Repeat and the model call it): pushes
// the layer's frame and sets the phase, and when this thread records a timeline, times a leaf
// layer's call. A literal type whose work is done only outside constant evaluation.
struct layer_scope {
  bool pushed = false;      // a frame was pushed (pop() is due)
  phase was = phase::none;  // the phase before the call
  double begin_us = -1;     // when a timed call began (-1: not timed)
  constexpr layer_scope() = default;
  // Pushes the frame of the call of layer `name`, number `index` in its parent, in phase p.
  layer_scope(std::uint32_t index, char const* (*name)(), bool leaf, phase p) : pushed(true) {
    trace_context& c = current_trace();
    if (c.depth < trace_context::max_depth) c.frames[c.depth] = {index, name, leaf};
    ++c.depth;
    was = c.current;
    c.enter(p);
    if (c.recording && leaf) begin_us = c.recording->now_us();
  }
  // Takes o's frame.
  layer_scope(layer_scope&& o) noexcept : pushed(o.pushed), was(o.was), begin_us(o.begin_us) { o.pushed = false; }
  layer_scope(layer_scope const&) = delete;
  layer_scope& operator=(layer_scope const&) = delete;
  constexpr ~layer_scope() {
    if (pushed) pop();
  }
  // Ends the call: records its span if timed, restores the phase.
  void pop() noexcept {
    trace_context& c = current_trace();
    if (begin_us >= 0 && c.recording) {
      try {
        c.recording->on_span(begin_us, c.recording->now_us(), c.path(), c.current);
      } catch (...) {  // no room to record: the trace misses a span, the step goes on
      }
    }
    c.enter(was);
    --c.depth;
  }
};

// The phase of a step, outside any layer (the model's pass, the loss, the optimizer).
struct phase_scope {
  phase was;  // the phase before
  // Enters phase p on this thread.
  explicit phase_scope(phase p) : was(current_trace().current) { current_trace().enter(p); }
  ~phase_scope() { current_trace().enter(was); }
  phase_scope(phase_scope const&) = delete;
  phase_scope& operator=(phase_scope const&) = delete;
};

}  // namespace tracing

inline timeline::summary timeline::summarize() const {
  std::lock_guard<std::mutex> lock(mutex_);
  summary out;
  std::vector<layer_row> rows(paths_.size());
  for (std::size_t i = 0; i < paths_.size(); ++i) rows[i].path = paths_[i];
  std::vector<bool> used(paths_.size(), false);
  for (span const& s : spans_) {
    layer_row& r = rows[s.path];
    used[s.path] = true;
    if (s.when == phase::forward) ++r.calls;
    r.ms[std::size_t(s.when)] += (s.end_us - s.begin_us) * 1e-3;
  }
  std::size_t peak_at = 0;
  for (std::size_t i = 0; i < events_.size(); ++i)
    if (events_[i].in_use > out.peak) {
      out.peak = events_[i].in_use;
      peak_at = i;
    }
  if (!events_.empty()) out.start = std::size_t(std::int64_t(events_[0].in_use) - events_[0].bytes);
  // Blocks open between an allocation and its free, by (path, tag, bytes, phase allocated in):
  // blocks with the same key are interchangeable for the sums below.
  std::map<std::tuple<std::uint32_t, std::uint8_t, std::int64_t, phase>, std::size_t> open;
  bool backward_seen = false;
  for (std::size_t i = 0; i < events_.size(); ++i) {
    event const& e = events_[i];
    used[e.path] = true;
    if (e.bytes > 0) {
      ++open[std::make_tuple(e.path, e.tag, e.bytes, e.allocated_in)];
      rows[e.path].allocated += std::size_t(e.bytes);
    } else {
      auto it = open.find(std::make_tuple(e.path, e.tag, -e.bytes, e.allocated_in));
      if (it != open.end() && --it->second == 0) open.erase(it);
    }
    // The first event of the backward (the model's output freed after the loss): what the forward
    // allocated and is still in use is what it kept.
    if (e.when == phase::backward && !backward_seen) {
      backward_seen = true;
      for (auto const& [k, n] : open)
        if (std::get<3>(k) == phase::forward) rows[std::get<0>(k)].saved += n * std::size_t(std::get<2>(k));
    }
    if (i == peak_at) {
      out.peak_phase = e.when;
      for (auto const& [k, n] : open) rows[std::get<0>(k)].at_peak += n * std::size_t(std::get<2>(k));
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (used[i]) out.layers.push_back(rows[i]);
  return out;
}

inline std::string timeline::table() const {
  summary const s = summarize();
  auto mib = [](std::size_t b) { return double(b) / double(1 << 20); };
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "peak %.3f MiB in use (%.3f MiB before the recording), during the %s\n", mib(s.peak),
                mib(s.start), name(s.peak_phase));
  out += line;
  std::snprintf(line, sizeof line, "%-28s %6s %11s %11s %11s %11s %11s %11s\n", "layer", "calls", "forward ms",
                "recompute", "backward ms", "saved MiB", "at peak MiB", "alloc MiB");
  out += line;
  for (layer_row const& r : s.layers) {
    std::string label = r.path.empty() ? "(outside layers)" : r.path;
    if (label.size() > 28) label = "..." + label.substr(label.size() - 25);
    std::snprintf(line, sizeof line, "%-28s %6zu %11.3f %11.3f %11.3f %11.3f %11.3f %11.3f\n", label.c_str(), r.calls,
                  r.ms[std::size_t(phase::forward)], r.ms[std::size_t(phase::recomputation)],
                  r.ms[std::size_t(phase::backward)], mib(r.saved), mib(r.at_peak), mib(r.allocated));
    out += line;
  }
  return out;
}

}  // namespace memory
}  // namespace REMAT_NAMESPACE
