// Table lookups by token id: the embedding's gather (a thread per element) and its backward, the
// scatter-add of the output gradient into the rows the ids picked. The scatter-add sums each
// table row's contributions in the order of the batch on both devices, so the GPU's result equals
// the host's bit for bit: the host runs a task per block of columns over every row (the rows'
// columns read contiguously); the GPU sorts the row numbers by id (CUB's stable radix sort), then a
// thread per (id, column) adds its run of rows. On the host every pass goes row by row, each row a
// contiguous loop (a thread per element divided by the width to find its row, which GCC does not
// vectorise: the position table's add took 5 ms of a GPT step of 4096 x 512 that now takes 0.6).
#pragma once

#include "../numeric/compute.hpp"
#include "rows.hpp"

#if REMAT_HAS_CUDA
#include <cub/device/device_radix_sort.cuh>
#endif

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

// out[r, i] = table[ids[r], i] for r < rows, i < w. The ids are checked before (in [0, vocab)).
template <class T, device_tag D>
void gather_rows(D, T const* table, std::int32_t const* ids, std::size_t rows, std::size_t w, T* out) {
  if constexpr (std::is_same_v<D, host>) {
    for_each_index(host{}, rows, rows * w, [=] REMAT_HOST_LAMBDA(std::size_t r) {
      T const* src = table + std::size_t(ids[r]) * w;
      T* dst = out + r * w;
      for (std::size_t i = 0; i < w; ++i) dst[i] = src[i];
    });
  } else {
    for_each_index(D{}, rows * w, rows * w,
                   [=] REMAT_LAMBDA(std::size_t e) { out[e] = table[std::size_t(ids[e / w]) * w + e % w]; });
  }
}

// g[ids[r], i] += dy[r, i] for every r, in the order of r, accumulated in g's compute type.
template <class T, class G>
void scatter_add_rows(host, std::int32_t const* ids, std::size_t rows, std::size_t w, std::size_t,
                      T const* dy, G* g) {
  using V = compute_type_t<G>;
  constexpr std::size_t block = column_block<host>;
  for_each_index(host{}, (w + block - 1) / block, rows * w, [=] REMAT_HOST_LAMBDA(std::size_t b) {
    std::size_t const c0 = b * block, c1 = std::min(w, c0 + block);
    for (std::size_t r = 0; r < rows; ++r) {
      G* const gr = g + std::size_t(ids[r]) * w;
      T const* const dr = dy + r * w;
      for (std::size_t i = c0; i < c1; ++i) gr[i] = from_compute<G>(to_compute<V>(gr[i]) + to_compute<V>(dr[i]));
    }
  });
}

#if REMAT_HAS_CUDA
template <class T, class G>
void scatter_add_rows(cuda, std::int32_t const* ids, std::size_t rows, std::size_t w, std::size_t vocab,
                      T const* dy, G* g) {
  using V = compute_type_t<G>;
  if (rows == 0 || w == 0) return;
  if (rows > std::size_t(INT32_MAX))
    REMAT_NAMESPACE::detail::raise<argument_error>("remat embedding backward: expected at most 2^31 - 1 ids, found ",
                                                   rows);
  int const n = int(rows);
  int const bits = int(std::bit_width(vocab > 1 ? vocab - 1 : std::size_t(1)));  // ids are below vocab
  cudaStream_t const stream = current_cuda_stream();
  // Sorted ids and the row numbers in their order, then CUB's temporary storage.
  std::size_t temp = 0;
  using key = std::uint32_t;  // (the ids are known to be non-negative: sorted as unsigned)
  key const* const in = reinterpret_cast<key const*>(ids);
  REMAT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<key const*>(nullptr),
                                                   static_cast<key*>(nullptr), static_cast<std::uint32_t const*>(nullptr),
                                                   static_cast<std::uint32_t*>(nullptr), n, 0, bits, stream));
  std::size_t const lists = (3 * rows * sizeof(key) + 255) / 256 * 256;
  memory::scratch_buffer<cuda> space(lists + temp);
  auto* const order = space.as<std::uint32_t>();  // row numbers 0..rows-1
  key* const keys = order + rows;                 // ids, sorted
  std::uint32_t* const sorted_rows = keys + rows;  // row numbers in the order of `keys`
  for_each_index(cuda{}, rows, rows, [=] REMAT_LAMBDA(std::size_t r) { order[r] = std::uint32_t(r); });
  REMAT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(space.as<unsigned char>() + lists, temp, in, keys, order,
                                                   sorted_rows, n, 0, bits, stream));
  // A thread per (position in the sorted list, column); the first position of each id's run adds
  // the run's rows, which the stable sort left in batch order.
  for_each_index(cuda{}, rows * w, rows * w, [=] REMAT_LAMBDA(std::size_t e) {
    std::size_t const k = e / w, i = e % w;
    key const id = keys[k];
    if (k > 0 && keys[k - 1] == id) return;
    G& gi = g[std::size_t(id) * w + i];
    V acc = to_compute<V>(gi);
    for (std::size_t j = k; j < rows && keys[j] == id; ++j)
      acc = V(acc + to_compute<V>(dy[std::size_t(sorted_rows[j]) * w + i]));
    gi = from_compute<G>(acc);
  });
}
#endif

