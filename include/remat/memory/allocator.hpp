// The caching allocator: one per device, every byte tagged with what it holds (parameters,
// gradients, optimizer state, activations, workspace, or one of the program's own tags:
// memory/tags.hpp). It counts bytes in use, the peak and the
// bytes reserved from the system, per tag and in total; the activation plan is checked against it.
//
// Rounding: every request is rounded up to a multiple of `granularity` (256) bytes, and all
// counts are of rounded bytes. Freed blocks are cached per tag and per rounded size and reused
// for the next request of the same tag and size, so a training loop stops calling the system
// after its first step.
//
// Arenas: a planned training step reserves one block (reserve_arena) and lays its activations and
// workspace out in it at offsets its plan computed (plan/arena.hpp); allocate_at serves a block at
// an offset, counted in use like any other, unless a live block of the arena overlaps it (then the
// caller allocates as usual). An arena counts as reserved activations, and apart in stats().arena.
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "system.hpp"
#include "tags.hpp"
#include "trace.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace memory {

// The caching allocator of one device (see the top of this header): tagged blocks, cached per tag
// and size, with counts, a limit, arenas for planned steps and fault injection for tests.
// Thread-safe: every call takes its lock.
template <class Device>
class caching_allocator {
 public:
  static constexpr std::size_t granularity = 256;  // every request is rounded up to a multiple

  // What a request of `bytes` is counted as (and takes).
  static constexpr std::size_t rounded(std::size_t bytes) {
    return (bytes + granularity - 1) / granularity * granularity;
  }

  // An allocator that throws out_of_memory rather than reserve more than `limit` bytes in all.
  explicit caching_allocator(std::size_t limit = unlimited) {
    stats_.limit = limit;
    spare_.reserve(spare_nodes);
  }
  caching_allocator(caching_allocator const&) = delete;
  caching_allocator& operator=(caching_allocator const&) = delete;
  // Returns cached blocks to the system. Blocks still in use belong to their owners' lifetimes.
  ~caching_allocator() {
    release_cached();
    for (auto& [p, a] : arenas_) system<Device>::deallocate(p);
  }

  // Memory for `bytes` bytes holding `t`. Throws argument_error for zero bytes and
  // out_of_memory (with the summary) past the limit or when the system has none left.
  void* allocate(std::size_t bytes, tag t) {
    if (bytes == 0)
      detail::raise<argument_error>("allocation of ", name(t), ": expected a positive number of bytes, found 0");
    if (bytes > std::numeric_limits<std::size_t>::max() - granularity)
      detail::raise<out_of_memory>("allocation of ", bytes, " bytes of ", name(t), " on ", Device::name,
                                   " cannot be represented\n", summary());
    std::size_t const size = rounded(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    if (injected_hit()) fail(bytes, size, t, "a failure injected by fail_request");
    if (next_.base && next_.t == t && next_.bytes == size) {
      planned_slot const slot = std::exchange(next_, planned_slot{});
      if (void* q = allocate_at_locked(slot.base, slot.offset, size, t)) return q;
    }
    auto& bin = cache_[index(t)][size];
    void* p = nullptr;
    if (!bin.empty()) {
      p = bin.back();
      bin.pop_back();
      ++stats_.cache_hits;
    } else {
      if (stats_.total.reserved + size > stats_.limit) release_cached_locked();
      if (stats_.total.reserved + size > stats_.limit) fail(bytes, size, t, "the limit");
      p = system<Device>::allocate(size);
      if (!p) {
        release_cached_locked();
        p = system<Device>::allocate(size);
      }
      if (!p) fail(bytes, size, t, "the system's memory");
      ++stats_.system_allocations;
      add(stats_.by_tag[index(t)].reserved, stats_.total.reserved, size);
    }
    remember(p, block{size, t});
    count_in(p, size, t);
    return p;
  }

  // Reserves `bytes` from the system as an arena: counted as reserved activations (and in
  // stats().arena), in use only as allocate_at serves it. nullptr when it does not fit under the
  // limit (after giving back what is cached) or the system has none.
  void* reserve_arena(std::size_t bytes) {
    if (bytes == 0 || bytes > std::numeric_limits<std::size_t>::max() - granularity) return nullptr;
    std::size_t const size = rounded(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    if (injected_hit()) return nullptr;
    if (stats_.total.reserved + size > stats_.limit) release_cached_locked();
    if (stats_.total.reserved + size > stats_.limit) return nullptr;
    void* p = system<Device>::allocate(size);
    if (!p) {
      release_cached_locked();
      p = system<Device>::allocate(size);
    }
    if (!p) return nullptr;
    arenas_.emplace(p, arena_record{size});
    ++stats_.system_allocations;
    add(stats_.by_tag[index(tag::activations)].reserved, stats_.total.reserved, size);
    stats_.arena += size;
    return p;
  }

  // Gives an arena back to the system: now, or when the last block served from it is freed.
  void release_arena(void* base) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = arenas_.find(base);
    if (it == arenas_.end()) return;
    it->second.doomed = true;
    if (it->second.live.empty()) drop_arena(it);
  }

  // `bytes` of tag t at `offset` in the arena at `base`, counted in use as allocate counts; nullptr
  // when the range leaves the arena or a live block served from it overlaps the range.
  void* allocate_at(void* base, std::size_t offset, std::size_t bytes, tag t) {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocate_at_locked(base, offset, rounded(bytes), t);
  }

  // The next allocate() of tag t and of `bytes` (rounded) is served by allocate_at(base, offset)
  // (what a loss allocates inside a planned step); unplan() forgets it if nothing came.
  void plan_next(void* base, std::size_t offset, std::size_t bytes, tag t) {
    std::lock_guard<std::mutex> lock(mutex_);
    next_ = {base, offset, rounded(bytes), t};
  }
  // Forgets a plan_next that no allocate used.
  void unplan() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    next_ = {};
  }

