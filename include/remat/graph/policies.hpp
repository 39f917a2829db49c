// Storage policies: wrapper types around a segment of the graph that change what its forward keeps
// for backward, and so the peak memory of training, without changing a single value.
//
//   Checkpointed<S>               keeps S's input and RNG offset; backward re-runs S's forward
//   CheckpointSequential<K, S>    S (a Seq or a Repeat) cut into K equal runs, each checkpointed
//   Revolve<C, Repeat<N, B>>      at most C block inputs kept; the binomial schedule (revolve.hpp)
//   Selective<S>                  keeps S's input and its matrix products' outputs; backward
//                                 recomputes only the point-wise work (norms, activations)
//   Offloaded<S>                  S's saved activations in (pinned) host memory between S's forward
//                                 and its backward, copied on a side stream beside the compute
//
// What every policy guarantees (each is tested):
// - The recomputation runs with the same RNG offsets and precision as the first forward, so losses
//   and gradients are bit-for-bit those of the stored run (dropout included).
// - A recomputing forward runs with pass_state::recomputing set: a layer with side effects (a step
//   counter, a running statistic) does them once.
// - Parameters of a segment get their gradients whether or not its input needs one.
// - Parameter layout and names are those of S: a checkpointed model reads a stored model's file.
//
// Policies nest (a Checkpointed block inside a Revolve, a Selective block in a checkpointed
// run); inside another policy's forward that keeps nothing, a policy just runs its segment.
#pragma once

#include "graph.hpp"
#include "revolve.hpp"

#include <string>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

template <class L>
inline constexpr bool is_segment_v = requires {
  L::in_width;
  L::out_width;
  L::param_count;
  L::init(static_cast<float*>(nullptr), std::size_t{}, std::uint64_t{});
};

// Fails to compile, naming the type a policy was given, when it is not a layer or segment.
template <class Policy, class Given>
struct not_a_segment {
  static constexpr bool ok = is_segment_v<Given>;
  static_assert(ok, "remat: a storage policy wraps a layer or a segment (Seq, Residual, Repeat, a layer); "
                    "not_a_segment<Policy, Given> names the type given instead");
};

template <std::size_t K, std::size_t Layers>
struct too_many_segments {
  static constexpr bool ok = K >= 1 && K <= Layers;
  static_assert(ok, "remat::CheckpointSequential<K, S>: K must be between 1 and the number of layers (or blocks) "
                    "of S; too_many_segments<K, layers of S> names both");
};

template <std::size_t C>
struct revolve_needs_a_slot {
  static constexpr bool ok = C >= 1;
  static_assert(ok, "remat::Revolve<C, Repeat<N, B>>: C (the block inputs kept at once) must be at least 1");
};

template <class Given>
struct revolve_needs_a_repeat {
  static constexpr bool ok = sizeof(Given*) == 0;  // always false, once instantiated
  static_assert(ok, "remat::Revolve<C, S>: S must be a Repeat<N, Block> (a chain of identical blocks); "
                    "revolve_needs_a_repeat<S> names the type given");
};

namespace detail {

// Block forwards in one run of S (what `recomputed` counts).
template <class S>
constexpr std::uint64_t blocks_in() {
  if constexpr (requires { S::count; typename S::block; })
    return S::count;
  else if constexpr (requires { typename S::segment; })
    return blocks_in<typename S::segment>();
  else
    return 1;
}

// What a policy forwards unchanged from its segment: widths, parameters, names, initialisation.
template <class S>
struct wraps {
  using segment = S;
  using first = S;
  static constexpr bool handles_hollow = handles_hollow_v<S>;
  static constexpr std::size_t in_width = S::in_width;
  static constexpr std::size_t out_width = S::out_width;
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

// Runs `body` as a recomputation: from RNG offset `offset`, with side effects off; puts both back.
template <class St, class Body>
constexpr void as_recomputation(St& s, std::uint64_t offset, Body&& body) {
  std::uint64_t const now = s.rng_offset;
  bool const was = s.recomputing;
  s.rng_offset = offset;
  s.recomputing = true;
  body();
  s.rng_offset = now;
  s.recomputing = was;
}

// Runs `body` with nothing kept for backward.
template <class St, class Body>
constexpr auto keeping_nothing(St& s, Body&& body) {
  bool const was = s.keep;
  s.keep = false;
  auto r = body();
  s.keep = was;
  return r;
}

}  // namespace detail

template <class S>
struct Checkpointed : detail::wraps<S> {
  static_assert(not_a_segment<Checkpointed, S>::ok);

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    std::uint64_t const offset = s.rng_offset;
    typename St::act_type y = detail::keeping_nothing(s, [&] { return S::forward(s, p, x); });
    s.save(std::move(x));
    s.save_counter(offset);
    return y;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    std::uint64_t const offset = s.restore_counter();
    typename St::act_type x = s.restore();
    detail::as_recomputation(s, offset, [&] { S::forward(s, p, std::move(x)).reset(); });
    s.recomputed += detail::blocks_in<S>();
    return S::backward(s, p, g, std::move(dy));
  }
};

