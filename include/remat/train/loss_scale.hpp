// remat::loss_scaler: the run-time state of a model's loss scale. The model multiplies the loss's
// gradient by scale(); the optimizer divides it out in its fused update, checks the gradients for
// inf/NaN first (when the scale is not the identity), skips the step on overflow and calls
// update(). A dynamic scale follows torch.cuda.amp.GradScaler: ×growth_factor after
// growth_interval steps in a row without overflow, ×backoff_factor on one.
#pragma once

#include "../error.hpp"
#include "../numeric/precision.hpp"

#include <cmath>
#include <cstdint>

namespace REMAT_NAMESPACE {

// A DynamicLossScale's schedule: PyTorch GradScaler's names and defaults.
struct dynamic_scale_options {
  double init_scale = 65536.0;           // the scale configure() sets
  double growth_factor = 2.0;            // the scale's factor after growth_interval clean steps
  double backoff_factor = 0.5;           // the scale's factor on an overflow (the step is skipped)
  std::uint64_t growth_interval = 2000;  // steps in a row without overflow before it grows
};

class loss_scaler {
 public:
  // The state a model with loss scale Scale starts with.
  template <class Scale>
  static loss_scaler of() {
    loss_scaler s;
    s.dynamic_ = Scale::dynamic;
    s.checks_ = !Scale::identity;
    s.scale_ = Scale::initial;
    return s;
  }

  // The factor the loss's gradient is multiplied by in this step.
  double scale() const { return scale_; }
  // Whether the optimizer checks for overflow and skips (false for a scale of 1).
  bool checks() const { return checks_; }
  // Whether the scale moves (DynamicLossScale) and configure() applies.
  bool dynamic() const { return dynamic_; }
  // Steps in a row without overflow since the scale last changed (GradScaler's growth tracker).
  std::uint64_t growth_tracker() const { return tracker_; }
  // Optimizer steps skipped because a gradient overflowed.
  std::uint64_t skipped_steps() const { return skipped_; }
  // The schedule (the defaults until configure()).
  dynamic_scale_options const& options() const { return o_; }

  // A dynamic scale's schedule (and, optionally, its current value).
  void configure(dynamic_scale_options o) {
    if (!dynamic_)
      detail::raise<argument_error>("loss_scaler::configure: expected a model with DynamicLossScale, found a static scale");
    // (An infinite scale or growth would overflow every step after it, each one skipped: refused.)
    if (!(o.init_scale > 0 && std::isfinite(o.init_scale)) || !(o.growth_factor > 1 && std::isfinite(o.growth_factor)) ||
        !(o.backoff_factor > 0 && o.backoff_factor < 1) || o.growth_interval == 0)
      detail::raise<argument_error>(
          "loss_scaler::configure: expected a finite init_scale > 0, a finite growth_factor > 1, 0 < backoff_factor "
          "< 1 and growth_interval > 0, found ",
          o.init_scale, ", ", o.growth_factor, ", ", o.backoff_factor, ", ", o.growth_interval);
    o_ = o;
    scale_ = o.init_scale;
    tracker_ = 0;
  }

  // Restores a saved state (see io/checkpoint.hpp).
  void set_state(double scale, std::uint64_t tracker, std::uint64_t skipped) {
    if (!(scale > 0) || !std::isfinite(scale))
      detail::raise<argument_error>("loss_scaler: expected a finite positive scale, found ", scale);
    if (!dynamic_ && scale != scale_)
      detail::raise<argument_error>("loss_scaler: a static scale is ", scale_, ", found ", scale);
    scale_ = scale;
    tracker_ = tracker;
    skipped_ = skipped;
  }

  // After each optimizer step: whether a gradient overflowed (and the step was skipped).
  void update(bool overflow) {
    if (overflow) ++skipped_;
    if (!dynamic_) return;
    if (overflow) {
      scale_ *= o_.backoff_factor;
      tracker_ = 0;
    } else if (++tracker_ == o_.growth_interval) {
      scale_ *= o_.growth_factor;
      tracker_ = 0;
    }
  }

 private:
  bool dynamic_ = false;
  bool checks_ = false;
  double scale_ = 1.0;
  std::uint64_t tracker_ = 0;
  std::uint64_t skipped_ = 0;
  dynamic_scale_options o_{};
};

}  // namespace REMAT_NAMESPACE