  // Returns a block to the cache of its tag. Pointers this allocator did not hand out are ignored.
  void deallocate(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    block const b = it->second;
    forget(it);
    stats_.by_tag[index(b.t)].in_use -= b.bytes;
    stats_.total.in_use -= b.bytes;
    if (timeline_) note(p, -std::int64_t(b.bytes), b.t);
    if (b.arena) {
      auto a = arenas_.find(b.arena);
      auto& live = a->second.live;
      for (std::size_t i = 0; i < live.size(); ++i)
        if (live[i].first == b.offset) {
          live[i] = live.back();
          live.pop_back();
          break;
        }
      if (a->second.doomed && live.empty()) drop_arena(a);
      return;
    }
    try {
      cache_[index(b.t)][b.bytes].push_back(p);
    } catch (...) {  // no room to remember it: give it back instead
      system<Device>::deallocate(p);
      stats_.by_tag[index(b.t)].reserved -= b.bytes;
      stats_.total.reserved -= b.bytes;
    }
  }

  // Every count now (a copy).
  statistics stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  // One tag's counts now.
  usage stats(tag t) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.by_tag[index(t)];
  }

  // Starts a new peak measurement from what is in use now.
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& u : stats_.by_tag) u.peak = u.in_use;
    stats_.total.peak = stats_.total.in_use;
  }

  // Measures one tag's peak over a stretch of work, above what was in use when the window opened
  // (so tensors the caller held before do not count), apart from reset_peak's measurement; several
  // may be open at once. model::accumulate opens one over each training pass
  // (model::last_pass().activation_peak). Work of other threads on this allocator counts too.
  std::size_t open_peak_window(tag t) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t const in_use = stats_.by_tag[index(t)].in_use;
    windows_.push_back({++last_window_, t, in_use, in_use});
    return last_window_;
  }
  // Closes a window: the largest in-use value of its tag while it was open, less the value when it
  // opened (0 for a window that is not open).
  std::size_t close_peak_window(std::size_t id) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < windows_.size(); ++i)
      if (windows_[i].id == id) {
        std::size_t const rise = windows_[i].peak - windows_[i].base;
        windows_.erase(windows_.begin() + std::ptrdiff_t(i));
        return rise;
      }
    return 0;
  }

  // Gives every cached (free) block back to the system.
  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

  // Fault injection, for testing what code above the allocator does when memory runs out: the
  // n-th request from now (1: the next) fails as if the system had no memory left, whether the
  // cache could have served it or not: allocate throws out_of_memory (naming the layer and phase,
  // as a real failure does) and reserve_arena returns nullptr. Requests are allocate and
  // reserve_arena calls, counted in stats().requests. Fails once; fail_request(0) disarms.
  void fail_request(std::size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_at_ = n ? stats_.requests + n : 0;
  }

  // Limit on reserved bytes (host: any value; GPU: at most what the device has).
  void set_limit(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.limit = bytes;
  }
  // The limit on reserved bytes (set_limit's, or the constructor's).
  std::size_t limit() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.limit;
  }

  // Names one of the program's tags (user1 to user3) in summary() and in out_of_memory's messages
  // ("solver", "replay buffer"); argument_error for remat's own tags.
  void name_tag(tag t, std::string label) {
    if (!is_user(t))
      detail::raise<argument_error>("caching_allocator::name_tag: expected a user tag (user1 to user3), found ",
                                    name(t), ", which is remat's");
    std::lock_guard<std::mutex> lock(mutex_);
    names_[index(t)] = std::move(label);
  }
  // A tag's name here: name_tag's for a user tag so named, else memory::name(t).
  std::string tag_name(tag t) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return label(t);
  }

  // Every allocation and free from now on is reported to `t` (which records them while it is
  // recording); detach() stops it. The timeline must outlive the attachment.
  void attach(timeline& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline_ = &t;
  }
  // Stops reporting to the timeline attached.
  void detach() {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline_ = nullptr;
  }

  // A table of in use / peak / reserved per tag and in total.
  std::string summary() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return summary_locked();
  }

 private:
  struct block {
    std::size_t bytes;
    tag t;
    void* arena = nullptr;  // the arena it was served from, at `offset`
    std::size_t offset = 0;
  };
  struct arena_record {
    std::size_t bytes;
    std::vector<std::pair<std::size_t, std::size_t>> live{};  // (offset, end) of blocks in use
    bool doomed = false;
  };
  struct planned_slot {
    void* base = nullptr;
    std::size_t offset = 0, bytes = 0;
    tag t = tag::activations;
  };

  void count_in(void* p, std::size_t size, tag t) {
    usage& u = stats_.by_tag[index(t)];
    u.in_use += size;
    stats_.total.in_use += size;
    if (u.in_use > u.peak) u.peak = u.in_use;
    if (stats_.total.in_use > stats_.total.peak) stats_.total.peak = stats_.total.in_use;
    for (peak_window& w : windows_)
      if (w.t == t && u.in_use > w.peak) w.peak = u.in_use;
    if (timeline_) note(p, std::int64_t(size), t);
  }

  void* allocate_at_locked(void* base, std::size_t offset, std::size_t size, tag t) {
    auto a = arenas_.find(base);
    if (a == arenas_.end() || a->second.doomed || offset > a->second.bytes || size > a->second.bytes - offset)
      return nullptr;
    auto& live = a->second.live;
    for (auto const& [begin, end] : live)
      if (begin < offset + size && offset < end) return nullptr;
    void* p = static_cast<char*>(base) + offset;
    if (live_.count(p)) return nullptr;
    live.reserve(live.size() + 1);
    remember(p, block{size, t, base, offset});
    live.push_back({offset, offset + size});
    ++stats_.planned;
    count_in(p, size, t);
    return p;
  }

  // Records p as in use, in the map node of a block freed earlier when one is kept: a loop of
  // passes that frees what it allocates then asks the heap for nothing.
  void remember(void* p, block b) {
    if (spare_.empty()) {
      live_.emplace(p, b);
      return;
    }
    auto node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = p;
    node.mapped() = b;
    live_.insert(std::move(node));
  }
  // Forgets a block in use, keeping its node for the next (up to spare_nodes of them).
  void forget(typename std::unordered_map<void*, block>::iterator it) noexcept {
    if (spare_.size() < spare_.capacity())
      spare_.push_back(live_.extract(it));  // (within the capacity reserved: no allocation, no throw)
    else
      live_.erase(it);
  }

  void drop_arena(typename std::unordered_map<void*, arena_record>::iterator it) noexcept {
    system<Device>::deallocate(it->first);
    stats_.by_tag[index(tag::activations)].reserved -= it->second.bytes;
    stats_.total.reserved -= it->second.bytes;
    stats_.arena -= it->second.bytes;
    arenas_.erase(it);
  }

  static constexpr std::size_t index(tag t) { return static_cast<std::size_t>(t); }
  std::string label(tag t) const { return names_[index(t)].empty() ? std::string(name(t)) : names_[index(t)]; }

  // Counts a request; true when it is the one fail_request armed (which it disarms).
  bool injected_hit() noexcept {
    if (++stats_.requests != fail_at_) return false;
    fail_at_ = 0;
    return true;
  }

  void note(void const* p, std::int64_t bytes, tag t) noexcept {
    std::array<std::size_t, tag_count> by_tag{};
    for (std::size_t i = 0; i < tag_count; ++i) by_tag[i] = stats_.by_tag[i].in_use;
    try {
      timeline_->on_allocation(p, bytes, std::uint8_t(t), stats_.total.in_use, by_tag);
    } catch (...) {  // no room to record: the timeline misses an event, the program goes on
    }
  }

  static void add(std::size_t& a, std::size_t& b, std::size_t n) {
    a += n;
    b += n;
  }

  void release_cached_locked() noexcept {
    for (std::size_t i = 0; i < tag_count; ++i) {
      for (auto& [size, bin] : cache_[i]) {
        for (void* p : bin) system<Device>::deallocate(p);
        stats_.by_tag[i].reserved -= size * bin.size();
        stats_.total.reserved -= size * bin.size();
        bin.clear();
      }
    }
  }

  [[noreturn]] void fail(std::size_t bytes, std::size_t size, tag t, char const* what) const {
    std::string const layer = current_layer();
    phase const when = current_phase();
    detail::raise<out_of_memory>("out of memory on ", Device::name, ": expected room for ", format_bytes(size),
                                 " (", bytes, " bytes requested) of ", label(t), ", found ",
                                 format_bytes(stats_.total.reserved), " already reserved against ", what,
                                 " (limit ", format_bytes(stats_.limit), ")",
                                 when == phase::none ? std::string()
                                                     : std::string(", in ") + (layer.empty() ? "the step" : layer) +
                                                           " (" + name(when) + ")",
                                 "\n", summary_locked(), system<Device>::describe());
  }

  std::string summary_locked() const {
    std::string out;
    char line[160];
    std::snprintf(line, sizeof line, "remat memory on %s (limit %s)\n", Device::name,
                  format_bytes(stats_.limit).c_str());
    out += line;
    auto row = [&](std::string const& what, usage const& u) {
      std::snprintf(line, sizeof line, "  %-16s %12s %12s %12s\n", what.c_str(), format_bytes(u.in_use).c_str(),
                    format_bytes(u.peak).c_str(), format_bytes(u.reserved).c_str());
      out += line;
    };
    std::snprintf(line, sizeof line, "  %-16s %12s %12s %12s\n", "", "in use", "peak", "reserved");
    out += line;
    for (tag t : all_tags)  // (a user tag never used has no row)
      if (!is_user(t) || stats_.by_tag[index(t)].peak || stats_.by_tag[index(t)].reserved)
        row(label(t), stats_.by_tag[index(t)]);
    row("total", stats_.total);
    std::snprintf(line, sizeof line, "  %zu system allocations, %zu served from the cache\n",
                  stats_.system_allocations, stats_.cache_hits);
    out += line;
    if (stats_.arena) {
      std::snprintf(line, sizeof line, "  %s reserved as planned arenas (in activations), %zu served from them\n",
                    format_bytes(stats_.arena).c_str(), stats_.planned);
      out += line;
    }
    return out;
  }

  struct peak_window {
    std::size_t id;
    tag t;
    std::size_t base, peak;
  };

  mutable std::mutex mutex_;
  std::vector<peak_window> windows_;
  std::size_t last_window_ = 0;
  timeline* timeline_ = nullptr;
  statistics stats_{};
  std::unordered_map<void*, block> live_;
  static constexpr std::size_t spare_nodes = 256;  // freed blocks' map nodes kept (see remember)
  std::vector<typename std::unordered_map<void*, block>::node_type> spare_;
  std::unordered_map<void*, arena_record> arenas_;
  planned_slot next_{};
  std::size_t fail_at_ = 0;  // the value of stats_.requests whose request fails (0: none)
  std::array<std::unordered_map<std::size_t, std::vector<void*>>, tag_count> cache_;
  std::array<std::string, tag_count> names_{};  // name_tag's (empty: memory::name's)
};

