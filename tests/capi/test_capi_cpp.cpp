// The C interface against the C++ API it wraps, in one process: the same model, seed, optimizer
// settings and data through capi_surrogate_* and through model<capi_surrogate_net> + AdamW give the
// same losses and outputs bit for bit; the library exports its C functions and nothing of remat's
// C++ (checked by the CMake test beside this one).
#include "capi_surrogate.h"
#include "data.h"
#include "surrogate_mlp.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

TEST_CASE("capi: the C interface trains bit for bit as model<Net> and AdamW do in C++", "[capi]") {
  remat_options o = capi_surrogate_default_options();
  o.seed = 5;
  o.learning_rate = 3e-3;
  o.weight_decay = 0.02;
  capi_surrogate_model* h = nullptr;
  REQUIRE(capi_surrogate_create(&h, &o) == REMAT_OK);
  remat::model<capi_surrogate_net> m(remat::seed{5});
  remat::AdamW opt(m, {.lr = 3e-3, .weight_decay = 0.02});
  std::size_t const rows = 24;
  std::vector<float> x(rows * 5), t(rows * 5), yc(rows * 5);
  for (int step = 0; step < 25; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(step, std::int64_t(i));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = capi_target(step, std::int64_t(i));
    double lc = 0;
    REQUIRE(capi_surrogate_train_step(h, x.data(), t.data(), std::int64_t(rows), &lc) == REMAT_OK);
    double const lp = m.train_step<remat::MSE>(remat::tensor_view<float const, remat::host>(x.data(), rows, 5),
                                               remat::tensor_view<float const, remat::host>(t.data(), rows, 5), opt);
    INFO("step " << step);
    CHECK(lc == lp);
  }
  REQUIRE(capi_surrogate_forward(h, x.data(), std::int64_t(rows), yc.data()) == REMAT_OK);
  std::vector<float> const yp = m.forward(remat::tensor_view<float const, remat::host>(x.data(), rows, 5)).to_vector();
  CHECK(std::memcmp(yc.data(), yp.data(), yc.size() * sizeof(float)) == 0);
  capi_surrogate_destroy(h);
}

TEST_CASE("capi: the plan the C interface gives is memory_plan's and inference_plan's", "[capi]") {
  remat_memory_plan p{};
  REQUIRE(capi_surrogate_memory_plan(nullptr, 100, &p) == REMAT_OK);
  auto const q = remat::memory_plan<capi_surrogate_net, remat::fp32, remat::AdamW, remat::MSE>(100);
  CHECK(p.parameters == q.parameters());
  CHECK(p.activations == q.activations.peak_bytes);
  CHECK(p.step_peak == q.peak);
  CHECK(p.step_reserved == q.reserved);
  CHECK(p.inference_arena == remat::inference_plan<capi_surrogate_net>(100).bytes);
}
