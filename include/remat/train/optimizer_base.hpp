// What every optimizer shares: the gradients' prelude of a step (a loss scale's overflow check
// and unscaling, clipping by the global norm, agreed across data-parallel ranks), the range of
// the model's parameters it updates, its data-parallel hooks, and for AdamW and SGD the
// constructors from a model or from two buffers, the settings and the step count.
#pragma once

#include "../kernels/evaluate.hpp"
#include "../kernels/optimizers.hpp"
#include "../memory/allocator.hpp"
#include "../pass/gradient_sync.hpp"
#include "../tensor/tensor.hpp"
#include "loss_scale.hpp"

#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <utility>

namespace REMAT_NAMESPACE {

namespace detail {

// One of an optimizer's settings, checked where it is given (the constructor, set_lr): finite and
// at least 0, and below 1 when `below_one` (a moment's decay); argument_error naming it otherwise.
inline void check_setting(char const* who, char const* name, double v, bool below_one = false) {
  if (!(std::isfinite(v) && v >= 0 && (!below_one || v < 1)))
    raise<argument_error>(who, ": expected ", name, below_one ? " in [0, 1)" : " finite and >= 0", ", found ", v);
}

// What an optimizer step does before its update: the overflow check of a loss scale and
// clip_grad_norm_ (scale gradients by max_norm / (norm + 1e-6) when that is below 1), both from one
// reduction over the gradients, which is skipped when neither is wanted (the norm then reads NaN).
struct grad_prelude {
  bool overflow = false;
  double factor = 1.0;  // the gradients' multiplier in the update: clipping / loss scale
  double norm = std::numeric_limits<double>::quiet_NaN();  // of the unscaled gradients
};

//
// What may fail on one rank (the reduction's scratch; `fallible`: what else the step does before it
// changes anything) runs first, and under data parallelism the ranks agree on it before any of
// them goes on (gradient_sync::step_prepared): a failure on any rank is an error on every rank,
// with nothing changed. What follows, the update included, allocates nothing on the host.
template <class T, class D, class F>
grad_prelude prepare_gradients(tensor_view<T const, D> g, double max_norm, loss_scaler const* scaler,
                               gradient_sync* sync, F&& fallible) {
  grad_prelude r;
  double const scale = scaler ? scaler->scale() : 1.0;
  bool const check = scaler && scaler->checks();
  r.factor = 1.0 / scale;
  double squares = 0;
  std::exception_ptr failed;
  try {
    fallible();
    if (check || max_norm > 0) squares = kernels::grad_check(D{}, g.size(), g.data());
  } catch (...) {
    failed = std::current_exception();
  }
  if (sync) sync->step_prepared(failed);
  else if (failed) std::rethrow_exception(failed);
  if (!check && max_norm <= 0) return r;
  // Data parallel: every rank decides on the same norm (and overflow) from all ranks' gradients.
  if (sync) squares = sync->agree_squares(std::isfinite(squares) ? squares : std::numeric_limits<double>::infinity());
  if (!std::isfinite(squares)) {
    if (check) {
      r.overflow = true;
      return r;
    }
    // Without a loss scale an inf/NaN gradient is not a skipped step: clipping proceeds as
    // PyTorch's does, and the update spreads the NaN.
  }
  r.norm = std::sqrt(squares) / scale;
  if (max_norm > 0) {
    double const c = max_norm / (r.norm + 1e-6);
    r.factor = (c < 1.0 ? c : 1.0) / scale;
  }
  return r;
}

// The parameters an optimizer built from a model updates: its data-parallel shard, or all.
// Elements [r.begin, r.end) of a view, clamped to it (attach() then rejects a bad range with its
// own message).
template <class T, class D>
tensor_view<T, D> range_of(tensor_view<T, D> v, param_range r) {
  std::size_t const b = r.begin < v.rows() ? r.begin : v.rows();
  std::size_t const e = r.end < v.rows() ? r.end : v.rows();
  return v.row_range(b, e > b ? e - b : 0);
}

template <class Model>
param_range shard_of(Model const& m) {
  if (gradient_sync const* s = m.link().gradient_sync()) return s->shard();
  return {0, Model::parameter_count};
}

// What AdamW and SGD share beyond their update: the model's compute copy of the weights (written
// in the update's pass), its loss scale, its data-parallel wrapper, and what the last step saw.
template <class T, class D, class C>
class optimizer_base {
 public:
  // The global norm of the (unscaled) gradients seen by the last step, before clipping; NaN when
  // neither clipping nor a loss scale's check needed it.
  double last_grad_norm() const { return last_norm_; }
  // Whether the last step was skipped because a gradient overflowed.
  bool last_step_skipped() const { return last_skipped_; }
  // The loss scale of the model this optimizer was built from (null over bare buffers).
  loss_scaler* scaler() const { return scaler_; }
  // The parameters of its model that this optimizer updates (a data-parallel shard, or all).
  param_range range() const { return range_; }
  // Fault injection, for testing what code above the optimizer does when its step fails: the next
  // step throws remat::error where a failure of its own would (before it changes anything; under
  // data parallelism, before the ranks agree on it). Fails once.
  void fail_next_step() { fail_next_ = true; }

