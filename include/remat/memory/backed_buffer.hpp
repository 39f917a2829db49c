// Memory whose backing comes and goes under a fixed address range: a buffer's pages of the system
// (host memory: madvise gives them back, mincore counts those held) or, for device memory, granules
// of CUDA's virtual memory (cuda/granules.hpp). A data-parallel wrapper that keeps a shard of the
// gradients or parameters (ZeRO-2 and 3, parallel/) gives back the pages of what it does not own
// and takes them again just before something writes them; the buffer's offsets never change.
//
// A backed_buffer's `held` says which of its pages (granules) hold memory that may be written: a
// page given back is not held until commit() takes it again. A page given back reads as zero on
// both devices. On the host it would also come back by itself when written; on the GPU it shows a
// granule of zeros shared by all such granules, which must not be written, so commit() maps it
// first. REMAT_DIST_STRICT_PAGES (for the tests) makes the host's pages given back read-only: a
// write that was not committed first faults, as it would corrupt the GPU's shared granule.
#pragma once

#include "../cuda/granules.hpp"
#include "../device.hpp"
#include "../error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
// Whether host pages can be given back and counted (Linux: madvise, mincore): what a
// data-parallel wrapper's options::shard_gradients needs for a host model.
#define REMAT_HOST_PAGES 1
#else
// Whether host pages can be given back and counted (Linux: madvise, mincore): what a
// data-parallel wrapper's options::shard_gradients needs for a host model.
#define REMAT_HOST_PAGES 0
#endif

// A check for tests (0 unless a test build defines it): the host pages a ZeRO-2 or ZeRO-3 wrapper
// has given back (gradients, weights, compute copy) are made read-only (mprotect) until it commits
// them again, so that a write it did not commit first faults; on the GPU such a write would land
// in the granule of zeros that every granule given back shares.
#ifndef REMAT_DIST_STRICT_PAGES
#define REMAT_DIST_STRICT_PAGES 0
#endif

namespace REMAT_NAMESPACE {
namespace detail {

// The pages of a buffer of elements (host memory), or its granules (device memory).
struct page_span {
  std::size_t page = 0;               // the system's page size (0: no pages of ours)
  std::uintptr_t begin = 0, end = 0;  // the buffer's bytes
  std::uintptr_t first = 0;           // the first page it touches
  std::size_t whole = 0;              // the bytes of the pages it touches
  std::size_t element = 1;            // the bytes of one of its elements
  constexpr std::size_t count() const { return page ? whole / page : 0; }           // the pages it touches
  constexpr std::uintptr_t at(std::size_t i) const { return begin + i * element; }  // where element i is
  // Whether page k lies wholly in the buffer (pages shared with other memory are never given back).
  constexpr bool inside(std::size_t k) const {
    return first + k * page >= begin && first + (k + 1) * page <= end;
  }
  // Whether page k holds any of elements [lo, hi).
  constexpr bool touches(std::size_t k, std::size_t lo, std::size_t hi) const {
    return lo < hi && first + k * page < at(hi) && at(lo) < first + (k + 1) * page;
  }
  // The page that holds byte address a.
  constexpr std::size_t page_of(std::uintptr_t a) const { return std::size_t((a - first) / page); }
  // The span of `count` elements of `element` bytes that start on a page boundary (a GPU buffer's
  // granules, or what a plan made before any address is known takes).
  static constexpr page_span aligned(std::size_t count, std::size_t element, std::size_t page) {
    std::size_t const bytes = count * element;
    return page_span{page, 0, bytes, 0, page ? (bytes + page - 1) / page * page : 0, element};
  }
};

// The pages of `count` elements at `data` (host memory), kept from huge pages when `split` (pages
// given back one by one must never be gathered into huge pages).
template <class U>
page_span host_span(U const* data, std::size_t count, bool split) {
  page_span s;
  s.element = sizeof(U);
#if REMAT_HOST_PAGES
  long const sys_page = sysconf(_SC_PAGESIZE);
  s.page = sys_page > 0 ? std::size_t(sys_page) : 4096;
  s.begin = reinterpret_cast<std::uintptr_t>(data);
  s.end = s.begin + count * sizeof(U);
  s.first = s.begin / s.page * s.page;
  s.whole = count ? std::size_t((s.end + s.page - 1) / s.page * s.page - s.first) : 0;
  if (split && s.whole) (void)madvise(reinterpret_cast<void*>(s.first), s.whole, MADV_NOHUGEPAGE);
#else
  (void)data;
  (void)count;
  (void)split;
#endif
  return s;
}

// The bytes of a span's pages the process holds now (mincore; `in` is its answer's storage).
inline std::size_t resident_bytes(page_span const& s, std::vector<unsigned char>& in) {
#if REMAT_HOST_PAGES
  if (!s.page || s.whole == 0) return 0;
  in.resize(s.count());
  if (mincore(reinterpret_cast<void*>(s.first), s.whole, in.data()) != 0) return 0;
  std::size_t count = 0;
  for (unsigned char c : in) count += c & 1u;
  return count * s.page;
#else
  (void)s;
  (void)in;
  return 0;
#endif
}

// Sets `bytes` at `p` (memory of Device) to zero (on the GPU: on the current stream).
template <class Device>
void zero_device_bytes(void* p, std::size_t bytes) {
  if (bytes == 0) return;
#if REMAT_HAS_CUDA
  if constexpr (!std::is_same_v<Device, host>) {
    REMAT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_cuda_stream()));
    return;
  }
#endif
  std::memset(p, 0, bytes);
}
// Copies `bytes` within the memory of Device (on the GPU: on the current stream).
template <class Device>
void copy_device_bytes(void* to, void const* from, std::size_t bytes) {
  if (bytes == 0) return;
#if REMAT_HAS_CUDA
  if constexpr (!std::is_same_v<Device, host>) {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, current_cuda_stream()));
    return;
  }
