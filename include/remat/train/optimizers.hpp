// SGD (momentum, Nesterov, weight decay) and AdamW (decoupled weight decay, bias correction),
// each with optional gradient clipping by global norm; an update is one fused pass over the
// parameters. Both follow PyTorch's definitions (torch.optim.SGD, torch.optim.AdamW).
//
// Built from a model, an optimizer also serves its precision: it divides the loss scale out of
// the gradients in the update's multiply, and (unless the scale is the identity) checks them for
// inf/NaN first. On overflow the step is skipped: weights, moments and the step count stay as they
// were, step() returns false and the scale backs off. A mixed-precision model's compute copy of
// the weights is written in the same pass as the fp32 master weights.
#pragma once

#include "../kernels/evaluate.hpp"
#include "../kernels/optimizers.hpp"
#include "../memory/allocator.hpp"
#include "../memory/offload.hpp"
#include "../tensor/tensor.hpp"
#include "../pass/gradient_sync.hpp"
#include "../plan/optimizer_state.hpp"
#include "loss_scale.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

namespace REMAT_NAMESPACE {

namespace detail {

// What an optimizer step does before its update: the overflow check of a loss scale and
// clip_grad_norm_ (scale gradients by max_norm / (norm + 1e-6) when that is below 1), both from one
// reduction over the gradients, which is skipped when neither is wanted (the norm then reads NaN).
struct grad_prelude {
  bool overflow = false;
  double factor = 1.0;  // the gradients' multiplier in the update: clipping / loss scale
  double norm = std::numeric_limits<double>::quiet_NaN();  // of the unscaled gradients
};

template <class T, class D>
grad_prelude prepare_gradients(tensor_view<T const, D> g, double max_norm, loss_scaler const* scaler,
                               gradient_sync* sync = nullptr) {
  grad_prelude r;
  double const scale = scaler ? scaler->scale() : 1.0;
  bool const check = scaler && scaler->checks();
  r.factor = 1.0 / scale;
  if (!check && max_norm <= 0) return r;
  double squares = kernels::grad_check(D{}, g.size(), g.data());
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

 protected:
  template <class Model>
  void attach(Model& m, param_range r, char const* who) {
    if (r.begin > r.end || r.end > Model::parameter_count)
      raise<argument_error>(who, ": expected a range of the model's ", Model::parameter_count, " parameters, found [",
                            r.begin, ", ", r.end, ")");
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
    pre = prepare_gradients(g, clip_norm, scaler_, sync);
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
  loss_scaler* scaler_ = nullptr;
  gradient_sync* const* sync_slot_ = nullptr;
  param_range range_{};
  char const* who_ = "optimizer";

 private:
  double last_norm_ = 0;
  bool last_skipped_ = false;
};

}  // namespace detail

// AdamW's settings, PyTorch's names and defaults (torch.optim.AdamW).
struct adamw_options {
  double lr = 1e-3;            // the learning rate (set_lr changes it between steps)
  double beta1 = 0.9;          // the first moment's decay
  double beta2 = 0.999;        // the second moment's decay
  double eps = 1e-8;           // added to the second moment's root
  double weight_decay = 1e-2;  // decoupled: p -= lr * weight_decay * p, beside the Adam update
  double clip_norm = 0;        // the gradients' global norm is clipped to this; 0: no clipping
};

namespace detail {
// What AdamW's update of step t (from 1) uses, with the gradients' multiplier `factor`.
inline kernels::adamw_scalars adamw_scalars_for(adamw_options const& o, double factor, double t) {
  return {factor,
          1.0 - o.lr * o.weight_decay,
          o.beta1,
          o.beta2,
          o.lr / (1.0 - std::pow(o.beta1, t)),
          std::sqrt(1.0 - std::pow(o.beta2, t)),
          o.eps};
}
}  // namespace detail

// AdamW (Loshchilov and Hutter; PyTorch's update, bias corrections included) over fp32 (or fp64)
// master weights T on device D; a mixed-precision model's compute copy C is written in the same
// pass. step() unscales, checks (a loss scale's overflow skips the step) and clips the gradients
// first. Build it from the model: AdamW opt(model, {.lr = 3e-4}).
template <class T, class D = host, class C = T>
class AdamW : public detail::optimizer_base<T, D, C> {
 public:
  // Over the model's parameters, or this rank's shard of them when the model is wrapped in a
  // sharded remat::dist::data_parallel.
  template <class Model>
  explicit AdamW(Model& m, adamw_options o = {}) : AdamW(m, o, detail::shard_of(m)) {}