// The positional table added to a sequence batch: out[r, i] = x[r, i] + table[r % seq, i].
template <class T, device_tag D>
void add_positions(D, T const* x, T const* table, std::size_t rows, std::size_t seq, std::size_t w, T* out) {
  using V = compute_type_t<T>;
  if constexpr (std::is_same_v<D, host>) {
    for_each_index(host{}, rows, rows * w, [=] REMAT_HOST_LAMBDA(std::size_t r) {
      T const* const xr = x + r * w;
      T const* const tr = table + r % seq * w;
      T* const o = out + r * w;
      for (std::size_t i = 0; i < w; ++i) o[i] = from_compute<T>(to_compute<V>(xr[i]) + to_compute<V>(tr[i]));
    });
  } else {
    for_each_index(D{}, rows * w, rows * w, [=] REMAT_LAMBDA(std::size_t e) {
      out[e] = from_compute<T>(to_compute<V>(x[e]) + to_compute<V>(table[(e / w) % seq * w + e % w]));
    });
  }
}

// Its table's gradient: g[t, i] += sum over sequences b, in order, of dy[b * seq + t, i].
template <class T, class G, device_tag D>
void add_positions_backward(D, T const* dy, std::size_t rows, std::size_t seq, std::size_t w, G* g) {
  using V = compute_type_t<G>;
  std::size_t const batch = rows / seq;
  if constexpr (std::is_same_v<D, host>) {  // a task per block of a position's columns, sequences outside
    constexpr std::size_t block = column_block<host>;
    std::size_t const blocks = (w + block - 1) / block;
    for_each_index(host{}, seq * blocks, rows * w, [=] REMAT_HOST_LAMBDA(std::size_t k) {
      std::size_t const t = k / blocks, c0 = k % blocks * block, n = std::min(w - c0, block);
      G* const gt = g + t * w + c0;
      V acc[block];
      for (std::size_t i = 0; i < n; ++i) acc[i] = to_compute<V>(gt[i]);
      for (std::size_t b = 0; b < batch; ++b) {
        T const* const d = dy + (b * seq + t) * w + c0;
        for (std::size_t i = 0; i < n; ++i) acc[i] = V(acc[i] + to_compute<V>(d[i]));
      }
      for (std::size_t i = 0; i < n; ++i) gt[i] = from_compute<G>(acc[i]);
    });
  } else {
    for_each_index(D{}, seq * w, rows * w, [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const t = e / w, i = e % w;
      V acc = to_compute<V>(g[e]);
      for (std::size_t b = 0; b < batch; ++b) acc = V(acc + to_compute<V>(dy[(b * seq + t) * w + i]));
      g[e] = from_compute<G>(acc);
    });
  }
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
