// remat::model<Net, Device, Precision>: the parameters of a layer graph in one flat buffer (with
// its gradients), initialised deterministically from a seed; inference, a training pass that
// accumulates gradients, and a training step. Every input is checked before anything changes.
#pragma once

#include "../graph/walk.hpp"
#include "../kernels/reduce.hpp"
#include "../numeric/precision.hpp"
#include "../pass/step.hpp"
#include "../plan/activation.hpp"
#include "../plan/arena.hpp"
#include "../pass/gradient_sync.hpp"
#include "../train/loss_scale.hpp"
#include "../graph/training_pass.hpp"

#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

// A model's seed: its initial parameters and every dropout mask are functions of it (and of the
// pass and the element), so two models with one seed train alike, bit for bit.
struct seed {
  std::uint64_t value = 0;  // any value; 0 is as good as another
};

// A parameter tensor of a model: its full name ("2.1.0.weight"), offset and shape.
struct named_param {
  std::string name;                 // PyTorch-style: layer indices and the tensor's name
  std::size_t offset;               // its first element in the model's flat buffer
  std::vector<std::size_t> shape;   // PyTorch's order (Linear's weight: out x in)
  std::size_t size() const { return shape_elements(shape); }  // its elements (the shape's product)
};

namespace detail {

// Names a graph's running-state buffers (and, given `init`, initialises them), each leaf that
// holds some in the walk's order: its buffers' offsets follow the last one's.
template <class T>
struct buffer_walker {
  using visits_buffers = void;
  std::vector<named_param>* names = nullptr;
  T* init = nullptr;
  std::size_t at = 0;
  template <class L>
  void layer(std::string const& prefix) {
    if (names)
      for (param_desc const& b : L::buffers()) names->push_back({prefix + b.name, at + b.offset, b.shape});
    if (init) L::init_buffers(init + at);
    at += L::buffer_count;
  }
};

// The stream a model's work goes to: none on the host; on the GPU one stream per model, current
// while the model runs (so a step issues everything without waiting, and two models on two host
// threads run side by side).
// Offloaded<S>'s copies go to a second stream of the model's, beside the compute.
template <class Device>
struct model_stream {
  struct scope_type {};
  scope_type scope() { return {}; }
  void synchronize() {}
  void attach(offload_channel<Device>&) {}
};
#if REMAT_HAS_CUDA
template <>
struct model_stream<cuda> {
  owned_cuda_stream stream;
  owned_cuda_stream copies{cudaStreamNonBlocking};
  cuda_stream_scope scope() { return cuda_stream_scope(stream.get()); }
  void synchronize() { stream.synchronize(); }
  void attach(offload_channel<cuda>& c) { c.side = copies.get(); }
};
#endif

}  // namespace detail

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

