// What makes a model's training pass a transaction (runtime/model.hpp): when it throws (out of
// memory at any allocation, say), the gradients are as they were before it, bit for bit (zeroed
// gradients are zeroed again; gradients holding a sum are restored from a copy made in the offload
// allocator before the pass), and an out_of_memory says where the activation plan stood. The
// running state, dropout stream and pass count are the model's to keep (a pass commits them only
// when it succeeds).
#pragma once

#include "../error.hpp"
#include "../kernels/evaluate.hpp"
#include "../memory/allocator.hpp"
#include "../memory/offload.hpp"
#include "../plan/activation.hpp"
#include "../pass/gradient_sync.hpp"
#include "arena_cache.hpp"

#include <cstddef>
#include <string>

namespace REMAT_NAMESPACE {
namespace detail {

// The activation peak of a pass: a window of the allocator's, closed when the pass leaves.
template <class Device>
struct peak_window {
  memory::caching_allocator<Device>& a;
  std::size_t const id;
  explicit peak_window(memory::caching_allocator<Device>& alloc)
      : a(alloc), id(alloc.open_peak_window(memory::tag::activations)) {}
  peak_window(peak_window const&) = delete;
  peak_window& operator=(peak_window const&) = delete;
  ~peak_window() { a.close_peak_window(id); }
};

// The gradients' side of a pass: armed once the pass is about to write them, it restores them
// when the pass leaves by an exception (after a data-parallel wrapper has finished what reads
// them). Params: the model, whose parameters (runtime/parameters.hpp) befriend it.
template <class Params>
class pass_rollback {
 public:
  using T = typename Params::value_type;
  using device = typename Params::device;
  explicit pass_rollback(Params& m) : m_(m), was_zero_(m.grads_zero_) {}
  pass_rollback(pass_rollback const&) = delete;
  pass_rollback& operator=(pass_rollback const&) = delete;

  // The pass is about to write the gradients: a sum in them is copied first when `backup` (a
  // wrapper that keeps a shard of the gradients only: the shard, the rest being zero); armed.
  void arm(bool backup) {
    if (!was_zero_ && backup) {
      gradient_sync* const sync = m_.link_.gradient_sync();
      kept_ = sync ? sync->kept_gradients(Params::stored_count()) : param_range{0, Params::stored_count()};
      if (kept_.size())
        copy_ = memory::held_block<memory::offload_space_t<device>>(m_.offload_allocator(), kept_.size() * sizeof(T),
                                                                    memory::tag::gradients);
      m_.copy_gradients(static_cast<T*>(copy_.get()), kept_, true);
      backed_up_ = true;
    }
    torn_ = !was_zero_ && !backup;
    armed_ = true;
    m_.grads_zero_ = false;
  }
  // Whether a failure leaves part of the pass's contribution in the gradients (no copy was made).
  bool torn() const { return torn_; }
  // The pass succeeded: nothing to restore.
  void disarm() { armed_ = false; }
  ~pass_rollback() {
    if (!armed_) return;
    try {
      gradient_sync* const sync = m_.link_.gradient_sync();
      if (was_zero_ || (backed_up_ && kept_.size() < Params::stored_count()))
        if (!sync || !sync->clear_gradients()) evaluate(m_.grads_, expr::to_expr(0.0));
      if (was_zero_)
        m_.grads_zero_ = true;
      else if (backed_up_)
        m_.copy_gradients(static_cast<T*>(copy_.get()), kept_, false);
    } catch (...) {  // (a device that fails a copy has failed the pass's error already)
    }
  }

 private:
  Params& m_;
  bool const was_zero_;
  bool armed_ = false, backed_up_ = false, torn_ = false;
  param_range kept_{};  // the gradients the copy holds (the rest were zero)
  memory::held_block<memory::offload_space_t<device>> copy_;
};

// Out of memory in a training pass of shape p: the allocator's message (with the layer and
// phase), and what the activation plan has in use at that point of the step (computed now, at run
// time): before activation number `made` (from 0), which failed or is the next to be made.
template <class Net, class Precision>
[[noreturn]] void explain_out_of_memory(out_of_memory const& e, pass_shape p, bool dx, std::size_t made,
                                        bool activation_failed, bool torn) {
  char const* const torn_note =
      torn ? "the gradients hold part of this pass's contribution (set_failure_backup is off): zero them before "
             "training on\n"
           : "";
  if constexpr (!plannable_v<Net>) {
    (void)p, (void)dx, (void)made, (void)activation_failed;
    if (torn) raise<out_of_memory>(e.what(), torn_note);
    throw e;
  } else {
    auto const [batch, features, seq] = p;
    auto const plan = plan_pass<Net, Precision>(batch, features, seq, input_gradient(dx), 0, made);
    raise<out_of_memory>(e.what(), "the activation plan of this step (batch ", batch, seq > 1 ? " x " : "",
                         seq > 1 ? std::to_string(seq) : std::string(), ") has ",
                         memory::format_bytes(plan.live_before_watch), " of activations in use ",
                         activation_failed ? "when it makes activation " : "after activation ",
                         activation_failed ? made + 1 : made, " of the step, where this failed; its peak is ",
                         memory::format_bytes(plan.activations.peak_bytes), "\n", torn_note);
  }
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
