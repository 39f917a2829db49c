// The layer contract, as one C++20 concept, and the optional traits a layer may declare. Every
// built-in layer, composite (Seq, Residual, Repeat) and storage policy satisfies it; a layer of
// your own does too and then works under every composite, policy and plan.
//
// A layer is a type with static members only (its parameters live in the model's flat buffer):
//
//   static constexpr std::size_t in_width, out_width;  // remat::any_width: adapts to its neighbour
//   static constexpr std::size_t param_count;           // its parameters' elements
//   static std::vector<param_desc> params();            // their names, offsets and shapes
//   template <class T> static void init(T* p, std::size_t global_offset, std::uint64_t seed);
//   template <class S> static constexpr typename S::act_type
//       forward(S& s, typename S::param_ptr p, typename S::act_type x);
//   template <class S> static constexpr typename S::act_type
//       backward(S& s, typename S::param_ptr p, typename S::grad_ptr g, typename S::act_type dy);
//
// forward and backward are written against the pass-state vocabulary (pass/vocabulary.hpp): new
// tensors from s.make, what backward needs through s.save / s.restore, a matrix product through
// s.product (so Selective can keep it), dropout through s.draw, and the arithmetic inside
// `if constexpr (S::computes)`. The same code then runs a training step (pass_state) and, at
// compile time, the activation plan (planning::state, which only counts). backward adds into the
// parameter gradients `g` and returns the input's gradient; when `s.gradients_zero()` (the pass
// began on zeroed gradients) it may write over them instead, as a layer's gradients get one
// contribution a pass (a layer that runs a child twice on the same parameters must add the
// second itself). A composite may name its children's
// parameters with `template <class F> static void visit(std::string const& prefix,
// std::size_t offset, F& f)` instead of params().
//
// A backward may skip its input gradient when `!s.needs_gradient(x)` (x: its saved input, then the
// pass's input, whose gradient nobody asked for) and return `s.hollow(rows, cols)` instead: Linear
// and the norms do (`s.gradient_for(x, dy, cols)` makes one or the other). Composites pass a
// hollow gradient on.
//
// Optional traits (a static constexpr member, or a type, that the graph and the policies read):
//
//   handles_hollow = true      copes with a hollow input (a shape without values) in a selective
//                              recomputation, or a checkpointed one past its last needed product;
//                              before any other layer, the graph marks the products so far needed,
//                              so such a layer always sees values
//   fuses_epilogue = true      forward<F> and backward<F> take a following point-wise layer's
//                              function F and apply it in the pass that writes the output (Seq
//                              fuses the pair)
//   using pointwise_function = F   a point-wise layer that a fusing layer before it may absorb
//   adds_residual = true       forward_onto(s, p, x, r) writes its output plus r, rounded as the
//                              separate add would round it (a Residual whose branch ends in it
//                              runs its add there: Linear, in its bias pass)
//   adds_residual_gradient = true   backward_onto(s, p, g, dy, r) writes its input's gradient
//                              plus r, rounded as the separate add would (a Residual whose branch
//                              starts with it adds the shortcut's gradient there: the norms)
//   overwrites_gradients = true   when s.gradients_zero(), backward writes every one of its
//                              parameter gradients (Linear): a train_step leaves them unzeroed
//                              before its pass, which writes them before anything reads them
//   identity = true            forward and backward return their argument (Dropout<0>): a
//                              Residual looks past it for the layer that ends its branch
//   sequence_layer = true      its rows are positions of sequences (s.sequence_length())
//   max_sequence = N           the longest sequence it takes (a positional table)
//   reads_ids = true           reads the pass's token ids (s.ids()) instead of its input; the
//                              model then takes ids, below `vocabulary`
//   attention_core = true      RecomputeAttention checkpoints it
//   buffer_count = N           holds N elements of running state (BatchNorm2d's statistics) in the
//                              model's buffers, named by `static std::vector<param_desc> buffers()`
//                              and initialised by `template <class T> static void init_buffers(T*)`;
//                              its forward takes them with s.buffers(N) whenever it is not
//                              recomputing, and updates them only when s.updates_buffers()
#pragma once

#include "../pass/vocabulary.hpp"
#include "common.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace REMAT_NAMESPACE {

namespace detail {

template <class L>
concept has_widths = requires {
  { L::in_width } -> std::convertible_to<std::size_t>;
  { L::out_width } -> std::convertible_to<std::size_t>;
};
template <class L>
concept has_param_count = requires {
  { L::param_count } -> std::convertible_to<std::size_t>;
};
template <class L>
concept has_init = requires(float* p, double* q) {
  L::init(p, std::size_t{}, std::uint64_t{});
  L::init(q, std::size_t{}, std::uint64_t{});
};
using param_visitor = void (*)(std::string const&, std::size_t, std::vector<std::size_t> const&);
template <class L>
concept names_params = requires(std::string const& prefix, param_visitor& f) {
  { L::params() } -> std::convertible_to<std::vector<param_desc>>;
} || requires(std::string const& prefix, param_visitor& f) { L::visit(prefix, std::size_t{}, f); };

template <class L, class S>
concept has_forward = requires(S& s, typename S::param_ptr p, typename S::act_type x) {
  { L::forward(s, p, x) } -> std::same_as<typename S::act_type>;
};
template <class L, class S>
concept has_backward = requires(S& s, typename S::param_ptr p, typename S::grad_ptr g, typename S::act_type dy) {
  { L::backward(s, p, g, dy) } -> std::same_as<typename S::act_type>;
};

}  // namespace detail

