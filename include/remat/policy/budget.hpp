// Budget<Bytes, Batch, S, Sequence = 1>: the storage of S chosen at compile time so that a training
// step of S at `Batch` rows (of `Sequence` positions each) keeps at most `Bytes` of activations,
// with the least recomputation that allows. S is a chain Repeat<N, B>, or a Seq with one such
// chain among its layers (an embedding before it, a head after it); the layers around the chain
// are stored, and the chain runs one of these:
//
//   blocks(a, b)   the first a blocks Checkpointed, the next b Selective, the rest stored
//                  (a from 0 to N with b either 0 or N - a; and a = 0 with b from 1 to N - 1)
//   revolve(C)     the binomial schedule with C slots (Revolve<C, Repeat<N, B>>), C from 1 to N - 1
//
// Blocks at the start of the chain are the ones recomputed: their backward runs last, when the
// later blocks' activations are already freed. Every candidate is planned at compile time (its
// activation peak, exactly as activation_plan counts it, and its work), and the budget policy
// runs the one of least work whose peak fits; among equal work, the smaller peak. A budget below every candidate's peak
// fails to compile: `budget_below_minimum<Bytes, Smallest>` names the smallest feasible budget.
//
// The cost model: the work of a step is the multiply-adds of its matrix products (Linear's, and
// the attention core's Q K^T and P V) plus one per element of every tensor the step makes (the
// point-wise layers' outputs, norms, dropout masks, gradients). A product a recomputation skips or
// takes back from a selective forward costs nothing. The backward's work is the same for every
// candidate, so the work minimised is the recomputation's. (The model counts an element as one
// multiply-add; on a CPU a point-wise pass costs more per element than that, so Selective's
// recomputation is cheaper in the model than on the clock: 0.1% against 2-3% of a step in
// bench/results/budget-host.md.) Since the chosen candidate is the
// cheapest among those that fit, a larger budget never chooses more work (the set that fits only
// grows), and a budget that fits Revolve<C>'s peak recomputes no more than Revolve<C>.
//
// The budget holds for the whole step when Budget is the model's graph (then the model's
// activation plan at Batch is the chosen candidate's peak); inside a larger graph it is that of S
// alone, as if S were the model. Training at more than Batch x Sequence rows (or longer
// sequences) is refused: the plan's peak grows with the batch. Values and gradients are bit for bit
// those of the stored model, like every policy's.
#pragma once

#include "../plan/state.hpp"
#include "checkpoint_sequential.hpp"
#include "checkpointed.hpp"
#include "revolve.hpp"
#include "selective.hpp"
#include "wraps.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

// One way to store the chain, and what its plan says.
struct budget_choice {
  // blocks: the first blocks checkpointed, the next Selective, the rest stored; revolve: the
  // binomial schedule.
  enum kind_type : std::uint8_t { blocks, revolve };
  kind_type kind = blocks;  // which of the two
  std::uint32_t checkpointed = 0;  // blocks: the first ones, each checkpointed
  std::uint32_t selective = 0;     // blocks: the next ones, each Selective
  std::uint32_t slots = 0;         // revolve: block inputs kept at once
  std::size_t peak = 0;            // the step's activation peak, as activation_plan counts it
  std::uint64_t work = 0;          // the step's work in the cost model above
  std::uint64_t recomputed = 0;    // block forwards run again
  std::size_t saved = 0;           // activation bytes kept when the forward ends
  constexpr bool operator==(budget_choice const&) const = default;  // the same choice and plan
};

// Fails to compile, naming the budget given and the smallest that fits, when nothing fits.
template <std::size_t Bytes, std::size_t Smallest>
struct budget_below_minimum {
  static constexpr bool ok = Bytes >= Smallest;  // (true: the assertion passed)
  static_assert(ok,
                "remat::Budget<Bytes, Batch, S>: no way to store S fits Bytes of activations at this batch; "
                "budget_below_minimum<Bytes, Smallest> names the budget given and the smallest that fits");
};

// Fails to compile, naming the type given, when a Budget wraps something without one Repeat chain.
template <class S>
struct budget_needs_a_chain {
  static constexpr bool ok = sizeof(S*) == 0;  // always false, once instantiated
  static_assert(ok,
                "remat::Budget<Bytes, Batch, S>: S must be a Repeat<N, Block>, or a Seq with exactly one "
                "Repeat<N, Block> among its layers; budget_needs_a_chain<S> names the type given");
};