#endif
  std::memcpy(to, from, bytes);
}

// One buffer of Device's memory whose pages (granules) come and go: its pages, which of them are
// held, and on the GPU the granules it lives in.
template <class Device>
struct backed_buffer {
  static constexpr bool on_gpu = !std::is_same_v<Device, host>;
  page_span span;
  mutable std::vector<unsigned char> held;       // per page: 1 when it holds memory that may be written
  mutable std::vector<unsigned char> residency;  // (mincore's answer)
#if REMAT_HAS_CUDA
  mutable device_granules granules;  // a GPU buffer's (the owner's buffer moves there)
#endif

  // The pages of `count` elements: a host buffer's at `data`, or on the GPU, when `sharded`,
  // granules of virtual memory that the buffer moves into (the caller relocates its buffer to
  // device_data()). Every page is held.
  template <class U>
  void place(U const* data, std::size_t count, bool sharded) {
#if REMAT_HAS_CUDA
    if constexpr (on_gpu) {
      if (!sharded) return;  // (device memory that stays where it is: not pages of ours)
      granules = device_granules(std::max<std::size_t>(count, 1) * sizeof(U));
      span.page = granules.granule();
      span.begin = span.first = reinterpret_cast<std::uintptr_t>(granules.data());
      span.end = span.begin + count * sizeof(U);
      span.whole = granules.count() * granules.granule();
      span.element = sizeof(U);
    }
#endif
    if constexpr (!on_gpu) span = host_span(data, count, sharded);
    (void)data;
    held.assign(span.count(), 1);
  }
  // Where a GPU buffer's granules are (null on the host, or before place()).
  void* device_data() const {
#if REMAT_HAS_CUDA
    if constexpr (on_gpu) return granules.count() ? granules.data() : nullptr;
#endif
    return nullptr;
  }
  // Whether it has granules of its own (a GPU buffer placed as sharded).
  bool has_granules() const { return device_data() != nullptr; }
  // Its granules are left alive (leaked) for whatever may still read or write them.
  void abandon_granules() noexcept {
#if REMAT_HAS_CUDA
    if constexpr (on_gpu)
      if (granules.count()) (void)new device_granules(std::move(granules));
#endif
  }