 protected:
  template <class Model>
  void attach(Model& m, param_range r, char const* who) {
    if (r.begin > r.end || r.end > Model::parameter_count)
      raise<argument_error>(who, ": expected a range of the model's ", Model::parameter_count, " parameters, found [",
                            r.begin, ", ", r.end, ")");
    if constexpr (!std::is_same_v<D, host>)
      if (m.master_on_host())
        raise<argument_error>(who, ": this model's master weights live in host memory (OffloadedAdamW with "
                              "offload_options::master_weights put them there), where the device's update does not "
                              "reach; train it with OffloadedAdamW");
    if (gradient_sync const* s = m.link().gradient_sync(); s && s->gradients_elsewhere())
      raise<argument_error>(who, ": this model's gradients live in host memory (OffloadedAdamW with "
                            "offload_options::gradients put them there); train it with that optimizer");
    tensor_view<C, D> pc = m.compute_parameters();
    if (pc.data() && pc.size() != Model::parameter_count)
      raise<shape_error>(who, ": expected a compute copy of ", Model::parameter_count, " weights, found ", pc.size());
    pc_ = pc.data() ? pc.data() + r.begin : nullptr;
    scaler_ = &m.scaler();
    sync_slot_ = m.link().gradient_sync_slot();
    range_ = r;
    who_ = who;
  }
  // The check and the clipping factor; false (and the scale backed off) when the step is skipped.
  // Under data parallelism, first waits for the gradients' reduction.
  bool begin_step(tensor_view<T const, D> g, double clip_norm, grad_prelude& pre) {
    return begin_step<D>(g, clip_norm, pre);
  }
  // (The gradients g may be on another device than the update: OffloadedAdamW checks them where
  // the model computed them.)
  template <class GD>
  bool begin_step(tensor_view<T const, GD> g, double clip_norm, grad_prelude& pre) {
    gradient_sync* const sync = finish_reduction();
    pre = prepare_gradients(g, clip_norm, scaler_, sync, [&] {
      if (std::exchange(fail_next_, false)) raise<error>(who_, ": a failure injected by fail_next_step");
    });
    last_norm_ = pre.norm;
    last_skipped_ = pre.overflow;
    if (scaler_) scaler_->update(pre.overflow);
    return !pre.overflow;
  }
  // Under data parallelism: checks that the wrapper's shard is this optimizer's and waits for the
  // gradients' reduction (again: a no-op). Returns the wrapper, or null.
  gradient_sync* finish_reduction() {
    gradient_sync* const sync = sync_slot_ ? *sync_slot_ : nullptr;
    if (sync) {
      if (sync->shard() != range_)
        raise<argument_error>(who_, ": this optimizer updates parameters [", range_.begin, ", ", range_.end,
                              ") but its model's data-parallel wrapper gives this rank [", sync->shard().begin, ", ",
                              sync->shard().end, "); build the optimizer after the remat::dist::data_parallel");
      sync->finish();
    }
    return sync;
  }
  // After the update (or the skip): a sharded data-parallel run gathers the parameters.
  void end_step(bool stepped) {
    if (gradient_sync* sync = sync_slot_ ? *sync_slot_ : nullptr) sync->after_update(stepped);
  }