namespace detail {

template <class L>
inline constexpr bool is_repeat_v = false;
template <std::size_t N, class B>
inline constexpr bool is_repeat_v<Repeat<N, B>> = true;

// Where the chain is in S: the layers before it, the chain, the layers after it.
template <class S>
struct budget_split {
  static constexpr bool ok = budget_needs_a_chain<S>::ok;
};
template <std::size_t N, class B>
struct budget_split<Repeat<N, B>> {
  static constexpr bool ok = true;
  static constexpr std::size_t count = N;
  using block = B;
  using before = void;
  using after = void;
  static constexpr std::size_t chain_at = 0, after_at = N * B::param_count;
};
template <class... L>
struct budget_split<Seq<L...>> {
  static constexpr std::size_t n = sizeof...(L);
  static constexpr std::size_t repeats = (std::size_t(is_repeat_v<L>) + ...);
  static constexpr bool ok = [] {
    if constexpr (repeats == 1)
      return true;
    else
      return budget_needs_a_chain<Seq<L...>>::ok;
  }();
  static constexpr std::size_t at = [] {
    constexpr bool is[] = {is_repeat_v<L>...};
    for (std::size_t i = 0; i < n; ++i)
      if (is[i]) return i;
    return std::size_t(0);
  }();
  using chain = nth<at, L...>;
  static constexpr std::size_t count = chain::count;
  using block = typename chain::block;
  using before = std::conditional_t<(at > 0), seq_slice<Seq<L...>, 0, (at > 0 ? at : 1)>, void>;
  using after = std::conditional_t<(at + 1 < n), seq_slice<Seq<L...>, (at + 1 < n ? at + 1 : n - 1), n>, void>;
  static constexpr std::size_t chain_at = Seq<L...>::offsets[at], after_at = Seq<L...>::offsets[at + 1];
};

// S's training forward and backward with the chain stored as `c` says (a revolve schedule in
// `schedule` for kind::revolve). The same code plans a candidate and runs the chosen one.
template <class S>
struct budget_runner {
  using split = budget_split<S>;
  using B = typename split::block;
  static constexpr std::size_t N = split::count;
  static constexpr std::size_t stride = B::param_count;

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x,
                                                 budget_choice const& c, revolve::action const* schedule,
                                                 std::size_t schedule_size) {
    using A = typename St::act_type;
    if constexpr (!std::is_void_v<typename split::before>) x = split::before::forward(s, p, std::move(x));
    typename St::param_ptr const q = p + split::chain_at;
    if (c.kind == budget_choice::revolve) {
      A unused;
      revolve_run<B>(s, q, typename St::grad_ptr{}, x, unused, schedule, 0, forward_end(schedule, schedule_size),
                     nullptr);
    } else {
      for (std::size_t k = 0; k < N; ++k) {
        if (k < c.checkpointed) {
          x = checkpoint_forward(s, std::move(x),
                                 [&](A in) { return forward_blocks<B>(s, q, std::move(in), k, k + 1); });
        } else if (k < std::size_t(c.checkpointed) + c.selective) {
          if constexpr (!handles_hollow_v<B>) s.need_input();
          auto const frame = trace_layer<B>(s, k, false);
          auto const gathered = gather_frame<Selective<B>>(s, q + k * stride);
          x = Selective<B>::forward(s, gathered.at(q + k * stride), std::move(x));
        } else {
          x = forward_blocks<B>(s, q, std::move(x), k, k + 1);
        }
      }
    }
    if constexpr (!std::is_void_v<typename split::after>)
      x = split::after::forward(s, p + split::after_at, std::move(x));
    return x;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy, budget_choice const& c,
                                                  revolve::action const* schedule, std::size_t schedule_size) {
    using A = typename St::act_type;
    if constexpr (!std::is_void_v<typename split::after>)
      dy = split::after::backward(s, p + split::after_at, g + split::after_at, std::move(dy));
    typename St::param_ptr const q = p + split::chain_at;
    typename St::grad_ptr const h = g + split::chain_at;
    if (c.kind == budget_choice::revolve) {
      A current;
      auto again = s.recompute_from(s.rng_offset());
      revolve_run<B>(s, q, h, current, dy, schedule, forward_end(schedule, schedule_size), schedule_size, &again);
    } else {
      for (std::size_t k = N; k-- > 0;) {
        if (k < c.checkpointed) {
          checkpoint_recompute(s, [&](A in) { return forward_blocks<B>(s, q, std::move(in), k, k + 1); });
          s.count_recomputed(blocks_in<B>());
          dy = backward_blocks<B>(s, q, h, std::move(dy), k, k + 1);
        } else if (k < std::size_t(c.checkpointed) + c.selective) {
          auto const frame = trace_layer<B>(s, k, true);
          auto const gathered = gather_frame<Selective<B>>(s, q + k * stride);
          dy = Selective<B>::backward(s, gathered.at(q + k * stride), h + k * stride, std::move(dy));
          if constexpr (B::param_count > 0) s.grads_ready(h + k * stride);
        } else {
          dy = backward_blocks<B>(s, q, h, std::move(dy), k, k + 1);
        }
      }
    }
    if constexpr (!std::is_void_v<typename split::before>) dy = split::before::backward(s, p, g, std::move(dy));
    return dy;
  }

