// Walking a graph at compile time, through any composite or storage policy, including ones
// defined outside the library: a composite's children, rebuilding it with other children, and the
// walks built on that (the first layer, whether rows are sequences, the longest sequence, the
// parameters' names).
//
// A composite names its children with `using children = type_list<...>` and how to rebuild itself
// with `template <class... C> using rebuild = ...` (Seq, Residual and Repeat do). A storage policy
// derived from remat::wraps<S> has S as its one child, and a policy written `P<S>` or `P<N, S>` is
// rebuilt as `P<C>` or `P<N, C>` without declaring anything.
#pragma once

#include "../layers/layer.hpp"
#include "../memory/trace.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {

template <class... T>
struct type_list {};

// (declared here for the walks that recognise them: graph/seq.hpp and graph/repeat.hpp)
template <class... L>
struct Seq;
template <std::size_t N, class Block>
struct Repeat;

namespace detail {

template <class L>
struct children_of {
  using type = type_list<>;
};
template <class L>
  requires requires { typename L::segment; }
struct children_of<L> {
  using type = type_list<typename L::segment>;
};
template <class L>
  requires requires { typename L::children; }
struct children_of<L> {
  using type = typename L::children;
};

template <class L, class... C>
struct rebuild_by_template {
  static_assert(sizeof(L*) == 0,
                "remat: cannot rebuild this composite with other children (rebuild_by_template<L, ...> names it); "
                "declare `template <class... C> using rebuild = ...` in it");
};
template <template <class> class P, class S, class C>
struct rebuild_by_template<P<S>, C> {
  using type = P<C>;
};
template <template <std::size_t, class> class P, std::size_t N, class S, class C>
struct rebuild_by_template<P<N, S>, C> {
  using type = P<N, C>;
};

template <class L, class... C>
struct rebuilt : rebuild_by_template<L, C...> {};
template <class L, class... C>
  requires requires { typename L::template rebuild<C...>; }
struct rebuilt<L, C...> {
  using type = typename L::template rebuild<C...>;
};

}  // namespace detail

// The segments directly inside L (a Seq's layers, a Residual's or a policy's segment, a Repeat's
// block); none for a layer.
template <class L>
using children_t = typename detail::children_of<L>::type;

// L with its children replaced by C...
template <class L, class... C>
using rebuilt_t = typename detail::rebuilt<L, C...>::type;

namespace detail {

template <class L, template <class> class Rule, class Children>
struct rewrite_children;
template <class L, template <class> class Rule>
struct rewrite_node {
  using type = Rule<typename rewrite_children<L, Rule, children_t<L>>::type>;
};
template <class L, template <class> class Rule>
struct rewrite_children<L, Rule, type_list<>> {
  using type = L;
};
template <class L, template <class> class Rule, class... C>
struct rewrite_children<L, Rule, type_list<C...>> {
  using type = rebuilt_t<L, typename rewrite_node<C, Rule>::type...>;
};

}  // namespace detail

// The graph L with Rule applied to every node, children first: Rule<X> is X's replacement
// (RecomputeAttention's rule wraps every attention core in Checkpointed).
template <class L, template <class> class Rule>
using rewrite_t = typename detail::rewrite_node<L, Rule>::type;

namespace detail {

template <class List>
struct first_of;
template <class C0, class... C>
struct first_of<type_list<C0, C...>> {
  using type = C0;
};

template <class L, class Children = children_t<L>>
struct first_leaf {
  using type = typename first_leaf<typename first_of<Children>::type>::type;
};
template <class L>
struct first_leaf<L, type_list<>> {
  using type = L;
};

template <class L, class Children = children_t<L>>
struct sequence_walk;
template <class L, class... C>
struct sequence_walk<L, type_list<C...>> {
  // Whether any layer of L reads rows as positions of sequences (attention, positions).
  static constexpr bool uses = is_sequence_layer_v<L> || (sequence_walk<C>::uses || ... || false);
  // The longest sequence every layer of L accepts (a positional table's length), or SIZE_MAX.
  static constexpr std::size_t longest = std::min({own_max_sequence<L>(), sequence_walk<C>::longest...});
  // The most rows and the longest sequence of a pass that every segment of L was planned for.
  static constexpr std::size_t planned_rows = std::min({own_planned_rows<L>(), sequence_walk<C>::planned_rows...});
  static constexpr std::size_t planned_sequence =
      std::min({own_planned_sequence<L>(), sequence_walk<C>::planned_sequence...});
};

}  // namespace detail

