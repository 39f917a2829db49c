// What the caching allocator counts (memory/allocator.hpp): the tags a block of memory can hold,
// remat's and the program's own, and the counts per tag (in use, peak, reserved) that
// caching_allocator::stats() returns.
#pragma once

#include "../config.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

namespace REMAT_NAMESPACE {
namespace memory {

// What a block of memory holds; every allocation names one, and the allocator counts each apart.
// The first five are remat's; user1 to user3 are the program's own (a solver's arrays, a replay
// buffer: tensor<double>(rows, cols, memory::tag::user1, alloc)), so that a program that trains
// beside other work can plan and check all of its memory in one allocator. remat itself never
// allocates under a user tag; caching_allocator::name_tag gives one its name in tables.
enum class tag : std::uint8_t { parameters, gradients, optimizer_state, activations, workspace, user1, user2, user3 };
inline constexpr std::size_t tag_count = 8;  // the number of tags
// Every tag, in the order of tag's values (and of statistics::by_tag).
inline constexpr std::array<tag, tag_count> all_tags{tag::parameters, tag::gradients, tag::optimizer_state,
                                                     tag::activations, tag::workspace, tag::user1,
                                                     tag::user2,      tag::user3};
// Whether t is one of the program's tags (user1 to user3) rather than remat's.
constexpr bool is_user(tag t) { return t == tag::user1 || t == tag::user2 || t == tag::user3; }

// A tag's name in tables and messages ("optimizer state"; a user tag's default, "user 1").
constexpr char const* name(tag t) {
  switch (t) {
    case tag::parameters: return "parameters";
    case tag::gradients: return "gradients";
    case tag::optimizer_state: return "optimizer state";
    case tag::activations: return "activations";
    case tag::workspace: return "workspace";
    case tag::user1: return "user 1";
    case tag::user2: return "user 2";
    case tag::user3: return "user 3";
  }
  return "?";
}

// A limit that is no limit (the default of caching_allocator).
inline constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

// Bytes in use, the largest in-use value since the last reset_peak, and bytes held from the
// system (in use plus cached for reuse).
struct usage {
  std::size_t in_use = 0;    // handed out and not given back
  std::size_t peak = 0;      // the most in use since the last reset_peak
  std::size_t reserved = 0;  // held from the system: in use plus cached
};

// An allocator's counts at one moment (all bytes rounded to caching_allocator::granularity).
struct statistics {
  std::array<usage, tag_count> by_tag{};  // per tag, in the order of all_tags
  usage total{};                          // all tags together (peak: of the sum)
  std::size_t limit = unlimited;          // reserved bytes allowed in total
  std::size_t system_allocations = 0;  // requests that went to the system
  std::size_t cache_hits = 0;          // requests served from the cache
  std::size_t arena = 0;               // bytes reserved as arenas (part of activations' reserved)
  std::size_t planned = 0;             // requests served from an arena
  std::size_t requests = 0;            // allocate and reserve_arena calls (what fail_request counts)
  usage const& operator[](tag t) const { return by_tag[static_cast<std::size_t>(t)]; }  // by_tag's, by tag
};

// "1.50 MiB"-style, exact bytes below 1 KiB.
inline std::string format_bytes(std::size_t bytes) {
  if (bytes == unlimited) return "unlimited";
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
    return buf;
  }
  static constexpr char const* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace memory
}  // namespace REMAT_NAMESPACE