// The allocator that tensors use unless given another: one per device, for the whole program.
template <class Device>
caching_allocator<Device>& default_allocator() {
  static caching_allocator<Device> instance;
  return instance;
}

namespace detail {
template <class Device>
caching_allocator<Device>*& scratch_slot() {
  thread_local caching_allocator<Device>* a = nullptr;  // null: the default allocator
  return a;
}
}  // namespace detail

// The allocator this thread's scratch_buffer<Device> takes from: the default allocator, or the
// one a scratch_scope names.
template <class Device>
caching_allocator<Device>& scratch_allocator() {
  caching_allocator<Device>* a = detail::scratch_slot<Device>();
  return a ? *a : default_allocator<Device>();
}

// While it lives, this thread's kernel scratch comes from `a` (which keeps the blocks when they
// are given back): what a CUDA graph's capture needs, so that the addresses it records stay its
// own after the capture ends (runtime/inference_graph.hpp). Scopes nest.
template <class Device>
class scratch_scope {
 public:
  // This thread's scratch from `a` until the end of the scope.
  explicit scratch_scope(caching_allocator<Device>& a) : previous_(detail::scratch_slot<Device>()) {
    detail::scratch_slot<Device>() = &a;
  }
  // The allocator before it serves the thread's scratch again.
  ~scratch_scope() { detail::scratch_slot<Device>() = previous_; }
  scratch_scope(scratch_scope const&) = delete;
  scratch_scope& operator=(scratch_scope const&) = delete;