namespace detail {

// A planned arena a model holds in its allocator (move-only; given back when dropped).
template <class Device>
class arena_hold {
 public:
  arena_hold() = default;
  arena_hold(arena_hold&& o) noexcept
      : alloc_(std::exchange(o.alloc_, nullptr)), base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  arena_hold& operator=(arena_hold&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = std::exchange(o.alloc_, nullptr);
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~arena_hold() { reset(); }
  // At least `bytes` in `alloc`: the arena held, grown when needed (false when it cannot be had).
  bool hold(memory::caching_allocator<Device>& alloc, std::size_t bytes) {
    if (base_ && alloc_ == &alloc && bytes_ >= bytes) return true;
    reset();
    base_ = alloc.reserve_arena(bytes);
    if (!base_) return false;
    alloc_ = &alloc;
    bytes_ = memory::caching_allocator<Device>::rounded(bytes);
    return true;
  }
  void reset() noexcept {
    if (base_) alloc_->release_arena(base_);
    alloc_ = nullptr;
    base_ = nullptr;
    bytes_ = 0;
  }
  void* base() const { return base_; }
  std::size_t bytes() const { return bytes_; }

 private:
  memory::caching_allocator<Device>* alloc_ = nullptr;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace detail

// What a data-parallel wrapper (remat::dist) plugs into a model, and the optimizers built from the
// model read: the wrapper told of the passes and gradients (null when training alone), and the
// replica, whose dropout streams are its own (replica 0, the default, draws those of a model on
// its own; remat::dist sets it to the rank).
class model_link {
 public:
  // The wrapper plugged in (null when training alone).
  detail::gradient_sync* gradient_sync() const { return sync_; }
  // Plugs a wrapper in (null: none); remat::dist::data_parallel does it when built.
  void set_gradient_sync(detail::gradient_sync* s) { sync_ = s; }
  // The slot the wrapper is read from, so an optimizer built before it still sees it.
  detail::gradient_sync* const* gradient_sync_slot() const { return &sync_; }
  // Whose dropout streams the model draws (0: a model's own).
  std::uint64_t replica() const { return replica_; }
  // Sets the replica (below 65536); remat::dist sets each rank's.
  void set_replica(std::uint64_t r) {
    if (r >= (std::uint64_t(1) << 16))
      detail::raise<argument_error>("model::link().set_replica: expected a replica below 65536, found ", r);
    replica_ = r;
  }
  // Whether the model holds one rank's shard of its parameters only (the rest read as zero): a
  // ZeRO-3 wrapper went without making them whole (dist::data_parallel::gather_parameters). Its
  // passes then refuse to run alone, until a file is loaded into it.
  bool partial_parameters() const { return partial_; }
  void set_partial_parameters(bool p) { partial_ = p; }  // (what the wrapper and load set)

 private:
  detail::gradient_sync* sync_ = nullptr;
  std::uint64_t replica_ = 0;
  bool partial_ = false;
};

// Where a model's Offloaded<S> segments put their activations (memory/offload.hpp): pinned host
// memory for a GPU model, host memory apart from the activations for a host model.
template <class Device>
using offload_allocator_t = memory::caching_allocator<memory::offload_space_t<Device>>;

template <class Net, class Device = host, class Precision = fp32>
class model {
 public:
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

  // Offloaded<S> segments use an allocator of the model's own unless given one. (Its blocks are
  // reused in the order of one model's copy stream: give a shared one to models that do not run
  // at the same time.)
  explicit model(seed s = {}, allocator_type& alloc = memory::default_allocator<Device>()) : model(s, alloc, nullptr) {}
  model(seed s, allocator_type& alloc, offload_allocator_t<Device>& offload_alloc) : model(s, alloc, &offload_alloc) {}

 private:
  model(seed s, allocator_type& alloc, offload_allocator_t<Device>* offload_alloc)
      : stream_(),
        alloc_(&alloc),
        own_offload_(offload_alloc ? nullptr : std::make_unique<offload_allocator_t<Device>>()),
        offload_alloc_(offload_alloc ? offload_alloc : own_offload_.get()),
        params_(index_t(stored_count()), 1, memory::tag::parameters, alloc),
        grads_(index_t(stored_count()), 1, memory::tag::gradients, alloc),
        seed_(s.value) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    if constexpr (mixed_precision) compute_params_ = tensor<C, Device>(index_t(stored_count()), 1, memory::tag::parameters, alloc);
    if constexpr (buffer_count > 0) {
      buffers_ = tensor<T, Device>(index_t(buffer_count), 1, memory::tag::parameters, alloc);
      staged_buffers_ = tensor<T, Device>(index_t(buffer_count), 1, memory::tag::parameters, alloc);
      std::vector<T> host_buffers(buffer_count, T(0));
      detail::buffer_walker<T> w{nullptr, host_buffers.data()};
      detail::visit_params<Net>("", 0, w);
      buffers_.copy_from(host_buffers);
    }
    std::vector<T> host_params(stored_count(), T(0));
    Net::init(host_params.data(), 0, seed_);
    params_.copy_from(host_params);
    compute_stale_ = true;
    zero_grad();
  }

 public:
  // Inference: nothing is saved for a backward pass.
  // Under a data-parallel wrapper that keeps a shard of the parameters (ZeRO-3), every rank calls
  // it together (and likewise loss and training_loss): if it throws on any rank (bad input, out of
  // memory midway), it throws on every rank, the failing one its own error and the others
  // dist_error quoting it.
  tensor<T, Device> forward(input_view x) const {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    return collective(false, [&] {
      validate_input(x);
      return forward_checked(x);
    });
  }

  // The loss of the model on (x, target), without training.
  template <class Loss>
  double loss(input_view x, typename Loss::template target_type<T, Device> target) const {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    return collective(false, [&] {
      check<Loss>(x, target, false);  // (inference: any batch)
      tensor<T, Device> y = forward_checked(x);
      return Loss::forward_backward(y, target, 1.0, static_cast<tensor<T, Device>*>(nullptr));
    });
  }

 private:
  // forward() on checked input.
  tensor<T, Device> forward_checked(input_view x) const {
    memory::tracing::phase_scope const running(memory::phase::forward);
    state_type s = make_state({.training = false}, x);
    read_buffers(s);
    gathering const gathers(*this, s);
    act<C, Device> y = [&] {
      auto const gathered = detail::gather_frame<Net>(s, weights());
      return Net::forward(s, gathered.at(weights()), detail::input_activation<Net, Precision>(s, x, false));
    }();
    return take(std::move(y));
  }

  // A pass outside training under a wrapper whose passes are collective (ZeRO-3): the wrapper is
  // told it starts and how it ended (see gradient_sync::collective_pass_ended); otherwise f().
  template <class F>
  auto collective(bool training, F&& f) const {
    detail::gradient_sync* const sync = link_.gradient_sync();
    if (!sync || !sync->gathers_parameters()) return f();
    sync->collective_pass_starting(training);
    std::optional<decltype(f())> result;
    std::exception_ptr failed;
    try {
      result.emplace(f());
    } catch (...) {
      failed = std::current_exception();
    }
    sync->collective_pass_ended(failed);
    return std::move(*result);
  }

 public:
  // A training pass: forward (saving what backward needs), loss, backward; gradients of
  // weight * loss are added to the model's gradients. Returns the loss.
  // If `dx` is given, the gradient with respect to the input is written there too.
  // Transactional: when it throws (out of memory at any allocation, say), the gradients, running
  // state, dropout stream and pass count are as they were before the call, bit for bit. Gradients
  // that were zero are zeroed again; gradients holding a sum are restored from a copy made in the
  // offload allocator before the pass (see set_failure_backup).
  template <class Loss>
  double accumulate(input_view x, typename Loss::template target_type<T, Device> target, double weight = 1.0,
                    tensor<T, Device>* dx = nullptr) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    validate<Loss>(x, target);
    if (dx && (reads_ids || dx->rows() != x.rows() || dx->cols() != x.cols()))
      detail::raise<shape_error>("model::accumulate: the input gradient must have the input's shape ", x.rows(), " x ",
                                 x.cols(), reads_ids ? " (and token ids have none)" : "");
    return training_pass<Loss>(x, target, weight, dx).get();
  }

