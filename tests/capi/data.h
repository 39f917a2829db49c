/* The C interface tests' data, the same in C and C++: value i of input or target batch `step`,
 * from integers only (no library function whose last bit could differ).
 */
#ifndef REMAT_TESTS_CAPI_DATA_H
#define REMAT_TESTS_CAPI_DATA_H

#include <stdint.h>

static inline float capi_input(int64_t step, int64_t i) {
  return (float)((i * 37 + step * 11) % 101 - 50) / 50.0f;
}
/* (A target the model can learn: half its input, element by element; inputs and targets are both
 * 5 wide.) */
static inline float capi_target(int64_t step, int64_t i) {
  return 0.5f * capi_input(step, i);
}

#endif
