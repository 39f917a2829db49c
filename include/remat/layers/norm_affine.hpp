// What the normalisation layers share (LayerNorm and RMSNorm in layers/norm.hpp, BatchNorm2d and
// GroupNorm in layers/image.hpp): a weight of N values (one per feature or channel), and a bias
// of N after it unless the layer has none, initialised as PyTorch does (weight 1, bias 0) and named
// as its state dict names them; and the epsilon added to the variance (PyTorch's default).
#pragma once

#include "layer.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace detail {

template <std::size_t N, bool Bias>
struct norm_affine {
  // weight (and bias), N each.
  static constexpr std::size_t param_count = Bias ? 2 * N : N;
  // Added to the variance, or the mean square (PyTorch's default).
  static constexpr double eps = 1e-5;

  // "weight" (and "bias"), PyTorch's names and shapes.
  static std::vector<param_desc> params() {
    if constexpr (Bias)
      return {{"weight", 0, {N}}, {"bias", N, {N}}};
    else
      return {{"weight", 0, {N}}};
  }
  // weight 1, bias 0 (PyTorch's).
  template <class T>
  static void init(T* p, std::size_t, std::uint64_t) {
    init::fill(p, N, 1.0);
    if constexpr (Bias) init::fill(p + N, N, 0.0);
  }
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