namespace detail {

// Runs blocks [first, last) of a Repeat's block B forward.
template <class B, class St>
constexpr typename St::act_type run_blocks(St& s, typename St::param_ptr p, typename St::act_type x, std::size_t first,
                                           std::size_t last) {
  for (std::size_t k = first; k < last; ++k) x = B::forward(s, p + k * B::param_count, std::move(x));
  return x;
}

// The segment j of n items cut into k runs as equal as possible (the first n % k one longer).
constexpr std::size_t segment_begin(std::size_t n, std::size_t k, std::size_t j) {
  return j * (n / k) + (j < n % k ? j : n % k);
}

template <std::size_t Begin, class Seq, class I>
struct seq_slice_impl;
template <std::size_t Begin, class... L, std::size_t... I>
struct seq_slice_impl<Begin, Seq<L...>, std::index_sequence<I...>> {
  using type = Seq<nth<Begin + I, L...>...>;
};
template <class S, std::size_t Begin, std::size_t End>
using seq_slice = typename seq_slice_impl<Begin, S, std::make_index_sequence<End - Begin>>::type;

template <std::size_t K, class S, class J>
struct checkpointed_runs_impl;
template <std::size_t K, class... L, std::size_t... J>
struct checkpointed_runs_impl<K, Seq<L...>, std::index_sequence<J...>> {
  static constexpr std::size_t n = sizeof...(L);
  using type = Seq<Checkpointed<seq_slice<Seq<L...>, segment_begin(n, K, J), segment_begin(n, K, J + 1)>>...>;
};

}  // namespace detail

template <std::size_t K, class S>
struct CheckpointSequential {
  static_assert(not_a_segment<CheckpointSequential, S>::ok);
  static_assert(sizeof(S*) == 0, "remat::CheckpointSequential<K, S>: S must be a Seq<...> or a Repeat<N, Block>");
};

// A Seq cut into K runs of layers, each checkpointed. Names and layout stay those of the Seq.
template <std::size_t K, class... L>
struct CheckpointSequential<K, Seq<L...>> : detail::wraps<Seq<L...>> {
  static_assert(too_many_segments<K, sizeof...(L)>::ok);
  using runs = typename detail::checkpointed_runs_impl<K, Seq<L...>, std::make_index_sequence<K>>::type;
  static_assert(runs::param_count == Seq<L...>::param_count);

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    return runs::forward(s, p, std::move(x));
  }
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    return runs::backward(s, p, g, std::move(dy));
  }
};

// A Repeat cut into K runs of blocks, each checkpointed.
template <std::size_t K, std::size_t N, class B>
struct CheckpointSequential<K, Repeat<N, B>> : detail::wraps<Repeat<N, B>> {
  static_assert(too_many_segments<K, N>::ok);

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Repeat<N, B>::forward(s, p, std::move(x));
    for (std::size_t j = 0; j < K; ++j) {
      std::size_t const first = detail::segment_begin(N, K, j), last = detail::segment_begin(N, K, j + 1);
      std::uint64_t const offset = s.rng_offset;
      typename St::act_type y =
          detail::keeping_nothing(s, [&] { return detail::run_blocks<B>(s, p, x, first, last); });
      s.save(std::move(x));
      s.save_counter(offset);
      x = std::move(y);
    }
    return x;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    for (std::size_t j = K; j-- > 0;) {
      std::size_t const first = detail::segment_begin(N, K, j), last = detail::segment_begin(N, K, j + 1);
      std::uint64_t const offset = s.restore_counter();
      typename St::act_type x = s.restore();
      detail::as_recomputation(s, offset, [&] { detail::run_blocks<B>(s, p, std::move(x), first, last).reset(); });
      s.recomputed += last - first;
      for (std::size_t k = last; k-- > first;)
        dy = B::backward(s, p + k * B::param_count, g + k * B::param_count, std::move(dy));
    }
    return dy;
  }
};

