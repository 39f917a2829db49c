// planning::state: a pass state that computes nothing and only counts. The layers' forward and
// backward are written once against the pass-state vocabulary (pass/vocabulary.hpp); run against
// this state at compile time, they make, share and drop the same tensors in the same order as a
// real training step, and the state adds up the bytes the caching allocator would hand out (each
// request rounded up as the allocator rounds it). That is the activation plan (plan/activation.hpp).
#pragma once

#include "../memory/allocator.hpp"
#include "../pass/vocabulary.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace planning {

// What a planned tensor has: a shape and a byte count (zero for a hollow one).
struct buffer {
  std::size_t rows_ = 0, cols_ = 0, bytes = 0;
  long refs = 0;
  bool hollow = false;
  // Its lifetime in the counter's clock (one tick per make and per free): made at `born`, freed
  // at `died` (or never, if the pass ends holding it). The arena's layout reads them
  // (plan/arena.hpp).
  std::size_t born = 0, died = std::size_t(-1);
  constexpr std::size_t rows() const { return rows_; }
  constexpr std::size_t cols() const { return cols_; }
  constexpr std::size_t size() const { return rows_ * cols_; }
};

// Parameters are not needed to plan; offsets into them are still written `p + k`.
struct no_params {
  constexpr no_params operator+(std::size_t) const { return {}; }
};

class counter;

// A counted handle with std::shared_ptr's semantics (copy shares, the last owner frees).
class ref {
 public:
  constexpr ref() = default;
  constexpr ref(std::nullptr_t) {}
  constexpr ref(counter* c, int id) : c_(c), id_(id) {}
  constexpr ref(ref const& o) : c_(o.c_), id_(o.id_) { retain(); }
  constexpr ref(ref&& o) noexcept : c_(o.c_), id_(o.id_) { o.id_ = -1; }
  constexpr ref& operator=(ref const& o) {
    if (this != &o) {
      ref copy(o);
      swap(copy);
    }
    return *this;
  }
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

  constexpr void reset();
  constexpr long use_count() const;
  constexpr buffer const* operator->() const;
  constexpr buffer const& operator*() const { return *operator->(); }
  constexpr explicit operator bool() const { return id_ >= 0; }
  constexpr bool operator==(ref const& o) const { return id_ == o.id_; }
  constexpr int id() const { return id_; }

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

// The live bytes of every planned tensor and their peak.
class counter {
 public:
  std::size_t live = 0, peak = 0;
  std::vector<buffer> buffers;
  // The bytes in use just before make number `watch` (from 0): what a step had in use when its
  // allocation of that number failed.
  std::size_t made = 0, watch = std::size_t(-1), live_before_watch = 0;
  std::size_t clock = 0;
  // The buffer of each make, in order (what the arena serves make number k from).
  std::vector<int> made_ids;
  // The loss's workspace: its bytes and lifetime, while the loss runs (workspace_while).
  std::size_t workspace_bytes = 0, workspace_born = 0, workspace_died = 0;

  constexpr ref make(std::size_t rows, std::size_t cols, std::size_t element_bytes) {
    if (made++ == watch) live_before_watch = live;
    std::size_t const bytes = memory::caching_allocator<host>::rounded(rows * cols * element_bytes);
    buffers.push_back(buffer{rows, cols, bytes, 1, false, clock++});
    made_ids.push_back(int(buffers.size()) - 1);
    live += bytes;
    if (live > peak) peak = live;
    return ref(this, int(buffers.size()) - 1);
  }
  constexpr ref hollow(std::size_t rows, std::size_t cols) {
    buffers.push_back(buffer{rows, cols, 0, 1, true});
    return ref(this, int(buffers.size()) - 1);
  }
  constexpr ref borrow(std::size_t rows, std::size_t cols) {
    buffers.push_back(buffer{rows, cols, 0, 1, false});
    return ref(this, int(buffers.size()) - 1);
  }
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
  constexpr void begin(int) {}
  constexpr void end() {}
  constexpr void wait() const {}
};

// The caller's input, as a plan sees it: a shape.
struct input_shape {
  std::size_t rows_ = 0, cols_ = 0;
  constexpr std::size_t rows() const { return rows_; }
  constexpr std::size_t cols() const { return cols_; }
};

// The pass-state vocabulary, counting instead of computing. T is the type activations are stored
// in.
template <class T>
class state : public pass_vocabulary<ref, state<T>, offload_record<ref, ref, no_fence>> {
  using record = offload_record<ref, ref, no_fence>;
  using base = pass_vocabulary<ref, state<T>, record>;

 public:
  using value_type = T;
  using grad_type = T;
  using device = void;
  using act_type = ref;
  using param_ptr = no_params;
  using grad_ptr = no_params;
  using buffer_ptr = no_params;
  static constexpr bool computes = false;

  // `offloaded` counts what Offloaded<S> moves off the device (memory/offload.hpp).
  constexpr state(counter& mem, counter& offloaded, pass_options const& o)
      : base(o), mem_(&mem), offloaded_(&offloaded) {}

  constexpr void grads_ready(no_params) const {}
  // Running state lives outside the pass's activations: nothing to count.
  constexpr no_params buffers(std::size_t) const { return {}; }
  constexpr bool updates_buffers() const { return false; }
  constexpr void forward_done(ref const& y) { this->set_saved_bytes(mem_->live - y->bytes); }
  constexpr ref make(std::size_t rows, std::size_t cols) {
    this->note_work(std::uint64_t(rows) * cols);
    return mem_->make(rows, cols, sizeof(T));
  }
  constexpr ref hollow(std::size_t rows, std::size_t cols) { return mem_->hollow(rows, cols); }
  static constexpr bool is_hollow(ref const& a) { return a && a->hollow; }
  static constexpr bool owns(ref const& a) { return a->bytes > 0; }
  // The pass's input (planned buffers are never reused, so an id is its identity).
  constexpr void mark_pass_input(ref const& a) { input_ = a.id(); }
  constexpr bool is_pass_input(ref const& a) const { return a && a.id() == input_; }
  constexpr ref borrow(input_shape x) { return mem_->borrow(x.rows(), x.cols()); }
  constexpr ref convert(input_shape x) { return make(x.rows(), x.cols()); }
  constexpr ref copy_off(ref const& a, no_fence&) { return offloaded_->make(a->rows(), a->cols(), sizeof(T)); }
  constexpr ref copy_back(typename record::item const& it, no_fence&) { return make(it.rows, it.cols); }
  static constexpr int offload_target() { return 0; }

 private:
  counter* mem_;
  counter* offloaded_;
  int input_ = -1;
};

}  // namespace planning

// The pass state the activation plan runs a layer on (what `layer_for<L, plan_state<float>>`
// checks). The namespace is `planning`, not `plan`: `plan` is a name users give their variables.
template <class T>
using plan_state = planning::state<T>;

}  // namespace REMAT_NAMESPACE
