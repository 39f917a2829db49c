// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so a random number is a pure function of (key, counter). remat's
// dropout masks are functions of (seed, step, element index) and can be replayed exactly by a
// recomputing backward pass, on any device, in any order.
#pragma once

#include "../config.hpp"

#include <cstdint>

namespace REMAT_NAMESPACE {
namespace philox {

// Four 32-bit words: a Philox counter, or the random bits it gives.
struct block {
  std::uint32_t v[4];  // the words
};

// The 64-bit product of a and b, as its high and low words.
REMAT_HOST_DEVICE void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  std::uint64_t const p = std::uint64_t(a) * std::uint64_t(b);
  hi = std::uint32_t(p >> 32);
  lo = std::uint32_t(p);
}

// Philox4x32's multipliers, and its key's increments per round (a Weyl sequence).
inline constexpr std::uint32_t m0 = 0xD2511F53u;  // the multiplier of the counter's word 0
inline constexpr std::uint32_t m1 = 0xCD9E8D57u;  // the multiplier of the counter's word 2
inline constexpr std::uint32_t w0 = 0x9E3779B9u;  // the increment of the key's word 0
inline constexpr std::uint32_t w1 = 0xBB67AE85u;  // the increment of the key's word 1

// Ten rounds of Philox4x32 on counter c with key k.
REMAT_HOST_DEVICE block generate(block c, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(m0, c.v[0], hi0, lo0);
    mulhilo(m1, c.v[2], hi1, lo1);
    c = block{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

// The counter of block q of stream `stream`: elements 4 q .. 4 q + 3 of the stream take its words.
REMAT_HOST_DEVICE block counter(std::uint64_t stream, std::uint64_t q) {
  return block{{std::uint32_t(q), std::uint32_t(q >> 32), std::uint32_t(stream), std::uint32_t(stream >> 32)}};
}

// Word j (0 to 3) of b, chosen by value: indexing b.v by a run-time j keeps b in memory, so a host
// loop over elements does not vectorise (a quarter of the speed) and a GPU thread goes through
// local memory.
REMAT_HOST_DEVICE std::uint32_t word(block const& b, std::uint64_t j) {
  return j == 0 ? b.v[0] : j == 1 ? b.v[1] : j == 2 ? b.v[2] : b.v[3];
}

// A random word as a uniform number in [0, 1): its top 24 bits, so every value is exact in float.
REMAT_HOST_DEVICE float to_uniform(std::uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }

// A uniform number in [0, 1) for element `index` of stream `stream` under `seed`: word index % 4 of
// block index / 4. (A pass over many consecutive elements makes each block once instead:
// kernels::transform_uniform.)
REMAT_HOST_DEVICE float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  block const r = generate(counter(stream, index >> 2), std::uint32_t(seed), std::uint32_t(seed >> 32));
  return to_uniform(word(r, index & 3u));
}

}  // namespace philox
}  // namespace REMAT_NAMESPACE
