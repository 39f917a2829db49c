// Test helper: a layer or model's backward against central differences (remat::check_gradients),
// with the checker's summary printed when it fails.
#pragma once

#include <remat/remat.hpp>

#include <catch2/catch.hpp>

template <class Net>
void require_gradients(remat::gradient_check_options o = {}, std::size_t min_checked = 1) {
  auto const r = remat::check_gradients<Net>(o);
  INFO(r.summary());
  REQUIRE(r.checked >= min_checked);
  REQUIRE(r.passed);
}