  // The loss of a training-mode forward (dropout on, the stream of pass `passes()`), without
  // backward and without advancing anything: what finite differences of accumulate() measure.
  template <class Loss>
  double training_loss(input_view x, typename Loss::template target_type<T, Device> target) const {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    return collective(true, [&] { return training_loss_checked<Loss>(x, target); });
  }

 private:
  // training_loss() once collective.
  template <class Loss>
  double training_loss_checked(input_view x, typename Loss::template target_type<T, Device> target) const {
    check<Loss>(x, target, false);  // (inference: any batch)
    // Nothing is kept for a backward (nor offloaded); the values are the same.
    state_type s = make_state({.training = true, .keep = false, .stream = dropout_stream()}, x);
    read_buffers(s);
    gathering const gathers(*this, s);
    act<C, Device> y = [&] {
      auto const gathered = detail::gather_frame<Net>(s, weights());
      return Net::forward(s, gathered.at(weights()), detail::input_activation<Net, Precision>(s, x, true));
    }();
    return Loss::forward_backward(*y, target, 1.0, static_cast<tensor<C, Device>*>(nullptr));
  }

 public:
  // Sets the gradients to zero (after a data-parallel wrapper's reductions in flight finish):
  // what a step of gradient accumulation starts with. train_step does it itself.
  void zero_grad() {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    detail::gradient_sync* const sync = link_.gradient_sync();
    if (sync) sync->zeroing_gradients();
    if (!sync || !sync->clear_gradients()) evaluate(grads_, expr::to_expr(0.0));
    grads_zero_ = true;
  }

