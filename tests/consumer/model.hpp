// The model consumer_model's C interface exports (remat_add_model_library in CMakeLists.txt).
#pragma once

#include <remat/remat.hpp>

using consumer_net = remat::Seq<remat::Linear<3, 8>, remat::GELU, remat::Linear<8, 2>>;
