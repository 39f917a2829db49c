// remat::model<Net, Device, Precision>: the parameters of a layer graph in one flat buffer (with
// its gradients), initialised deterministically from a seed; inference, a training pass that
// accumulates gradients, and a training step. Every input is checked before anything changes.
//
// Its parts: the parameters and their copies (parameters.hpp), the input checks
// (input_checks.hpp), the planned arenas (arena_cache.hpp), the pass transaction
// (pass_transaction.hpp), what a data-parallel wrapper plugs in (link.hpp); the pass itself is
// graph/training_pass.hpp's, the code the activation plan runs too.
#pragma once

#include "../graph/training_pass.hpp"
#include "../graph/walk.hpp"
#include "../kernels/gemm.hpp"
#include "../numeric/precision.hpp"
#include "../pass/step.hpp"
#include "../train/loss_scale.hpp"
#include "arena_cache.hpp"
#include "input_checks.hpp"
#include "link.hpp"
#include "parameters.hpp"
#include "pass_transaction.hpp"

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace REMAT_NAMESPACE {

template <class Model>
class inference_graph;  // (runtime/inference_graph.hpp)

// What the last training pass of a model did.
struct pass_report {
  std::size_t saved_bytes = 0;      // activation bytes kept when the forward ended (its output excluded)
  std::uint64_t recomputed = 0;     // block forwards that storage policies ran again
  bool planned = false;             // its activations and the loss's workspace lay in the planned arena
  std::size_t unplanned = 0;        // activations the arena did not hold (0 when the step followed its plan)
  // The activation-tagged bytes the pass had in use at its peak in the model's allocator, above
  // those in use when it began (the caller's own tensors): what activation_plan gives for it.
  std::size_t activation_peak = 0;
};

template <class Net, class Device = host, class Precision = fp32>
class model : public detail::model_parameters<Net, Device, Precision> {
  using base = detail::model_parameters<Net, Device, Precision>;
  using inputs = detail::model_inputs<Net, Device, Precision>;

 public:
  template <class Model>
  friend class inference_graph;  // (runs and captures forward_into)

  using net = Net;              // the layer graph
  using device = Device;        // host or cuda
  using precision = Precision;  // fp32, fp64 or mixed<half or bfloat16, a loss scale>
  using value_type = typename Precision::master;  // parameters, gradients and what the caller sees
  using compute_type = typename Precision::compute;  // activations and the weights layers read
  using T = value_type;    // (short for value_type)
  using C = compute_type;  // (short for compute_type)
  using state_type = pass_state<C, Device, T>;  // what a pass hands its layers
  // Whether the model keeps fp32 master weights beside a 16-bit compute copy.
  static constexpr bool mixed_precision = is_mixed_v<Precision>;
  static constexpr std::size_t in_width = Net::in_width;    // features per input row
  static constexpr std::size_t out_width = Net::out_width;  // features per output row
  static constexpr std::size_t parameter_count = Net::param_count;  // trained values, in all
  // Running state beside the parameters (BatchNorm2d's statistics): not trained, no gradients;
  // updated once by each training pass, whatever its storage policies recompute.
  static constexpr std::size_t buffer_count = buffer_count_v<Net>;
  // Whether the input is token ids (an Embedding first) rather than features.
  static constexpr bool reads_ids = reads_ids_v<Net>;
  // A sequence model (attention, positions) sees its rows as positions of sequences: token ids come
  // batch x seq (one sequence per row); a model reading features groups its rows by
  // set_sequence_length. Sequences are at most max_sequence long (the positional table).
  static constexpr bool sequence_model = is_sequence_model_v<Net>;
  static constexpr std::size_t max_sequence = max_sequence_v<Net>;  // (see sequence_model)
  // An input's element: int32 token ids, or features in value_type.
  using input_element = std::conditional_t<reads_ids, std::int32_t, T>;
  using input_view = tensor_view<input_element const, Device>;  // a batch of inputs
  using allocator_type = memory::caching_allocator<Device>;     // what activations come from

  // A target of loss Loss for a batch.
  template <class Loss>
  using target_type = typename Loss::template target_type<T, Device>;

  // Offloaded<S> segments use an allocator of the model's own unless given one. (Its blocks are
  // reused in the order of one model's copy stream: give a shared one to models that do not run
  // at the same time.)
  explicit model(seed s = {}, allocator_type& alloc = memory::default_allocator<Device>()) : model(s, alloc, nullptr) {}
  model(seed s, allocator_type& alloc, offload_allocator_t<Device>& offload_alloc) : model(s, alloc, &offload_alloc) {}
  // A mixed-precision model whose fp32 master weights live in host memory from the start
  // (host_master_weights; trained by OffloadedAdamW): the device never holds them.
  model(seed s, allocator_type& alloc, host_master_weights master)
      : base(s, alloc, &master.allocator),
        own_offload_(std::make_unique<offload_allocator_t<Device>>()),
        offload_alloc_(own_offload_.get()) {
    static_assert(mixed_precision,
                  "remat::model: host_master_weights expects a mixed-precision model (mixed<bfloat16> or "
                  "mixed<half>); an fp32 model's layers read its master weights, which stay on the device");
    this->zero_grad();
  }

  // Inference: nothing is saved for a backward pass. The activations, and the output handed back,
  // lie in the model's planned arena (see use_planned_arena): drop the output before the model's
  // next pass, or that pass allocates around it (it is never overwritten).
  // Under a data-parallel wrapper that keeps a shard of the parameters (ZeRO-3), every rank calls
  // it together (and likewise loss and training_loss): if it throws on any rank (bad input, out of
  // memory midway), it throws on every rank, the failing one its own error and the others
  // dist_error quoting it.
  tensor<T, Device> forward(input_view x) const {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    return detail::collective_pass(this->link_, false, [&] {
      inputs::check_whole_parameters(this->link_);
      inputs::check_input(x, seq_len_).raise_if_bad();
      return in_forward_arena(x, forward_kind::inference, 0, nullptr, [&](state_type& s, arena_layout const*) {
        return take(forward_pass(s, x, false), s);
      });
    });
  }

  // Inference into the caller's tensor: out (rows x out_width, in value_type) gets the model's
  // output for x. After reserve_inference(max_batch), every batch up to max_batch runs in the arena
  // reserved then, and a call allocates nothing from the model's allocator; a larger batch is a
  // shape_error, nothing written. Without a reservation it runs in the arena of its own shape.
  // Thread-safe across models; on one model, a call while another pass runs (another thread)
  // allocates its activations as usual.
  void forward(input_view x, tensor_view<T, Device> out) const {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    detail::collective_pass(this->link_, false, [&] {
      inputs::check_whole_parameters(this->link_);
      check_inference_shape(x, out);
      inputs::check_input(x, seq_len_).raise_if_bad();
      return forward_into(x, out, false);
    });
  }

  // Plans forward(x, out) for every batch up to max_batch (of sequences of up to `sequence`
  // positions: a model reading token ids takes max_sequence unless told; one reading features, the
  // sequence_length set) and holds its arena now: inference_plan<Net, Precision>(max_batch) bytes,
  // or fewer where the run-time layout search does better, and on the GPU cuBLASLt's workspace
  // block (32 MiB, in the default allocator, which keeps it). Afterwards forward(x, out) makes no
  // request of the system for its activations; the products' other scratch (oneDNN's scratchpad,
  // one block of the largest size asked so far, at least 256 KiB, likewise kept) is taken at their
  // first use, so after a first call at max_batch no call asks the system for memory. An argument_error (nothing changed) when the model
  // has no plan (a layer written for pass_state only), the arena is off (use_planned_arena),
  // max_batch is 0, the sequence is past the positional table, or the plan would pass 4 EiB;
  // out_of_memory when the arena cannot be had.
  void reserve_inference(std::size_t max_batch, std::size_t sequence = 0) {
    if (max_batch == 0) detail::raise<argument_error>("model::reserve_inference: expected a positive batch, found 0");
    if (!arenas_.used())
      detail::raise<argument_error>("model::reserve_inference: the planned arena is off (use_planned_arena(false))");
    if constexpr (!detail::plannable_v<Net>)
      detail::raise<argument_error>("model::reserve_inference: the model has a layer without a plan");
    if (sequence == 0) sequence = reads_ids && sequence_model ? max_sequence : (sequence_model ? seq_len_ : 1);
    if (sequence == 0)
      detail::raise<argument_error>("model::reserve_inference: a sequence model reading features needs "
                                    "set_sequence_length first");
    if (sequence_model && sequence > max_sequence)
      detail::raise<argument_error>("model::reserve_inference: expected a sequence of at most ", max_sequence,
                                    " positions (the positional table), found ", sequence);
    kernels::hold_product_workspace(Device{});  // (first: if it fails, nothing is reserved)
    if (!arenas_.reserve_inference({max_batch, in_width == any_width ? 0 : in_width, sequence}, *this->alloc_))
      detail::raise<out_of_memory>("model::reserve_inference: the arena for ", max_batch,
                                   " rows could not be had\n", this->alloc_->summary());
  }
  // The batch reserve_inference planned for (0: none).
  std::size_t inference_batch() const {
    detail::pass_shape const* r = arenas_.inference_shape();
    return r ? r->batch : 0;
  }

  // The loss of the model on (x, target), without training.
  template <class Loss>
  double loss(input_view x, target_type<Loss> target) const {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    return detail::collective_pass(this->link_, false, [&] {
      check<Loss>(x, target, false);  // (inference: any batch)
      return in_forward_arena(x, forward_kind::loss, loss_workspace<Loss, T>(x), nullptr,
                              [&](state_type& s, arena_layout const* layout) {
                                tensor<T, Device> y = take(forward_pass(s, x, false), s);
                                planned_workspace const ws(this->alloc_, arenas_.base(), layout);
                                return Loss::forward_backward(y, target, 1.0, static_cast<tensor<T, Device>*>(nullptr));
                              });
    });
  }

  // A training pass: forward (saving what backward needs), loss, backward; gradients of
  // weight * loss are added to the model's gradients (a weight that is not finite: argument_error,
  // nothing changed). Returns the loss.
  // If `dx` is given, the gradient with respect to the input is written there too.
  // Transactional: when it throws (out of memory at any allocation, say), the gradients, running
  // state, dropout stream and pass count are as they were before the call, bit for bit. Gradients
  // that were zero are zeroed again; gradients holding a sum are restored from a copy made in the
  // offload allocator before the pass (see set_failure_backup).
  template <class Loss>
  double accumulate(input_view x, target_type<Loss> target, double weight = 1.0, tensor<T, Device>* dx = nullptr) {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    validate<Loss>(x, target);
    if (!std::isfinite(weight)) detail::raise<argument_error>("model::accumulate: expected a finite weight, found ", weight);
    if (dx && (reads_ids || dx->rows() != x.rows() || dx->cols() != x.cols()))
      detail::raise<shape_error>("model::accumulate: the input gradient must have the input's shape ", x.rows(), " x ",
                                 x.cols(), reads_ids ? " (and token ids have none)" : "");
    return training_pass<Loss>(x, target, weight, dx).get();
  }

  // The loss of a training-mode forward (dropout on, the stream of pass `passes()`), without
  // backward and without advancing anything: what finite differences of accumulate() measure.
  template <class Loss>
  double training_loss(input_view x, target_type<Loss> target) const {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    return detail::collective_pass(this->link_, true, [&] {
      check<Loss>(x, target, false);  // (inference: any batch)
      // Nothing is kept for a backward (nor offloaded); the values are the same.
      return in_forward_arena(x, forward_kind::training_loss, loss_workspace<Loss, C>(x), nullptr,
                              [&](state_type& s, arena_layout const* layout) {
                                act<C, Device> const y = forward_pass(s, x, true);
                                planned_workspace const ws(this->alloc_, arenas_.base(), layout);
                                return Loss::forward_backward(*y, target, 1.0, static_cast<tensor<C, Device>*>(nullptr));
                              });
    });
  }

  // zero_grad, accumulate, optimizer step.
  // The loss is read last: on the GPU nothing waits between forward and backward, and the
  // optimizer's skip decision (the norm, the overflow check) is what the host waits for.
  // When it throws, the parameters, optimizer state, loss scale, running state, dropout stream
  // and pass count are as they were before the call, bit for bit, and the gradients are zero (the
  // step's first act is to clear them; keeping the last step's would cost a copy every step).
  template <class Loss, class Optimizer>
  double train_step(input_view x, target_type<Loss> target, Optimizer& opt) {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    validate<Loss>(x, target);  // before zero_grad: bad input changes nothing
    if (detail::gradient_sync* sync = this->link_.gradient_sync()) sync->check_pass();
    bool const left = this->zero_grad_before_pass();
    pass_report const before = report_;
    auto const l = [&] {
      try {
        return training_pass<Loss>(x, target, 1.0, nullptr);
      } catch (...) {  // (failed before its rollback was armed, it leaves what it did not write)
        if (left) this->zero_grad_quietly();
        throw;
      }
    }();
    try {
      opt.step();  // (an optimizer that throws has changed nothing of its own)
    } catch (...) {
      --passes_;  // the pass is undone: its dropout stream is the next pass's again
      if constexpr (buffer_count > 0) std::swap(this->buffers_, this->staged_buffers_);
      report_ = before;
      this->zero_grad();
      throw;
    }
    return l.get();
  }

  // Whether accumulate() on gradients that already hold a sum (the second and later micro-batches
  // of gradient accumulation) first copies them to the offload allocator (host memory: pinned
  // for a GPU model), so that a pass that fails restores them bit for bit. On (the default), that
  // costs one copy of the gradients per such pass, and their size in host memory while it runs.
  // Off, a pass that fails there leaves them holding part of its own contribution, and its error
  // says so. Passes on zeroed gradients (train_step, the first micro-batch) never copy.
  void set_failure_backup(bool on) { failure_backup_ = on; }
  // Whether accumulate() copies summed gradients before a pass (set_failure_backup).
  bool failure_backup() const { return failure_backup_; }

  // The loss scale: its value, skipped steps and (for DynamicLossScale) its schedule.
  loss_scaler& scaler() { return scaler_; }
  loss_scaler const& scaler() const { return scaler_; }
  // The host memory Offloaded<S> segments move activations to.
  offload_allocator_t<Device>& offload_allocator() const { return *offload_alloc_; }
  // What the last training pass kept and recomputed, and whether it ran in the planned arena.
  pass_report const& last_pass() const { return report_; }
  // The last pass outside training (forward, loss, training_loss) that had the arena: whether it
  // was planned, what it made outside the arena, and its activation peak (saved_bytes and
  // recomputed are 0).
  pass_report const& last_forward() const { return forward_report_; }
  // Every pass (training, forward, loss, training_loss) lays its activations and the loss's
  // workspace out in one arena at offsets its plan computed (plan/arena.hpp, plan/forward.hpp);
  // the arena is as large as the largest layout used so far, so the allocator reserves for
  // activations exactly the largest plan of the passes run. A layout is computed once per kind
  // of pass and batch shape. Off: every activation comes from the caching allocator (which may
  // reserve more than the plan: blocks cached per size).
  void use_planned_arena(bool on) { arenas_.use(on); }
  bool uses_planned_arena() const { return arenas_.used(); }  // (see use_planned_arena)
  // The bytes of the arena held now (reserved in the model's allocator as activations).
  std::size_t arena_bytes() const { return arenas_.bytes(); }
  // Training passes run so far; each draws its own dropout stream.
  std::uint64_t passes() const { return passes_; }
  // Sets the pass count (so the next pass draws pass p's dropout stream): what resuming a run, or
  // a data-parallel wrapper's broadcast from rank 0, needs.
  void set_passes(std::uint64_t p) { passes_ = p; }

  // Checks an input and its target as a training pass would, and throws what it would throw. On
  // the GPU the input's device check is issued before the target's and both are read with one
  // wait; the input's complaint comes first.
  // (A batch above what a Budget of the model was planned for is refused here, though inference
  // takes it.)
  template <class Loss>
  void validate(input_view x, target_type<Loss> target) const {
    check<Loss>(x, target, true);
  }

  // For a sequence model reading features: its input rows are sequences of `n` consecutive rows.
  // (A model reading token ids takes the length from the ids' columns.)
  void set_sequence_length(std::size_t n) {
    static_assert(sequence_model, "model::set_sequence_length: this model has no sequence layers");
    if (n == 0 || n > max_sequence)
      detail::raise<argument_error>("model::set_sequence_length: expected a length in [1, ", max_sequence,
                                    "], found ", n);
    seq_len_ = n;
  }
  std::size_t sequence_length() const { return seq_len_; }  // (0 until set_sequence_length is called)

 private:
  model(seed s, allocator_type& alloc, offload_allocator_t<Device>* offload_alloc)
      : base(s, alloc),
        own_offload_(offload_alloc ? nullptr : std::make_unique<offload_allocator_t<Device>>()),
        offload_alloc_(offload_alloc ? offload_alloc : own_offload_.get()) {
    this->zero_grad();
  }

  template <class Loss>
  void check(input_view x, target_type<Loss> target, bool training) const {
    inputs::template check<Loss>(x, target, training, seq_len_, this->link_);
  }

  // A forward outside training (inference, or training_loss's) on checked input, in state s: it
  // reads the running state without updating it.
  act<C, Device> forward_pass(state_type& s, input_view x, bool training) const {
    memory::tracing::phase_scope const running(memory::phase::forward);
    if constexpr (buffer_count > 0) s.use_buffers(const_cast<T*>(this->buffers_.data()), buffer_count, false);
    detail::gathering const gathers(this->link_, s, this->weights());
    auto const gathered = detail::gather_frame<Net>(s, this->weights());
    return Net::forward(s, gathered.at(this->weights()), detail::input_activation<Net, Precision>(s, x, training));
  }

  // forward(x, out) on checked input and shapes. `reserved_only` (an inference_graph's capture, whose
  // addresses must stay valid): in the arena reserve_inference holds, or an argument_error before
  // anything runs; a pass that made anything outside it is an argument_error too.
  bool forward_into(input_view x, tensor_view<T, Device> out, bool reserved_only) const {
    return in_forward_arena(
        x, forward_kind::into_caller, 0, arenas_.inference_shape(),
        [&](state_type& s, arena_layout const*) {
          act<C, Device> const y = forward_pass(s, x, false);
          evaluate(out, to_expr(*y));
          if (reserved_only && s.unplanned())
            detail::raise<argument_error>("inference_graph: the forward made ", s.unplanned(),
                                          " bytes outside the arena reserve_inference holds");
          return true;
        },
        reserved_only);
  }

  // Runs fn(state, layout), a forward of `kind` on checked input x, in the planned arena: the
  // layout reserved for `reserved`'s shape (reserve_inference; any batch up to its own), or the
  // layout of x's shape. Outside it when the arena is off or another pass of this model holds it
  // (unless `arena_only`: then an argument_error, nothing run).
  template <class Fn>
  auto in_forward_arena(input_view x, forward_kind kind, std::size_t workspace, detail::pass_shape const* reserved,
                        Fn&& fn, bool arena_only = false) const {
    bool const training = kind == forward_kind::training_loss;
    state_type s = make_state({.training = training, .keep = false, .stream = training ? dropout_stream() : 0}, x);
    struct holding {
      detail::arena_busy* busy;
      ~holding() {
        if (busy) busy->give_back();
      }
    } const hold{arenas_.busy().try_take() ? &arenas_.busy() : nullptr};
    arena_layout const* layout = nullptr;
    std::optional<detail::peak_window<Device>> window;
    if (hold.busy) {
      layout = reserved ? arenas_.inference_layout(*this->alloc_)
                        : arenas_.layout_for(inputs::shape_of(x, seq_len_), {.training = false, .forward = kind},
                                             workspace, *this->alloc_);
      if (layout)
        s.use_arena({arenas_.base(), layout->offset.data(), layout->bytes.data(), layout->offset.size(), reserved != nullptr});
      window.emplace(*this->alloc_);
    }
    if (arena_only && !layout)
      detail::raise<argument_error>("inference_graph: expected the arena reserve_inference holds, found ",
                                    hold.busy ? "none (reserve_inference first)" : "another pass of the model in it");
    auto result = fn(s, layout);
    if (hold.busy)
      forward_report_ = {0, 0, layout != nullptr, s.unplanned(), this->alloc_->close_peak_window(window->id)};
    return result;
  }

  // While it lives, the loss's next workspace allocation is served from the arena's slot for it.
  struct planned_workspace {
    memory::caching_allocator<Device>* alloc = nullptr;
    planned_workspace(memory::caching_allocator<Device>* a, void* base, arena_layout const* layout) {
      if (!layout || !layout->workspace_bytes) return;
      alloc = a;
      alloc->plan_next(base, layout->workspace_offset, layout->workspace_bytes, memory::tag::workspace);
    }
    planned_workspace(planned_workspace const&) = delete;
    planned_workspace& operator=(planned_workspace const&) = delete;
    ~planned_workspace() {
      if (alloc) alloc->unplan();
    }
  };
  // The workspace Loss allocates for the output of x in U.
  template <class Loss, class U>
  static std::size_t loss_workspace(input_view x) {
    if constexpr (requires { Loss::template workspace_bytes<U>(std::size_t(1), std::size_t(1)); })
      return Loss::template workspace_bytes<U>(inputs::out_rows(x), inputs::out_cols(x));
    else
      return 0;
  }

  // forward(x, out)'s shape checks: out's shape, and x within what reserve_inference planned.
  void check_inference_shape(input_view x, tensor_view<T, Device> out) const {
    std::size_t const rows = inputs::out_rows(x), cols = inputs::out_cols(x);
    if (out.rows() != rows || out.cols() != cols)
      detail::raise<shape_error>("model::forward: expected an output of ", rows, " x ", cols, ", found ", out.rows(),
                                 " x ", out.cols());
    detail::pass_shape const* r = arenas_.inference_shape();
    if (!r) return;
    detail::pass_shape const p = inputs::shape_of(x, seq_len_);
    if (p.batch > r->batch)
      detail::raise<shape_error>("model::forward: expected at most ", r->batch, " rows (reserve_inference), found ",
                                 p.batch);
    if ((r->features && p.features != r->features) || p.sequence > r->sequence)
      detail::raise<shape_error>("model::forward: expected ", r->features, " features in sequences of at most ",
                                 r->sequence, " (reserve_inference), found ", p.features, " in sequences of ",
                                 p.sequence);
  }

  // accumulate's pass on checked input; the loss is read when the caller asks for it.
  template <class Loss>
  kernels::pending_scalar<Device> training_pass(input_view x, target_type<Loss> target, double weight,
                                                tensor<T, Device>* dx) {
    warn_unscaled_half();
    detail::gradient_sync* const sync = this->link_.gradient_sync();
    if (sync) sync->check_pass(), sync->pass_starting();
    memory::tracing::phase_scope const stepping(memory::phase::forward);
    detail::peak_window<Device> window{*this->alloc_};
    detail::pass_rollback<model> rollback(*this);  // (restores the gradients if the pass fails)
    bool ended = false;  // the wrapper has been told how the pass ended
    try {
      state_type s = training_state(x, dx != nullptr);
      arena_layout const* const layout = use_arena<Loss>(s, x, dx != nullptr);
      // The loss's gradient is multiplied by the loss scale (gradients stay scaled until the
      // optimizer's update divides it out); the loss itself is not.
      double const scale = weight * scaler_.scale();
      rollback.arm(failure_backup_);
      kernels::pending_scalar<Device> l;
      act<C, Device> g;
      try {
        g = detail::training_pass<Net>(s, this->weights(), this->grads_.data(), detail::input_activation<Net, Precision>(s, x, true),
                                       [&](act<C, Device> const& y, act<C, Device> const& dy) {
                                         l = loss_of<Loss>(*y, target, scale, dy.get(), layout);
                                       });
      } catch (out_of_memory const& e) {
        detail::explain_out_of_memory<Net, Precision>(e, inputs::shape_of(x, seq_len_), dx != nullptr, s.makes(),
                                                      s.make_failed(), rollback.torn());
      }
      if (dx && g) evaluate(*dx, to_expr(*g));
      if (sync) sync->gradients_ready(0), ended = true, sync->pass_ended(nullptr);  // (throws if another rank failed)
      rollback.disarm();  // (nothing below throws)
      commit_pass(s, layout != nullptr, window);
      return l;
    } catch (...) {
      // A wrapper's reductions may still read or write the gradients: this rank takes its part
      // in them, and all ranks agree, before `rollback` puts the gradients back.
      if (sync && !ended) sync->pass_ended(std::current_exception());
      throw;
    }
  }

  // A training pass's state: its dropout stream, the wrapper told of gradients made final and
  // (ZeRO-3) of the parameters each layer reads, and the running state updated in a copy, which
  // becomes the model's when the pass succeeds.
  state_type training_state(input_view x, bool dx) {
    // (read before the pass's rollback is armed, which marks the gradients written)
    state_type s = make_state(
        {.training = true, .stream = dropout_stream(), .input_gradient = dx, .gradients_zero = this->grads_zero_}, x);
    detail::listen_gradients(this->link_, s, this->grads_.data());
    detail::listen_parameters(this->link_, s, this->weights());
    if constexpr (buffer_count > 0) {
      evaluate(this->staged_buffers_, to_expr(this->buffers_));
      s.use_buffers(this->staged_buffers_.data(), buffer_count, true);
    }
    return s;
  }
  // The planned arena of a training pass on x, given to s (null: none).
  template <class Loss>
  arena_layout const* use_arena(state_type& s, input_view x, bool dx) {
    std::size_t workspace = 0;
    detail::pass_shape const p = inputs::shape_of(x, seq_len_);
    if constexpr (requires { Loss::template workspace_bytes<C>(std::size_t(1), std::size_t(1)); })
      workspace = Loss::template workspace_bytes<C>(p.batch * p.sequence, inputs::out_cols(x));
    arena_layout const* const layout = arenas_.layout_for(p, {.training = true, .dx = dx}, workspace, *this->alloc_);
    if (layout) s.use_arena({arenas_.base(), layout->offset.data(), layout->bytes.data(), layout->offset.size()});
    return layout;
  }
  // The loss of y against the target, with scale * its gradient in dy, read later if the loss can;
  // its workspace in the planned arena when there is one.
  template <class Loss>
  kernels::pending_scalar<Device> loss_of(tensor<C, Device> const& y, target_type<Loss> const& target, double scale,
                                          tensor<C, Device>* dy, arena_layout const* layout) {
    kernels::pending_scalar<Device> l;
    {
      memory::tracing::phase_scope const in_loss(memory::phase::loss);
      planned_workspace const ws(this->alloc_, arenas_.base(), layout);
      if constexpr (requires { Loss::forward_backward_pending(y, target, scale, dy); })
        l = Loss::forward_backward_pending(y, target, scale, dy);
      else
        l = kernels::pending_scalar<Device>(Loss::forward_backward(y, target, scale, dy));
    }
    memory::tracing::current_trace().enter(memory::phase::backward);  // (until the pass's phase ends)
    return l;
  }
  // A training pass succeeded: its running state, pass count and report become the model's.
  void commit_pass(state_type const& s, bool planned, detail::peak_window<Device>& window) {
    if constexpr (buffer_count > 0) std::swap(this->buffers_, this->staged_buffers_);
    ++passes_;
    report_ = {s.saved_bytes(), s.recomputed(), planned, s.unplanned(), 0};
    report_.activation_peak = this->alloc_->close_peak_window(window.id);
  }

  // The dropout stream of the next pass: one per pass, and per replica in data parallelism.
  std::uint64_t dropout_stream() const { return passes_ + (this->link_.replica() << 40); }

  static void warn_unscaled_half() {
    if constexpr (std::is_same_v<C, half> && Precision::loss_scale::identity) {
      static bool warned = false;
      if (!warned) {
        warned = true;
        std::fprintf(stderr,
                     "remat: warning: a mixed<half> model without a loss scale; fp16 gradients may underflow to "
                     "zero (use mixed<half, remat::DynamicLossScale> or StaticLossScale<S>)\n");
      }
    }
  }

  // A pass on input x: its ids and sequence length filled in from x and the model.
  state_type make_state(pass_options o, input_view x) const {
    o.seed = this->seed_;
    if constexpr (reads_ids) {
      o.ids = {x.data(), x.size()};
      if constexpr (sequence_model) o.sequence_length = x.cols();
    } else if constexpr (sequence_model) {
      o.sequence_length = seq_len_;
    }
    detail::offload_channel<Device> offload;
    offload.space = offload_alloc_;
    this->stream_.attach(offload);
    return state_type(o, *this->alloc_, offload);
  }

  // A forward's output y as the caller's tensor of T: y itself, or a copy made as s's next make
  // (what the plan of forward_kind::inference counts).
  static tensor<T, Device> take(act<C, Device> y, state_type& s) {
    if constexpr (!mixed_precision)
      if (y.use_count() == 1) return std::move(*y);
    tensor<T, Device> out = s.template make_output<T>(y->rows(), y->cols());
    evaluate(out, to_expr(*y));
    return out;
  }

  std::unique_ptr<offload_allocator_t<Device>> own_offload_;
  offload_allocator_t<Device>* offload_alloc_;
  bool failure_backup_ = true;  // see set_failure_backup
  loss_scaler scaler_ = loss_scaler::of<typename Precision::loss_scale>();
  std::uint64_t passes_ = 0;
  std::size_t seq_len_ = 0;  // a sequence model reading features: rows per sequence
  pass_report report_{};
  mutable pass_report forward_report_{};  // (written by the pass that holds the arena)
  mutable detail::arena_cache<Net, Device, Precision> arenas_;  // (declared last: given back before the allocator's blocks)
};

}  // namespace REMAT_NAMESPACE
