// The planned arenas of a model's training passes (plan/arena.hpp): the layout of a pass of each
// batch shape (computed once; the last few shapes are kept) and the arena held for it in the
// model's allocator, so the allocator reserves for a pass's activations exactly the arena's bytes.
#pragma once

#include "../memory/allocator.hpp"
#include "../plan/activation.hpp"
#include "../plan/arena.hpp"

#include <cstddef>
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

// The layouts of a model's training passes by shape, and the arena held for the last one.
template <class Net, class Device, class Precision>
class arena_cache {
 public:
  // On (the default): training passes lay out their activations in an arena; off: every
  // activation comes from the caching allocator.
  void use(bool on) {
    on_ = on;
    if (!on) {
      arena_.reset();
      layouts_.clear();
    }
  }
  bool used() const { return on_; }
  std::size_t bytes() const { return arena_.bytes(); }  // the arena's, held now
  void* base() const { return arena_.base(); }

  // The layout of a training pass of shape p (with an input gradient when dx, and `workspace`
  // bytes of the loss's), with the arena held for it; null when the arena is off, the model cannot
  // be planned, or the arena cannot be had (the pass then allocates as usual).
  arena_layout const* layout_for(pass_shape p, bool dx, std::size_t workspace, memory::caching_allocator<Device>& alloc) {
    if constexpr (!plannable_v<Net>) {
      (void)p, (void)dx, (void)workspace, (void)alloc;
      return nullptr;
    } else {
      if (!on_) return nullptr;
      entry* found = nullptr;
      for (entry& e : layouts_)
        if (e.shape == p && e.dx == dx && e.workspace == workspace) found = &e;
      if (!found) {
        if (layouts_.size() == 4) layouts_.erase(layouts_.begin());
        layouts_.push_back({p, dx, workspace,
                            plan_arena<Net, Precision>(p.batch, p.features, p.sequence, input_gradient(dx), workspace)});
        found = &layouts_.back();
      }
      if (found->layout.size == 0 || !arena_.hold(alloc, found->layout.size)) return nullptr;
      return &found->layout;
    }
  }

 private:
  struct entry {
    pass_shape shape;
    bool dx;
    std::size_t workspace;
    arena_layout layout;
  };
  std::vector<entry> layouts_;
  bool on_ = true;
  arena_hold<Device> arena_;
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
