// recycling<U>: a standard allocator for single objects that keeps up to `kept` freed ones per
// thread and hands them out again, so a loop that makes and drops the same small objects every
// iteration (a pass's activations: the shared_ptr control block and tensor of each) asks the heap
// for nothing once it runs. Arrays, and objects past the kept ones, go to std::allocator.
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <memory>

namespace REMAT_NAMESPACE {
namespace memory {

template <class U>
struct recycling {
  using value_type = U;  // what it allocates
  static constexpr std::size_t kept = 64;  // freed objects a thread keeps for reuse

  recycling() = default;
  // (rebinding: allocate_shared makes its control block with recycling<the block>)
  template <class V>
  explicit(false) recycling(recycling<V> const&) noexcept {}

  // Memory for n objects: a kept one when n is 1 and this thread has one.
  U* allocate(std::size_t n) {
    if (n == 1 && !gone())
      if (void* p = shelf().take()) return static_cast<U*>(p);
    return std::allocator<U>{}.allocate(n);
  }
  // Keeps a single object's memory for reuse on this thread (while it has room), or frees it.
  void deallocate(U* p, std::size_t n) noexcept {
    if (n == 1 && !gone() && shelf().keep(p)) return;
    std::allocator<U>{}.deallocate(p, n);
  }
  // (stateless: any two are interchangeable)
  friend bool operator==(recycling const&, recycling const&) noexcept { return true; }

 private:
  struct kept_objects {
    void* slot[kept];
    std::size_t count = 0;
    void* take() noexcept { return count ? slot[--count] : nullptr; }
    bool keep(void* p) noexcept {
      if (count == kept) return false;
      slot[count++] = p;
      return true;
    }
    ~kept_objects() {
      gone() = true;  // (an object freed later on this thread's way out goes to std::allocator)
      while (count) std::allocator<U>{}.deallocate(static_cast<U*>(slot[--count]), 1);
    }
  };
  // Whether this thread's shelf was destroyed (a trivial thread_local: readable to the thread's end).
  static bool& gone() noexcept {
    thread_local bool g = false;
    return g;
  }
  static kept_objects& shelf() noexcept {
    thread_local kept_objects s;
    return s;
  }
};

}  // namespace memory
}  // namespace REMAT_NAMESPACE