  // Over parameters [r.begin, r.end) of the model.
  template <class Model>
  AdamW(Model& m, adamw_options o, param_range r)
      : AdamW(detail::range_of(m.parameters(), r), detail::range_of(m.gradients(), r), o, m.allocator()) {
    this->attach(m, r, "AdamW");
  }

  // Over any parameter and gradient buffers of the same size.
  AdamW(tensor_view<T, D> params, tensor_view<T, D> grads, adamw_options o = {},
        memory::caching_allocator<D>& alloc = memory::default_allocator<D>())
      : p_(params),
        g_(grads),
        m_(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc),
        v_(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc),
        o_(o) {
    if (grads.size() != params.size())
      detail::raise<shape_error>("AdamW: expected as many gradients as parameters (", params.size(), "), found ",
                                 grads.size());
    this->range_ = {0, p_.size()};
    evaluate(m_, expr::to_expr(0.0));
    evaluate(v_, expr::to_expr(0.0));
  }

  // Returns false when the step was skipped (a gradient overflowed under a loss scale).
  bool step() {
    memory::tracing::phase_scope const stepping(memory::phase::optimizer);
    detail::grad_prelude pre;
    if (!this->begin_step(g_, o_.clip_norm, pre)) {
      this->end_step(false);
      return false;
    }
    // (t_ counts the step once the update is issued)
    kernels::adamw_scalars const k = detail::adamw_scalars_for(o_, pre.factor, double(t_ + 1));
    kernels::adamw_update(D{}, p_.size(), p_.data(), g_.data(), m_.data(), v_.data(), k, this->pc_);
    ++t_;
    this->end_step(true);
    return true;
  }

  void set_lr(double lr) { o_.lr = lr; }  // the rate of the next steps (a schedule calls it)
  double lr() const { return o_.lr; }     // the rate of the next step
  // Steps taken (skipped ones not counted): the bias corrections' t.
  std::uint64_t steps() const { return t_; }
  // Sets the step count (what a restored state resumes from).
  void set_steps(std::uint64_t t) { t_ = t; }
  adamw_options const& options() const { return o_; }  // its settings (and set_lr's rate)
  // The first moments ("exp_avg" in PyTorch's state dict), one per parameter it updates.
  tensor<T, D>& exp_avg() { return m_; }
  // The second moments ("exp_avg_sq" in PyTorch's state dict), one per parameter it updates.
  tensor<T, D>& exp_avg_sq() { return v_; }
  // The first moments, read-only.
  tensor<T, D> const& exp_avg() const { return m_; }
  // The second moments, read-only.
  tensor<T, D> const& exp_avg_sq() const { return v_; }