  // zero_grad, accumulate, optimizer step.
  // The loss is read last: on the GPU nothing waits between forward and backward, and the
  // optimizer's skip decision (the norm, the overflow check) is what the host waits for.
  // When it throws, the parameters, optimizer state, loss scale, running state, dropout stream
  // and pass count are as they were before the call, bit for bit, and the gradients are zero (the
  // step's first act is to clear them; keeping the last step's would cost a copy every step).
  template <class Loss, class Optimizer>
  double train_step(input_view x, typename Loss::template target_type<T, Device> target, Optimizer& opt) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    validate<Loss>(x, target);  // before zero_grad: bad input changes nothing
    if (detail::gradient_sync* sync = link_.gradient_sync()) sync->check_pass();
    zero_grad();
    pass_report const before = report_;
    auto const l = training_pass<Loss>(x, target, 1.0, nullptr);
    try {
      opt.step();  // (an optimizer that throws has changed nothing of its own)
    } catch (...) {
      --passes_;  // the pass is undone: its dropout stream is the next pass's again
      if constexpr (buffer_count > 0) std::swap(buffers_, staged_buffers_);
      report_ = before;
      zero_grad();
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

  // The fp32 master weights. Handing out a writable view marks the compute copy (mixed precision)
  // stale, so the next pass casts it again; after writing through a view kept from earlier, call
  // parameters_changed(). Optimizers update both copies in one pass.
  tensor_view<T, Device> parameters() {
    compute_stale_ = true;
    ++parameter_version_;
    return params_.view().row_range(0, parameter_count);
  }
  // Marks the compute copy stale after the master weights were written through a kept view.
  void parameters_changed() {
    compute_stale_ = true;
    ++parameter_version_;
  }
  // Counts the writable views of the master weights handed out and the parameters_changed()
  // calls: an optimizer with a copy of the weights elsewhere (OffloadedAdamW) reads it again when
  // this has moved since its own update.
  std::uint64_t parameter_version() const { return parameter_version_; }
  // The weights in the compute type that layers read (empty unless mixed precision), for an
  // optimizer that writes them in its update.
  tensor_view<C, Device> compute_parameters() {
    if constexpr (mixed_precision)
      return compute_params_.view().row_range(0, parameter_count);
    else
      return {};
  }
  // The running state (buffer_count elements; empty when the model has none), in the order of
  // buffer_table(). Written through this view, it is what the next inference forward reads.
  tensor_view<T, Device> buffers() { return buffers_.view(); }
  tensor_view<T const, Device> buffers() const { return buffers_.view(); }
  // The loss scale: its value, skipped steps and (for DynamicLossScale) its schedule.
  loss_scaler& scaler() { return scaler_; }
  loss_scaler const& scaler() const { return scaler_; }
  // The master weights, read-only (the compute copy stays valid). Under a ZeRO-3 wrapper with
  // more than one rank they hold this rank's shard only (the rest read as zero) unless
  // parameters_whole(): see remat::dist::data_parallel::gather_parameters.
  tensor_view<T const, Device> parameters() const { return params_.view().row_range(0, parameter_count); }
  // Whether this process holds the value of every parameter: false while a data-parallel wrapper
  // with shard_parameters (ZeRO-3) on more than one rank keeps this rank's shard only, or after
  // such a wrapper went without gathering them (link().partial_parameters()).
  bool parameters_whole() const {
    if (detail::gradient_sync const* s = link_.gradient_sync()) return s->parameters_whole();
    return !link_.partial_parameters();
  }
  // (A writable view may be written: the gradients are no longer known to be zero.)
  tensor_view<T, Device> gradients() {
    grads_zero_ = false;
    return grads_.view().row_range(0, parameter_count);
  }
  tensor_view<T const, Device> gradients() const { return grads_.view().row_range(0, parameter_count); }
  // For a data-parallel wrapper that keeps a shard of the gradients of a GPU model (ZeRO-2): the
  // gradient buffer moves to `storage` (room for max(parameter_count, 1) values, owned by the wrapper and
  // alive until it moves the buffer back), its values copied there; with null it moves back into
  // memory from the model's allocator. The allocator's gradients tag no longer counts memory
  // the wrapper holds.
  void relocate_gradients(T* storage) { relocate(grads_, storage, memory::tag::gradients); }
  // The same for the parameters of a wrapper that keeps a shard of them (ZeRO-3): the master
  // weights move to `master` and, in mixed precision, the compute copy to `compute`; with null,
  // both move back into memory from the model's allocator.
  void relocate_parameters(T* master, C* compute) {
    relocate(params_, master, memory::tag::parameters);
    if constexpr (mixed_precision) relocate(compute_params_, master ? compute : nullptr, memory::tag::parameters);
  }
  // The allocator activations, gradients and parameters come from (given at construction).
  allocator_type& allocator() const { return *alloc_; }
  // The host memory Offloaded<S> segments move activations to.
  offload_allocator_t<Device>& offload_allocator() const { return *offload_alloc_; }
  std::uint64_t seed_value() const { return seed_; }  // the seed it was built with
  // What the last training pass kept and recomputed, and whether it ran in the planned arena.
  pass_report const& last_pass() const { return report_; }
  // Training passes lay their activations and the loss's workspace out in one arena at offsets
  // their plan computed (plan/arena.hpp), so the allocator reserves for them exactly the arena's
  // bytes; the layout is computed once per batch shape. Off: every activation comes from the
  // caching allocator (which may reserve more than the plan: blocks cached per size).
  void use_planned_arena(bool on) {
    use_arena_ = on;
    if (!on) {
      arena_.reset();
      layouts_.clear();
    }
  }
  bool uses_planned_arena() const { return use_arena_; }  // (see use_planned_arena)
  // The bytes of the arena held now (reserved in the model's allocator as activations).
  std::size_t arena_bytes() const { return arena_.bytes(); }
  // Training passes run so far; each draws its own dropout stream.
  std::uint64_t passes() const { return passes_; }
  // Sets the pass count (so the next pass draws pass p's dropout stream): what resuming a run, or
  // a data-parallel wrapper's broadcast from rank 0, needs.
  void set_passes(std::uint64_t p) { passes_ = p; }
  // Makes the model's stream current until the end of the scope (on the GPU; nothing on the host):
  // work issued beside the model's own (a data-parallel wrapper's) is then ordered with it.
  [[nodiscard]] auto stream_scope() const { return stream_.scope(); }
  // What a data-parallel wrapper (remat::dist) and the optimizers plug into; a model trained alone
  // leaves it as it is.
  model_link& link() { return link_; }
  model_link const& link() const { return link_; }

  // Checks an input and its target as a training pass would, and throws what it would throw. On
  // the GPU the input's device check is issued before the target's and both are read with one
  // wait; the input's complaint comes first.
  // (A batch above what a Budget of the model was planned for is refused here, though inference
  // takes it.)
  template <class Loss>
  void validate(input_view x, typename Loss::template target_type<T, Device> target) const {
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

  // Every parameter tensor with a PyTorch-style name ("0.weight", "1.2.0.bias"), offset and shape.
  static std::vector<named_param> parameter_table() {
    std::vector<named_param> out;
    auto f = [&](std::string const& name, std::size_t offset, std::vector<std::size_t> const& shape) {
      out.push_back({name, offset, shape});
    };
    detail::visit_params<Net>("", 0, f);
    return out;
  }
  // Every running-state tensor with a PyTorch-style name ("1.running_mean"), offset into
  // buffers() and shape.
  static std::vector<named_param> buffer_table() {
    std::vector<named_param> out;
    detail::buffer_walker<T> w{&out};
    detail::visit_params<Net>("", 0, w);
    return out;
  }

 private:
  static constexpr std::size_t stored_count() { return parameter_count > 0 ? parameter_count : 1; }

  // Moves buffer t (stored_count() values) to `storage` (memory the caller owns), or back into
  // memory of the allocator when null; waits for the copy (the old memory may go right after).
  template <class U>
  void relocate(tensor<U, Device>& t, U* storage, memory::tag tag) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    if (storage == t.data() || (!storage && t.allocator())) return;
    tensor<U, Device> moved = storage ? tensor<U, Device>(tensor<U, Device>::borrowed, storage, stored_count(), 1)
                                      : tensor<U, Device>(index_t(stored_count()), 1, tag, *alloc_);
    evaluate(moved, to_expr(std::as_const(t)));
    stream_.synchronize();
    t = std::move(moved);
  }

  // The loss of y against the target, with scale * its gradient in dy: read later if the loss can.
  template <class Loss, class Y, class Target>
  static kernels::pending_scalar<Device> loss_and_gradient(Y const& y, Target const& target, double scale, Y* dy) {
    if constexpr (requires { Loss::forward_backward_pending(y, target, scale, dy); })
      return Loss::forward_backward_pending(y, target, scale, dy);
    else
      return kernels::pending_scalar<Device>(Loss::forward_backward(y, target, scale, dy));
  }

  // accumulate's pass on checked input; the loss is read when the caller asks for it.
  template <class Loss>
  kernels::pending_scalar<Device> training_pass(input_view x, typename Loss::template target_type<T, Device> target,
                                                double weight, tensor<T, Device>* dx) {
    warn_unscaled_half();
    detail::gradient_sync* const sync = link_.gradient_sync();
    if (sync) {
      sync->check_pass();
      sync->pass_starting();
    }
    memory::tracing::phase_scope const stepping(memory::phase::forward);
    struct peak_window {
      allocator_type& a;
      std::size_t const id = a.open_peak_window(memory::tag::activations);
      ~peak_window() { a.close_peak_window(id); }
    } window{*alloc_};
    // What a pass that fails gives back: zeroed gradients are zeroed again, a sum is copied first.
    // (Restored when this function leaves by an exception, after a data-parallel wrapper has
    // finished what reads the gradients.)
    bool const was_zero = grads_zero_;
    memory::held_block<memory::offload_space_t<Device>> backup;
    struct restore_on_failure {
      model* m;
      bool was_zero;
      void* copy;
      bool backed_up;    // a copy was made (of `kept`, which may be empty)
      param_range kept;  // the gradients the copy holds (the rest were zero)
      ~restore_on_failure() {
        if (!m) return;
        try {
          detail::gradient_sync* const sync = m->link_.gradient_sync();
          if (was_zero || (backed_up && kept.size() < stored_count()))
            if (!sync || !sync->clear_gradients()) evaluate(m->grads_, expr::to_expr(0.0));
          if (was_zero) {
            m->grads_zero_ = true;
          } else if (backed_up) {
            m->copy_gradients(static_cast<T*>(copy), kept, false);
          }
        } catch (...) {  // (a device that fails a copy has failed the pass's error already)
        }
      }
    } restore{nullptr, was_zero, nullptr, false, {}};
    bool ended = false;  // the wrapper has been told how the pass ended
    try {
      state_type s = make_state({.training = true, .stream = dropout_stream(), .input_gradient = dx != nullptr}, x);
      if (sync)
        s.listen_gradients(grads_.data(), {sync, [](void* to, std::size_t offset) {
                                             static_cast<detail::gradient_sync*>(to)->gradients_ready(offset);
                                           }});
      listen_parameters(s);  // (ZeRO-3: each layer's parameters gathered as it is about to run)
      // The running state is updated in a copy, which becomes the model's when the pass succeeds.
      if constexpr (buffer_count > 0) {
        evaluate(staged_buffers_, to_expr(buffers_));
        s.use_buffers(staged_buffers_.data(), buffer_count, true);
      }
      arena_layout const* const layout = planned_arena<Loss>(x, dx != nullptr);
      if (layout) s.use_arena({arena_.base(), layout->offset.data(), layout->bytes.data(), layout->offset.size()});
      kernels::pending_scalar<Device> l;
      // The loss's gradient is multiplied by the loss scale (gradients stay scaled until the
      // optimizer's update divides it out); the loss itself is not.
      double const scale = weight * scaler_.scale();
      act<C, Device> g;
      if (!was_zero && failure_backup_) {
        // (a wrapper that keeps a shard of the gradients only: the shard, the rest being zero)
        param_range const kept = sync ? sync->kept_gradients(stored_count()) : param_range{0, stored_count()};
        if (kept.size())
          backup = memory::held_block<memory::offload_space_t<Device>>(*offload_alloc_, kept.size() * sizeof(T),
                                                                         memory::tag::gradients);
        copy_gradients(static_cast<T*>(backup.get()), kept, true);
        restore.copy = backup.get();
        restore.backed_up = true;
        restore.kept = kept;
      }
      restore.m = this;
      grads_zero_ = false;
      try {
        g = detail::training_pass<Net>(
            s, weights(), grads_.data(), detail::input_activation<Net, Precision>(s, x, true),
            [&](act<C, Device> const& y, act<C, Device> const& dy) {
              {
                memory::tracing::phase_scope const in_loss(memory::phase::loss);
                struct unplan_at_end {
                  allocator_type* a;
                  ~unplan_at_end() {
                    if (a) a->unplan();
                  }
                } const planned_workspace{layout && layout->workspace_bytes ? alloc_ : nullptr};
                if (planned_workspace.a)
                  alloc_->plan_next(arena_.base(), layout->workspace_offset, layout->workspace_bytes,
                                    memory::tag::workspace);
                l = loss_and_gradient<Loss>(*y, target, scale, dy.get());
              }
              memory::tracing::current_trace().current = memory::phase::backward;  // (until `stepping` ends)
            });
      } catch (out_of_memory const& e) {
        explain_out_of_memory(e, x, dx != nullptr, s.makes(), s.make_failed(), !was_zero && !failure_backup_);
      }
      if (dx && g) evaluate(*dx, to_expr(*g));
      if (sync) {
        sync->gradients_ready(0);
        ended = true;
        sync->pass_ended(nullptr);  // (throws, so the pass is undone, when another rank's failed)
      }
      restore.m = nullptr;  // (nothing below throws)
      if constexpr (buffer_count > 0) std::swap(buffers_, staged_buffers_);
      ++passes_;
      report_ = {s.saved_bytes(), s.recomputed(), layout != nullptr, s.unplanned(), 0};
      report_.activation_peak = alloc_->close_peak_window(window.id);
      return l;
    } catch (...) {
      // A wrapper's reductions may still read or write the gradients: this rank takes its part
      // in them, and all ranks agree, before `restore` puts the gradients back.
      if (sync && !ended) sync->pass_ended(std::current_exception());
      throw;
    }
  }

  // Copies the gradients in r (of the stored_count() values) to the failure backup (to_backup) or
  // back: on the host with the point-wise kernels' threads, to or from the GPU as one copy.
  void copy_gradients(T* backup, param_range r, bool to_backup) {
    std::size_t const count = r.size();
    if (count == 0) return;
    T* const g = grads_.data() + r.begin;
    if constexpr (std::is_same_v<Device, host>) {
      T* const to = to_backup ? backup : g;
      T const* const from = to_backup ? g : backup;
      evaluate(tensor_view<T, host>(to, index_t(count), 1), to_expr(tensor_view<T const, host>(from, index_t(count), 1)));
    } else if (to_backup) {
      memory::system<Device>::copy_to_host(backup, g, count * sizeof(T));
    } else {
      memory::system<Device>::copy_from_host(g, backup, count * sizeof(T));
    }
  }

  // The batch, features and sequence length a pass on x plans for.
  struct pass_shape {
    std::size_t batch, features, sequence;
  };
  pass_shape shape_of(input_view x) const {
    std::size_t const seq = reads_ids ? (sequence_model ? x.cols() : 1) : (sequence_model ? seq_len_ : 1);
    return {(reads_ids ? x.size() : x.rows()) / seq, reads_ids ? in_width : x.cols(), seq};
  }

  // The arena layout of a training pass on x (computed on the first pass of its shape; the last
  // few shapes are kept), with the arena held for it; null when the arena is off, the model cannot
  // be planned, or the arena cannot be had (the pass then allocates as usual).
  template <class Loss>
  arena_layout const* planned_arena(input_view x, bool dx) {
    if constexpr (!detail::plannable_v<Net>) {
      (void)x;
      (void)dx;
      return nullptr;
    } else {
      if (!use_arena_) return nullptr;
      pass_shape const p = shape_of(x);
      std::size_t workspace = 0;
      if constexpr (requires { Loss::template workspace_bytes<C>(std::size_t(1), std::size_t(1)); })
        workspace = Loss::template workspace_bytes<C>(p.batch * p.sequence, out_cols(x));
      layout_entry* found = nullptr;
      for (layout_entry& e : layouts_)
        if (e.shape.batch == p.batch && e.shape.features == p.features && e.shape.sequence == p.sequence &&
            e.dx == dx && e.workspace == workspace)
          found = &e;
      if (!found) {
        if (layouts_.size() == 4) layouts_.erase(layouts_.begin());
        layouts_.push_back({p, dx, workspace,
                            detail::plan_arena<Net, Precision>(p.batch, p.features, p.sequence, input_gradient(dx),
                                                               workspace)});
        found = &layouts_.back();
      }
      if (found->layout.size == 0 || !arena_.hold(*alloc_, found->layout.size)) return nullptr;
      return &found->layout;
    }
  }

  // Out of memory in a training pass: the allocator's message (with the layer and phase), and what
  // the activation plan has in use at that point of the step (computed now, at run time): before
  // activation number `made` (from 0), which failed or is the next to be made.
  [[noreturn]] void explain_out_of_memory(out_of_memory const& e, input_view x, bool dx, std::size_t made,
                                          bool activation_failed, bool torn) const {
    auto const [batch, features, seq] = shape_of(x);
    char const* const torn_note =
        torn ? "the gradients hold part of this pass's contribution (set_failure_backup is off): zero them before "
               "training on\n"
             : "";
    if constexpr (!detail::plannable_v<Net>) {
      (void)batch;
      (void)features;
      (void)made;
      (void)activation_failed;
      if (torn) detail::raise<out_of_memory>(e.what(), torn_note);
      throw e;
    } else {
      auto const p = detail::plan_pass<Net, Precision>(batch, features, seq, input_gradient(dx), 0, made);
      detail::raise<out_of_memory>(e.what(), "the activation plan of this step (batch ", batch, seq > 1 ? " x " : "",
                                   seq > 1 ? std::to_string(seq) : std::string(), ") has ",
                                   memory::format_bytes(p.live_before_watch), " of activations in use ",
                                   activation_failed ? "when it makes activation " : "after activation ",
                                   activation_failed ? made + 1 : made, " of the step, where this failed; its peak is ",
                                   memory::format_bytes(p.activations.peak_bytes), "\n", torn_note);
    }
  }

  std::size_t out_cols(input_view x) const { return out_width == any_width ? x.cols() : out_width; }
  // One output row per token id (batch x seq ids give batch * seq rows), or per input row.
  static std::size_t out_rows(input_view x) { return reads_ids ? x.size() : x.rows(); }

  // The device side of the input check: the first token id out of range, or the largest |x| (NaN
  // or inf when there is one), reduced on the device and read by raise_if_bad.
  struct input_verdict {
    kernels::pending_scalar<Device> found;
    input_view x;
    void raise_if_bad() const {
      double const v = found.get();
      if constexpr (reads_ids) {
        using E = first_layer_t<Net>;
        if (v < double(x.size()))
          detail::raise<argument_error>("model input: expected token ids in [0, ", E::vocabulary, "), found ",
                                        kernels::read_element(Device{}, x.data() + std::size_t(v)), " at element ",
                                        std::size_t(v));
      } else {
        if (!std::isfinite(v)) detail::raise<argument_error>("model input: expected finite values, found NaN or inf");
        if (std::is_same_v<C, half> && v > 65504.0)
          detail::raise<argument_error>(
              "model input: expected values within half's range (|x| <= 65504) for a "
              "mixed<half> model, found ",
              v);
      }
    }
  };

  void validate_input(input_view x) const {
    check_whole_parameters();
    check_input(x).raise_if_bad();
  }
  // A model left with one rank's shard of its parameters (link().partial_parameters()) runs only
  // under a wrapper.
  void check_whole_parameters() const {
    if (link_.partial_parameters() && !link_.gradient_sync())
      detail::raise<argument_error>(
          "model: expected whole parameters, found one rank's shard of them only: its remat::dist::data_parallel "
          "with shard_parameters (ZeRO-3) went without gathering them; call dp.gather_parameters() on every rank "
          "before the wrapper goes, or load the parameters from a file");
  }

  // validate's checks, and for a training pass the rows a Budget was planned for.
  template <class Loss>
  void check(input_view x, typename Loss::template target_type<T, Device> target, bool training) const {
    check_whole_parameters();
    input_verdict const verdict = check_input(x);
    try {
      Loss::template validate<T, Device>(out_rows(x), out_cols(x), target);
    } catch (...) {
      verdict.raise_if_bad();
      throw;
    }
    verdict.raise_if_bad();
    if (training) check_planned_rows(x);
  }

  // A training pass keeps what a Budget was planned for (inference takes any batch): checked before
  // anything changes, as the Budget's own forward checks it again.
  void check_planned_rows(input_view x) const {
    if constexpr (planned_rows_v<Net> != std::size_t(-1)) {
      std::size_t const seq = shape_of(x).sequence;
      if (out_rows(x) > planned_rows_v<Net> || seq > planned_sequence_v<Net>)
        detail::raise<argument_error>("model input: expected a training pass of at most ",
                                      planned_rows_v<Net> / planned_sequence_v<Net>, " x ", planned_sequence_v<Net>,
                                      " rows (batch x sequence: what this model's remat::Budget was planned for), "
                                      "found ",
                                      out_rows(x) / seq, " x ", seq);
    } else {
      (void)x;
    }
  }

  input_verdict check_input(input_view x) const {
    if (x.rows() == 0) detail::raise<argument_error>("model input: expected a batch of at least one row, found 0 rows");
    if constexpr (sequence_model && reads_ids) {
      if (x.cols() == 0)
        detail::raise<argument_error>("model input: expected sequences of at least one token, found length 0");
      if (x.cols() > max_sequence)
        detail::raise<argument_error>("model input: expected sequences of at most ", max_sequence,
                                      " tokens (the positional table), found ", x.cols());
    }
    if constexpr (sequence_model && !reads_ids) {
      if (seq_len_ == 0)
        detail::raise<argument_error>(
            "model input: expected a sequence length for this sequence model reading features (call "
            "set_sequence_length first), found none");
      if (x.rows() % seq_len_ != 0)
        detail::raise<shape_error>("model input: expected whole sequences of ", seq_len_, " rows, found ", x.rows(),
                                   " rows");
    }
    std::size_t const want = reads_ids ? (sequence_model ? x.cols() : 1) : in_width;
    if (want != any_width && x.cols() != want)
      detail::raise<shape_error>("model input: expected ", want, reads_ids ? " token id" : " features",
                                 " per row, found ", x.cols());
    require_device_memory<Device>(x.data(), "model input");
    if constexpr (reads_ids) {
      using E = first_layer_t<Net>;
      return {kernels::first_out_of_range_pending(Device{}, x.data(), x.size(), 0, E::vocabulary), x};
    } else {
      return {max_of_pending(abs(to_expr(x))), x};  // one pass: NaN wins the maximum, inf is the largest
    }
  }

  // The weights layers read: the master weights, or their compute copy cast when stale (once per
  // change of the weights, not per pass).
  // Under a wrapper that keeps a shard of the parameters (ZeRO-3), only the shard is cast: layers
  // read the rest gathered from the other ranks.
  C const* weights() const {
    if constexpr (mixed_precision) {
      detail::gradient_sync const* const sync = link_.gradient_sync();
      param_range const want = sync ? sync->kept_parameters(stored_count()) : param_range{0, stored_count()};
      if (compute_stale_ || compute_cast_ != want) {
        if (want.size() == stored_count())
          evaluate(compute_params_, to_expr(params_));
        else if (want.size())
          evaluate(compute_params_.view().row_range(want.begin, want.size()),
                   to_expr(params_.view().row_range(want.begin, want.size())));
        compute_cast_ = want;
        compute_stale_ = false;
      }
      return compute_params_.data();
    } else {
      return params_.data();
    }
  }

  // ZeRO-3: the pass tells a data-parallel wrapper that keeps a shard of the parameters which
  // parameters each layer reads, before it runs.
  void listen_parameters(state_type& s) const {
    detail::gradient_sync* const sync = link_.gradient_sync();
    if (!sync || !sync->gathers_parameters()) return;
    s.listen_parameters(weights(), {sync,
                                    [](void* to, std::size_t offset, std::size_t count) -> void const* {
                                      return static_cast<detail::gradient_sync*>(to)->parameters_needed(offset, count);
                                    },
                                    [](void* to) noexcept { static_cast<detail::gradient_sync*>(to)->parameters_done(); }});
  }
  // A pass outside training listens to the gathering (listen_parameters) and, as it ends, has the
  // wrapper let go of parameters made whole before it (dist::save's gather).
  struct gathering {
    detail::gradient_sync* sync;
    gathering(model const& m, state_type& s) : sync(m.link_.gradient_sync()) {
      if (sync && !sync->gathers_parameters()) sync = nullptr;
      m.listen_parameters(s);
    }
    gathering(gathering const&) = delete;
    gathering& operator=(gathering const&) = delete;
    ~gathering() {
      if (sync) sync->release_parameters();
    }
  };

  // A pass that reads the running state without updating it.
  void read_buffers(state_type& s) const {
    if constexpr (buffer_count > 0) s.use_buffers(const_cast<T*>(buffers_.data()), buffer_count, false);
  }

  // The dropout stream of the next pass: one per pass, and per replica in data parallelism.
  std::uint64_t dropout_stream() const { return passes_ + (link_.replica() << 40); }

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
    o.seed = seed_;
    if constexpr (reads_ids) {
      o.ids = {x.data(), x.size()};
      if constexpr (sequence_model) o.sequence_length = x.cols();
    } else if constexpr (sequence_model) {
      o.sequence_length = seq_len_;
    }
    detail::offload_channel<Device> offload;
    offload.space = offload_alloc_;
    stream_.attach(offload);
    return state_type(o, *alloc_, offload);
  }

