// pass_state<T, D, G>: the pass state of a training step (or an inference forward) on device D,
// which computes. Activations of type T are tensors from the model's caching allocator, shared
// as in PyTorch's autograd: a tensor lives exactly as long as someone (the next layer, or a layer
// that saved it for backward) still needs it. G is the type of the gradients layers accumulate
// into (the fp32 master gradients in mixed precision).
#pragma once

#include "../kernels/evaluate.hpp"
#include "../memory/allocator.hpp"
#include "../memory/offload.hpp"
#include "../memory/recycling.hpp"
#include "../tensor/tensor.hpp"
#include "vocabulary.hpp"

#include <memory>

namespace REMAT_NAMESPACE {

// An activation of a pass: shared (a layer keeps it for backward while the next reads it), freed
// when the last holder lets go.
template <class T, class D>
using act = std::shared_ptr<tensor<T, D>>;

// A new activation object (its tensor and count in one block, recycled: memory/recycling.hpp).
template <class T, class D, class... Args>
act<T, D> make_act(Args&&... args) {
  return std::allocate_shared<tensor<T, D>>(memory::recycling<tensor<T, D>>{}, std::forward<Args>(args)...);
}

// Told by backward as a layer's gradients become final: those from `offset` (in elements from the
// start of the model's gradient buffer) to its end. A data-parallel wrapper starts reducing them.
struct gradient_listener {
  void* context = nullptr;  // passed back to ready
  // Called with the offset (null: nobody listens).
  void (*ready)(void* context, std::size_t offset) = nullptr;
  // Tells the listener, if any.
  void operator()(std::size_t offset) const {
    if (ready) ready(context, offset);
  }
};

// Told by every frame that runs a layer whose parameters are gathered (graph/walk.hpp's
// gather_frame) which parameters it reads, and when it is done: a wrapper that keeps a shard of
// the parameters (ZeRO-3) gathers them from the other ranks into a buffer the layer reads.
struct parameter_listener {
  void* context = nullptr;  // passed back to needed and done
  // Called before the layer runs with the offset and count of its parameters; returns where they
  // are until `done` (null: nobody listens).
  void const* (*needed)(void* context, std::size_t offset, std::size_t count) = nullptr;
  void (*done)(void* context) noexcept = nullptr;  // when the layer has run (or left by an exception)
};

// Where a planned step's activations go (plan/arena.hpp): make number k of the pass at
// offset[k] of the arena at `base`, when it takes bytes[k] (rounded) as planned, or at most
// bytes[k] when `up_to` (a layout planned for a larger batch serving a smaller one).
struct arena_slots {
  void* base = nullptr;                 // the arena
  std::size_t const* offset = nullptr;  // make number k's offset in it
  std::size_t const* bytes = nullptr;   // make number k's planned bytes
  std::size_t count = 0;                // the makes planned
  bool up_to = false;                   // (see above)
};

template <class T, class D, class G = T>
class pass_state
    : public pass_vocabulary<act<T, D>, pass_state<T, D, G>,
                         offload_record<act<T, D>, memory::held_block<memory::offload_space_t<D>>,
                                        detail::copy_fence<D>>> {
  using host_copy = memory::held_block<memory::offload_space_t<D>>;
  using record = offload_record<act<T, D>, host_copy, detail::copy_fence<D>>;
  using base = pass_vocabulary<act<T, D>, pass_state, record>;

 public:
  using value_type = T;      // the activations' type (the compute type)
  using grad_type = G;       // the gradients' type (the master type)
  using device = D;          // host or cuda
  using act_type = act<T, D>;  // an activation (see act)
  using param_ptr = T const*;  // a layer's parameters, in the activations' type
  using grad_ptr = G*;         // a layer's gradients, to add to
  using buffer_ptr = G*;       // a layer's running state
  static constexpr bool computes = true;  // this state runs kernels (the plan's only counts)

  // A pass started as `o` says, its activations from `alloc`, its offloads through `offload`.
  explicit pass_state(pass_options const& o = {},
                      memory::caching_allocator<D>& alloc = memory::default_allocator<D>(),
                      detail::offload_channel<D> offload = {})
      : base(o), alloc_(&alloc), offload_(offload) {}

  // Backward reports each layer's gradients as final (from `grad_base` on) to `listener`.
  void listen_gradients(G const* grad_base, gradient_listener listener) {
    grad_base_ = grad_base;
    listener_ = listener;
  }
  void grads_ready(G const* g) const { listener_(std::size_t(g - grad_base_)); }  // the gradients from g on are final
  // Every layer that runs tells `listener` which parameters (from `param_base` on) it reads first.
  void listen_parameters(T const* param_base, parameter_listener listener) {
    param_base_ = param_base;
    param_listener_ = listener;
  }
  // What a frame that gathers holds: where its layer reads the parameters (at), until it ends.
  class gathered_params {
   public:
    gathered_params() = default;
    // The parameters at `origin` (in the model's buffer) are read at `where` while it lives; s
    // counts it among the frames that gathered.
    gathered_params(pass_state const* s, T const* origin, T const* where) : s_(s), origin_(origin), where_(where) {
      ++s_->gather_depth_;
    }
    gathered_params(gathered_params const&) = delete;
    gathered_params& operator=(gathered_params const&) = delete;
    ~gathered_params() {
      if (!s_) return;
      --s_->gather_depth_;
      s_->param_listener_.done(s_->param_listener_.context);
    }
    // Where the parameters at p (of the frame's, in the model's buffer) are read now.
    T const* at(T const* p) const { return s_ ? where_ + (p - origin_) : p; }

   private:
    pass_state const* s_ = nullptr;
    T const* origin_ = nullptr;
    T const* where_ = nullptr;
  };
  // The `count` parameters at p are about to be read (gather_frame): the listener, if any, brings
  // them in and says where they are until the scope returned ends. (A frame inside a frame that
  // gathered reads them where the outer one put them.)
  gathered_params gather_params(T const* p, std::size_t count) const {
    if (!param_listener_.needed || gather_depth_ > 0) return {};
    void const* where = param_listener_.needed(param_listener_.context, std::size_t(p - param_base_), count);
    return gathered_params(this, p, where ? static_cast<T const*>(where) : p);
  }

  // A new rows x cols activation: from the planned arena when the pass has one, else from the
  // allocator (out_of_memory when it cannot).
  act_type make(std::size_t rows, std::size_t cols) {
    making_ = true;
    act_type a = arena_.base ? from_arena(rows, cols) : nullptr;
    if (!a) a = make_act<T, D>(index_t(rows), index_t(cols), memory::tag::activations, *alloc_);
    making_ = false;
    ++makes_;
    return a;
  }
  // A rows x cols tensor of U as the pass's next make (the arena's slot when planned), owned by
  // whoever takes it: a forward's output converted to the caller's type.
  template <class U>
  tensor<U, D> make_output(std::size_t rows, std::size_t cols) {
    void* p = arena_.base ? arena_block(rows * cols * sizeof(U)) : nullptr;
    ++makes_;
    if (!p) return tensor<U, D>(index_t(rows), index_t(cols), memory::tag::activations, *alloc_);
    return tensor<U, D>(tensor<U, D>::adopted, static_cast<U*>(p), rows, cols, memory::tag::activations, *alloc_);
  }
  // The model's running state (buffer_count_v<Net> elements of G, BatchNorm2d's statistics), and
  // whether this pass updates it (a training pass does; a loss without a backward does not).
  void use_buffers(G* base, std::size_t count, bool update) {
    buffers_ = base;
    buffer_count_ = count;
    buffer_next_ = 0;
    update_buffers_ = update;
  }
  // The next n elements of the running state: a layer that holds some takes them in each forward
  // that is not a recomputation (the layers' first runs are in the walk's order, so each gets its
  // own). Null when the pass has none (a pass state made without a model).
  G* buffers(std::size_t n) {
    if (!buffers_) return nullptr;
    if (buffer_next_ + n > buffer_count_)
      detail::raise<error>("pass_state::buffers: the layers asked for more running state than the model holds (",
                           buffer_next_ + n, " > ", buffer_count_, "): a layer took its buffers in a recomputation?");
    G* const p = buffers_ + buffer_next_;
    buffer_next_ += n;
    return p;
  }
  // Whether a layer's forward updates its running state now: a training pass's first forward.
  bool updates_buffers() const { return update_buffers_ && this->training() && !this->recomputing(); }
  // Serve the pass's activations from a planned arena (the model's, reserved in alloc).
  void use_arena(arena_slots const& slots) { arena_ = slots; }
  // Activations made so far in this pass (the plan's state counts the same: plan/activation.hpp),
  // and whether the last one failed to be made.
  std::size_t makes() const { return makes_; }
  // Of those, made outside the arena because the plan did not foresee them (0 when the step
  // follows its plan).
  std::size_t unplanned() const { return unplanned_; }
  bool make_failed() const { return making_; }  // (see makes)
  // A shape without memory (what a selective recomputation passes on past its last product).
  act_type hollow(std::size_t rows, std::size_t cols) {
    return make_act<T, D>(tensor<T, D>::shape_only, rows, cols);
  }
  static bool is_hollow(act_type const& a) { return a && a->data() == nullptr; }  // a shape without values
  // Whether the pass made `a` (not the caller's input, read in place).
  static bool owns(act_type const& a) { return a->allocator() != nullptr; }
  // The pass's input (the training pass marks it; held weakly: a tensor made after it was freed is
  // never taken for it).
  void mark_pass_input(act_type const& a) { input_ = a; }
  // Whether `a` is the pass's input.
  bool is_pass_input(act_type const& a) const { return a && !input_.expired() && input_.lock() == a; }

  // The caller's input as the first activation: read in place (never written: training makes
  // every output anew), or converted into a new tensor of T.
  template <class U>
  act_type borrow(tensor_view<U const, D> v) {
    static_assert(std::is_same_v<U, T>, "pass_state::borrow: only an input of the activation type is read in place");
    return make_act<T, D>(tensor<T, D>::borrowed, const_cast<T*>(v.data()), v.rows(), v.cols());
  }
  // The caller's input of another type, converted into a new activation of T.
  template <class U>
  act_type convert(tensor_view<U const, D> v) {
    act_type a = make(v.rows(), v.cols());
    evaluate(*a, expr::to_expr(v));
    return a;
  }

  // After the forward: what it kept (the activations in use, its output excluded).
  void forward_done(act_type const& y) {
    memory::tracing::current_trace().enter(memory::phase::loss);  // (the model's scope restores it)
    this->set_saved_bytes(alloc_->stats()[memory::tag::activations].in_use -
                          memory::caching_allocator<D>::rounded(y->bytes()));
  }

  // Offloaded<S>: a copy of `a` in offloaded memory, issued through `f`; and back.
  host_copy copy_off(act_type const& a, detail::copy_fence<D>& f) {
    host_copy h(*offload_.space, a->bytes(), memory::tag::activations);
    f.to_host(h.get(), a->data(), a->bytes());
    return h;
  }
  // (See copy_off.)
  act_type copy_back(typename record::item const& it, detail::copy_fence<D>& f) {
    act_type a = make(it.rows, it.cols);
    f.to_device(a->data(), it.host.get(), a->bytes());
    return a;
  }
  // Where offloads go: the offload allocator and, on the GPU, the copy stream.
  detail::offload_channel<D> const& offload_target() const { return offload_; }

 private:
  // Make number makes_'s block in the arena (null, counted unplanned, when it does not fit).
  void* arena_block(std::size_t bytes) {
    std::size_t const k = makes_;
    std::size_t const size = memory::caching_allocator<D>::rounded(bytes);
    void* p = nullptr;
    if (k < arena_.count && bytes > 0 && (arena_.up_to ? size <= arena_.bytes[k] : arena_.bytes[k] == size))
      p = alloc_->allocate_at(arena_.base, arena_.offset[k], bytes, memory::tag::activations);
    if (!p) ++unplanned_;
    return p;
  }
  act_type from_arena(std::size_t rows, std::size_t cols) {
    void* const p = arena_block(rows * cols * sizeof(T));
    if (!p) return nullptr;
    try {
      return make_act<T, D>(tensor<T, D>::adopted, static_cast<T*>(p), rows, cols,
                                            memory::tag::activations, *alloc_);
    } catch (...) {
      alloc_->deallocate(p);
      throw;
    }
  }

  memory::caching_allocator<D>* alloc_;
  G* buffers_ = nullptr;
  std::size_t buffer_count_ = 0, buffer_next_ = 0;
  bool update_buffers_ = false;
  arena_slots arena_{};
  std::size_t unplanned_ = 0;
  detail::offload_channel<D> offload_;
  G const* grad_base_ = nullptr;
  gradient_listener listener_{};
  T const* param_base_ = nullptr;
  parameter_listener param_listener_{};
  mutable int gather_depth_ = 0;  // the frames that gathered, running
  std::weak_ptr<tensor<T, D>> input_;
  std::size_t makes_ = 0;
  bool making_ = false;
};

}  // namespace REMAT_NAMESPACE