template <std::size_t C, class S>
struct Revolve {
  static_assert(not_a_segment<Revolve, S>::ok);
  static_assert(revolve_needs_a_repeat<S>::ok);
};

template <std::size_t C, std::size_t N, class B>
struct Revolve<C, Repeat<N, B>> : detail::wraps<Repeat<N, B>> {
  static_assert(revolve_needs_a_slot<C>::ok);
  static constexpr std::size_t slots = C;
  static constexpr auto const& schedule = revolve::schedule<N, C>;
  static constexpr std::size_t forward_end = revolve::forward_end<N, C>;
  // Block forwards the backward runs again: revolve::cost(N, C), the fewest possible with C slots.
  static constexpr std::uint64_t recomputed_forwards = revolve::recomputed_forwards<N, C>;

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Repeat<N, B>::forward(s, p, std::move(x));
    typename St::act_type unused;
    run<St>(s, p, typename St::grad_ptr{}, x, unused, 0, forward_end);
    return x;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    typename St::act_type current;
    std::uint64_t const now = s.rng_offset;
    bool const was = s.recomputing;
    s.recomputing = true;
    run<St>(s, p, g, current, dy, forward_end, schedule.size());
    s.rng_offset = now;
    s.recomputing = was;
    return dy;
  }

 private:
  // Slots live on the pass state's stacks (the schedule is last in, first out): the input on the
  // activation stack, its RNG offset on the counter stack.
  template <class St>
  static constexpr void run(St& s, typename St::param_ptr p, typename St::grad_ptr g, typename St::act_type& current,
                            typename St::act_type& dy, std::size_t from, std::size_t to) {
    bool const backward = from > 0;
    for (std::size_t i = from; i < to; ++i) {
      revolve::action const a = schedule[i];
      switch (a.what) {
        case revolve::op::store:
          s.saved.push_back(current);
          s.counters.push_back(s.rng_offset);
          break;
        case revolve::op::advance:
          current = detail::keeping_nothing(s, [&] { return detail::run_blocks<B>(s, p, std::move(current), a.first, a.last); });
          if (backward) s.recomputed += a.last - a.first;
          break;
        case revolve::op::taped:
          current = B::forward(s, p + a.first * B::param_count, std::move(current));
          if (backward) s.recomputed += 1;
          break;
        case revolve::op::reverse:
          current.reset();  // the block's output: the gradient arrives instead
          dy = B::backward(s, p + a.first * B::param_count, g + a.first * B::param_count, std::move(dy));
          break;
        case revolve::op::restore:
          current = s.saved.back();
          s.rng_offset = s.counters.back();
          break;
        case revolve::op::drop:
          s.saved.pop_back();
          s.counters.pop_back();
          break;
      }
    }
  }
};

// Keeps S's input and the outputs of its matrix products that the recomputation needs (a Linear
// fused with an activation keeps its pre-activation; a plain Linear's output is kept when a later
// layer of S needs its input); backward re-runs S's forward taking those products back instead of
// multiplying, so it recomputes only the point-wise work: norms, activations, dropout masks.
// Megatron-LM's selective recompute, decided per layer type. For the block
// Residual<Seq<LayerNorm, Linear, GELU, Linear>> it keeps 2 of the 4 tensors of the block's width
// that storing keeps, and recomputes one norm and one activation.
template <class S>
struct Selective : detail::wraps<S> {
  static_assert(not_a_segment<Selective, S>::ok);

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    using A = typename St::act_type;
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    std::uint64_t const offset = s.rng_offset;
    std::vector<captured<A>> products;
    auto* const outer = s.capture;
    s.capture = &products;
    A y = detail::keeping_nothing(s, [&] { return S::forward(s, p, x); });
    s.capture = outer;
    for (auto& c : products) {  // (not `needed ? value : A()`: GCC 12 miscounts that at compile time)
      if (!c.needed) c.value.reset();
      s.save(std::move(c.value));
    }
    std::uint64_t const count = products.size();
    products.clear();
    s.save(std::move(x));
    s.save_counter(count);
    s.save_counter(offset);
    return y;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    using A = typename St::act_type;
    std::uint64_t const offset = s.restore_counter();
    std::size_t const count = s.restore_counter();
    A x = s.restore();
    std::vector<A> products(count);
    for (std::size_t i = count; i-- > 0;) products[i] = s.restore();
    auto* const outer = s.replay;
    std::size_t const outer_next = s.replay_next;
    s.replay = &products;
    s.replay_next = 0;
    detail::as_recomputation(s, offset, [&] { S::forward(s, p, std::move(x)).reset(); });
    s.replay = outer;
    s.replay_next = outer_next;
    products.clear();
    s.recomputed += detail::blocks_in<S>();
    return S::backward(s, p, g, std::move(dy));
  }
};