 private:
  tensor_view<T, D> p_, g_;
  tensor<T, D> m_, v_;
  adamw_options o_;
  std::uint64_t t_ = 0;
};

// AdamW keeps two: the first and second moments.
template <>
struct optimizer_state_buffers<AdamW> {
  static constexpr std::size_t count(step_options const&) { return 2; }  // exp_avg and exp_avg_sq
};

// AdamW opt(model): the model's master type, device and compute type.
template <class Model>
AdamW(Model&, adamw_options = {})
    -> AdamW<typename Model::value_type, typename Model::device, typename Model::compute_type>;

namespace detail {
// The stream an optimizer's copies up run on: none on the host (memcpy), one of its own on the GPU.
template <class D>
struct upload_stream {
  offload_channel<D> channel() { return {}; }
};
#if REMAT_HAS_CUDA
template <>
struct upload_stream<cuda> {
  upload_stream() = default;
  upload_stream(upload_stream&&) = default;
  upload_stream& operator=(upload_stream&&) = default;
  // The last step's copies read the optimizer's page-locked buffers: they finish before those go.
  ~upload_stream() {
    try {
      stream.synchronize();
    } catch (...) {  // (a destructor may run after the context is gone)
    }
  }
  owned_cuda_stream stream{cudaStreamNonBlocking};
  offload_channel<cuda> channel() { return {&memory::default_offload_allocator<cuda>(), stream.get()}; }
};
#endif
}  // namespace detail

// AdamW with its state in host memory, for a model on the GPU (ZeRO-Offload's optimizer): the
// moments and a copy of the fp32 master weights live on the host, and each step copies the
// gradients down, runs AdamW's update there (kernels::adamw_update on the host: one vectorised
// pass split across the host's threads) and copies the new weights up, with the compute copy of a
// mixed-precision model. The device keeps the model's master weights, gradients and compute copy
// but no optimizer state: 8 bytes per parameter less than AdamW (the model allocator's
// optimizer_state tag holds nothing; the host state is in host_allocator()). What crosses to and
// from the GPU (the gradients' landing buffer, the weights' host copy and their compute copy) is
// page-locked on the GPU, in staging_allocator(), so the copies run at the link's full rate.
//
// The update is AdamW's own on the same values, so on the host a run equals AdamW's bit for bit,
// skipped steps, clipping and loss scale included. On the GPU the overflow check and the norm are
// AdamW's own reduction on the device and the update the same IEEE operations on the host: the
// same bits as AdamW on the GPU (tested on an H100). Built from a model as AdamW is, it takes the
// same options, a data-parallel wrapper's shard (its copies are then of the shard only) and
// agreements, and saves and loads in AdamW's format. When the model's weights are written from
// outside (load, a writable parameters() view: model::parameter_version moves), the next step
// copies them down again first.
//
// Each step waits for the gradients to reach the host. The update and the copies up go a chunk at
// a time (set_chunk), each chunk's copy overlapping the update of the next, and the step returns
// without waiting for the last copy: the model's stream waits for it on the device, so the host
// goes on to queue the next forward. The next forward's compute does not yet start before the
// last weights have arrived (that needs the walk to wait per segment).
template <class Model>
class OffloadedAdamW
    : public detail::optimizer_base<typename Model::value_type, host, typename Model::compute_type> {
  using T = typename Model::value_type;
  using C = typename Model::compute_type;
  using D = typename Model::device;
  using sys = memory::system<D>;

 public:
  // Over the model's parameters, or this rank's shard of them when the model is wrapped in a
  // sharded remat::dist::data_parallel. The host state comes from host_alloc, or from an
  // allocator of the optimizer's own.
  explicit OffloadedAdamW(Model& m, adamw_options o = {}) : OffloadedAdamW(m, o, detail::shard_of(m)) {}

  // Over parameters [r.begin, r.end) of the model.
  OffloadedAdamW(Model& m, adamw_options o, param_range r, memory::caching_allocator<host>* host_alloc = nullptr)
      : own_(host_alloc ? nullptr : std::make_unique<memory::caching_allocator<host>>()),
        alloc_(host_alloc ? host_alloc : own_.get()),
        model_(&m),
        o_(o) {
    if (r.begin > r.end || r.end > Model::parameter_count)
      detail::raise<argument_error>("OffloadedAdamW: expected a range of the model's ", Model::parameter_count,
                                    " parameters, found [", r.begin, ", ", r.end, ")");
    if constexpr (std::is_same_v<staging_space, host>) {
      staging_ = alloc_;
    } else {
      own_staging_ = std::make_unique<memory::caching_allocator<staging_space>>();
      staging_ = own_staging_.get();
    }
    std::size_t const n = r.size();
    dp_ = detail::range_of(m.parameters(), r);
    dg_ = detail::range_of(m.gradients(), r);
    tensor_view<C, D> const pc = m.compute_parameters();
    dpc_ = pc.data() ? pc.data() + r.begin : nullptr;
    p_ = staged<T>(p_block_, n, memory::tag::optimizer_state);
    g_ = staged<T>(g_block_, n, memory::tag::gradients);
    m_ = tensor<T, host>(index_t(n), 1, memory::tag::optimizer_state, *alloc_);
    v_ = tensor<T, host>(index_t(n), 1, memory::tag::optimizer_state, *alloc_);
    if (dpc_) pc_host_ = staged<C>(pc_block_, n, memory::tag::optimizer_state);
    evaluate(m_, expr::to_expr(0.0));
    evaluate(v_, expr::to_expr(0.0));
    if (n) sys::copy_to_host(p_.data(), dp_.data(), n * sizeof(T));
    version_ = m.parameter_version();
    this->scaler_ = &m.scaler();
    this->sync_slot_ = m.link().gradient_sync_slot();
    this->range_ = r;
    this->who_ = "OffloadedAdamW";
  }

  // Copies the gradients down, unscales, checks and clips them, updates on the host and copies
  // the weights up. Returns false when the step was skipped (a gradient overflowed under a loss
  // scale): nothing is copied up then.
  bool step() {
    memory::tracing::phase_scope const stepping(memory::phase::optimizer);
    std::size_t const n = p_.size();
    // The overflow check and the norm run where the gradients are (on the GPU: one reduction
    // there, the same as AdamW's), and a skipped step copies nothing down.
    detail::grad_prelude pre;
    if (!this->begin_step(tensor_view<T const, D>(dg_), o_.clip_norm, pre)) {
      this->end_step(false);
      return false;
    }
    if (n) sys::copy_to_host(g_.data(), dg_.data(), n * sizeof(T));
    if (model_->parameter_version() != version_ && n)  // written from outside: read them again
      sys::copy_to_host(p_.data(), dp_.data(), n * sizeof(T));
    kernels::adamw_scalars const k = detail::adamw_scalars_for(o_, pre.factor, double(t_ + 1));
    // The update and the copies up, a chunk at a time: on the GPU a chunk's weights cross on a
    // stream of their own while the host updates the next chunk, and the model's stream waits for
    // the last copy on the device, not on the host (the next forward is queued behind it).
    std::size_t const chunk = chunk_ && chunk_ < n ? chunk_ : n;
    detail::copy_fence<D> up;
    up.begin(uploads_.channel());
    for (std::size_t at = 0; at < n; at += chunk) {
      std::size_t const len = std::min(chunk, n - at);
      C* const pc = dpc_ ? pc_host_.data() + at : nullptr;
      kernels::adamw_update(host{}, len, p_.data() + at, g_.data() + at, m_.data() + at, v_.data() + at, k, pc);
      up.to_device(dp_.data() + at, p_.data() + at, len * sizeof(T));
      if (dpc_) up.to_device(dpc_ + at, pc, len * sizeof(C));
    }
    up.end();
    up.wait();
    ++t_;
    this->end_step(true);  // (a sharded run gathers the other ranks' parts; this rank's are p_)
    version_ = model_->parameter_version();
    return true;
  }

  void set_lr(double lr) { o_.lr = lr; }  // the rate of the next steps (a schedule calls it)
  double lr() const { return o_.lr; }     // the rate of the next step
  std::uint64_t steps() const { return t_; }  // steps taken (skipped ones not counted)
  void set_steps(std::uint64_t t) { t_ = t; }  // sets the step count (what a restored state resumes from)
  adamw_options const& options() const { return o_; }  // its settings (and set_lr's rate)
  // The parameters updated and copied up at a time (0: all at once, no overlap). On the GPU a
  // chunk's copy up overlaps the host's update of the next; the default, 8 Mi parameters (32 MiB
  // of fp32), was the fastest measured on an H100 (bench_policies_cuda --offload-optimizer). On
  // the host, where the copies are memcpy, the default is 0. The results are the same bits for
  // every chunk.
  void set_chunk(std::size_t parameters) { chunk_ = parameters; }
  std::size_t chunk() const { return chunk_; }  // set_chunk's value
  // The first moments, in host memory ("exp_avg", as AdamW's).
  tensor<T, host>& exp_avg() { return m_; }
  // The second moments, in host memory ("exp_avg_sq", as AdamW's).
  tensor<T, host>& exp_avg_sq() { return v_; }
  tensor<T, host> const& exp_avg() const { return m_; }  // (read-only)
  tensor<T, host> const& exp_avg_sq() const { return v_; }  // (read-only)
  // The host copy of the master weights it updates (equal to the model's after each step).
  tensor<T, host> const& master_weights() const { return p_; }
  // Where the host state lives: the moments (and, for a host model, the buffers of
  // staging_allocator(): the weights' copy, their compute copy and the gradients' landing buffer).
  memory::caching_allocator<host>& host_allocator() const { return *alloc_; }
  // The memory of the buffers that cross to and from the device: pinned host memory for a GPU
  // model, host memory for a host model.
  using staging_space = memory::offload_space_t<D>;
  // Where the buffers that cross to and from the device live: page-locked host memory of the
  // optimizer's own for a GPU model (copies at the link's full rate, without a bounce through a
  // driver buffer); host_allocator() itself for a host model.
  memory::caching_allocator<staging_space>& staging_allocator() const { return *staging_; }

 private:
  // A host tensor of n elements over a block of the staging allocator, which `block` holds.
  template <class U>
  tensor<U, host> staged(memory::held_block<staging_space>& block, std::size_t n, memory::tag t) {
    if (n == 0) return tensor<U, host>(index_t(0), 1, t, *alloc_);
    block = memory::held_block<staging_space>(*staging_, n * sizeof(U), t);
    return tensor<U, host>(tensor<U, host>::borrowed, static_cast<U*>(block.get()), n, 1);
  }

  std::unique_ptr<memory::caching_allocator<host>> own_;
  memory::caching_allocator<host>* alloc_;
  std::unique_ptr<memory::caching_allocator<staging_space>> own_staging_;
  memory::caching_allocator<staging_space>* staging_ = nullptr;
  // (the staging blocks outlive the tensors over them: declared first, destroyed last)
  memory::held_block<staging_space> p_block_, g_block_, pc_block_;
  Model* model_;
  tensor_view<T, D> dp_, dg_;
  C* dpc_ = nullptr;
  tensor<T, host> p_, g_, m_, v_;
  tensor<C, host> pc_host_;
  adamw_options o_;
  std::uint64_t t_ = 0;
  std::uint64_t version_ = 0;
  std::size_t chunk_ = std::is_same_v<D, host> ? 0 : std::size_t(8) << 20;
  detail::upload_stream<D> uploads_;  // (last: destroyed first, once its copies are done)
};

// SGD's settings, PyTorch's names and meaning (torch.optim.SGD, without dampening).
struct sgd_options {
  double lr = 1e-2;          // the learning rate (set_lr changes it between steps)
  double momentum = 0;       // 0: plain SGD, no buffer kept
  bool nesterov = false;     // Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;   // L2: weight_decay * p added to the gradient
  double clip_norm = 0;      // the gradients' global norm is clipped to this; 0: no clipping
};

// Stochastic gradient descent with optional (Nesterov) momentum and weight decay, PyTorch's
// update, over master weights T on device D (a mixed-precision model's compute copy C written in
// the same pass); unscaling, the overflow check and clipping as AdamW's.
template <class T, class D = host, class C = T>
class SGD : public detail::optimizer_base<T, D, C> {
 public:
  // Over the model's parameters, or this rank's shard of them when the model is wrapped in a
  // sharded remat::dist::data_parallel.
  template <class Model>
  explicit SGD(Model& m, sgd_options o = {}) : SGD(m, o, detail::shard_of(m)) {}