  // Zeroes [a, e) of one page, if it is held (a page given back reads as zero).
  void zero_in_page(char* a, char* e) const {
    if (a >= e) return;
    std::size_t const k = span.page_of(reinterpret_cast<std::uintptr_t>(a));
    if (k < held.size() && !held[k]) return;
    zero_device_bytes<Device>(a, std::size_t(e - a));
  }
  // Pages [k, e) (all wholly inside the buffer) are given back.
  void release_pages(std::size_t k, std::size_t e) const noexcept {
    if (k >= e) return;
#if REMAT_HAS_CUDA
    if constexpr (on_gpu) granules.release(k, e);
#endif
    if constexpr (!on_gpu) {
#if REMAT_HOST_PAGES
      char* const pa = reinterpret_cast<char*>(span.first + k * span.page);
      std::size_t const bytes = (e - k) * span.page;
      if (madvise(pa, bytes, MADV_DONTNEED) != 0) std::memset(pa, 0, bytes);  // (the values are what matters)
#if REMAT_DIST_STRICT_PAGES
      if (mprotect(pa, bytes, PROT_READ) != 0) std::abort();
#endif
#endif
    }
    for (std::size_t q = k; q < e && q < held.size(); ++q) held[q] = 0;
  }
  // The whole pages inside elements [lo, hi) (of type U, from `base`) are given back (they read as
  // zero); the elements of [lo, hi) on pages partly outside it are zeroed.
  template <class U>
  void give_back(U* base, std::size_t lo, std::size_t hi) const {
    if (lo >= hi || span.page == 0) return;
    auto const page = std::uintptr_t(span.page);
    char* const x = reinterpret_cast<char*>(base + lo);
    char* const y = reinterpret_cast<char*>(base + hi);
    char* const px = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(x) + page - 1) / page * page);
    char* const py = reinterpret_cast<char*>(reinterpret_cast<std::uintptr_t>(y) / page * page);
    if (px >= py) return zero_in_page(x, y);
    zero_in_page(x, px);
    zero_in_page(py, y);
    release_pages(span.page_of(reinterpret_cast<std::uintptr_t>(px)), span.page_of(reinterpret_cast<std::uintptr_t>(py)));
  }
  // The pages of the pages that hold nothing of elements [lo, hi) and lie wholly inside the
  // buffer are given back.
  void give_back_outside(std::size_t lo, std::size_t hi) const noexcept {
    for (std::size_t k = 0; k < span.count();) {
      auto const free_page = [&](std::size_t q) { return span.inside(q) && !span.touches(q, lo, hi) && held[q]; };
      if (!free_page(k)) {
        ++k;
        continue;
      }
      std::size_t e = k + 1;
      while (e < span.count() && free_page(e)) ++e;
      release_pages(k, e);
      k = e;
    }
  }
  // The pages holding elements [lo, hi) are held again (zero), before something writes them.
  void commit(std::size_t lo, std::size_t hi) const {
    if (lo >= hi || span.page == 0) return;
    std::size_t const last = std::min(held.size(), span.page_of(span.at(hi) - 1) + 1);
    for (std::size_t k = span.page_of(span.at(lo)); k < last; ++k) {
      if (held[k]) continue;
      std::size_t e = k;
      while (e < last && !held[e]) ++e;
#if REMAT_HAS_CUDA
      if constexpr (on_gpu) granules.map(k, e);  // (zeroed)
#endif
#if REMAT_DIST_STRICT_PAGES && REMAT_HOST_PAGES
      if constexpr (!on_gpu)
        if (mprotect(reinterpret_cast<void*>(span.first + k * span.page), (e - k) * span.page, PROT_READ | PROT_WRITE) != 0)
          std::abort();
#endif
      for (std::size_t q = k; q < e; ++q) held[q] = 1;
      k = e;
    }
  }
  // The bytes of its pages the process holds now (mincore; on the GPU, its granules mapped).
  std::size_t resident() const {
#if REMAT_HAS_CUDA
    if constexpr (on_gpu) return span.page ? granules.mapped_bytes() : 0;
#endif
    return resident_bytes(span, residency);
  }
};

// Memory of its own, all held, for a buffer the owner writes and reads for its whole life (a
// data-parallel wrapper's gather buffers): whole pages of the system (mmap), or on the GPU granules.
template <class Device, class C>
struct page_buffer {
  static constexpr bool on_gpu = !std::is_same_v<Device, host>;
  C* data = nullptr;
  std::size_t bytes = 0;  // (whole pages, or granules)
  page_span span;         // (a host buffer's pages, to count them)
#if REMAT_HAS_CUDA
  device_granules device;  // (a GPU buffer's: all held, zeroed)
#endif
  page_buffer() = default;
  page_buffer(page_buffer const&) = delete;
  page_buffer& operator=(page_buffer const&) = delete;
  ~page_buffer() {
    if constexpr (!on_gpu) {
#if REMAT_HOST_PAGES
      if (data) munmap(data, bytes);
#endif
    }
  }
  // Takes `need` bytes (whole pages of `page` bytes); on the host every page is touched (zeroed)
  // now, so that it is held from here on. `what` names it in an out_of_memory.
  void allocate(std::size_t need, std::size_t page, char const* what) {
    if (need == 0) return;
#if REMAT_HAS_CUDA
    if constexpr (on_gpu) {
      device = device_granules(need);
      data = static_cast<C*>(device.data());
      bytes = device.count() * device.granule();
      return;
    }
#endif
    if constexpr (!on_gpu) {
#if REMAT_HOST_PAGES
      bytes = (need + page - 1) / page * page;
      void* const p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) raise<out_of_memory>(what, " of ", bytes, " bytes could not be mapped");
      data = static_cast<C*>(p);
      span = host_span(data, need / sizeof(C), false);
      std::memset(static_cast<void*>(data), 0, bytes);
#endif
    }
    (void)page;
    (void)what;
  }
  // The bytes of it held now (mincore; on the GPU, all of it).
  std::size_t resident(std::vector<unsigned char>& in) const {
    if constexpr (on_gpu) return bytes;
    return resident_bytes(span, in);
  }
  // Left alive for whatever may still write into it (NCCL or MPI); on the host the mapping stays.
  void leak() noexcept {
#if REMAT_HAS_CUDA
    if constexpr (on_gpu)
      if (data) (void)new device_granules(std::move(device));
#endif
    data = nullptr;
  }
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
