// planning::state: a pass state that computes nothing and only counts. The layers' forward and
// backward are written once against the pass-state vocabulary (pass/vocabulary.hpp); run against
// this state at compile time, they make, share and drop the same tensors in the same order as a
// real training step, and the state adds up the bytes the caching allocator would hand out (each
// request rounded up as the allocator rounds it). That is the activation plan (plan/activation.hpp).
#pragma once

#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "../pass/vocabulary.hpp"
#include "../pass/gradient_sync.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace planning {

// What a planned tensor has: a shape and a byte count (zero for a hollow one).
struct buffer {
  std::size_t rows_ = 0;  // its rows
  std::size_t cols_ = 0;  // its columns
  std::size_t bytes = 0;  // what the allocator would hand out for it (0: hollow or borrowed)
  long refs = 0;  // the handles that share it
  bool hollow = false;  // a shape without storage (the vocabulary's hollow())
  // Its lifetime in the counter's clock (one tick per make and per free): made at `born`, freed
  // at `died` (or never, if the pass ends holding it). The arena's layout reads them
  // (plan/arena.hpp).
  std::size_t born = 0;
  std::size_t died = std::size_t(-1);  // (see born)
  constexpr std::size_t rows() const { return rows_; }  // its rows
  constexpr std::size_t cols() const { return cols_; }  // its columns
  constexpr std::size_t size() const { return rows_ * cols_; }  // its elements
};

// Parameters are not needed to plan; offsets into them are still written `p + k`, and are kept:
// where backward reports gradients final (grads_ready) is part of a sharded run's plan.
struct no_params {
  std::size_t at = 0;  // the offset from the start of the parameters
  constexpr no_params operator+(std::size_t k) const { return {at + k}; }  // k further on
};

class counter;

// A counted handle with std::shared_ptr's semantics (copy shares, the last owner frees).
class ref {
 public:
  constexpr ref() = default;
  constexpr ref(std::nullptr_t) {}  // an empty handle
  constexpr ref(counter* c, int id) : c_(c), id_(id) {}  // takes the one reference c's buffer id was made with
  constexpr ref(ref const& o) : c_(o.c_), id_(o.id_) { retain(); }  // shares o's buffer
  constexpr ref(ref&& o) noexcept : c_(o.c_), id_(o.id_) { o.id_ = -1; }  // takes o's reference; o is empty
  // Shares o's buffer, dropping this handle's.
  constexpr ref& operator=(ref const& o) {
    if (this != &o) {
      ref copy(o);
      swap(copy);
    }
    return *this;
  }
  // Takes o's reference, dropping this handle's; o is empty.
  constexpr ref& operator=(ref&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = o.c_;
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  constexpr ~ref() { reset(); }

  // Drops this handle's reference (the last one frees the buffer's bytes); the handle is empty.
  constexpr void reset();
  // The handles sharing the buffer (0 when empty).
  constexpr long use_count() const;
  // The planned buffer (its shape and bytes).
  constexpr buffer const* operator->() const;
  constexpr buffer const& operator*() const { return *operator->(); }  // the planned buffer
  constexpr explicit operator bool() const { return id_ >= 0; }  // whether it holds a buffer
  constexpr bool operator==(ref const& o) const { return id_ == o.id_; }  // the same buffer
  constexpr int id() const { return id_; }  // the buffer's index in the counter (-1: empty)

 private:
  constexpr void retain();
  constexpr void swap(ref& o) {
    counter* c = c_;
    int i = id_;
    c_ = o.c_;
    id_ = o.id_;
    o.c_ = c;
    o.id_ = i;
  }
  counter* c_ = nullptr;
  int id_ = -1;
};

// The most bytes a plan counts, all its tensors together (4 EiB): past it a plan is refused, so
// that no sum of a plan (live bytes, the peak, an arena's layout, a whole step's total) wraps
// around to a small number that would pass a static_assert.
inline constexpr std::size_t max_bytes = std::size_t(1) << 62;

// The live bytes of every planned tensor and their peak.
class counter {
 public:
  std::size_t live = 0;  // bytes held now
  std::size_t peak = 0;  // the most bytes held at once
  std::vector<buffer> buffers;  // every buffer made, borrowed or hollow, by id
  std::size_t made = 0;  // the makes so far
  // A make's number (from 0): live_before_watch gets the bytes in use just before it, what a step
  // had in use when its allocation of that number failed.
  std::size_t watch = std::size_t(-1);
  std::size_t live_before_watch = 0;  // (see watch)
  std::size_t clock = 0;  // one tick per make and per free: the buffers' born and died
  // The buffer of each make, in order (what the arena serves make number k from).
  std::vector<int> made_ids;
  // The loss's workspace: its bytes and lifetime, while the loss runs (workspace_while).
  std::size_t workspace_bytes = 0;
  std::size_t workspace_born = 0;  // (see workspace_bytes)
  std::size_t workspace_died = 0;  // (see workspace_bytes)
  std::size_t made_bytes = 0;  // every make's bytes together (at most max_bytes)