  // Over parameters [r.begin, r.end) of the model.
  template <class Model>
  SGD(Model& m, sgd_options o, param_range r)
      : SGD(detail::range_of(m.parameters(), r), detail::range_of(m.gradients(), r), o, m.allocator()) {
    this->attach(m, r, "SGD");
  }

  // Over any parameter and gradient buffers of the same size.
  SGD(tensor_view<T, D> params, tensor_view<T, D> grads, sgd_options o = {},
      memory::caching_allocator<D>& alloc = memory::default_allocator<D>())
      : p_(params), g_(grads), o_(o) {
    if (grads.size() != params.size())
      detail::raise<shape_error>("SGD: expected as many gradients as parameters (", params.size(), "), found ",
                                 grads.size());
    this->range_ = {0, p_.size()};
    if (o_.nesterov && o_.momentum <= 0)
      detail::raise<argument_error>("SGD: Nesterov momentum needs a momentum > 0, found ", o_.momentum);
    if (o_.momentum != 0) buf_ = tensor<T, D>(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc);
  }

  // Returns false when the step was skipped (a gradient overflowed under a loss scale).
  bool step() {
    memory::tracing::phase_scope const stepping(memory::phase::optimizer);
    detail::grad_prelude pre;
    if (!this->begin_step(g_, o_.clip_norm, pre)) {
      this->end_step(false);
      return false;
    }
    kernels::sgd_scalars k{pre.factor, o_.lr, o_.momentum, o_.weight_decay, o_.nesterov, t_ == 0};
    kernels::sgd_update(D{}, p_.size(), p_.data(), g_.data(), buf_.empty() ? nullptr : buf_.data(), k, this->pc_);
    ++t_;
    this->end_step(true);
    return true;
  }

