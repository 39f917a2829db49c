// OffloadedAdamW: AdamW with its state and update in host memory for a model on the GPU
// (ZeRO-Offload's optimizer), in AdamW's file format.
#pragma once

#include "../memory/offload.hpp"
#include "../memory/transfer_ring.hpp"
#include "adamw.hpp"
#include "gradient_offload.hpp"

#include <algorithm>
#include <array>
#include <chrono>
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

// Where a model's gradients live between its passes (offload_options::gradients).
enum class gradient_place : unsigned char {
  device,  // the model's gradient buffer, on its device
  host,    // the host's memory; the device holds the spans backward writes and sends down only
};

// What OffloadedAdamW moves to the host besides AdamW's state and update.
struct offload_options {
  // Also the fp32 master weights of a mixed-precision model (ZeRO-Offload's placement): they move
  // into the optimizer's host memory (pageable) for the model's life, and the device keeps their
  // 16-bit compute copy only, 4 bytes per parameter less; each step copies up the compute copy
  // alone. model::master_on_host() tells; parameters() then views host memory. Refused for an
  // fp32 model (its layers read the master weights). Under a data-parallel wrapper each rank
  // updates its shard; a sharded one (ZeRO-1, 2) then gathers the master weights where they are
  // (a GPU model's: in host memory, through MPI) and their compute copy on the device. Under a
  // wrapper that shards the parameters (ZeRO-3) the model must be built with them on the host
  // (host_master_weights), before the wrapper: it then keeps the rank's shard of their pages in
  // host memory (and a GPU model's shard of the compute copy in device memory), and each step
  // writes the rank's part of the compute copy, which the next pass gathers layer by layer.
  bool master_weights = false;
  // gradient_place::host: also the gradients (ZeRO-Offload's placement of them). The host holds
  // their fp32 sum; the device only the pages of the span backward is writing and of the one
  // coming down. At each of backward's reports the span it made final starts down into the
  // host's sum, the one before it is waited for and its pages are given back
  // (train/gradient_offload.hpp): two spans instead of 4 bytes per parameter (memory_plan with
  // step_options::offload_gradients; gradient_pages() measures them). The model's gradients()
  // then reads zero between passes; gradients() here reads the sum. The same bits as the model's
  // own gradients, accumulation included (a pass adding onto a sum finds it on the device
  // first); the step checks, clips and updates from host memory. Under a data-parallel wrapper it
  // needs one that shards the gradients (options::shard_gradients, ZeRO-2; or shard_parameters,
  // ZeRO-3), built before the optimizer: the host holds the sum of the rank's shard, which comes
  // down as its buckets' reductions end (the wrapper's gradient_pages() plans the device's pages).
  gradient_place gradients = gradient_place::device;
};

// The device's gradient pages of an OffloadedAdamW with offload_options::gradients, in bytes.
struct offloaded_gradient_pages {
  std::size_t page = 0;          // a page (the host's) or a granule (the GPU's)
  std::size_t planned_peak = 0;  // the most a pass holds, by the plan (memory_plan's gradient_pages)
  std::size_t last_peak = 0;     // the most the last pass that succeeded held, measured at its reports
  std::size_t resident = 0;      // held now
};