  static tensor<T, Device> take(act<C, Device> y) {
    if constexpr (!mixed_precision)
      if (y.use_count() == 1) return std::move(*y);
    tensor<T, Device> out(index_t(y->rows()), index_t(y->cols()), memory::tag::activations, *y->allocator());
    evaluate(out, to_expr(*y));
    return out;
  }

  mutable detail::model_stream<Device> stream_;  // (declared first: the tensors' work is on it)
  allocator_type* alloc_;
  std::unique_ptr<offload_allocator_t<Device>> own_offload_;
  offload_allocator_t<Device>* offload_alloc_;
  tensor<T, Device> params_;
  tensor<T, Device> grads_;
  mutable tensor<C, Device> compute_params_;  // mixed precision only
  tensor<T, Device> buffers_, staged_buffers_;  // running state (and the copy a pass updates)
  mutable bool compute_stale_ = true;
  mutable param_range compute_cast_{};  // the part of the compute copy cast last (see weights)
  std::uint64_t parameter_version_ = 0;  // (see parameter_version)
  bool grads_zero_ = false;      // the gradients are known to be zero (zero_grad, nothing since)
  bool failure_backup_ = true;   // see set_failure_backup
  loss_scaler scaler_ = loss_scaler::of<typename Precision::loss_scale>();
  std::uint64_t seed_;
  std::uint64_t passes_ = 0;
  std::size_t seq_len_ = 0;  // a sequence model reading features: rows per sequence
  model_link link_;
  pass_report report_{};
  struct layout_entry {
    pass_shape shape;
    bool dx;
    std::size_t workspace;
    arena_layout layout;
  };
  std::vector<layout_entry> layouts_;
  bool use_arena_ = true;
  detail::arena_hold<Device> arena_;  // (declared last: given back before the allocator's blocks)
};

}  // namespace REMAT_NAMESPACE
