// What a data-parallel wrapper (remat::dist) plugs into a model, so that the model's own training
// pass and the optimizers built from it reduce gradients across processes without the caller
// doing anything else: backward reports gradients as they become final (the wrapper starts
// reducing them while backward goes on), and an optimizer's step waits for the reduction, agrees
// with the other ranks on the gradient norm and on overflow, updates its shard of the parameters
// and lets the wrapper gather the rest.
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <exception>

namespace REMAT_NAMESPACE {

// A range of a model's flat parameter buffer: what a sharded optimizer updates.
struct param_range {
  std::size_t begin = 0;  // the first element
  std::size_t end = 0;    // one past the last
  constexpr std::size_t size() const { return end - begin; }  // the number of elements
  // The same range.
  friend constexpr bool operator==(param_range, param_range) = default;
};

namespace detail {

// What a training pass does that a data-parallel wrapper takes part in, in order, as the plan
// walk records it: a frame gathers parameters (ZeRO-3) and ends, and backward reports gradients
// final from an offset on.
struct pass_event {
  enum class kind : unsigned char { gather, done, report };
  kind what = kind::done;
  param_range range{};  // gather: the frame's parameters; report: {offset, offset}
};

// Where a rank's reduced gradients go when they live in host memory (OffloadedAdamW's
// offload_options::gradients under a ZeRO-2 or ZeRO-3 data-parallel wrapper): the wrapper tells
// it, in parameter offsets within the rank's shard, what to put on the device before backward adds
// onto it and what is reduced and final there, before it gives those pages back.
class gradient_sink {
 public:
  virtual ~gradient_sink() = default;
  // A training pass starts (the sink may copy its sum aside, to restore if the pass fails).
  virtual void pass_starting() = 0;
  // Backward is about to add onto gradients [lo, hi) of the shard: the sum so far goes there.
  virtual void fill(std::size_t lo, std::size_t hi) = 0;
  // Gradients [lo, hi) of the shard are reduced and final on the device: they come down.
  virtual void reduced(std::size_t lo, std::size_t hi) = 0;
  // The pass ended on every rank (failed: every rank undoes it; the sum is as before the pass).
  virtual void pass_ended(bool failed) = 0;
  // zero_grad, or a failed pass's undoing (after pass_ended(true): the sum restored is kept).
  virtual void clear() = 0;
};

class gradient_sync {
 public:
  virtual ~gradient_sync() = default;
  // Throws, before anything changes, when a training pass may not start now.
  virtual void check_pass() const = 0;
  // A training pass starts.
  virtual void pass_starting() = 0;
  // During backward: the gradients from `offset` to the end are final. The pass ends with 0.
  virtual void gradients_ready(std::size_t offset) = 0;
  // The training pass has ended on this rank: `failed` holds what it threw, or is null when it
  // succeeded. Called before the model keeps the pass or restores what it changed. A wrapper
  // completes this rank's part of what the other ranks started and agrees with them; when any rank
  // failed it throws on every rank (the failing rank its own exception, the others dist_error),
  // and the model then restores its state. Returns only when every rank succeeded.
  virtual void pass_ended(std::exception_ptr failed) {
    if (failed) std::rethrow_exception(failed);
  }
  // The model's gradients are about to be set to zero (what still reads them finishes first).
  virtual void zeroing_gradients() = 0;
  // Sets the model's gradients to zero itself and returns true, when it keeps only part of them
  // (sharded gradients: the memory of the rest is given back); false: the model zeroes them.
  virtual bool clear_gradients() { return false; }
  // The part of the model's `count` gradients that may hold values between passes (the rest is
  // zero): what a failed pass's backup copies and restores. All of them, unless the wrapper keeps
  // a shard of the gradients only.
  virtual param_range kept_gradients(std::size_t count) const { return {0, count}; }
  // The parameters this process's optimizer updates (all of them unless the state is sharded).
  virtual param_range shard() const = 0;
  // Whether the model's gradients live elsewhere (OffloadedAdamW's offload_options::gradients:
  // in host memory), so that the model's buffer reads zero between passes.
  virtual bool gradients_elsewhere() const { return false; }
  // Sends this rank's reduced gradients to `sink` from now on (null: back to the model's buffer);
  // false when this wrapper cannot (only one that keeps a shard of the gradients can: ZeRO-2, 3).
  virtual bool attach_gradient_sink(gradient_sink* sink) {
    (void)sink;
    return false;
  }
  // Before an optimizer reads the gradients: every reduction finished.
  virtual void finish() = 0;
  // An optimizer's step has done what may fail on this rank (`failed`: what it threw, or null)
  // and changed nothing yet. A wrapper agrees with the other ranks: when any failed, every rank
  // throws (the failing rank its own exception, the others dist_error) and no step is taken.
  virtual void step_prepared(std::exception_ptr failed) {
    if (failed) std::rethrow_exception(failed);
  }
  // The sum of squares of all gradients, from this rank's part (its shard, or all when not
  // sharded); +inf when any rank's part is not finite. The same value on every rank.
  virtual double agree_squares(double local) = 0;
  // After an optimizer step (stepped: not skipped): gather the shards' updated parameters.
  virtual void after_update(bool stepped) = 0;

  // ---- a wrapper that keeps a shard of the parameters (ZeRO-3), or of the master weights only
  // Whether it holds the pages of the model's parameter buffers (the master weights' at least; on
  // any number of ranks): they must stay where they are while it lives.
  virtual bool shards_parameters() const { return false; }
  // Whether every pass (training or not) must tell parameters_needed which parameters each layer
  // reads before it runs; such passes are collective (every rank runs them).
  virtual bool gathers_parameters() const { return false; }
  // Whether the model's buffer holds every parameter's value now (a wrapper that keeps a shard of
  // them: only after it made them whole, until its next pass or step).
  virtual bool parameters_whole() const { return true; }
  // A layer is about to read parameters [offset, offset + count): their values are brought in;
  // returns where the layer reads them until parameters_done (null: where they are).
  virtual void const* parameters_needed(std::size_t offset, std::size_t count) {
    (void)offset;
    (void)count;
    return nullptr;
  }
  // The layer of the last parameters_needed not yet done has run (or left by an exception).
  virtual void parameters_done() noexcept {}
  // The part of the model's `count` parameters whose compute copy (mixed precision) a pass casts
  // from the master weights: all of them, unless the wrapper keeps a shard of them and gathers
  // each layer's compute copy from the other ranks (ZeRO-3) or the rest of the copy after each
  // step (the master weights' shard only), when it is the shard.
  virtual param_range kept_parameters(std::size_t count) const { return {0, count}; }
  // A pass outside training (model.forward, model.loss, model.training_loss) has ended, or the
  // parameters were made whole for a while (dist::save): what is not this rank's is let go.
  virtual void release_parameters() noexcept {}
  // A pass outside training (model.forward, loss; with `training`, training_loss's forward)
  // starts on a model whose passes are collective (gathers_parameters()).
  virtual void collective_pass_starting(bool training) { (void)training; }
  // That pass has ended on this rank, `failed` if it threw: a rank that failed takes its part in
  // what the other ranks' pass still gathers, the ranks agree, and if it threw on any rank it
  // throws on every rank (the failing rank its own exception); the parameters made whole for it
  // are let go.
  virtual void collective_pass_ended(std::exception_ptr failed) {
    if (failed) std::rethrow_exception(failed);
  }
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