namespace detail {
template <class L, class Children = children_t<L>>
struct image_walk;
template <class L, class... C>
struct image_walk<L, type_list<C...>> {
  // The image L reads: its own in_image, or that of its first child that fixes its input width.
  static constexpr image_shape in = [] {
    if constexpr (requires { L::in_image; }) {
      return image_shape(L::in_image);
    } else {
      image_shape r{};
      bool found = false;
      ((found ? void() : (C::in_width != any_width ? (r = image_walk<C>::in, found = true, void()) : void())), ...);
      return r;
    }
  }();
  // The image L writes: its own out_image, or that of its last child that fixes its output width.
  static constexpr image_shape out = [] {
    if constexpr (requires { L::out_image; }) {
      return image_shape(L::out_image);
    } else {
      image_shape r{};
      ((C::out_width != any_width ? (r = image_walk<C>::out, void()) : void()), ...);
      return r;
    }
  }();
};
}  // namespace detail

// The image (channels, height, width) a layer or segment reads and writes; all zero when it
// declares none (a Linear, a point-wise layer).
template <class L>
inline constexpr image_shape image_in_v = detail::image_walk<L>::in;
// (image_in_v's counterpart: the image a layer or segment writes)
template <class L>
inline constexpr image_shape image_out_v = detail::image_walk<L>::out;

// The first layer a graph's input reaches, through any nesting.
template <class Net>
using first_layer_t = typename detail::first_leaf<Net>::type;

// Whether a graph reads token ids (its first layer does) rather than features.
template <class Net>
inline constexpr bool reads_ids_v = layer_reads_ids_v<first_layer_t<Net>>;

// Whether a graph is a sequence model: its rows are positions of sequences of a length fixed per
// pass (token ids batch x seq; see model).
template <class Net>
inline constexpr bool is_sequence_model_v = detail::sequence_walk<Net>::uses;

// The longest sequence a graph takes (SIZE_MAX: any).
template <class Net>
inline constexpr std::size_t max_sequence_v = detail::sequence_walk<Net>::longest;

// The most rows of a training pass (batch x sequence) that a graph's Budget segments were planned
// for (SIZE_MAX: any).
template <class Net>
inline constexpr std::size_t planned_rows_v = detail::sequence_walk<Net>::planned_rows;
// The longest sequence of a training pass that a graph's Budget segments were planned for
// (SIZE_MAX: any).
template <class Net>
inline constexpr std::size_t planned_sequence_v = detail::sequence_walk<Net>::planned_sequence;

namespace detail {

// A visitor of running-state buffers (buffer_table) rather than parameters: each leaf layer is
// handed to it, in the order the layers first run.
template <class F>
concept buffer_visitor = requires { typename std::remove_cvref_t<F>::visits_buffers; };

// Running-state elements a layer itself holds (BatchNorm2d's statistics): 0 unless it declares
// `static constexpr std::size_t buffer_count` and names them in `static std::vector<param_desc>
// buffers()`.
template <class L>
constexpr std::size_t own_buffer_count() {
  if constexpr (requires { L::buffer_count; })
    return L::buffer_count;
  else
    return 0;
}

// A visitor of the layers that hold parameters rather than of their tensors: each leaf with
// parameters is handed to it with its first parameter's offset (f.template layer<L>(offset)); a
// layer that names its own tensors (L::visit) hands them to it as to any visitor, by name.
template <class F>
concept layer_visitor = requires { typename std::remove_cvref_t<F>::visits_layers; };

// A name for each parameter tensor, PyTorch-style: "0.weight", "2.1.0.bias". With a buffer
// visitor, the same walk names each buffer ("1.running_mean"), offsets counted by the visitor.
template <class L, class F>
void visit_params(std::string const& prefix, std::size_t offset, F&& f) {
  if constexpr (requires { L::template visit<F>; })
    L::visit(prefix, offset, f);
  else if constexpr (buffer_visitor<F>) {
    if constexpr (own_buffer_count<L>() > 0) f.template layer<L>(prefix);
  } else if constexpr (layer_visitor<F>) {
    if constexpr (L::param_count > 0) f.template layer<L>(offset);
  } else
    for (param_desc const& p : L::params()) f(prefix + p.name, offset + p.offset, p.shape);
}

// The running-state elements of a graph: its layers' buffer_count, a Repeat's block counted once
// per block. A layer's buffers are found at run time in the order layers first run (the walk's
// order): pass_state::buffers.
template <class L, class Children = children_t<L>>
struct buffer_walk;
template <class L, class... C>
struct buffer_walk<L, type_list<C...>> {
  static constexpr std::size_t copies = [] {
    if constexpr (requires {
                    L::count;
                    typename L::block;
                  })
      return std::size_t(L::count);
    else
      return std::size_t(1);
  }();
  static constexpr std::size_t count = own_buffer_count<L>() + copies * (buffer_walk<C>::count + ... + 0);
};

// A composite with one child whose parameters are all it has (Residual, every storage policy):
// their count, names and initialisation are the child's.
template <class S>
struct parameters_of {
  static constexpr std::size_t param_count = S::param_count;
  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    visit_params<S>(prefix, offset, f);
  }
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    S::init(p, global_offset, seed);
  }
};

