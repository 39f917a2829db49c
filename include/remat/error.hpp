// The exceptions remat throws. Every message says what was expected and what was found.
#pragma once

#include "config.hpp"

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace REMAT_NAMESPACE {

// Base of everything remat throws on bad input or exhausted resources.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Sizes or shapes that do not fit together (tensors in an expression, GEMM operands, ...).
class shape_error : public error {
 public:
  using error::error;
};

// A value that is not allowed: a negative or zero size, an empty reduction, ...
class argument_error : public error {
 public:
  using error::error;
};

// An allocation past the configured (host) or physical (GPU) limit; the message holds the
// allocator's summary table.
class out_of_memory : public error {
 public:
  using error::error;
};

// A file that cannot be read or written, is corrupt, or belongs to another model.
class io_error : public error {
 public:
  using error::error;
};

// A CUDA runtime or library call that failed; the message names the call.
class cuda_error : public error {
 public:
  using error::error;
};

// A failure shared across the processes of a data-parallel run: another rank failed (its message
// follows), the ranks' models differ, or a collective operation timed out.
class dist_error : public error {
 public:
  using error::error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts const&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class Error, class... Parts>
[[noreturn]] void raise(Parts const&... parts) {
  throw Error(concat(parts...));
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