  static constexpr std::size_t forward_end(revolve::action const* schedule, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i)
      if (schedule[i].what == revolve::op::reverse) return i;
    return size;
  }

  // The plan of candidate c: a training step of S as the whole model (the caller's input read in
  // place, converted first when T is 16-bit; no input gradient), in T.
  template <class T>
  static constexpr budget_choice planned(budget_choice c, std::size_t rows, std::size_t sequence) {
    planning::counter mem, offloaded;
    {
      pass_options o{.training = true, .sequence_length = sequence, .input_gradient = false};
      if constexpr (reads_ids_v<S>) o.ids.count = rows;
      planning::state<T> s(mem, offloaded, o);
      planning::ref x;
      if constexpr (!reads_ids_v<S>) {
        if constexpr (is_small_float_v<T>)
          x = s.convert(planning::input_shape{rows, S::in_width});
        else
          x = s.borrow(planning::input_shape{rows, S::in_width});
        s.mark_pass_input(x);
      }
      std::vector<revolve::action> schedule;
      if (c.kind == budget_choice::revolve) schedule = revolve::schedule_list(std::uint32_t(N), c.slots);
      planning::ref y = forward(s, planning::no_params{}, std::move(x), c, schedule.data(), schedule.size());
      s.forward_done(y);
      planning::ref dy = s.make(y->rows(), y->cols());
      y.reset();
      backward(s, planning::no_params{}, planning::no_params{}, std::move(dy), c, schedule.data(), schedule.size()).reset();
      c.work = s.work();
      c.recomputed = s.recomputed();
      c.saved = s.saved_bytes();
    }
    c.peak = mem.peak;
    return c;
  }

  // Every candidate, planned (stored first).
  template <class T>
  static constexpr std::vector<budget_choice> candidates(std::size_t rows, std::size_t sequence) {
    std::vector<budget_choice> out;
    for (std::uint32_t a = 0; a <= N; ++a) {
      out.push_back(planned<T>({.kind = budget_choice::blocks, .checkpointed = a}, rows, sequence));
      if (a < N)
        out.push_back(planned<T>({.kind = budget_choice::blocks, .checkpointed = a, .selective = std::uint32_t(N - a)},
                                 rows, sequence));
    }
    for (std::uint32_t b = 1; b < N; ++b)
      out.push_back(planned<T>({.kind = budget_choice::blocks, .selective = b}, rows, sequence));
    for (std::uint32_t slots = 1; slots < N; ++slots)
      out.push_back(planned<T>({.kind = budget_choice::revolve, .slots = slots}, rows, sequence));
    return out;
  }

  // The cheapest candidate whose peak is at most `bytes` (peak 0 and work 0 when none fits).
  static constexpr budget_choice cheapest(std::vector<budget_choice> const& all, std::size_t bytes) {
    budget_choice best{};
    bool found = false;
    for (budget_choice const& c : all) {
      if (c.peak > bytes) continue;
      if (!found || c.work < best.work || (c.work == best.work && c.peak < best.peak)) best = c;
      found = true;
    }
    return found ? best : budget_choice{};
  }

  static constexpr std::size_t smallest_peak(std::vector<budget_choice> const& all) {
    std::size_t m = all[0].peak;
    for (budget_choice const& c : all) m = c.peak < m ? c.peak : m;
    return m;
  }

  // The i-th member of a family of candidates, ordered by work (least first) and so by peak (most
  // first): checkpointed heads before stored blocks (i blocks checkpointed), before selective ones
  // (i checkpointed, the rest selective), selective heads before stored blocks (i selective), and
  // revolve (N - 1 - i slots).
  static constexpr std::size_t family_size(int f) { return f == 0 ? N + 1 : f == 1 ? N : N - 1; }
  static constexpr budget_choice member(int f, std::size_t i) {
    auto const k = std::uint32_t(i);
    switch (f) {
      case 0:
        return {.kind = budget_choice::blocks, .checkpointed = k};
      case 1:
        return {.kind = budget_choice::blocks, .checkpointed = k, .selective = std::uint32_t(N - k)};
      case 2:
        return {.kind = budget_choice::blocks, .selective = k + 1};
      default:
        return {.kind = budget_choice::revolve, .slots = std::uint32_t(N - 1 - k)};
    }
  }

  // What Budget runs: the cheapest fitting candidate of each family found by bisection (a family's
  // peak falls as its work grows), then the cheapest of those: the same choice as cheapest() over
  // every candidate while each family's peaks are ordered (tests/plan/test_budget.cpp compares
  // the two), from about 4 log2(N) plans instead of 4N. Peak 0 when none fits.
  template <class T>
  static constexpr budget_choice search(std::size_t bytes, std::size_t rows, std::size_t sequence) {
    budget_choice best{};
    bool found = false;
    for (int f = 0; f < (N > 1 ? 4 : 1); ++f) {
      std::size_t lo = 0, hi = family_size(f);  // the first member that fits is in [lo, hi]
      budget_choice fit{};
      while (lo < hi) {
        std::size_t const mid = lo + (hi - lo) / 2;
        budget_choice const c = planned<T>(member(f, mid), rows, sequence);
        if (c.peak <= bytes) {
          hi = mid;
          fit = c;
        } else {
          lo = mid + 1;
        }
      }
      if (lo == family_size(f)) continue;  // none of the family fits (else `fit` is member lo, planned)
      if (!found || fit.work < best.work || (fit.work == best.work && fit.peak < best.peak)) best = fit;
      found = true;
    }
    return found ? best : budget_choice{};
  }

  // The smallest peak of any candidate: each family's last member (its least memory).
  template <class T>
  static constexpr std::size_t lowest(std::size_t rows, std::size_t sequence) {
    std::size_t m = planned<T>(member(0, family_size(0) - 1), rows, sequence).peak;
    if constexpr (N > 1) {
      std::size_t const r = planned<T>(member(3, family_size(3) - 1), rows, sequence).peak;
      m = r < m ? r : m;
    }
    return m;
  }
};