// The frame of a layer call (memory/trace.hpp): the layer's index in its Seq or Repeat, its type
// and the phase (forward, recomputation when a policy runs it again, backward). Only a pass that
// computes keeps frames; a plan's pass gets an empty scope.
template <class Layer, class S>
constexpr memory::tracing::layer_scope trace_layer(S const& s, std::size_t index, bool backward) {
  if constexpr (S::computes) {
    constexpr bool leaf = std::is_same_v<children_t<Layer>, type_list<>>;
    memory::phase const p = backward          ? memory::phase::backward
                            : s.recomputing() ? memory::phase::recomputation
                                              : memory::phase::forward;
    return memory::tracing::layer_scope(std::uint32_t(index), &memory::tracing::type_name<Layer>, leaf, p);
  } else {
    (void)s;
    (void)index;
    (void)backward;
    return {};
  }
}

// ---- gathering a layer's parameters before it runs (ZeRO-3: dist::options::shard_parameters)

// Whether running L opens a frame (trace_layer, gather_frame) for each of its children: a Seq for
// each layer, a chain of blocks (Repeat, and every policy that schedules one) for each block.
template <class L>
inline constexpr bool opens_frames = false;
template <class... L>
inline constexpr bool opens_frames<Seq<L...>> = true;
template <std::size_t N, class B>
inline constexpr bool opens_frames<Repeat<N, B>> = true;

// Whether every parameter L reads is gathered by frames inside it: L has none, opens frames for its
// children, or is a composite (Residual, a storage policy) whose children all are so. A frame
// around an L that is not (a layer, Residual<Linear>, Checkpointed<Linear>) gathers L's parameters
// itself; nested frames never gather a second time.
template <class L, class Children = children_t<L>>
struct gathered_inside;
template <class L, class... C>
struct gathered_inside<L, type_list<C...>> {
  static constexpr bool value =
      L::param_count == 0 || opens_frames<L> || (sizeof...(C) > 0 && (gathered_inside<C>::value && ...));
};

// What a frame that gathers nothing holds: the layer reads its parameters where they are.
struct no_gather {
  template <class P>
  static constexpr P at(P p) {
    return p;
  }
};

// The frame of a call of Layer on parameters p: when Layer's parameters are not gathered inside
// it, the pass state gathers them, and the layer reads them at gathered.at(p) (a buffer the
// state's listener filled, until the frame ends). A pass with no gathering listener, and the
// plan's state (which records the frames), read them at p.
template <class Layer, class S, class P>
constexpr auto gather_frame(S& s, P p) {
  if constexpr (Layer::param_count > 0 && !gathered_inside<Layer>::value) {
    return s.gather_params(p, Layer::param_count);
  } else {
    (void)s;
    (void)p;
    return no_gather{};
  }
}

}  // namespace detail

// The running-state elements (BatchNorm2d's running statistics) of a graph: what a model holds
// beside its parameters, neither trained nor given gradients.
template <class Net>
inline constexpr std::size_t buffer_count_v = detail::buffer_walk<Net>::count;

}  // namespace REMAT_NAMESPACE
