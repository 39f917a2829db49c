// Precision policies, the model's third template parameter. fp32 trains in float; fp64 runs the
// same code in double (what the gradient checker uses). Mixed precision builds on these.
#pragma once

#include "../config.hpp"

namespace REMAT_NAMESPACE {

struct fp32 {
  using master = float;   // parameters, gradients, optimizer state
  using compute = float;  // activations and matrix inputs
  static constexpr char const* name = "fp32";
};

struct fp64 {
  using master = double;
  using compute = double;
  static constexpr char const* name = "fp64";
};

}  // namespace REMAT_NAMESPACE