  // A new buffer of rows x cols elements of element_bytes, counted as the allocator rounds it. An
  // argument_error when the plan's tensors pass max_bytes together (a batch that was a negative
  // number converted to std::size_t, say), never a count that wrapped around.
  constexpr ref make(std::size_t rows, std::size_t cols, std::size_t element_bytes) {
    if (made++ == watch) live_before_watch = live;
    std::size_t const room = made_bytes < max_bytes ? max_bytes - made_bytes : 0;  // (elements of <= 8 bytes)
    if (cols > max_bytes / 8 || (cols && rows > room / (cols * element_bytes)))
      detail::raise<argument_error>("remat plan: expected at most 4 EiB of tensors in all, found more with one of ",
                                    rows, " x ", cols, " elements of ", element_bytes, " bytes");
    std::size_t const bytes = memory::caching_allocator<host>::rounded(rows * cols * element_bytes);
    made_bytes += bytes;
    buffers.push_back(buffer{rows, cols, bytes, 1, false, clock++});
    made_ids.push_back(int(buffers.size()) - 1);
    live += bytes;
    if (live > peak) peak = live;
    return ref(this, int(buffers.size()) - 1);
  }
  // A shape without storage: counts nothing.
  constexpr ref hollow(std::size_t rows, std::size_t cols) {
    buffers.push_back(buffer{rows, cols, 0, 1, true});
    return ref(this, int(buffers.size()) - 1);
  }
  // A buffer owned elsewhere (the caller's input): counts nothing.
  constexpr ref borrow(std::size_t rows, std::size_t cols) {
    buffers.push_back(buffer{rows, cols, 0, 1, false});
    return ref(this, int(buffers.size()) - 1);
  }
  // Drops one reference to buffer id; the last frees its bytes and ends its lifetime.
  constexpr void release(int id) {
    buffer& b = buffers[std::size_t(id)];
    if (--b.refs == 0 && b.bytes) {
      live -= b.bytes;
      b.died = clock++;
    }
  }
  // `bytes` of workspace (the loss's, untagged as activations) in use from now until the next
  // event: counted apart from the activations.
  constexpr void workspace_while(std::size_t bytes) {
    workspace_bytes = memory::caching_allocator<host>::rounded(bytes);
    workspace_born = clock++;
    workspace_died = clock++;
  }
};

constexpr void ref::retain() {
  if (id_ >= 0) ++c_->buffers[std::size_t(id_)].refs;
}
constexpr void ref::reset() {
  if (id_ >= 0) c_->release(id_);
  id_ = -1;
}
constexpr long ref::use_count() const { return id_ >= 0 ? c_->buffers[std::size_t(id_)].refs : 0; }
constexpr buffer const* ref::operator->() const { return &c_->buffers[std::size_t(id_)]; }

// Offloaded copies are not ordered against anything in a plan.
struct no_fence {
  constexpr void begin(int) {}  // (nothing to order)
  constexpr void end() {}  // (nothing to order)
  constexpr void wait() const {}  // (nothing to wait for)
};

// The caller's input, as a plan sees it: a shape.
struct input_shape {
  std::size_t rows_ = 0;  // the input's rows
  std::size_t cols_ = 0;  // the input's columns
  constexpr std::size_t rows() const { return rows_; }  // the input's rows
  constexpr std::size_t cols() const { return cols_; }  // the input's columns
};

// The pass-state vocabulary, counting instead of computing. T is the type activations are stored
// in.
template <class T>
class state : public pass_vocabulary<ref, state<T>, offload_record<ref, ref, no_fence>> {
  using record = offload_record<ref, ref, no_fence>;
  using base = pass_vocabulary<ref, state<T>, record>;

 public:
  using value_type = T;  // what activations are stored in
  using grad_type = T;  // (gradients: not planned)
  using device = void;  // (no device: nothing runs)
  using act_type = ref;  // an activation: a counted handle
  using param_ptr = no_params;  // (parameters are not read)
  using grad_ptr = no_params;  // (gradients are not written)
  using buffer_ptr = no_params;  // (running state is not read)
  static constexpr bool computes = false;  // layers skip their arithmetic

