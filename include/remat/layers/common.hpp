// What every layer shares: activation handles, the state of one forward/backward pass (what the
// forward saved, the dropout stream), the parameter description used for names and files, and
// deterministic initialisation from the seed.
//
// A layer is a type with in_width, out_width, param_count, params(), init() and
//
//   template <class S> static constexpr typename S::act_type forward(S& s, typename S::param_ptr p,
//                                                                     typename S::act_type x);
//   template <class S> static constexpr typename S::act_type backward(S& s, typename S::param_ptr p,
//                                                                      typename S::grad_ptr g,
//                                                                      typename S::act_type dy);
//
// written against the state S: s.make for new tensors, s.save / s.restore for what backward needs,
// and the arithmetic inside `if constexpr (S::computes)`. The same code then runs a training step
// (S = pass_state) and, at compile time, the activation plan (S = plan::state, which only counts).
// A layer written for pass_state<T, D> alone trains too, but cannot be planned.
#pragma once

#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "../memory/offload.hpp"
#include "../numeric/compute.hpp"
#include "../numeric/philox.hpp"
#include "../tensor/tensor.hpp"
#include "../train/gradient_sync.hpp"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace REMAT_NAMESPACE {

// A width that adapts to its neighbour (point-wise layers, dropout).
inline constexpr std::size_t any_width = dynamic_width;

// An activation: shared so that a tensor lives exactly as long as someone (the next layer, or a
// layer that saved it for backward) still needs it, as in PyTorch's autograd.
template <class T, class D>
using act = std::shared_ptr<tensor<T, D>>;

// A layer that declares `static constexpr bool handles_hollow = true` copes with a hollow input (a
// shape without values, see pass_state::hollow) in a selective recomputation; before any other
// layer, the graph marks the captured products needed, so such a layer always sees values.
template <class L>
inline constexpr bool handles_hollow_v = requires { requires L::handles_hollow; };

// One Linear's matrix-product output kept by a selective policy (see graph/policies.hpp), and
// whether the recomputation needs it.
template <class A>
struct captured {
  A value;
  bool needed;
};

// What a pass state keeps whatever it runs on: the flags of the pass, the stacks the forward fills
// and the backward empties, and the lists of a selective policy. A is the activation handle;
// Self supplies make(rows, cols). Shared by pass_state (which computes) and plan::state (which
// counts), so the plan follows exactly the rules a training step follows.
template <class A, class Self>
struct pass_stacks {
  bool training = false;
  // Whether layers keep what their backward needs (false inside a checkpointed forward).
  bool keep = true;
  // A forward whose side effects already happened once (a policy recomputing): a layer that
  // updates state in forward (a counter, a running statistic) must do so only when this is false.
  bool recomputing = false;
  std::uint64_t seed = 0;
  std::uint64_t step = 0;        // the dropout stream of this pass
  std::uint64_t rng_offset = 0;  // elements of that stream consumed so far
  std::uint64_t recomputed = 0;  // block forwards run again by storage policies
  std::size_t saved_bytes = 0;   // activation bytes in use when the forward ended, its output excluded
  // Rows of a sequence batch: row r is position r % seq_len of sequence r / seq_len (1: no sequences).
  std::size_t seq_len = 1;
  std::int32_t const* ids = nullptr;  // the token ids of this pass, for a model that reads ids
  std::size_t id_count = 0;
  std::vector<A> saved;                 // tensors the forward kept, popped in reverse by backward
  std::vector<std::uint64_t> counters;  // the same for counters (dropout offsets, RNG states)
  // Selective recompute: the forward captures matrix-product outputs here, and the recomputing
  // forward takes them back (in the same order, from `replay_next`) instead of multiplying again.
  std::vector<captured<A>>* capture = nullptr;
  std::vector<A>* replay = nullptr;
  std::size_t replay_next = 0;

  constexpr bool keeps() const { return training && keep; }
  // Backward calls this after each layer with parameters, with the gradient pointer of that
  // layer: gradients from there to the end of the model's buffer are final (layers are laid out in
  // forward order and run backward in reverse). A data-parallel wrapper starts reducing them.
  template <class P>
  constexpr void grads_ready(P const&) const {}

  // Keeps `a` for backward; a forward that keeps nothing drops it (and, when capturing, notes that
  // every product captured so far is needed to recompute it).
  constexpr void save(A a) {
    if (keeps())
      saved.push_back(static_cast<A&&>(a));
    else
      need_input();
  }
  // Under a selective forward: everything captured so far is needed to recompute what follows.
  constexpr void need_input() {
    if (capture)
      for (auto& c : *capture) c.needed = true;
  }
  constexpr A restore() {
    A a = static_cast<A&&>(saved.back());
    saved.pop_back();
    return a;
  }
  constexpr void save_counter(std::uint64_t v) {
    if (keeps()) counters.push_back(v);
  }
  constexpr std::uint64_t restore_counter() {
    std::uint64_t const v = counters.back();
    counters.pop_back();
    return v;
  }
  // A tensor for dx: dy's own memory if nobody else holds it.
  constexpr A reuse_or_make(A& dy, std::size_t cols) {
    if (dy.use_count() == 1 && dy->cols() == cols) return dy;
    return static_cast<Self*>(this)->make(dy->rows(), cols);
  }
};