template <std::size_t Bytes, std::size_t Batch, std::size_t Sequence, class... C>
struct budget_rebuild;

}  // namespace detail

template <std::size_t Bytes, std::size_t Batch, class S, std::size_t Sequence = 1>
struct Budget : wraps<S> {
  static_assert(not_a_segment<Budget, S>::ok);
  static_assert(detail::budget_split<S>::ok);
  static_assert(Batch >= 1 && Sequence >= 1,
                "remat::Budget<Bytes, Batch, S, Sequence>: Batch and Sequence must be at least 1");
  // The same budget around another segment (what a policy that rewrites the graph builds).
  template <class... C>
  using rebuild = typename detail::budget_rebuild<Bytes, Batch, Sequence, C...>::type;

  using runner = detail::budget_runner<S>;  // how S's chain is run under a choice
  static constexpr std::size_t budget_bytes = Bytes;  // the activation bytes a step may peak at
  static constexpr std::size_t batch = Batch;         // the batch planned for
  static constexpr std::size_t sequence = Sequence;   // the sequence length planned for (1: none)
  static constexpr std::size_t rows = Batch * Sequence;  // the rows of a training pass planned for
  // The rows a model checks a training pass against before it starts (planned_rows_v).
  static constexpr std::size_t planned_rows = rows;
  // The sequence length a model checks a training pass against (planned_sequence_v).
  static constexpr std::size_t planned_sequence = Sequence;

