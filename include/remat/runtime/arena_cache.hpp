// The planned arenas of a model's passes (plan/arena.hpp, plan/forward.hpp): the layout of a pass
// of each kind and batch shape (computed once; the last few are kept) and one arena held for all
// of them in the model's allocator, as large as the largest layout used, so the allocator reserves
// for activations exactly the largest plan of the passes the program ran.
#pragma once

#include "../memory/allocator.hpp"
#include "../plan/activation.hpp"
#include "../plan/arena.hpp"
#include "../plan/forward.hpp"

#include <atomic>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
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

// The batch, features and sequence length a pass plans for.
struct pass_shape {
  std::size_t batch, features, sequence;
  friend bool operator==(pass_shape const&, pass_shape const&) = default;
};

// Which pass a layout is of: a training pass (with an input gradient or not), or one of the
// forwards outside training (plan/forward.hpp).
struct pass_kind {
  bool training = true;  // a training pass (else `forward`)
  bool dx = false;       // a training pass computing the input's gradient
  forward_kind forward = forward_kind::inference;  // (see training)
  friend bool operator==(pass_kind const&, pass_kind const&) = default;
};

// Held while a pass uses a model's arena: a second pass on the same model at the same time (a
// forward from another thread) finds it taken and allocates as usual, so the arena is never
// shared. Movable as a model is (a moved-to model's arena is free).
class arena_busy {
 public:
  arena_busy() = default;
  arena_busy(arena_busy&&) noexcept {}
  arena_busy& operator=(arena_busy&&) noexcept { return *this; }
  bool try_take() { return !taken_.exchange(true, std::memory_order_acquire); }  // true: this pass has it
  void give_back() { taken_.store(false, std::memory_order_release); }          // (after try_take's true)

 private:
  std::atomic<bool> taken_{false};
};

// The layouts of a model's passes by kind and shape, and the one arena held for them: as large as
// the largest layout used (a smaller pass runs in its bottom part).
template <class Net, class Device, class Precision>
class arena_cache {
 public:
  // On (the default): passes lay out their activations in an arena; off: every activation comes
  // from the caching allocator.
  void use(bool on) {
    on_ = on;
    if (!on) {
      arena_.reset();
      layouts_.clear();
      reserved_.reset();
    }
  }
  bool used() const { return on_; }
  std::size_t bytes() const { return arena_.bytes(); }  // the arena's, held now
  void* base() const { return arena_.base(); }

  // The layout of a pass of kind k and shape p (with `workspace` bytes of the loss's), with the
  // arena held for it; null when the arena is off, the model cannot be planned, or the arena
  // cannot be had (the pass then allocates as usual).
  arena_layout const* layout_for(pass_shape p, pass_kind k, std::size_t workspace,
                                 memory::caching_allocator<Device>& alloc) {
    if constexpr (!plannable_v<Net>) {
      (void)p, (void)k, (void)workspace, (void)alloc;
      return nullptr;
    } else {
      if (!on_) return nullptr;
      entry* found = nullptr;
      for (entry& e : layouts_)
        if (e.shape == p && e.kind == k && e.workspace == workspace) found = &e;
      if (!found) {
        if (layouts_.size() == 8) layouts_.erase(layouts_.begin());
        layouts_.push_back({p, k, workspace, plan(p, k, workspace)});
        found = &layouts_.back();
      }
      return held(found->layout, alloc);
    }
  }

  // Plans forward(x, out) for up to `rows` of shape p (p.batch = rows) and holds the arena for
  // it: what reserve_inference does. False when the model cannot be planned or the arena cannot
  // be had (nothing changes then).
  bool reserve_inference(pass_shape p, memory::caching_allocator<Device>& alloc) {
    if constexpr (!plannable_v<Net>) {
      (void)p, (void)alloc;
      return false;
    } else {
      arena_layout layout = plan(p, {.training = false, .forward = forward_kind::into_caller}, 0);
      if (!on_ || (layout.size && !arena_.hold(alloc, layout.size))) return false;
      reserved_.emplace(reserved{p, std::move(layout)});
      return true;
    }
  }
  // The shape reserve_inference planned for (null: none).
  pass_shape const* inference_shape() const { return reserved_ ? &reserved_->shape : nullptr; }
  // The layout reserved for forward(x, out), with the arena held (null when there is none).
  arena_layout const* inference_layout(memory::caching_allocator<Device>& alloc) {
    return reserved_ ? held(reserved_->layout, alloc) : nullptr;
  }

  arena_busy& busy() { return busy_; }  // (see arena_busy)

 private:
  static arena_layout plan(pass_shape p, pass_kind k, std::size_t workspace) {
    if (k.training)
      return plan_arena<Net, Precision>(p.batch, p.features, p.sequence, input_gradient(k.dx), workspace);
    return plan_forward_arena<Net, Precision>(k.forward, p.batch, p.features, p.sequence, workspace);
  }
  arena_layout const* held(arena_layout const& layout, memory::caching_allocator<Device>& alloc) {
    if (layout.size == 0 || !arena_.hold(alloc, layout.size)) return nullptr;
    return &layout;
  }
  struct entry {
    pass_shape shape;
    pass_kind kind;
    std::size_t workspace;
    arena_layout layout;
  };
  struct reserved {
    pass_shape shape;
    arena_layout layout;
  };
  std::vector<entry> layouts_;
  std::optional<reserved> reserved_;
  bool on_ = true;
  arena_hold<Device> arena_;
  arena_busy busy_;
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
