// Passes that draw random numbers: out[i] = f(i, u_i), u_i the uniform number of element
// offset + i of a Philox stream (philox::uniform's, bit for bit). philox::uniform makes a whole
// Philox block (ten rounds, four words) for the one word an element takes; these passes make each
// block once for the four consecutive elements it serves: on the host 32 blocks at a time in
// vector lanes, into a buffer a chunk of elements then reads, on the GPU a thread a block.
#pragma once

#include "../device.hpp"
#include "../numeric/philox.hpp"
#include "detail/thrust.hpp"
#include "profile.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace REMAT_NAMESPACE {
namespace kernels {

// Where a pass's uniform numbers come from: element i takes element offset + i of the stream.
struct uniform_stream {
  std::uint64_t seed = 0;    // the Philox key
  std::uint64_t stream = 0;  // the stream (the counter's upper half)
  std::uint64_t offset = 0;  // the stream's element for the pass's element 0
};

namespace detail {

// Blocks made at once, in lanes: the state's four words each in 64-bit lanes (the products 32 x 32
// -> 64 bits in place, no shuffles between halves), 32 blocks: four AVX-512 registers a word. (On
// a Zen 4: 1.65 ns a block on one core, against 3.3 in 16 lanes of 32 bits and about 10 one block
// at a time.)
inline constexpr std::size_t philox_lanes = 32;
// Elements a host chunk takes between making its blocks and reading them (a 4 KiB buffer of words).
inline constexpr std::size_t uniform_chunk = 1024;

// The words of blocks q0 .. q0 + nb - 1 of s's stream: block q0 + b's word j at words[4 b + j].
// philox::generate's rounds, a lane a block. (A template so that its clones live in the program
// as the other host kernels' do.)
template <class = void>
REMAT_HOST_CLONES void philox_words(uniform_stream s, std::uint64_t q0, std::size_t nb, std::uint32_t* words) {
  constexpr std::size_t L = philox_lanes;
  constexpr std::uint64_t low = 0xffffffffu;  // a lane's low 32 bits: the word it holds
  for (std::size_t b = 0; b < nb; b += L) {
    std::uint64_t c0[L], c1[L], c2[L], c3[L];  // (each lane's upper half zero between rounds)
    for (std::size_t l = 0; l < L; ++l) {
      std::uint64_t const q = q0 + b + l;
      c0[l] = q & low;
      c1[l] = q >> 32;
      c2[l] = s.stream & low;
      c3[l] = s.stream >> 32;
    }
    std::uint64_t k0 = s.seed & low, k1 = s.seed >> 32;
    for (int round = 0; round < 10; ++round) {
      for (std::size_t l = 0; l < L; ++l) {
        std::uint64_t const p0 = std::uint64_t(philox::m0) * c0[l], p1 = std::uint64_t(philox::m1) * c2[l];
        std::uint64_t const n0 = (p1 >> 32) ^ c1[l] ^ k0, n2 = (p0 >> 32) ^ c3[l] ^ k1;
        c0[l] = n0;
        c1[l] = p1 & low;
        c2[l] = n2;
        c3[l] = p0 & low;
      }
      k0 = (k0 + philox::w0) & low;
      k1 = (k1 + philox::w1) & low;
    }
    std::size_t const m = std::min(L, nb - b);
    for (std::size_t l = 0; l < m; ++l) {
      std::uint32_t* const w = words + 4 * (b + l);
      w[0] = std::uint32_t(c0[l]);
      w[1] = std::uint32_t(c1[l]);
      w[2] = std::uint32_t(c2[l]);
      w[3] = std::uint32_t(c3[l]);
    }
  }
}

// out[i] = f(i, the uniform number of words[i - first]) for i in [first, last).
template <class Out, class F>
REMAT_HOST_CLONES void host_transform_words(Out* out, std::size_t first, std::size_t last, std::uint32_t const* words,
                                            F const& f) {
  F const body = f;  // (a local copy: see host_for_each)
  for (std::size_t i = first; i < last; ++i) out[i] = body(i, philox::to_uniform(words[i - first]));
}

// Elements [first, last) of transform_uniform on one host thread, a chunk at a time.
template <class Out, class F>
void host_transform_uniform(Out* out, std::size_t first, std::size_t last, uniform_stream s, F const& f) {
  alignas(64) std::uint32_t words[4 * (uniform_chunk / 4 + philox_lanes)];
  for (std::size_t a = first; a < last; a += uniform_chunk) {
    std::size_t const b = std::min(last, a + uniform_chunk);
    std::uint64_t const q0 = (s.offset + a) / 4, q1 = (s.offset + b - 1) / 4 + 1;
    philox_words(s, q0, std::size_t(q1 - q0), words);
    // (element a is word (offset + a) % 4 of block q0)
    host_transform_words(out, a, b, words + (s.offset + a) % 4, f);
  }
}

}  // namespace detail

// out[i] = f(i, u) for i in [0, n), u the uniform number in [0, 1) of element s.offset + i of
// stream s.stream under key s.seed: philox::uniform(s.seed, s.stream, s.offset + i), bit for bit
// (each element's number depends on its position alone, so neither the threads' split nor the
// chunks change a bit). f may read out[i] before it is written (in place).
template <class Out, class F>
void transform_uniform(host, std::size_t n, Out* out, uniform_stream s, F const& f) {
  if (n == 0) return;
  profile::timed<host> const timing(profile::work::pointwise);
  // (a block's ten rounds for four elements: about the cost of four plain passes an element)
  detail::host_split(n, 4 * n, [&](std::size_t first, std::size_t last) {
    detail::host_transform_uniform(out, first, last, s, f);
  });
}

#if REMAT_HAS_CUDA
namespace detail {

inline constexpr unsigned uniform_threads = 256;

// A thread a Philox block (grid-stride): block q0 + b serves elements 4 (q0 + b) - offset + j,
// j = 0 .. 3, those of them in [0, n).
template <class Out, class F>
__global__ void __launch_bounds__(uniform_threads)
    transform_uniform_kernel(Out* out, std::size_t n, uniform_stream s, std::uint64_t q0, std::size_t nb, F f) {
  for (std::size_t b = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; b < nb;
       b += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t const q = q0 + b;
    philox::block const r = philox::generate(philox::counter(s.stream, q), std::uint32_t(s.seed),
                                             std::uint32_t(s.seed >> 32));
#pragma unroll
    for (unsigned j = 0; j < 4; ++j) {
      std::uint64_t const e = 4 * q + j;  // the stream's element
      if (e >= s.offset && e - s.offset < n) {
        std::size_t const i = std::size_t(e - s.offset);
        out[i] = f(i, philox::to_uniform(r.v[j]));
      }
    }
  }
}

}  // namespace detail

// transform_uniform on the GPU: the same numbers, a thread a Philox block.
template <class Out, class F>
void transform_uniform(cuda, std::size_t n, Out* out, uniform_stream s, F const& f) {
  if (n == 0) return;
  profile::timed<cuda> const timing(profile::work::pointwise);
  std::uint64_t const q0 = s.offset / 4, nb = (s.offset + n - 1) / 4 + 1 - q0;
  std::size_t const grid = std::min<std::size_t>((nb + detail::uniform_threads - 1) / detail::uniform_threads,
                                                 std::size_t(1) << 16);
  detail::transform_uniform_kernel<<<unsigned(grid), detail::uniform_threads, 0, current_cuda_stream()>>>(
      out, n, s, q0, std::size_t(nb), f);
  REMAT_CUDA_CHECK(cudaGetLastError());
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
