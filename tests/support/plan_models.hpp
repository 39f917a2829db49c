// The small models the plan and arena tests share: a residual MLP block (LayerNorm, GELU, dropout)
// of width 32 between a 12-wide input and a 5-wide output, and a residual convolutional block
// with batch normalisation.
#pragma once

#include <remat/remat.hpp>

namespace plan_models {

constexpr std::size_t W = 32;
using Block = remat::Residual<remat::Seq<remat::LayerNorm<W>, remat::Linear<W, 64>, remat::GELU, remat::Dropout<0.1>,
                                         remat::Linear<64, W>>>;
template <class Middle>
using Net = remat::Seq<remat::Linear<12, W>, Middle, remat::Linear<W, 5>>;

// Two 3 x 3 convolutions of C channels on H x H, each followed by batch normalisation.
template <std::size_t C, std::size_t H>
using ConvBlock = remat::Residual<remat::Seq<remat::Conv2d<C, C, 3, H, H, 1, 1, false>, remat::BatchNorm2d<C, H, H>,
                                             remat::ReLU, remat::Conv2d<C, C, 3, H, H, 1, 1, false>,
                                             remat::BatchNorm2d<C, H, H>>>;

}  // namespace plan_models
