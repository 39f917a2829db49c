// The binomial checkpointing schedule of Griewank and Walther ("revolve") that
// Revolve<C, Repeat<N, B>> (policy/revolve.hpp) runs, computed at compile time: to run the
// backward of N blocks of a chain with at most C block inputs kept at once, it recomputes the
// fewest block forwards possible.
//
// cost(l, s) is the fewest block forwards that advance the chain while reversing l blocks from a
// kept input with s slots (that input's slot included). With s = 1 it is l(l-1)/2; otherwise, with
// r the smallest integer such that binomial(s + r, s) >= l, it is r*l - binomial(s + r, s + 1)
// (Griewank 1992). The recursion behind it splits the l blocks at m: advance m blocks, keep that
// input, reverse the l - m blocks to its right with one slot fewer, then the m to its left.
//
// Every block is run once more with its activations kept (just before its backward), so a chain
// of N blocks runs N + cost(N, C) block forwards per training step, and cost(N, C) of them again.
#pragma once

#include "../config.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace revolve {

// binomial(n, k), saturating at `cap` (the costs only ever compare it with a block count).
constexpr std::uint64_t binomial(std::uint64_t n, std::uint64_t k, std::uint64_t cap) {
  if (k > n) return 0;
  if (k > n - k) k = n - k;
  std::uint64_t b = 1;
  for (std::uint64_t i = 1; i <= k; ++i) {
    b = b * (n - k + i) / i;  // exact: a product of i consecutive integers is divisible by i!
    if (b > cap) return cap + 1;
  }
  return b;
}

// (See the top of this header.)
constexpr std::uint64_t cost(std::uint64_t l, std::uint64_t s) {
  if (l <= 1) return 0;
  if (s <= 1) return l * (l - 1) / 2;
  std::uint64_t r = 1;
  while (binomial(s + r, s, l) < l) ++r;
  return r * l - binomial(s + r, s + 1, r * l);
}

// The first split m in [1, l) that reaches cost(l, s).
constexpr std::uint64_t split(std::uint64_t l, std::uint64_t s) {
  std::uint64_t const best = cost(l, s);
  for (std::uint64_t m = 1; m < l; ++m)
    if (m + cost(l - m, s - 1) + cost(m, s) == best) return m;
  return 1;  // not reached: some split attains the optimum
}

// One step of the schedule. `current` is the activation being carried along the chain.
enum class op : std::uint8_t {
  store,    // keep `current` (and the RNG offset it was made at) in a new slot
  advance,  // run blocks [first, last) without keeping anything
  taped,    // run block `first`, keeping what its backward needs
  reverse,  // the backward of block `first`
  restore,  // `current` = the input in the newest slot
  drop,     // free the newest slot
};

// One step of the schedule (see op).
struct action {
  op what;                     // what it does
  std::uint32_t first = 0;     // the first block it concerns
  std::uint32_t last = 0;      // one past the last (advance and taped runs)
  constexpr bool operator==(action const&) const = default;  // the same step
};

namespace detail {

constexpr void reverse_range(std::vector<action>& out, std::uint32_t start, std::uint32_t l, std::uint32_t s) {
  // On entry `current` is the input of block `start`, kept in the newest slot.
  if (l == 1) {
    out.push_back({op::taped, start, start + 1});
    out.push_back({op::reverse, start, start + 1});
  } else if (s == 1) {
    for (std::uint32_t i = l; i-- > 0;) {
      if (i != l - 1) out.push_back({op::restore});
      if (i > 0) out.push_back({op::advance, start, start + i});
      out.push_back({op::taped, start + i, start + i + 1});
      out.push_back({op::reverse, start + i, start + i + 1});
    }
  } else {
    auto const m = std::uint32_t(split(l, s));
    out.push_back({op::advance, start, start + m});
    out.push_back({op::store});
    reverse_range(out, start + m, l - m, s - 1);
    out.push_back({op::drop});
    out.push_back({op::restore});
    reverse_range(out, start, m, s);
  }
}

}  // namespace detail

// The whole schedule for N blocks and C slots, as a list built at compile time.
constexpr std::vector<action> schedule_list(std::uint32_t n, std::uint32_t c) {
  std::vector<action> out;
  out.push_back({op::store});
  detail::reverse_range(out, 0, n, c);
  out.push_back({op::drop});
  return out;
}

// The number of actions of the schedule for N blocks and C slots.
template <std::size_t N, std::size_t C>
inline constexpr std::size_t schedule_length = schedule_list(N, C).size();

// The schedule for N blocks and C slots, as a constant array.
template <std::size_t N, std::size_t C>
inline constexpr std::array<action, schedule_length<N, C>> schedule = [] {
  std::array<action, schedule_length<N, C>> a{};
  auto const l = schedule_list(N, C);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = l[i];
  return a;
}();

// Where the forward pass ends: the first reverse (the last block is run keeping, then the rest of
// the model runs and comes back with the gradient).
template <std::size_t N, std::size_t C>
inline constexpr std::size_t forward_end = [] {
  for (std::size_t i = 0; i < schedule<N, C>.size(); ++i)
    if (schedule<N, C>[i].what == op::reverse) return i;
  return schedule<N, C>.size();
}();

// Block forwards the backward runs again, counted in the schedule itself.
template <std::size_t N, std::size_t C>
inline constexpr std::uint64_t recomputed_forwards = [] {
  std::uint64_t n = 0;
  for (std::size_t i = forward_end<N, C>; i < schedule<N, C>.size(); ++i) {
    auto const& a = schedule<N, C>[i];
    if (a.what == op::advance || a.what == op::taped) n += a.last - a.first;
  }
  return n;
}();

// The most slots in use at once.
template <std::size_t N, std::size_t C>
inline constexpr std::size_t slots_used = [] {
  std::size_t n = 0, most = 0;
  for (auto const& a : schedule<N, C>) {
    if (a.what == op::store) most = ++n > most ? n : most;
    if (a.what == op::drop) --n;
  }
  return most;
}();

}  // namespace revolve
}  // namespace REMAT_NAMESPACE
