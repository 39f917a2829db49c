// remat::activation_plan<Net, Precision>(batch): the peak bytes of activations during a training
// step of model<Net, Device, Precision>, known at compile time.
//
// It runs the model's training pass (graph/training_pass.hpp, the code model::accumulate runs)
// on a planning::state, which makes, shares and drops the same tensors in the same order and adds up what
// the caching allocator would count: each tensor rounded up to 256 bytes. Everything a step
// allocates as activations is in it: what the forward keeps, the output and
// its gradient, the gradients flowing back, and the scratch of every recomputation. Workspace
// (a loss's per-row values) and parameters, gradients and optimizer state are tagged apart.
//
//   constexpr auto plan = remat::activation_plan<Net, remat::fp32>(256);
//   static_assert(plan.peak_bytes <= (std::size_t(64) << 20), "the model's activations must fit in 64 MiB");
#pragma once

#include "../error.hpp"
#include "../graph/walk.hpp"
#include "../numeric/precision.hpp"
#include "../graph/training_pass.hpp"
#include "state.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {

// What activation_plan finds: the activation bytes of a training step, worked out without running it.
struct activation_plan_result {
  std::size_t peak_bytes = 0;    // the most activation bytes in use at once in a training step
  std::size_t saved_bytes = 0;   // in use when the forward ends, its output excluded: what it kept
  std::uint64_t recomputed = 0;  // block forwards the storage policies run again
  // Host memory that Offloaded<S> moves activations to: the most in use at once (not part of
  // peak_bytes, which counts the device's). The model's offload allocator measures the same.
  std::size_t offloaded_bytes = 0;
};

// (input_gradient: pass/vocabulary.hpp.)
// `features` is the input width, needed only when the graph's own is not fixed (a point-wise
// first layer). For a sequence model, `batch` counts sequences of `sequence` positions each (see
// sequence_plan).
//
// The plan is that of a training step (train_step, or accumulate without an input gradient): the
// layer that takes the input computes no gradient for it. `input_gradient::wanted` plans
// accumulate asked for one (its `dx`).

