// Precision policies, the model's third template parameter, and loss scaling.
//
//   fp32                       float everywhere.
//   fp64                       the same code in double (what the gradient checker uses).
//   mixed<bfloat16>            fp32 master weights, gradients and optimizer state; matrix inputs and
//   mixed<half, Scale>         saved activations in the 16-bit type; sums, norms, softmax and
//                              losses accumulate in fp32.
//
// Scale is StaticLossScale<S> (the loss's gradient is multiplied by the compile-time S and the
// optimizer divides it out; S = 1, the default, compiles to nothing) or DynamicLossScale (PyTorch
// GradScaler's schedule, state in remat::loss_scaler).
#pragma once

#include "../config.hpp"
#include "small_float.hpp"

#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {

// S is best a power of two: scaling and unscaling are then exact.
template <std::uint64_t S = 1>
struct StaticLossScale {
  static_assert(S >= 1, "remat::StaticLossScale<S>: S must be at least 1");
  static constexpr bool dynamic = false;       // a fixed scale: no schedule, no state
  static constexpr double initial = double(S);  // the scale, all along
  // S = 1: no scaling, no overflow check, nothing to skip.
  static constexpr bool identity = S == 1;
};

// GradScaler's defaults: start at 2^16, double after 2000 steps without overflow, halve on one.
// The schedule can be changed at run time through model::scaler().
struct DynamicLossScale {
  static constexpr bool dynamic = true;       // the scale moves (model::scaler() holds it)
  static constexpr double initial = 65536.0;  // the scale a model starts with (2^16)
  static constexpr bool identity = false;     // (always scales and checks)
};

// Whether T is a loss scale (what mixed<C, Scale> takes as Scale).
template <class T>
inline constexpr bool is_loss_scale_v = false;
// (StaticLossScale<S> is one.)
template <std::uint64_t S>
inline constexpr bool is_loss_scale_v<StaticLossScale<S>> = true;
// (DynamicLossScale is one.)
template <>
inline constexpr bool is_loss_scale_v<DynamicLossScale> = true;

// Single precision throughout: the default.
struct fp32 {
  using master = float;   // parameters, gradients, optimizer state
  using compute = float;  // activations and matrix inputs
  using loss_scale = StaticLossScale<>;        // none
  // In messages, files and benchmark lines.
  static constexpr char const* name = "fp32";
};

// Double precision throughout: the same code in double (what the gradient checker runs).
struct fp64 {
  using master = double;   // parameters, gradients, optimizer state
  using compute = double;  // activations and matrix inputs
  using loss_scale = StaticLossScale<>;        // none
  // In messages, files and benchmark lines.
  static constexpr char const* name = "fp64";
};

// Mixed precision: fp32 master weights, gradients and optimizer state; activations, saved
// tensors and matrix inputs in Compute (bfloat16 or half), accumulation in fp32; the loss scaled
// by Scale (for half, a DynamicLossScale keeps small gradients from flushing to zero).
template <class Compute, class Scale = StaticLossScale<>>
struct mixed {
  static_assert(std::is_same_v<Compute, bfloat16> || std::is_same_v<Compute, half>,
                "remat::mixed<C>: C must be remat::bfloat16 or remat::half");
  static_assert(is_loss_scale_v<Scale>,
                "remat::mixed<C, Scale>: Scale must be remat::StaticLossScale<S> or remat::DynamicLossScale");
  using master = float;      // parameters, gradients, optimizer state
  using compute = Compute;   // activations and matrix inputs
  using loss_scale = Scale;  // the loss scale
  // In messages, files and benchmark lines.
  static constexpr char const* name = std::is_same_v<Compute, bfloat16> ? "mixed<bfloat16>" : "mixed<half>";
};

// Whether a precision's activations are in another type than its parameters.
template <class P>
inline constexpr bool is_mixed_v = !std::is_same_v<typename P::master, typename P::compute>;

}  // namespace REMAT_NAMESPACE
