// What layers share besides the contract (layers/layer.hpp): the adapting width, the parameter
// description used for names and files, deterministic initialisation from the seed, and the layout
// of per-row statistics.
#pragma once

#include "../kernels/detail/thrust.hpp"
#include "../kernels/random.hpp"
#include "../numeric/compute.hpp"
#include "../numeric/philox.hpp"
#include "../tensor/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {

// A width that adapts to its neighbour (point-wise layers, dropout).
inline constexpr std::size_t any_width = dynamic_width;

// Columns of T that hold n statistics per row (a norm's mean and 1/std) in T's compute type:
// statistics stay fp32 when activations are 16-bit.
template <class T>
constexpr std::size_t stat_columns(std::size_t n) {
  return (n * sizeof(compute_type_t<T>) + sizeof(T) - 1) / sizeof(T);
}
// The statistics stored in a tensor of T (stat_columns), as T's compute type.
template <class T>
compute_type_t<T>* stat_data(T* p) {
  return reinterpret_cast<compute_type_t<T>*>(p);
}

// The number of elements of a shape: the product of its extents (1 for a scalar's {}).
inline std::size_t shape_elements(std::vector<std::size_t> const& shape) {
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

// The shape of an image a layer reads or writes (NCHW rows: channels x height x width values);
// all zero where a layer declares none.
struct image_shape {
  std::size_t channels = 0;  // planes
  std::size_t height = 0;    // rows of a plane
  std::size_t width = 0;     // values per row of a plane
  constexpr std::size_t size() const { return channels * height * width; }  // values per image
  constexpr bool known() const { return channels != 0; }  // whether the layer declares one
  constexpr bool operator==(image_shape const&) const = default;  // the same shape
};

// One parameter tensor of a layer: its name within the layer, offset and shape.
struct param_desc {
  char const* name;                // PyTorch's ("weight", "bias", ...)
  std::size_t offset;              // its first element among the layer's parameters
  std::vector<std::size_t> shape;  // PyTorch's order
  std::size_t size() const { return shape_elements(shape); }  // its elements
};

namespace detail {
// What a layer without parameters declares (the point-wise layers, Dropout, the attention cores,
// the pooling layers, Upsample2d): no parameters, none named, nothing to initialise.
struct no_parameters {
  static constexpr std::size_t param_count = 0;
  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}
};
}  // namespace detail

namespace init {

// Parameter k of a model is initialised from philox(seed, stream, k): a pure function of the seed
// and the parameter's position, whatever the order of initialisation.
inline constexpr std::uint64_t init_stream = 0x1417'0000'0000'0000ull;

namespace detail {
template <class T>
struct uniform_init_fn {
  double bound;
  T operator()(std::size_t, float u) const { return T((2.0 * double(u) - 1.0) * bound); }
};
}  // namespace detail

// p[0, n) from U(-bound, bound): element i from the model's parameter global_offset + i.
// (Each element is a pure function of its position: split across the host's threads, the same
// values; each Philox block made once for its four parameters.)
template <class T>
void uniform(T* p, std::size_t n, std::size_t global_offset, std::uint64_t seed, double bound) {
  kernels::transform_uniform(host{}, n, p, {seed, init_stream, global_offset}, detail::uniform_init_fn<T>{bound});
}

template <class T>
void normal(T* p, std::size_t n, std::size_t global_offset, std::uint64_t seed, double stddev) {
  constexpr double two_pi = 6.283185307179586476925;
  kernels::detail::host_split(n, n, [&](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      std::uint64_t const k = 2 * (global_offset + i);
      double const u1 = (double(philox::uniform(seed, init_stream + 1, k)) + 0x1p-25);  // (0, 1]
      double const u2 = double(philox::uniform(seed, init_stream + 1, k + 1));
      p[i] = T(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
    }
  });
}

// p[0, n) = v.
template <class T>
void fill(T* p, std::size_t n, double v) {
  for (std::size_t i = 0; i < n; ++i) p[i] = T(v);
}

}  // namespace init
}  // namespace REMAT_NAMESPACE