namespace detail {

// Whether every layer of L can be planned: each leaf has forward and backward for a plan's state
// (a layer written for pass_state alone cannot; a model of it trains, without plans).
template <class L, class Children = children_t<L>>
struct plannable;
template <class L>
struct plannable<L, type_list<>> {
  static constexpr bool value = has_forward<L, planning::state<float>> && has_backward<L, planning::state<float>>;
};
template <class L, class... C>
struct plannable<L, type_list<C...>> {
  static constexpr bool value = (plannable<C>::value && ...);
};
template <class L>
inline constexpr bool plannable_v = plannable<L>::value;

// The activation plan, and the most activation plus workspace bytes in use at once when the loss
// allocates `loss_workspace` bytes of workspace while it runs (the whole-step plan's transient
// peak: plan/step.hpp).
struct pass_plan {
  activation_plan_result activations;
  std::size_t transient_peak = 0;
  std::size_t live_before_watch = 0;  // activation bytes in use before make number `watch`
};

// Runs the pass on `mem` (which keeps every buffer's lifetime: plan/arena.hpp lays them out).
template <class Net, class Precision>
constexpr pass_plan plan_pass_into(planning::counter& mem, std::size_t batch, std::size_t features, std::size_t sequence,
                                   input_gradient dx, std::size_t loss_workspace,
                                   std::vector<std::size_t>* gradient_reports = nullptr,
                                   std::vector<pass_event>* events = nullptr) {
  using T = typename Precision::compute;
  planning::counter offloaded;
  pass_plan r;
  std::size_t at_loss = 0;
  {
    std::size_t const rows = batch * sequence;
    pass_options o{.training = true, .sequence_length = sequence, .input_gradient = bool(dx)};
    if constexpr (reads_ids_v<Net>) o.ids.count = rows;
    planning::state<T> s(mem, offloaded, o);
    s.record_gradient_reports(gradient_reports);
    s.record_events(events);
    planning::ref x = detail::input_activation<Net, Precision>(s, planning::input_shape{rows, features}, true);
    planning::ref g = detail::training_pass<Net>(s, planning::no_params{}, planning::no_params{}, std::move(x),
                                             [&](planning::ref const&, planning::ref const&) {
                                               at_loss = mem.live;
                                               if (loss_workspace) mem.workspace_while(loss_workspace);
                                             });
    g.reset();
    r.activations.saved_bytes = s.saved_bytes();
    r.activations.recomputed = s.recomputed();
  }
  r.activations.peak_bytes = mem.peak;
  r.activations.offloaded_bytes = offloaded.peak;
  r.live_before_watch = mem.watch < mem.made ? mem.live_before_watch : mem.live;
  std::size_t const workspace = memory::caching_allocator<host>::rounded(loss_workspace);
  r.transient_peak = at_loss + workspace > mem.peak ? at_loss + workspace : mem.peak;
  return r;
}

template <class Net, class Precision>
constexpr pass_plan plan_pass(std::size_t batch, std::size_t features, std::size_t sequence, input_gradient dx,
                              std::size_t loss_workspace, std::size_t watch = std::size_t(-1)) {
  planning::counter mem;
  mem.watch = watch;
  return plan_pass_into<Net, Precision>(mem, batch, features, sequence, dx, loss_workspace);
}

// The offsets (in parameters) at which a training pass's backward reports the gradients from
// there to the end final, in order (the model adds a last report of 0 after the pass): what a
// data-parallel wrapper that gives back reduced gradients' pages plans its peak with.
template <class Net, class Precision>
std::vector<std::size_t> gradient_reports() {
  planning::counter mem;
  std::vector<std::size_t> reports;
  plan_pass_into<Net, Precision>(mem, 1, Net::in_width, 1, input_gradient::none, 0, &reports);
  return reports;
}

// Where a running pass stands among the plan's reports (gradient_reports, with the model's own 0
// last): at each report, where the span backward writes next ends below.
struct report_cursor {
  std::vector<std::size_t> reports;
  std::size_t at = 0;
  void restart() { at = 0; }
  // The low end of the span a pass writes first.
  std::size_t first() const { return reports.empty() ? 0 : reports.front(); }
  // Backward reported `offset`: the span it writes next is [returned, offset), down to the plan's
  // next report; all below when a report was not the plan's.
  std::size_t next_after(std::size_t offset) {
    if (at < reports.size() && reports[at] == offset) {
      ++at;
      return at < reports.size() ? std::min(reports[at], offset) : 0;
    }
    at = reports.size();
    return 0;
  }
};

// The most device memory a gradient buffer holds in a pass when each span goes to the host as
// backward makes it final (OffloadedAdamW's offload_options::gradients): `count` elements of
// `element` bytes from a page-aligned base, pages of `page` bytes. Before backward writes the span
// down to the next report its pages are taken; a span's copy down starts at its report and is
// waited for at the next one (while backward makes the next span), when its pages are given back.
// What is held at a report: the pages touching that span and the one before it, and the last page
// when the buffer fills it only in part (never given back). `reports`: the plan's, in order; the
// model's own last report, 0, is added.
constexpr std::size_t offloaded_gradient_peak(std::vector<std::size_t> const& reports, std::size_t count,
                                              std::size_t element, std::size_t page) {
  if (count == 0 || page == 0) return 0;
  std::size_t const pages = (count * element + page - 1) / page;
  bool const last_partial = count * element % page != 0;
  // [prev, count) is final; [prev, pending) is the span whose copy is in flight (none when equal);
  // [next, prev) the span backward writes. Held: the pages touching [next, pending).
  std::size_t peak = 0, prev = count, pending = count, next = reports.empty() ? 0 : reports.front();
  for (std::size_t i = 0; i <= reports.size(); ++i) {
    std::size_t const r = i < reports.size() ? reports[i] : 0;
    std::size_t const lo = next * element / page, hi = (pending * element + page - 1) / page;
    std::size_t held = next < pending ? hi - lo : 0;
    if (last_partial && !(next < pending && hi == pages)) ++held;
    peak = held * page > peak ? held * page : peak;
    if (r < prev) {  // (the span [r, prev) is final: its copy starts, and the one before it ends)
      pending = prev;
      prev = r;
    }
    if (r == 0) pending = 0;  // (the last report waits for every copy)
    next = i + 1 < reports.size() ? (reports[i + 1] < r ? reports[i + 1] : r) : 0;
  }
  return peak;
}

// What a training pass does that a data-parallel wrapper takes part in, in order: the frames
// that gather parameters as they start and end, and backward's reports (see
// planning::state::gather_params): what a wrapper that keeps a shard of the parameters (ZeRO-3)
// plans its peak with, and what a rank whose pass failed goes on taking part in.
template <class Net, class Precision>
std::vector<pass_event> pass_events() {
  planning::counter mem;
  std::vector<pass_event> events;
  plan_pass_into<Net, Precision>(mem, 1, Net::in_width, 1, input_gradient::none, 0, nullptr, &events);
  return events;
}

// What a pass outside training does that a data-parallel wrapper takes part in: the frames of
// its forward that gather parameters, in order (an inference forward, or with `training` the
// training-mode forward of model.training_loss, which keeps nothing). What a rank whose forward
// failed goes on taking part in (ZeRO-3).
template <class Net, class Precision>
std::vector<pass_event> forward_events(bool training) {
  using T = typename Precision::compute;
  planning::counter mem, offloaded;
  std::vector<pass_event> events;
  {
    pass_options o{.training = training, .keep = false};
    if constexpr (reads_ids_v<Net>) o.ids.count = 1;
    planning::state<T> s(mem, offloaded, o);
    s.record_events(&events);
    planning::ref x = detail::input_activation<Net, Precision>(s, planning::input_shape{1, Net::in_width}, training);
    auto const gathered = gather_frame<Net>(s, planning::no_params{});
    planning::ref y = Net::forward(s, gathered.at(planning::no_params{}), std::move(x));
  }
  return events;
}

// The most rows (batch x sequence) a plan takes: 2^48, so that no count of rows times a width of
// bytes wraps around (planning::max_bytes bounds the rest).
inline constexpr std::size_t max_rows = std::size_t(1) << 48;

// A public plan's shape, refused (argument_error, from `who`) where the model would refuse the
// pass it describes (runtime/input_checks.hpp): no rows or more than max_rows, a sequence of 0 or
// past the positional table, a width other than the graph's fixed one (or none, any_width, for a
// graph whose width is open), an input gradient of token ids, and for a training pass more rows
// than a Budget was planned for. A plan never describes a pass that cannot run; in a constant
// expression the refusal is a compile error at its line.
template <class Net>
constexpr void check_plan_shape(char const* who, std::size_t batch, std::size_t features, std::size_t sequence,
                                bool training, input_gradient dx = input_gradient::none) {
  constexpr bool sequence_model = is_sequence_model_v<Net>;
  if (batch == 0) raise<argument_error>(who, ": expected a batch of at least one, found 0");
  if (sequence == 0) raise<argument_error>(who, ": expected a sequence of at least one position, found 0");
  if (batch > max_rows / sequence)
    raise<argument_error>(who, ": expected at most 2^48 rows (batch x sequence), found ", batch, " x ", sequence,
                          " (a negative number converted to std::size_t?)");
  if (sequence_model && sequence > max_sequence_v<Net>)
    raise<argument_error>(who, ": expected a sequence of at most ", max_sequence_v<Net>,
                          " positions (the model's positional table), found ", sequence);
  if (Net::in_width != any_width && features != Net::in_width)
    raise<argument_error>(who, ": expected the graph's input width of ", Net::in_width, " features, found ",
                          features);
  if (features == 0 || features == any_width)
    raise<argument_error>(who, ": expected the number of features (the graph's input width is not fixed), found none");
  if (reads_ids_v<Net> && dx == input_gradient::wanted)
    raise<argument_error>(who, ": expected no input gradient for a model reading token ids (ids have none), found "
                               "input_gradient::wanted");
  if (training && (batch * sequence > planned_rows_v<Net> || (sequence_model && sequence > planned_sequence_v<Net>)))
    raise<argument_error>(who, ": expected a training pass of at most ", planned_rows_v<Net> / planned_sequence_v<Net>,
                          " x ", planned_sequence_v<Net>,
                          " rows (batch x sequence: what this model's remat::Budget was planned for), found ", batch,
                          " x ", sequence);
}

}  // namespace detail

// The activation plan of a training step of a model<Net, Device, Precision> on `batch` rows (or
// sequences) of `features` values; `dx`: whether accumulate computes the input's gradient. The
// step's measured peak, model.last_pass().activation_peak, equals peak_bytes (the tests check it
// model by model); see the file's description.
template <class Net, class Precision = fp32>
constexpr activation_plan_result activation_plan(std::size_t batch, std::size_t features = Net::in_width,
                                                 std::size_t sequence = 1, input_gradient dx = input_gradient::none) {
  detail::check_plan_shape<Net>("remat::activation_plan", batch, features, sequence, true, dx);
  return detail::plan_pass<Net, Precision>(batch, features, sequence, dx, 0).activations;
}

// The plan of a sequence model for `batch` sequences of `sequence` positions.
template <class Net, class Precision = fp32>
constexpr activation_plan_result sequence_plan(std::size_t batch, std::size_t sequence) {
  static_assert(is_sequence_model_v<Net>, "remat::sequence_plan: the model has no sequence layers");
  return activation_plan<Net, Precision>(batch, Net::in_width, sequence);
}

}  // namespace REMAT_NAMESPACE