// What every layer, composite and policy is.
template <class L>
concept layer = detail::has_widths<L> && detail::has_param_count<L> && detail::has_init<L> && detail::names_params<L>;

// A layer that runs on the pass state S.
template <class L, class S>
concept layer_for = layer<L> && detail::has_forward<L, S> && detail::has_backward<L, S>;

// Fails to compile, naming the type and what it lacks, when L is not a layer. Composites check
// each child with it.
template <class L>
struct layer_contract {
  static_assert(detail::has_widths<L>,
                "remat: not a layer: layer_contract<L> names a type without `static constexpr std::size_t in_width, "
                "out_width` (see remat/layers/layer.hpp)");
  static_assert(detail::has_param_count<L>,
                "remat: not a layer: layer_contract<L> names a type without `static constexpr std::size_t "
                "param_count` (see remat/layers/layer.hpp)");
  static_assert(detail::has_init<L>,
                "remat: not a layer: layer_contract<L> names a type without `template <class T> static void "
                "init(T* p, std::size_t global_offset, std::uint64_t seed)` (see remat/layers/layer.hpp)");
  static_assert(detail::names_params<L>,
                "remat: not a layer: layer_contract<L> names a type without `static std::vector<param_desc> "
                "params()` (see remat/layers/layer.hpp)");
  static constexpr bool ok = layer<L>;  // (true: the assertions above passed)
};

// Fails to compile, naming the layer and the pass state, when L cannot run on S.
template <class L, class S>
struct layer_pass_contract {
  static_assert(detail::has_forward<L, S>,
                "remat: layer_pass_contract<L, S> names a layer without `template <class S> static constexpr "
                "typename S::act_type forward(S&, typename S::param_ptr, typename S::act_type)` for the pass "
                "state S (see remat/layers/layer.hpp)");
  static_assert(detail::has_backward<L, S>,
                "remat: layer_pass_contract<L, S> names a layer without `template <class S> static constexpr "
                "typename S::act_type backward(S&, typename S::param_ptr, typename S::grad_ptr, typename "
                "S::act_type)` for the pass state S (see remat/layers/layer.hpp)");
  static constexpr bool ok = detail::has_forward<L, S> && detail::has_backward<L, S>;  // (true: they passed)
};

// ---- the optional traits

template <class L>
inline constexpr bool handles_hollow_v = requires { requires L::handles_hollow; };
// Whether L declares fuses_epilogue (see the optional traits above).
template <class L>
inline constexpr bool fuses_epilogue_v = requires { requires L::fuses_epilogue; };
// Whether L declares adds_residual: forward_onto adds a residual in its output's pass.
template <class L>
inline constexpr bool adds_residual_v = requires { requires L::adds_residual; };
// Whether L declares adds_residual_gradient: backward_onto adds a gradient in its dx's pass.
template <class L>
inline constexpr bool adds_residual_gradient_v = requires { requires L::adds_residual_gradient; };
// Whether L declares identity: it passes values and gradients through (Dropout<0>).
template <class L>
inline constexpr bool is_identity_v = requires { requires L::identity; };
// Whether L is a point-wise layer (declares pointwise_function).
template <class L>
inline constexpr bool is_pointwise_v = requires { typename L::pointwise_function; };
// Whether L declares sequence_layer: its rows are positions of sequences.
template <class L>
inline constexpr bool is_sequence_layer_v = requires { requires L::sequence_layer; };
// Whether L declares reads_ids: it reads token ids (an Embedding).
template <class L>
inline constexpr bool layer_reads_ids_v = requires { requires L::reads_ids; };
// Whether L declares attention_core: RecomputeAttention recomputes it.
template <class L>
inline constexpr bool is_attention_core_v = requires { requires L::attention_core; };

// The longest sequence L itself takes (SIZE_MAX: any).
template <class L>
constexpr std::size_t own_max_sequence() {
  if constexpr (requires { L::max_sequence; })
    return L::max_sequence;
  else
    return std::size_t(-1);
}
// The rows (batch x sequence) of a training pass a segment was planned for (Budget declares
// planned_rows), or SIZE_MAX.
template <class L>
constexpr std::size_t own_planned_rows() {
  if constexpr (requires { L::planned_rows; })
    return L::planned_rows;
  else
    return std::size_t(-1);
}
// The longest sequence of a training pass a segment was planned for (Budget declares
// planned_sequence), or SIZE_MAX.
template <class L>
constexpr std::size_t own_planned_sequence() {
  if constexpr (requires { L::planned_sequence; })
    return L::planned_sequence;
  else
    return std::size_t(-1);
}

}  // namespace REMAT_NAMESPACE
