// The Gray–Scott surrogate's network (examples/surrogate, examples/online, examples/fortran): a
// residual convolutional network at full resolution on a G x G grid,
//   Conv3x3(2 -> Width) GELU, Blocks x [x + Conv3x3(GELU(BN(Conv3x3(x))))], Conv3x3(Width -> 2),
// reading the two species (scaled) and predicting their increments.
#pragma once

#include <remat/remat.hpp>

#include <cstddef>

template <std::size_t G, std::size_t Width = 16, std::size_t Blocks = 3>
struct gray_scott_surrogate {
  static constexpr std::size_t blocks = Blocks;  // residual blocks
  using block = remat::Residual<remat::Seq<remat::Conv2d<Width, Width, 3, G, G, 1, 1, false>,
                                           remat::BatchNorm2d<Width, G, G>, remat::GELU,
                                           remat::Conv2d<Width, Width, 3, G, G, 1, 1>>>;
  template <class Middle>
  using net = remat::Seq<remat::Conv2d<2, Width, 3, G, G, 1, 1>, remat::GELU, Middle,
                         remat::Conv2d<Width, 2, 3, G, G, 1, 1>>;
  using stored = net<remat::Repeat<Blocks, block>>;                            // every activation kept
  using checkpointed = net<remat::Repeat<Blocks, remat::Checkpointed<block>>>;  // each block recomputed
};

// The network of the Fortran example's model library (remat_add_model_library's NET names a type):
// a 32² grid, two blocks.
using gray_scott_surrogate_32 = gray_scott_surrogate<32, 16, 2>::stored;
