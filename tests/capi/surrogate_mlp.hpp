// The model the C interface's tests export (remat_add_model_library(capi_surrogate ...)): a small
// per-cell closure surrogate, 5 -> 64 -> 64 -> 5 with GELU.
#pragma once

#include <remat/remat.hpp>

using capi_surrogate_net = remat::Seq<remat::Linear<5, 64>, remat::GELU, remat::Linear<64, 64>, remat::GELU,
                                      remat::Linear<64, 5>>;