// AdamW with its state in host memory, for a model on the GPU (ZeRO-Offload's optimizer): the
// moments and a copy of the fp32 master weights live on the host, and each step copies the
// gradients down, runs AdamW's update there (kernels::adamw_update on the host: one vectorised
// pass split across the host's threads) and copies the new weights up, with the compute copy of a
// mixed-precision model. The device keeps the model's master weights, gradients and compute copy
// but no optimizer state: 8 bytes per parameter less than AdamW (the model allocator's
// optimizer_state tag holds nothing; the host state is in host_allocator()). With
// offload_options::master_weights the master weights move to the host as well (4 bytes per
// parameter less again), and the optimizer updates them where they are. What crosses to and
// from the GPU is page-locked, in staging_allocator(), so the copies run at the link's full rate:
// the gradients and the compute copy through two slots of a chunk each (memory/transfer_ring.hpp;
// the host holds no whole copy of either), and, unless the master weights live on the host, the
// weights' host copy.
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
// A step goes a chunk at a time (set_chunk): the next chunk's gradients come down while the host
// updates this one, each chunk's copy up overlaps the update of the next, and the step returns
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
  explicit OffloadedAdamW(Model& m, adamw_options o = {}, offload_options w = {})
      : OffloadedAdamW(m, o, detail::shard_of(m), nullptr, w) {}

  // Over parameters [r.begin, r.end) of the model. With host_alloc, which must then outlive the
  // model when w.master_weights moves the model's master weights into it.
  OffloadedAdamW(Model& m, adamw_options o, param_range r, memory::caching_allocator<host>* host_alloc = nullptr,
                 offload_options w = {})
      : own_(host_alloc ? nullptr : std::make_shared<memory::caching_allocator<host>>()),
        alloc_(host_alloc ? host_alloc : own_.get()),
        model_(&m),
        o_(o),
        master_(w.master_weights || m.master_on_host()) {
    o.check("OffloadedAdamW");
    if (r.begin > r.end || r.end > Model::parameter_count)
      detail::raise<argument_error>("OffloadedAdamW: expected a range of the model's ", Model::parameter_count,
                                    " parameters, found [", r.begin, ", ", r.end, ")");
    detail::gradient_sync* const sync = m.link().gradient_sync();
    if (w.gradients == gradient_place::host && !sync && (r.begin != 0 || r.end != Model::parameter_count))
      detail::raise<argument_error>("OffloadedAdamW: offload_options::gradients expects the model's whole range [0, ",
                                    Model::parameter_count, "), found [", r.begin, ", ", r.end, ")");
    if (w.gradients == gradient_place::host && sync && sync->gradients_elsewhere())
      detail::raise<argument_error>("OffloadedAdamW: offload_options::gradients expects a model trained alone or under "
                                    "a ZeRO-2 or ZeRO-3 data-parallel wrapper, found its gradients on the host "
                                    "already");
    if (w.gradients == gradient_place::host && sync && sync->shard() != r)
      detail::raise<argument_error>("OffloadedAdamW: offload_options::gradients under a data-parallel wrapper expects "
                                    "this rank's shard [", sync->shard().begin, ", ", sync->shard().end, "), found [",
                                    r.begin, ", ", r.end, ")");
    if (master_) check_master_placement(m);
    if constexpr (std::is_same_v<staging_space, host>) {
      staging_ = alloc_;
    } else {
      own_staging_ = std::make_unique<memory::caching_allocator<staging_space>>();
      staging_ = own_staging_.get();
    }
    std::size_t const n = r.size();
    dg_ = detail::range_of(m.gradients(), r);
    tensor_view<C, D> const pc = m.compute_parameters();
    dpc_ = pc.data() ? pc.data() + r.begin : nullptr;
    if (!master_) p_ = staged<T>(p_block_, n, memory::tag::optimizer_state);
    ring_ = std::make_unique<ring_type>(*staging_, n, chunk_, dpc_ != nullptr);
    m_ = tensor<T, host>(index_t(n), 1, memory::tag::optimizer_state, *alloc_);
    v_ = tensor<T, host>(index_t(n), 1, memory::tag::optimizer_state, *alloc_);
    evaluate(m_, expr::to_expr(0.0));
    evaluate(v_, expr::to_expr(0.0));
    // (the gradients' sum: nothing after it fails but a copy, so a constructor that throws leaves
    // the model as it was)
    if (w.gradients == gradient_place::host && !sync) {
      grads_ = std::make_unique<detail::gradient_offload<Model>>(m, *alloc_, *ring_, uploads_.channel());
      dg_ = {};
    } else if (w.gradients == gradient_place::host) {  // (ZeRO-2 or 3: the wrapper sends the shard down)
      sink_.sink = std::make_unique<detail::shard_sink<Model>>(m, r, *alloc_, *ring_, uploads_.channel());
      if (!sync->attach_gradient_sink(sink_.sink.get()))
        detail::raise<argument_error>("OffloadedAdamW: offload_options::gradients expects a model trained alone or "
                                      "under a data-parallel wrapper that keeps a shard of the gradients "
                                      "(options::shard_gradients, ZeRO-2, or shard_parameters, ZeRO-3), found one "
                                      "without it");
      sink_.slot = m.link().gradient_sync_slot();
      dg_ = {};
    }
    if constexpr (Model::mixed_precision)
      if (master_) m.place_master_on_host(*alloc_, own_);
    dp_ = detail::range_of(m.parameters(), r);
    if (master_)  // (the update writes the model's master weights where they are)
      p_ = tensor<T, host>(tensor<T, host>::borrowed, dp_.data(), n, 1);
    else if (n)
      sys::copy_to_host(p_.data(), dp_.data(), n * sizeof(T));
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
    // (gradients offloaded: the host's sum, checked and clipped there)
    T const* const sum = grads_ ? grads_->sum().data() : sink_.sink ? sink_.sink->sum().data() : nullptr;
    bool const go = sum ? this->begin_step(tensor_view<T const, host>(sum, index_t(n), 1), o_.clip_norm, pre)
                        : this->begin_step(tensor_view<T const, D>(dg_), o_.clip_norm, pre);
    if (!go) {
      this->end_step(false);
      return false;
    }
    if (!master_ && model_->parameter_version() != version_ && n)  // written from outside: read them again
      sys::copy_to_host(p_.data(), dp_.data(), n * sizeof(T));
    kernels::adamw_scalars const k = detail::adamw_scalars_for(o_, pre.factor, double(t_ + 1));
    // A chunk at a time: on the GPU the next chunk's gradients come down while the host updates
    // this one, and a chunk's weights go up on a stream of their own while the host updates the
    // next; the model's stream waits for the last copy on the device, not on the host (the next
    // forward is queued behind it).
    using clock = std::chrono::steady_clock;
    clock::duration waited{};
    auto const t0 = clock::now();
    detail::transfer_ring<D, T, C>& ring = *ring_;
    std::size_t const chunk = std::max<std::size_t>(ring.chunk(), 1);
    std::size_t const chunks = n ? (n + chunk - 1) / chunk : 0;
    detail::copy_fence<D> up;
    up.begin(uploads_.channel());
    ring.begin(uploads_.channel());
    T const* next = chunks && !sum ? ring.down(0, dg_.data(), std::min(chunk, n)) : nullptr;
    for (std::size_t c = 0; c < chunks; ++c) {
      std::size_t const at = c * chunk, len = std::min(chunk, n - at);
      T const* const g = sum ? sum + at : next;
      if (!sum && c + 1 < chunks) next = ring.down(c + 1, dg_.data() + at + len, std::min(chunk, n - at - len));
      auto const w0 = clock::now();
      if (!sum) ring.wait_down(c);
      C* const pc = dpc_ ? ring.up_buffer(c, dpc_ + at) : nullptr;
      waited += clock::now() - w0;
      kernels::adamw_update(host{}, len, p_.data() + at, g, m_.data() + at, v_.data() + at, k, pc);
      if (!master_) up.to_device(dp_.data() + at, p_.data() + at, len * sizeof(T));
      if (dpc_) ring.up(c, dpc_ + at, len);
    }
    ring.end();
    up.end();
    up.wait();
    using seconds = std::chrono::duration<double>;
    times_ = {seconds(waited).count(), seconds(clock::now() - t0 - waited).count()};
    ++t_;
    this->end_step(true);  // (a sharded run gathers the other ranks' parts; this rank's are p_)
    version_ = model_->parameter_version();
    return true;
  }

  // Where the host's time of the last step that was not skipped went, in seconds by its clock:
  // waiting for copies (a chunk's gradients to come down, a slot's last copy up to leave it), and
  // the rest: the update, with the copies issued beside it a chunk at a time. The step returns
  // with the last copies up in flight (the model's stream waits for them, so the next forward is
  // queued at once).
  struct step_times {
    double copy_down = 0;  // waiting for the copies: the gradients down (and a slot to reuse)
    double update = 0;     // AdamW's update on the host, the copies issued beside it
  };
  step_times const& last_step_times() const { return times_; }  // (see step_times)
  // With offload_options::gradients: how long the last training pass that succeeded waited at
  // backward's reports for the spans' copies down (seconds of the host's clock; 0 without).
  double last_pass_copy_wait() const { return grads_ ? grads_->last_copy_wait() : 0.0; }

  // The rate of the next steps (a schedule calls it): finite and >= 0, or argument_error and the
  // rate unchanged.
  void set_lr(double lr) {
    detail::check_setting("OffloadedAdamW", "lr", lr);
    o_.lr = lr;
  }
  double lr() const { return o_.lr; }         // the rate of the next step
  std::uint64_t steps() const { return t_; }  // steps taken (skipped ones not counted)
  void set_steps(std::uint64_t t) { t_ = t; }  // sets the step count (what a restored state resumes from)
  adamw_options const& options() const { return o_; }  // its settings (and set_lr's rate)
  // The parameters copied down, updated and copied up at a time (0: all at once, no overlap). On
  // the GPU a chunk's copies overlap the host's update of the next, and the page-locked slots hold
  // two chunks of gradients and of compute weights; the default, 8 Mi parameters (32 MiB of
  // fp32), was the fastest measured on an H100 (bench_policies_cuda --offload-optimizer). On the
  // host, where a chunk is read and written in place, the default is 0. The results are the same
  // bits for every chunk. Planned with step_options::offload_chunk. (The slots are taken anew: on
  // out_of_memory nothing changes.)
  void set_chunk(std::size_t parameters) {
    ring_type slots(*staging_, p_.size(), parameters, dpc_ != nullptr);
    *ring_ = std::move(slots);
    chunk_ = parameters;
  }
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
  // The host copy of the master weights it updates (equal to the model's after each step; with
  // offload_options::master_weights, the model's own, over this optimizer's range).
  tensor<T, host> const& master_weights() const { return p_; }
  // Whether it updates the model's master weights in host memory (offload_options::master_weights,
  // or a model built with host_master_weights).
  bool offloads_master_weights() const { return master_; }
  // Whether the gradients live on the host (offload_options::gradients).
  bool offloads_gradients() const { return grads_ || sink_.sink; }
  // With offload_options::gradients: their sum in host memory over this optimizer's range, what
  // the next step reads (the model's gradients() reads zero there between passes); without,
  // refused.
  tensor<T, host> const& gradients() const {
    if (!grads_ && !sink_.sink)
      detail::raise<argument_error>("OffloadedAdamW::gradients: the gradients are the model's (offload_options::gradients is off)");
    return grads_ ? grads_->sum() : sink_.sink->sum();
  }
  // With offload_options::gradients, trained alone: the device's gradient pages, planned and
  // measured (all zero without; under a data-parallel wrapper, its gradient_pages() has them).
  offloaded_gradient_pages gradient_pages() const {
    if (!grads_) return {};
    return {grads_->page(), grads_->planned_peak(), grads_->last_peak(), grads_->resident()};
  }
  // Where the host state lives: the moments (and, for a host model, the weights' copy, in
  // staging_allocator(), which is this allocator then).
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

  // offload_options::master_weights on a model that cannot have them on the host: refused, with
  // the model unchanged.
  static void check_master_placement(Model& m) {
    if constexpr (!Model::mixed_precision) {
      detail::raise<argument_error>(
          "OffloadedAdamW: offload_options::master_weights expects a mixed-precision model; an fp32 model's layers "
          "read its master weights, which stay on the device");
    } else {
      detail::gradient_sync const* const s = m.link().gradient_sync();
      if (s && s->shards_parameters() && !m.master_on_host())
        detail::raise<argument_error>(
            "OffloadedAdamW: offload_options::master_weights under a data-parallel wrapper that shards the "
            "parameters or the master weights (shard_parameters, ZeRO-3, or shard_master_weights) expects the model "
            "built with them on the host (host_master_weights), found them on its device: the wrapper holds their "
            "shard where they are");
    }
  }

  std::shared_ptr<memory::caching_allocator<host>> own_;  // (shared with the model's master weights)
  memory::caching_allocator<host>* alloc_;
  std::unique_ptr<memory::caching_allocator<staging_space>> own_staging_;
  memory::caching_allocator<staging_space>* staging_ = nullptr;
  using ring_type = detail::transfer_ring<D, T, C>;
  // (the staging blocks outlive the tensors over them: declared first, destroyed last)
  memory::held_block<staging_space> p_block_;
  // the page-locked slots the gradients and the compute copy cross through (where the offloaded
  // gradients find them)
  std::unique_ptr<ring_type> ring_;
  Model* model_;
  tensor_view<T, D> dp_, dg_;
  C* dpc_ = nullptr;
  tensor<T, host> p_, m_, v_;
  adamw_options o_;
  std::uint64_t t_ = 0;
  std::uint64_t version_ = 0;
  bool master_ = false;  // offload_options::master_weights
  step_times times_{};
  std::size_t chunk_ = std::is_same_v<D, host> ? 0 : std::size_t(8) << 20;
  detail::upload_stream<D> uploads_;  // (destroyed first but one, once its copies are done)
  // offload_options::gradients (first destroyed: the model gets its gradients back)
  std::unique_ptr<detail::gradient_offload<Model>> grads_;
  // ... under a ZeRO-2 wrapper, which sends this rank's shard down to it (detached first).
  struct attached_sink {
    std::unique_ptr<detail::shard_sink<Model>> sink;
    detail::gradient_sync* const* slot = nullptr;
    attached_sink() = default;
    attached_sink(attached_sink&& o) noexcept : sink(std::move(o.sink)), slot(std::exchange(o.slot, nullptr)) {}
    attached_sink& operator=(attached_sink&& o) noexcept {
      if (this != &o) {
        detach();
        sink = std::move(o.sink);
        slot = std::exchange(o.slot, nullptr);
      }
      return *this;
    }
    ~attached_sink() { detach(); }
    // (the wrapper fills the shard from the sum: the model's gradients are its own again)
    void detach() noexcept {
      if (!sink || !slot || !*slot) return;
      try {
        (*slot)->attach_gradient_sink(nullptr);
      } catch (...) {
      }
      slot = nullptr;
    }
  } sink_;
};

}  // namespace REMAT_NAMESPACE