// What one run of an Offloaded<S> forward moved off the device (graph/policies.hpp). Per tensor:
// its copy in offloaded memory (H), the slots of the saved stack it fills (holding a hollow
// tensor of its shape meanwhile), its shape, and the device copy while it is still held (`pending`: the
// copies may be in flight) or once it is back (`fetched`). A is the activation handle, Fence the
// ordering of the copies against the compute (memory/offload.hpp).
template <class A, class H, class Fence>
struct offload_record {
  struct item {
    A device;
    H host;
    std::vector<std::size_t> slots;
    std::size_t rows = 0, cols = 0;
  };
  std::vector<item> items;
  bool pending = true;
  bool fetched = false;
  Fence fence;  // (declared last, so destroyed first: the compute waits before the memory goes)
};

// Columns of T that hold n statistics per row (a norm's mean and 1/std) in T's compute type:
// statistics stay fp32 when activations are 16-bit.
template <class T>
constexpr std::size_t stat_columns(std::size_t n) {
  return (n * sizeof(compute_type_t<T>) + sizeof(T) - 1) / sizeof(T);
}
template <class T>
compute_type_t<T>* stat_data(T* p) {
  return reinterpret_cast<compute_type_t<T>*>(p);
}

// The state of one forward (and its backward) pass. Layers are written once against this
// interface and also run against plan::state (graph/plan_state.hpp), which follows the same calls
// without computing anything to give the activation plan; `computes` tells them apart.
// T is the type of activations and of the parameters layers read (the compute copy in mixed
// precision); G the type of the gradients they accumulate into (fp32 master gradients).
template <class T, class D, class G = T>
struct pass_state : pass_stacks<act<T, D>, pass_state<T, D, G>> {
  using value_type = T;
  using grad_type = G;
  using device = D;
  using act_type = act<T, D>;
  using param_ptr = T const*;
  using grad_ptr = G*;
  static constexpr bool computes = true;

  memory::caching_allocator<D>* alloc = &memory::default_allocator<D>();
  detail::gradient_sync* sync = nullptr;  // told as gradients become final (data parallelism)
  G const* grad_base = nullptr;           // the start of the model's gradient buffer
  // Offloaded<S>: where the activations go and the records of what went (last, first restored).
  using host_copy = memory::held_block<memory::offload_space_t<D>>;
  using offload_record_type = offload_record<act<T, D>, host_copy, detail::copy_fence<D>>;
  detail::offload_channel<D> offload{};
  std::vector<offload_record_type> offloads;

  void grads_ready(G const* g) const {
    if (sync) sync->gradients_ready(std::size_t(g - grad_base));
  }

  act<T, D> make(std::size_t rows, std::size_t cols, memory::tag t = memory::tag::activations) {
    return std::make_shared<tensor<T, D>>(index_t(rows), index_t(cols), t, *alloc);
  }
  void forward_done(act<T, D> const& y) {
    this->saved_bytes =
        alloc->stats()[memory::tag::activations].in_use - memory::caching_allocator<D>::rounded(y->bytes());
  }
  // The caller's tensor, read in place (never written: training makes every output anew).
  act<T, D> borrow(tensor_view<T const, D> v) {
    return std::make_shared<tensor<T, D>>(tensor<T, D>::borrowed, const_cast<T*>(v.data()), v.rows(), v.cols());
  }
  // A shape without memory (what a selective recomputation passes on past its last product).
  act<T, D> hollow(std::size_t rows, std::size_t cols) {
    return std::make_shared<tensor<T, D>>(tensor<T, D>::shape_only, rows, cols);
  }
  static bool is_hollow(act<T, D> const& a) { return a && a->data() == nullptr; }
  // Whether the pass made `a` (not the caller's input, read in place).
  static bool owns(act<T, D> const& a) { return a->allocator() != nullptr; }

  // Offloaded<S>: a copy of `a` in offloaded memory, issued through `f`; and back.
  host_copy copy_off(act<T, D> const& a, detail::copy_fence<D>& f) {
    host_copy h(*offload.space, a->bytes(), memory::tag::activations);
    f.to_host(h.get(), a->data(), a->bytes());
    return h;
  }
  act<T, D> copy_back(typename offload_record_type::item const& it, detail::copy_fence<D>& f) {
    act<T, D> a = make(it.rows, it.cols);
    f.to_device(a->data(), it.host.get(), a->bytes());
    return a;
  }
  detail::offload_channel<D> const& offload_target() const { return offload; }
};

inline std::size_t shape_elements(std::vector<std::size_t> const& shape) {
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

// One parameter tensor of a layer: its name within the layer, offset and shape.
struct param_desc {
  char const* name;
  std::size_t offset;
  std::vector<std::size_t> shape;
  std::size_t size() const { return shape_elements(shape); }
};

namespace init {

// Parameter k of a model is initialised from philox(seed, stream, k): a pure function of the seed
// and the parameter's position, whatever the order of initialisation.
inline constexpr std::uint64_t init_stream = 0x1417'0000'0000'0000ull;

template <class T>
void uniform(T* p, std::size_t n, std::size_t global_offset, std::uint64_t seed, double bound) {
  for (std::size_t i = 0; i < n; ++i)
    p[i] = T((2.0 * double(philox::uniform(seed, init_stream, global_offset + i)) - 1.0) * bound);
}

template <class T>
void normal(T* p, std::size_t n, std::size_t global_offset, std::uint64_t seed, double stddev) {
  constexpr double two_pi = 6.283185307179586476925;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t const k = 2 * (global_offset + i);
    double const u1 = (double(philox::uniform(seed, init_stream + 1, k)) + 0x1p-25);  // (0, 1]
    double const u2 = double(philox::uniform(seed, init_stream + 1, k + 1));
    p[i] = T(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
  }
}

template <class T>
void fill(T* p, std::size_t n, double v) {
  for (std::size_t i = 0; i < n; ++i) p[i] = T(v);
}

}  // namespace init
}  // namespace REMAT_NAMESPACE