  // `offloaded` counts what Offloaded<S> moves off the device (memory/offload.hpp).
  constexpr state(counter& mem, counter& offloaded, pass_options const& o)
      : base(o), mem_(&mem), offloaded_(&offloaded) {}

  // Where backward reports the gradients from g on final, in order (what a data-parallel wrapper
  // that gives back the pages of reduced gradients plans with): recorded when asked to.
  constexpr void grads_ready(no_params g) const {
    if (reports_) reports_->push_back(g.at);
    if (events_) events_->push_back({detail::pass_event::kind::report, {g.at, g.at}});
  }
  constexpr void record_gradient_reports(std::vector<std::size_t>* to) { reports_ = to; }  // (null: none kept)
  // The frames that gather parameters (gather_frame) as they start and end, and the reports of
  // gradients final, in order (what a data-parallel wrapper that keeps a shard of the parameters
  // plans its peak with, and what a rank whose pass failed goes on taking part in). Recorded when
  // asked to.
  class gather_scope {
   public:
    constexpr gather_scope() = default;
    // Records the frame's end in `to` when it goes.
    constexpr explicit gather_scope(std::vector<detail::pass_event>* to) : to_(to) {}
    gather_scope(gather_scope const&) = delete;
    gather_scope& operator=(gather_scope const&) = delete;
    constexpr ~gather_scope() {
      if (to_) to_->push_back({detail::pass_event::kind::done, {}});
    }
    static constexpr no_params at(no_params p) { return p; }  // (the plan reads no parameters)

   private:
    std::vector<detail::pass_event>* to_ = nullptr;
  };
  // A frame reading parameters [p, p + count) starts (recorded, with its end when the scope goes).
  constexpr gather_scope gather_params(no_params p, std::size_t count) const {
    if (!events_) return {};
    events_->push_back({detail::pass_event::kind::gather, {p.at, p.at + count}});
    return gather_scope(events_);
  }
  constexpr void record_events(std::vector<detail::pass_event>* to) { events_ = to; }  // (null: none kept)
  // Running state lives outside the pass's activations: nothing to count.
  constexpr no_params buffers(std::size_t) const { return {}; }
  constexpr bool updates_buffers() const { return false; }  // (running state is not planned)
  // Forward is over: what is held beside the output y is what forward saved for backward.
  constexpr void forward_done(ref const& y) { this->set_saved_bytes(mem_->live - y->bytes); }
  // A new activation of rows x cols values of T, counted.
  constexpr ref make(std::size_t rows, std::size_t cols) {
    this->note_work(std::uint64_t(rows) * cols);
    return mem_->make(rows, cols, sizeof(T));
  }
  constexpr ref hollow(std::size_t rows, std::size_t cols) { return mem_->hollow(rows, cols); }  // a shape only
  static constexpr bool is_hollow(ref const& a) { return a && a->hollow; }  // whether a is a shape only
  static constexpr bool owns(ref const& a) { return a->bytes > 0; }  // whether a's bytes are counted
  // The pass's input (planned buffers are never reused, so an id is its identity).
  constexpr void mark_pass_input(ref const& a) { input_ = a.id(); }
  constexpr bool is_pass_input(ref const& a) const { return a && a.id() == input_; }  // whether a is the pass's input
  constexpr ref borrow(input_shape x) { return mem_->borrow(x.rows(), x.cols()); }  // the input as is: not counted
  constexpr ref convert(input_shape x) { return make(x.rows(), x.cols()); }  // the input converted: a new activation
  // An offloaded copy of a: counted in the offload counter, not the device's.
  constexpr ref copy_off(ref const& a, no_fence&) { return offloaded_->make(a->rows(), a->cols(), sizeof(T)); }
  // An offloaded activation brought back: a new activation.
  constexpr ref copy_back(typename record::item const& it, no_fence&) { return make(it.rows, it.cols); }
  static constexpr int offload_target() { return 0; }  // (no device to offload from)

 private:
  counter* mem_;
  counter* offloaded_;
  std::vector<std::size_t>* reports_ = nullptr;
  std::vector<detail::pass_event>* events_ = nullptr;
  int input_ = -1;
};

}  // namespace planning

// The pass state the activation plan runs a layer on (what `layer_for<L, plan_state<float>>`
// checks). The namespace is `planning`, not `plan`: `plan` is a name users give their variables.
template <class T>
using plan_state = planning::state<T>;

}  // namespace REMAT_NAMESPACE