  void set_lr(double lr) { o_.lr = lr; }  // the rate of the next steps (a schedule calls it)
  double lr() const { return o_.lr; }     // the rate of the next step
  std::uint64_t steps() const { return t_; }  // steps taken (skipped ones not counted)
  // Sets the step count (what a restored state resumes from: the first step fills the momentum
  // buffer, later ones blend into it).
  void set_steps(std::uint64_t t) { t_ = t; }
  // The options it was built with (and set_lr's rate).
  sgd_options const& options() const { return o_; }
  // The momentum buffer ("momentum_buffer" in PyTorch's state dict); empty without momentum.
  tensor<T, D>& momentum_buffer() { return buf_; }
  // (Read-only.)
  tensor<T, D> const& momentum_buffer() const { return buf_; }

 private:
  tensor_view<T, D> p_, g_;
  tensor<T, D> buf_;
  sgd_options o_;
  std::uint64_t t_ = 0;
};

// SGD keeps its momentum buffer, if it has momentum.
template <>
struct optimizer_state_buffers<SGD> {
  static constexpr std::size_t count(step_options const& o) { return o.momentum ? 1 : 0; }  // the momentum buffer
};

// SGD opt(model): the model's master type, device and compute type.
template <class Model>
SGD(Model&, sgd_options = {})
    -> SGD<typename Model::value_type, typename Model::device, typename Model::compute_type>;

// Linear warm-up from 0 to base_lr over `warmup` steps, then cosine decay to min_lr at `total`.
struct warmup_cosine {
  double base_lr;       // the rate at the end of the warm-up
  std::size_t warmup;   // steps of linear warm-up
  std::size_t total;    // the step at which the rate reaches min_lr (and stays)
  double min_lr = 0;    // the rate the decay ends at

  // The rate of step `step` (from 0): opt.set_lr(schedule(step)) before each step.
  double operator()(std::size_t step) const {
    constexpr double pi = 3.14159265358979323846;
    if (step < warmup) return base_lr * double(step + 1) / double(warmup);
    if (step >= total) return min_lr;
    double const progress = double(step - warmup) / double(total > warmup ? total - warmup : 1);
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(pi * progress));
  }
};

}  // namespace REMAT_NAMESPACE