namespace detail {

// Offloaded<S>'s forward, after S's forward pushed its saved tensors onto slots [first, end) of the
// saved stack: each tensor that only those slots hold (not S's output, not a tensor an earlier
// layer also kept, not the caller's input) is copied to offloaded memory and its slots get a
// hollow tensor of its shape. The device copy stays held until the copy is known done: until the end of
// the next Offloaded forward (so the copy overlaps that compute), or until its own backward if
// none follows (then it never needs to come back). The plan runs this same code.
template <class St>
constexpr void offload_saved(St& s, std::size_t first) {
  using R = typename St::offload_record_type;
  auto& saved = s.saved;
  R rec;
  for (std::size_t i = first; i < saved.size(); ++i) {
    auto& a = saved[i];
    if (!a || St::is_hollow(a) || !St::owns(a)) continue;
    long holders = 0;
    for (std::size_t j = i; j < saved.size(); ++j) holders += saved[j] == a ? 1 : 0;
    if (holders != a.use_count()) continue;  // held outside S's slots too: moving it frees nothing
    if (rec.items.empty()) rec.fence.begin(s.offload_target());
    typename R::item it;
    it.rows = a->rows();
    it.cols = a->cols();
    it.host = s.copy_off(a, rec.fence);
    for (std::size_t j = i; j < saved.size(); ++j)
      if (saved[j] == a) it.slots.push_back(j);
    it.device = a;
    typename St::act_type const shape = s.hollow(it.rows, it.cols);
    for (std::size_t j : it.slots) saved[j] = shape;
    rec.items.push_back(std::move(it));
  }
  if (!rec.items.empty()) rec.fence.end();
  // Earlier segments' copies are done before anything that follows uses their device memory.
  for (auto& r : s.offloads) {
    if (!r.pending) continue;
    r.fence.wait();
    for (auto& it : r.items) it.device = nullptr;
    r.pending = false;
  }
  s.offloads.push_back(std::move(rec));
}

// Puts a record's tensors back into their slots: the device copies if still held, else copies
// from offloaded memory into new device memory (issued now, waited for by the record's backward).
template <class St>
constexpr void fetch_offloaded(St& s, typename St::offload_record_type& r) {
  if (r.fetched) return;
  r.fetched = true;
  if (!r.pending && !r.items.empty()) r.fence.begin(s.offload_target());
  for (auto& it : r.items) {
    typename St::act_type a;  // (not `pending ? device : copy_back(...)`: GCC 12 miscounts that at compile time)
    if (r.pending)
      a = std::move(it.device);
    else
      a = s.copy_back(it, r.fence);
    it.device = nullptr;
    it.host = {};
    for (std::size_t j : it.slots) s.saved[j] = a;
  }
  if (!r.pending && !r.items.empty()) r.fence.end();
  r.pending = false;
}

}  // namespace detail

// S's saved activations in host memory from the end of S's forward to the start of its backward:
// copied there on a side stream while the rest of the forward runs, and copied back, one
// Offloaded segment ahead, while the backward of the segment after it runs (memory/offload.hpp).
// The activation plan counts the device bytes (what stays until the copy is done, what comes back
// early) and, apart, the offloaded bytes. Values are untouched: gradients are bit for bit those of
// the stored model. On the host backend the copies are memcpy into a separate allocator and save
// nothing; they run so that the schedule is the one tested.
template <class S>
struct Offloaded : detail::wraps<S> {
  static_assert(not_a_segment<Offloaded, S>::ok);

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    std::size_t const first = s.saved.size();
    typename St::act_type y = S::forward(s, p, std::move(x));
    detail::offload_saved(s, first);
    return y;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    std::size_t const n = s.offloads.size();
    detail::fetch_offloaded(s, s.offloads[n - 1]);
    if (n >= 2) detail::fetch_offloaded(s, s.offloads[n - 2]);  // the next segment's, under this backward
    s.offloads[n - 1].fence.wait();
    s.offloads.pop_back();
    return S::backward(s, p, g, std::move(dy));
  }
};

}  // namespace REMAT_NAMESPACE