 private:
  caching_allocator<Device>* previous_;
};

// The size a call site asks scratch_buffer for: the most it has asked for so far, or `need` when
// more. The allocator keeps freed blocks by their exact (rounded) size, so a site whose need
// varies with the shape (a product's copies with its batch, oneDNN's scratchpad with its shape and
// the processor's kernels) reuses one cached block instead of one per size, and a steady loop asks
// the system for nothing once it has seen its largest need. With `pow2`, sizes are also rounded
// up to a power of two from `floor`: for needs that are not largest at the largest batch (on an
// AMX Xeon oneDNN sizes a small batch's scratchpad above a large one's), a little headroom.
class growing_size {
 public:
  // A site that asks for at least `floor` bytes, in powers of two when `pow2`.
  constexpr explicit growing_size(std::size_t floor = 0, bool pow2 = false) : most_(floor), pow2_(pow2) {}
  // The bytes to ask for when this call needs `need`: the most asked so far, or more.
  std::size_t operator()(std::size_t need) {
    if (pow2_ && need > 1) need = std::bit_ceil(need);
    std::size_t seen = most_.load(std::memory_order_relaxed);
    while (seen < need && !most_.compare_exchange_weak(seen, need, std::memory_order_relaxed)) {
    }
    return std::max(seen, need);
  }

 private:
  std::atomic<std::size_t> most_;
  bool pow2_;
};

// Temporary memory for one kernel (a reduction's partial results, a converting product's copies):
// workspace in scratch_allocator<Device>() (the device's default allocator unless a scratch_scope
// says otherwise), given back at the end of the scope. On the GPU the block is reused by later
// work on the same stream only, which runs after this kernel.
template <class Device>
class scratch_buffer {
 public:
  // At least one byte, tagged workspace.
  explicit scratch_buffer(std::size_t bytes)
      : a_(&scratch_allocator<Device>()), p_(a_->allocate(bytes ? bytes : 1, tag::workspace)) {}
  // Gives the block back to the allocator it came from.
  ~scratch_buffer() { a_->deallocate(p_); }
  scratch_buffer(scratch_buffer const&) = delete;
  scratch_buffer& operator=(scratch_buffer const&) = delete;
  void* get() const { return p_; }  // the memory
  // The memory as T* (aligned for any T: blocks start on 64 bytes on the host, 256 on the GPU).
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  caching_allocator<Device>* a_;
  void* p_;
};

}  // namespace memory
}  // namespace REMAT_NAMESPACE
