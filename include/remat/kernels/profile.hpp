// Where a step's time goes. With profiling on (remat::profile::enable(), this thread only; off by
// default, when it costs one branch per kernel call), every kernel entry point adds its wall time
// to a table by the phase it ran in (forward, recomputation, loss, backward, optimizer) and the
// kind of work (products, point-wise passes, row passes, reductions), and every phase change adds
// the phase's wall time, so the time outside the kernels shows too. A kernel called inside
// another (a row pass that evaluates an expression) counts once, as the outer one.
//
//   remat::profile::enable();
//   m.train_step<MSE>(x, t, opt);
//   remat::profile::report const r = remat::profile::read();   // r.seconds(phase::backward, work::product)
//
// On a GPU each timed kernel waits for the device before and after it, so the step runs slower
// than it would; the shares are what the profile is for.
#pragma once

#include "../device.hpp"
#include "../memory/trace.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace REMAT_NAMESPACE {
namespace profile {

using memory::phase;

// The kinds of work a kernel does.
enum class work : std::uint8_t {
  product,    // matrix products (GEMM, batched GEMM, convolutions, attention's blocked products)
  pointwise,  // element-by-element passes (fused expressions, the optimizers' updates)
  rows,       // passes over rows (norms, softmax, the loss, embeddings, image layouts)
  reduction,  // reductions (column sums of a bias's gradient, norms of gradients)
};
inline constexpr std::size_t work_count = 4;  // the number of kinds

// A kind's name in tables.
constexpr char const* name(work w) {
  switch (w) {
    case work::product:
      return "products";
    case work::pointwise:
      return "point-wise";
    case work::rows:
      return "row passes";
    case work::reduction:
      return "reductions";
  }
  return "?";
}

// What one thread's profile holds: seconds and calls by phase and kind, and wall seconds by phase.
struct report {
  std::array<std::array<double, work_count>, memory::phase_count> kernel_s{};         // [phase][work]
  std::array<std::array<std::uint64_t, work_count>, memory::phase_count> calls{};     // [phase][work]
  std::array<double, memory::phase_count> phase_s{};                                  // [phase]

  // Seconds of kind w in phase p.
  double seconds(phase p, work w) const { return kernel_s[std::size_t(p)][std::size_t(w)]; }
  // Wall seconds spent in phase p (kernels and everything between them).
  double wall(phase p) const { return phase_s[std::size_t(p)]; }
  // Seconds in phase p outside every timed kernel.
  double outside_kernels(phase p) const {
    double k = 0;
    for (double s : kernel_s[std::size_t(p)]) k += s;
    return phase_s[std::size_t(p)] - k;
  }
};

namespace detail {

struct thread_profile {
  bool on = false;
  int depth = 0;  // timed kernels open on this thread (only the outermost counts)
  report r;
};
inline thread_profile& current() {
  thread_local thread_profile t;
  return t;
}
inline double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace detail

// Zeroes this thread's tables (a phase now running is timed from here).
inline void reset() {
  detail::current().r = {};
  auto& c = memory::tracing::current_trace();
  c.wall = {};
  c.since = detail::seconds_now();
}

// Starts (on = true) or stops timing this thread's kernels and phases, from zero when started.
inline void enable(bool on = true) {
  detail::current().on = on;
  memory::tracing::current_trace().timing = on;
  if (on) reset();
}

// Whether this thread is being profiled.
inline bool enabled() { return detail::current().on; }

// This thread's tables so far (the phase now running counted up to this call).
inline report read() {
  auto& c = memory::tracing::current_trace();
  if (c.timing) c.enter(c.current);  // closes the running phase's interval
  report r = detail::current().r;
  for (std::size_t p = 0; p < memory::phase_count; ++p) r.phase_s[p] = c.wall[p];
  return r;
}

// Times one kernel call of kind W on device D for as long as it lives (nothing when profiling is
// off, or inside another timed kernel).
template <class D>
class timed {
 public:
  // Starts timing a kernel of kind w (when profiling is on and no timed kernel is open).
  explicit timed(work w) : w_(w) {
    detail::thread_profile& t = detail::current();
    if (!t.on || t.depth++ > 0) return;
    wait();
    begin_ = detail::seconds_now();
  }
  // Adds the kernel's time to its phase and kind (and the share given to split to that kind).
  ~timed() {
    detail::thread_profile& t = detail::current();
    if (!t.on) return;
    if (--t.depth > 0 || begin_ < 0) return;
    wait();
    std::size_t const p = std::size_t(memory::current_phase());
    double const s = detail::seconds_now() - begin_;
    t.r.kernel_s[p][std::size_t(w_)] += s * (1.0 - share_);
    ++t.r.calls[p][std::size_t(w_)];
    if (share_ > 0.0) {
      t.r.kernel_s[p][std::size_t(other_)] += s * share_;
      ++t.r.calls[p][std::size_t(other_)];
    }
  }
  timed(timed const&) = delete;
  timed& operator=(timed const&) = delete;
  // Whether this one is timing (profiling on, and not inside another timed kernel).
  bool counting() const { return begin_ >= 0; }
  // Counts `share` (0 to 1) of the call's time as kind `other`: a kernel whose threads each do two
  // kinds of work one after the other, which it timed per thread to know their shares.
  void split(work other, double share) {
    other_ = other;
    share_ = share > 0.0 ? (share < 1.0 ? share : 1.0) : 0.0;
  }

 private:
  static void wait() {
#if defined(__CUDACC__)
    if constexpr (std::is_same_v<D, cuda>) (void)cudaDeviceSynchronize();
#endif
  }
  work w_;
  double begin_ = -1;
  work other_ = work::rows;
  double share_ = 0.0;
};

}  // namespace profile
}  // namespace REMAT_NAMESPACE