  C* pc_ = nullptr;
  bool fail_next_ = false;
  loss_scaler* scaler_ = nullptr;
  gradient_sync* const* sync_slot_ = nullptr;
  param_range range_{};
  char const* who_ = "optimizer";

 private:
  double last_norm_ = 0;
  bool last_skipped_ = false;
};

}  // namespace detail

namespace detail {

// One tensor of an optimizer's state, under the name its files give it (PyTorch's state dict's):
// what io/checkpoint.hpp and dist::save write and read, so an optimizer gets its files by listing
// its state. `tensor` is null when this optimizer keeps none of it (`absent` then says what it
// lacks: SGD without "momentum").
template <class Tensor>
struct named_state {
  char const* name;
  Tensor* tensor;
  char const* absent = nullptr;
};

// An optimizer over a model's parameters and gradients (or any two buffers of the same size),
// with its options: the constructors, the settings and the step count AdamW and SGD share. The
// optimizer's own state comes from state_tensor(), in its member initializers.
template <class T, class D, class C, class Options>
class model_optimizer : public optimizer_base<T, D, C> {
 public:
  // Over the model's parameters, or this rank's shard of them when the model is wrapped in a
  // sharded remat::dist::data_parallel.
  template <class Model>
  explicit model_optimizer(Model& m, Options o = {}) : model_optimizer(m, o, shard_of(m)) {}

  // Over parameters [r.begin, r.end) of the model.
  template <class Model>
  model_optimizer(Model& m, Options o, param_range r)
      : model_optimizer(range_of(m.parameters(), r), range_of(m.gradients(), r), o, m.allocator()) {
    this->attach(m, r, Options::optimizer);
  }

  // Over any parameter and gradient buffers of the same size.
  model_optimizer(tensor_view<T, D> params, tensor_view<T, D> grads, Options o = {},
                  memory::caching_allocator<D>& alloc = memory::default_allocator<D>())
      : p_(params), g_(grads), o_(o), alloc_(&alloc) {
    if (grads.size() != params.size())
      raise<shape_error>(Options::optimizer, ": expected as many gradients as parameters (", params.size(),
                         "), found ", grads.size());
    this->range_ = {0, p_.size()};
    o_.check();
  }

  // The rate of the next steps (a schedule calls it): finite and >= 0, or argument_error and the
  // rate unchanged.
  void set_lr(double lr) {
    check_setting(Options::optimizer, "lr", lr);
    o_.lr = lr;
  }
  double lr() const { return o_.lr; }  // the rate of the next step
  // Steps taken (skipped ones not counted).
  std::uint64_t steps() const { return t_; }
  // Sets the step count (what a restored state resumes from).
  void set_steps(std::uint64_t t) { t_ = t; }
  Options const& options() const { return o_; }  // its settings (and set_lr's rate)
  // The kind of state its files hold ("AdamW", "SGD").
  static constexpr char const* state_kind = Options::optimizer;

 protected:
  // A step: the gradients' prelude (unscaling, the overflow check, clipping; under data
  // parallelism, the reduction first), then update(factor) with the gradients' multiplier, the
  // step counted. Returns false when the step was skipped (a gradient overflowed under a loss
  // scale): nothing is updated then.
  template <class Update>
  bool run_step(Update&& update) {
    memory::tracing::phase_scope const stepping(memory::phase::optimizer);
    grad_prelude pre;
    if (!this->begin_step(g_, o_.clip_norm, pre)) {
      this->end_step(false);
      return false;
    }
    update(pre.factor);  // (t_ counts the step once the update is issued)
    ++t_;
    this->end_step(true);
    return true;
  }
  // One value per parameter it updates, tagged optimizer_state, zero when `zeroed`.
  tensor<T, D> state_tensor(bool zeroed) {
    tensor<T, D> t(index_t(p_.size()), 1, memory::tag::optimizer_state, *alloc_);
    if (zeroed) evaluate(t, expr::to_expr(0.0));
    return t;
  }

  tensor_view<T, D> p_, g_;
  Options o_;
  memory::caching_allocator<D>* alloc_;
  std::uint64_t t_ = 0;
};

}  // namespace detail

}  // namespace REMAT_NAMESPACE
