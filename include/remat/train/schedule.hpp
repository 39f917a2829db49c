// Learning-rate schedules: opt.set_lr(schedule(step)) before each step.
#pragma once

#include "../error.hpp"

#include <cmath>
#include <cstddef>

namespace REMAT_NAMESPACE {

// Linear warm-up from 0 to base_lr over `warmup` steps, then cosine decay to min_lr at `total`.
struct warmup_cosine {
  double base_lr;       // the rate at the end of the warm-up
  std::size_t warmup;   // steps of linear warm-up
  std::size_t total;    // the step at which the rate reaches min_lr (and stays)
  double min_lr = 0;    // the rate the decay ends at

  // The rate of step `step` (from 0): opt.set_lr(schedule(step)) before each step.
  // Throws argument_error when the warm-up ends after `total` (its rate would climb past the
  // end of the decay, then drop to min_lr). (set_lr refuses a rate that is not finite or < 0.)
  double operator()(std::size_t step) const {
    constexpr double pi = 3.14159265358979323846;
    if (warmup > total)
      detail::raise<argument_error>("warmup_cosine: expected warmup <= total, found warmup ", warmup, " and total ", total);
    if (step < warmup) return base_lr * double(step + 1) / double(warmup);
    if (step >= total) return min_lr;
    double const progress = double(step - warmup) / double(total - warmup);  // (warmup <= step < total)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(pi * progress));
  }
};

}  // namespace REMAT_NAMESPACE
