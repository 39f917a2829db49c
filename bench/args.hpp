// Positional command-line numbers for the benchmarks that take them (bench_expr, bench_gemm_paths):
// a whole number in [1, most], or 0 when the argument is not one, so the caller prints its usage
// rather than running with a size of 0 or a count that overflowed.
#pragma once

#include <cstdlib>

namespace bench_args {

inline long long positive(char const* s, long long most) {
  char* end = nullptr;
  long long const v = std::strtoll(s, &end, 10);
  return end != s && *end == 0 && v > 0 && v <= most ? v : 0;
}

}  // namespace bench_args
