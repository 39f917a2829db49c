// Dropout<P>: zeroes each element with probability P and scales the rest by 1/(1-P) in training,
// the identity otherwise. The mask is a pure function of (seed, step, element index) through a
// counter-based generator, so it is never stored: the backward (or a recomputing forward) regenerates
// it from the offset the forward saved.
#pragma once

#include "../kernels/evaluate.hpp"
#include "../kernels/random.hpp"
#include "../numeric/philox.hpp"
#include "layer.hpp"

#include <bit>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {

// A probability given as a template argument: Dropout<0.1>, AttentionCore<W, H, 0.1>, GPT<..., 0.1>.
// A double converts to it implicitly and it converts back, so the argument reads as a number on
// every compiler; it holds the double's bits, which makes it a template argument that compilers
// without floating-point ones (clang before 18) accept. Dropout<0.1> and Dropout<rate(0.1)> are
// the same type.
struct rate {
  std::uint64_t bits;  // (public: a template argument's members must be)
  // The probability p.
  constexpr rate(double p) : bits(std::bit_cast<std::uint64_t>(p)) {}
  // An int is a probability too: Dropout<0>.
  constexpr rate(int p) : rate(double(p)) {}
  constexpr double value() const { return std::bit_cast<double>(bits); }  // the probability
  constexpr operator double() const { return value(); }                 // (value(), implicitly)
};

// The type of a probability template parameter: rate, except in sources nvcc compiles, where it
// is double. nvcc takes floating-point template arguments, and its generated code for device
// lambdas in a template with a class-type argument does not compile (CUDA 13). So under nvcc
// Dropout<0.1> is Dropout<(double)0.1>, a different type from a C++ source's Dropout<(rate)0.1>:
// a model type with dropout is not shared between a .cu and a .cpp file.
#if defined(__CUDACC__)
using rate_param = double;
#else
using rate_param = rate;
#endif

namespace expr {

// The dropout mask as an expression terminal: 0 or 1/(1-p) for element i.
struct dropout_mask : expr_base {
  using device = void;                      // (computed where it is read: any device)
  static constexpr bool is_double = false;  // (its values are float)
  random_draw draw;                         // the Philox stream and offset of the mask
  float p;                                  // the probability of a zero
  float scale;                              // the value of a kept element: 1 / (1 - p)
  constexpr std::size_t size() const { return any_size; }  // (as long as what it multiplies)
  constexpr std::size_t cols() const { return any_size; }  // (shaped as what it multiplies)
  // The mask value of an element whose uniform number is u, as V.
  template <class V>
  REMAT_HOST_DEVICE V value(float u) const {
    return u < p ? V(0) : V(scale);
  }
  // Element i's mask value, as V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t i) const {
    return value<V>(philox::uniform(draw.seed, draw.stream, draw.offset + i));
  }
  // Where its uniform numbers come from, for kernels::transform_uniform.
  constexpr kernels::uniform_stream stream() const { return {draw.seed, draw.stream, draw.offset}; }
};

namespace detail {

// x o mask in the compute type V, stored as T: the expression x * mask's element, from the
// element's uniform number (for kernels::transform_uniform).
template <class T, class X, class V>
struct masked_fn {
  X const* x;         // the input
  dropout_mask mask;  // the mask (its p and scale)
  REMAT_HOST_DEVICE T operator()(std::size_t i, float u) const {
    return from_compute<T>(to_compute<V>(x[i]) * mask.template value<V>(u));
  }
};

}  // namespace detail

// out = x * mask in one pass, each Philox block made once for the four elements it serves: the
// bits of evaluate(out, x * mask) (kernels/random.hpp), several times faster.
template <class Out, class X>
void apply_mask(Out& out, X const& x, dropout_mask const& mask) {
  using T = typename Out::value_type;
  using V = compute_t<decltype(to_expr(x * mask)), T>;
  static_assert(std::is_same_v<typename Out::device_type, typename X::device_type>,
                "remat::expr::apply_mask: the input and the destination live on different devices");
  if (x.size() != out.size() || x.cols() != out.cols())
    REMAT_NAMESPACE::detail::raise<shape_error>("remat::expr::apply_mask: expected an input of ", out.rows(), " x ",
                                                out.cols(), " like the destination, found ", x.rows(), " x ",
                                                x.cols());
  kernels::transform_uniform(typename Out::device_type{}, out.size(), out.data(), mask.stream(),
                             detail::masked_fn<T, typename X::value_type, V>{x.data(), mask});
}

}  // namespace expr

template <rate_param P>
struct Dropout : detail::no_parameters {
  static_assert(P >= 0.0 && P < 1.0, "remat::Dropout<P>: P must be in [0, 1)");
  // Any width: it takes its input's.
  static constexpr std::size_t in_width = any_width;
  // Its input's width.
  static constexpr std::size_t out_width = any_width;
  // P, the probability that an element is zeroed.
  static constexpr double probability = P;
  // It copes with a hollow input (a shape without values) in a selective recomputation: its
  // backward reads no values (see layer.hpp's optional traits).
  static constexpr bool handles_hollow = true;
  // Dropout<0> passes values and gradients through unchanged.
  static constexpr bool identity = P == 0.0;

  // The mask of draw d: 0 with probability P, else 1 / (1 - P).
  static expr::dropout_mask mask(random_draw d) { return {{}, d, float(P), float(1.0 / (1.0 - P))}; }

  // The mask of a training pass is drawn from the elements [offset, offset + size) of the pass's
  // stream; the offset is all the backward needs.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    if (!s.training() || P == 0.0) return x;
    std::uint64_t const offset = s.draw(x->size());
    s.save_counter(offset);
    if (S::is_hollow(x)) return x;  // a selective recomputation past its last needed product
    typename S::act_type y = s.make(x->rows(), x->cols());
    if constexpr (S::computes) expr::apply_mask(*y, *x, mask(s.random(offset)));
    return y;
  }

  // dx = dy * the same mask, drawn again from the pass's stream (nothing was stored).
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    if (P == 0.0) return dy;
    std::uint64_t const offset = s.restore_counter();
    typename S::act_type dx = s.reuse_or_make(dy, dy->cols());
    if constexpr (S::computes) expr::apply_mask(*dx, *dy, mask(s.random(offset)));
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
