// OffloadedAdamW: AdamW with its state and update in host memory for a model on the GPU
// (ZeRO-Offload's optimizer), in AdamW's file format.
#pragma once

#include "../memory/offload.hpp"
#include "adamw.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <type_traits>

namespace REMAT_NAMESPACE {

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
  // Its state for files: the two moments, in AdamW's format.
  static constexpr char const* state_kind = "AdamW";
  // The two moments, named as AdamW's.
  std::array<detail::named_state<tensor<T, host>>, 2> state_tensors() { return {{{"exp_avg", &m_}, {"exp_avg_sq", &v_}}}; }
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

}  // namespace REMAT_NAMESPACE
