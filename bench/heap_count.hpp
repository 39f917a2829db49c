// Counts the program's heap allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc,
// memalign: glibc's, which libstdc++'s operator new and libtorch's CPU allocator both call), so
// bench_inference and its libtorch twin report the same figure per call: what a time loop that
// must not touch the heap would see, beside remat's own count of requests to the system.
//
// It replaces glibc's functions in the executable (the dynamic linker binds every library's calls
// to the executable's definitions first) and forwards to the next definition, found by
// dlsym(RTLD_NEXT); dlsym's own first allocations are served from a small static block. Include
// it in exactly one translation unit of a program.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace heap_count {

// Heap allocations since the program started.
inline std::atomic<std::uint64_t> calls{0};

namespace detail {

alignas(64) inline char boot[8192];  // dlsym's allocations before the real functions are known
inline std::size_t boot_used = 0;

inline bool from_boot(void const* p) {
  return p >= static_cast<void const*>(boot) && p < static_cast<void const*>(boot + sizeof boot);
}

inline void* boot_alloc(std::size_t n) {
  std::size_t const at = (boot_used + 63) & ~std::size_t(63);
  if (at + n > sizeof boot) return nullptr;
  boot_used = at + n;
  return boot + at;
}

struct real {
  void* (*malloc)(std::size_t) = nullptr;
  void* (*calloc)(std::size_t, std::size_t) = nullptr;
  void* (*realloc)(void*, std::size_t) = nullptr;
  void (*free)(void*) = nullptr;
  int (*posix_memalign)(void**, std::size_t, std::size_t) = nullptr;
  void* (*aligned_alloc)(std::size_t, std::size_t) = nullptr;
  void* (*memalign)(std::size_t, std::size_t) = nullptr;
  bool looking = false;
};

inline real& fns() {
  static real r;
  if (!r.free && !r.looking) {
    r.looking = true;  // (dlsym may allocate: calloc then serves from boot)
    r.malloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(RTLD_NEXT, "malloc"));
    r.calloc = reinterpret_cast<void* (*)(std::size_t, std::size_t)>(dlsym(RTLD_NEXT, "calloc"));
    r.realloc = reinterpret_cast<void* (*)(void*, std::size_t)>(dlsym(RTLD_NEXT, "realloc"));
    r.posix_memalign = reinterpret_cast<int (*)(void**, std::size_t, std::size_t)>(dlsym(RTLD_NEXT, "posix_memalign"));
    r.aligned_alloc = reinterpret_cast<void* (*)(std::size_t, std::size_t)>(dlsym(RTLD_NEXT, "aligned_alloc"));
    r.memalign = reinterpret_cast<void* (*)(std::size_t, std::size_t)>(dlsym(RTLD_NEXT, "memalign"));
    r.free = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_NEXT, "free"));
    r.looking = false;
  }
  return r;
}

}  // namespace detail
}  // namespace heap_count

extern "C" {

void* malloc(std::size_t n) {
  auto& r = heap_count::detail::fns();
  if (!r.malloc) return heap_count::detail::boot_alloc(n);
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  return r.malloc(n);
}

void* calloc(std::size_t count, std::size_t n) {
  auto& r = heap_count::detail::fns();
  if (!r.calloc) return heap_count::detail::boot_alloc(count * n);  // (static: already zero)
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  return r.calloc(count, n);
}

void* realloc(void* p, std::size_t n) {
  auto& r = heap_count::detail::fns();
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  if (heap_count::detail::from_boot(p)) {  // (moved out of the boot block: at most what follows p there)
    std::size_t const held = std::size_t(heap_count::detail::boot + heap_count::detail::boot_used - static_cast<char*>(p));
    void* const q = r.malloc(n);
    if (q) std::memcpy(q, p, n < held ? n : held);
    return q;
  }
  return r.realloc(p, n);
}

void free(void* p) {
  if (!p || heap_count::detail::from_boot(p)) return;
  heap_count::detail::fns().free(p);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  return heap_count::detail::fns().posix_memalign(out, alignment, n);
}

void* aligned_alloc(std::size_t alignment, std::size_t n) {
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  return heap_count::detail::fns().aligned_alloc(alignment, n);
}

void* memalign(std::size_t alignment, std::size_t n) {
  heap_count::calls.fetch_add(1, std::memory_order_relaxed);
  return heap_count::detail::fns().memalign(alignment, n);
}

}  // extern "C"