  // Every candidate for activations of type T, planned.
  template <class T>
  static constexpr std::vector<budget_choice> candidates() {
    return runner::template candidates<T>(rows, Sequence);
  }
  // The smallest activation budget any candidate fits, for activations of type T.
  template <class T>
  static constexpr std::size_t minimum = runner::template lowest<T>(rows, Sequence);

 private:
  template <class T, int F, std::size_t I>
  static constexpr budget_choice plan_of = runner::template planned<T>(runner::member(F, I), rows, Sequence);

  // The plan of the first member of family F in [Lo, Hi] that fits (none when Lo = Hi = the size).
  template <class T, int F, std::size_t Lo, std::size_t Hi>
  struct first_fit {
    static constexpr budget_choice value = [] {
      if constexpr (Lo == Hi) {
        if constexpr (Hi == runner::family_size(F))
          return budget_choice{};
        else
          return plan_of<T, F, Hi>;
      } else {
        constexpr std::size_t mid = Lo + (Hi - Lo) / 2;
        if constexpr (plan_of<T, F, mid>.peak <= Bytes)
          return first_fit<T, F, Lo, mid>::value;
        else
          return first_fit<T, F, mid + 1, Hi>::value;
      }
    }();
  };

  template <class T, std::size_t... F>
  static constexpr budget_choice cheapest_of(std::index_sequence<F...>) {
    budget_choice best{};
    for (budget_choice const& c : {first_fit<T, int(F), 0, runner::family_size(int(F))>::value...})
      if (c.peak > 0 && (best.peak == 0 || c.work < best.work || (c.work == best.work && c.peak < best.peak))) best = c;
    return best;
  }

 public:
  // What the chain does with activations of type T (float; half or bfloat16 in mixed precision):
  // runner::search's bisection, with each plan a constant of its own (a compiler bounds the work
  // of one constant expression: GCC's -fconstexpr-ops-limit, clang's -fconstexpr-steps). The
  // minimum is planned only when nothing fits (Revolve with one slot is the costliest plan).
  template <class T>
  static constexpr budget_choice chosen = [] {
    constexpr budget_choice c = cheapest_of<T>(std::make_index_sequence<(runner::N > 1 ? 4 : 1)>{});
    if constexpr (c.peak == 0) static_assert(budget_below_minimum<Bytes, minimum<T>>::ok);
    return c;
  }();

  // Runs S's chain as chosen<T> says (all of S when nothing is kept).
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    using T = typename St::value_type;
    check_shape(s, x);
    auto const& schedule = schedule_of<T>();
    return runner::forward(s, p, std::move(x), chosen<T>, schedule.data(), schedule.size());
  }

  // S's backward under the choice: recomputing what chosen<T> did not keep.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    using T = typename St::value_type;
    auto const& schedule = schedule_of<T>();
    return runner::backward(s, p, g, std::move(dy), chosen<T>, schedule.data(), schedule.size());
  }

 private:
  static constexpr std::array<revolve::action, 0> no_schedule{};

  template <class T>
  static constexpr auto const& schedule_of() {
    if constexpr (chosen<T>.kind == budget_choice::revolve)
      return revolve::schedule<runner::N, chosen<T>.slots>;
    else
      return no_schedule;
  }

  template <class St>
  static constexpr void check_shape(St& s, typename St::act_type const& x) {
    std::size_t const n = reads_ids_v<S> ? s.ids().count : x->rows();
    if (n > rows || s.sequence_length() > Sequence)
      detail::raise<argument_error>("remat::Budget: planned for at most ", Batch, " x ", Sequence,
                                    " rows (batch x sequence) within ", Bytes, " bytes of activations, found ", n,
                                    " rows of sequences of ", s.sequence_length());
  }
};

namespace detail {
template <std::size_t Bytes, std::size_t Batch, std::size_t Sequence, class S>
struct budget_rebuild<Bytes, Batch, Sequence, S> {
  using type = Budget<Bytes, Batch, S, Sequence>;
};
}  // namespace detail

}  // namespace REMAT_NAMESPACE
