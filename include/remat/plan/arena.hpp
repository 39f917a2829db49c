// The arena of a training step: every activation the step makes, and the loss's workspace, at an
// offset computed from the plan, so that what the step reserves is what the plan says.
//
// The activation plan (plan/activation.hpp) knows each tensor a step makes, its rounded size, and
// when it is made and freed (planning::counter's clock). Laying them out in one block is colouring the
// intervals of their lifetimes with addresses: two tensors alive at the same time must not
// overlap. No layout is smaller than the most bytes alive at once (the plan's peak of activations
// and workspace together: `lower_bound`). The smallest layout is NP-hard to find in general
// (dynamic storage allocation), so lay_out searches: first-fit (each tensor at the lowest offset
// free for its whole life) in three orders (largest first, made first, longest lived first), then
// from the best, repeatedly moves a tensor that reaches the top of the arena to the front of the
// order, until the layout meets the lower bound or the search's work runs out. Every model and
// batch the tests plan (stored, checkpointed, selective, revolve, mixed precision, GPT) meets it
// to the byte; where the search runs out the layout is still valid, only larger, and `size` says
// by how much.
//
// The model computes the layout at run time for each new batch shape (milliseconds), reserves the
// arena once, and serves make number k at offset k (pass_state::make). A make the plan did not
// foresee (a size or a lifetime that differs) is served by the caching allocator instead and
// counted (pass_report::unplanned): the arena is never written where a live tensor is.
//
// The layout is also a constant expression (arena_plan, memory_plan's `arena`); there the search
// stops sooner (the compilers' evaluation limits), so a compile-time arena is never smaller than
// the run-time one and equal to it whenever the shorter search already meets the lower bound.
#pragma once

#include "activation.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {

// Where each activation of a planned training pass goes in one arena, and the arena's size.
struct arena_layout {
  std::vector<std::size_t> offset;  // make number k of the pass is at offset[k] ...
  std::vector<std::size_t> bytes;   // ... and takes bytes[k] (rounded as the allocator rounds)
  std::size_t workspace_offset = 0;  // where the loss's workspace goes, while it runs
  std::size_t workspace_bytes = 0;   // the loss's workspace
  std::size_t size = 0;         // the arena's bytes
  std::size_t lower_bound = 0;  // the most activation and workspace bytes in use at once
};

// What a layout's sizes are, without the layout (a constant expression can return only this).
struct arena_size {
  std::size_t bytes = 0;        // the arena's bytes
  std::size_t lower_bound = 0;  // the most activation and workspace bytes in use at once
};

namespace detail {

struct arena_item {
  std::size_t bytes = 0, born = 0, died = 0;
  std::size_t offset = 0;
  int slot = -1;  // make number, or -1 for the loss's workspace
};

constexpr bool lifetimes_overlap(arena_item const& a, arena_item const& b) {
  return a.born < b.died && b.born < a.died;
}

// Places items in the given order, each at the lowest offset where it overlaps no placed item
// that is alive at the same time. Returns the arena's size. Two ways to the same placement: with
// `overlapping[i]` (the items whose lifetimes meet item i's) it sorts those placed by offset; with
// no lists (a constant expression, where sorting costs most), it walks every placed item in a
// list kept in offset order.
struct span {
  std::size_t begin, end;
};
constexpr std::size_t first_fit(std::vector<arena_item>& items, std::vector<std::vector<std::size_t>> const& overlapping,
                                std::vector<std::size_t> const& order, std::vector<char>& placed,
                                std::vector<span>& busy) {
  std::size_t size = 0;
  if (overlapping.empty()) {
    std::vector<std::size_t> by_offset;
    by_offset.reserve(items.size());
    for (std::size_t i : order) {
      arena_item& it = items[i];
      std::size_t at = 0;
      for (std::size_t j : by_offset) {
        arena_item const& o = items[j];
        if (!lifetimes_overlap(o, it)) continue;
        if (o.offset >= at + it.bytes) break;  // the gap before o fits
        if (o.offset + o.bytes > at) at = o.offset + o.bytes;
      }
      it.offset = at;
      std::size_t k = by_offset.size();
      by_offset.push_back(i);
      for (; k > 0 && items[by_offset[k - 1]].offset > at; --k) by_offset[k] = by_offset[k - 1];
      by_offset[k] = i;
      if (at + it.bytes > size) size = at + it.bytes;
    }
    return size;
  }
  placed.assign(items.size(), 0);
  for (std::size_t i : order) {
    arena_item& it = items[i];
    busy.clear();
    for (std::size_t j : overlapping[i])
      if (placed[j]) busy.push_back({items[j].offset, items[j].offset + items[j].bytes});
    std::sort(busy.begin(), busy.end(), [](span const& a, span const& b) { return a.begin < b.begin; });
    std::size_t at = 0;
    for (span const& b : busy) {
      if (b.begin >= at + it.bytes) break;  // the gap before b fits
      if (b.end > at) at = b.end;
    }
    it.offset = at;
    placed[i] = 1;
    if (at + it.bytes > size) size = at + it.bytes;
  }
  return size;
}

// The most bytes alive at once (a sweep over the lifetimes).
constexpr std::size_t most_alive(std::vector<arena_item> const& items) {
  std::vector<std::pair<std::size_t, std::int64_t>> events;  // (time, +bytes / -bytes); frees first
  for (arena_item const& it : items) {
    events.push_back({it.born, std::int64_t(it.bytes)});
    events.push_back({it.died, -std::int64_t(it.bytes)});
  }
  std::sort(events.begin(), events.end());
  std::int64_t live = 0, most = 0;
  for (auto const& e : events) {
    live += e.second;
    if (live > most) most = live;
  }
  return std::size_t(most);
}

// The best of three greedy orders, then a local search from it (below) until the layout meets
// the lower bound or its work runs out: in a constant expression 256 rounds or about 2^20
// lifetime comparisons (inside the compiler's limits), at run time 4096 rounds or about 2^28
// comparisons (a few milliseconds for a model of a few hundred activations).
constexpr arena_layout lay_out(std::vector<arena_item> items, std::size_t makes) {
  arena_layout r;
  r.offset.assign(makes, 0);
  r.bytes.assign(makes, 0);
  r.lower_bound = most_alive(items);
  std::size_t const n = items.size();
  bool compiling = false;  // (not `bool const c = is_constant_evaluated()`: that is always true)
  if (std::is_constant_evaluated()) compiling = true;
  // The work of one layout: the pairs of lifetimes that meet (at run time), or all pairs.
  std::size_t cost = n * n;
  std::vector<std::vector<std::size_t>> overlapping;
  if (!compiling) {
    overlapping.resize(n);
    cost = n;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        if (i != j && lifetimes_overlap(items[i], items[j])) {
          overlapping[i].push_back(j);
          ++cost;
        }
  }
  std::vector<char> placed;
  std::vector<span> busy;
  std::vector<std::size_t> order(n, 0), best_order;  // (not order(n): clang rejects libstdc++ 12's constexpr default-fill)
  std::vector<std::size_t> best_offsets(n, 0);
  std::size_t best = std::size_t(-1);
  auto keep = [&](std::size_t size) {
    best = size;
    best_order = order;
    for (std::size_t i = 0; i < n; ++i) best_offsets[i] = items[i].offset;
  };
  for (int rule = 0; rule < 3 && best > r.lower_bound; ++rule) {
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      arena_item const &x = items[a], &y = items[b];
      if (rule == 0 && x.bytes != y.bytes) return x.bytes > y.bytes;
      if (rule == 2 && x.died - x.born != y.died - y.born) return x.died - x.born > y.died - y.born;
      return x.born < y.born;  // (births are distinct: a total order)
    });
    std::size_t const size = first_fit(items, overlapping, order, placed, busy);
    if (size < best) keep(size);
  }
  // Then, from the best order: move an item that reaches the top of the arena to the front of
  // the order, and lay out again.
  // (A constant expression tries a prefix of what run time tries: its arena is never smaller.)
  std::size_t const rounds = compiling ? 256 : 4096, work = std::size_t(1) << (compiling ? 20 : 28);
  std::size_t const tries = n < 2 ? 0 : std::min<std::size_t>(rounds, work / cost);
  order = best_order;
  for (std::size_t i = 0; i < n; ++i) items[i].offset = best_offsets[i];
  for (std::size_t t = 0; t < tries && best > r.lower_bound; ++t) {
    std::size_t top = 0, reach = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (items[i].offset + items[i].bytes > reach) {
        reach = items[i].offset + items[i].bytes;
        top = i;
      }
    std::size_t const at = std::size_t(std::find(order.begin(), order.end(), top) - order.begin());
    std::rotate(order.begin(), order.begin() + std::ptrdiff_t(at), order.begin() + std::ptrdiff_t(at) + 1);
    std::size_t const size = first_fit(items, overlapping, order, placed, busy);
    if (size < best) keep(size);
  }
  r.size = n ? best : 0;
  for (std::size_t i = 0; i < n; ++i) {
    arena_item const& it = items[i];
    if (it.slot < 0) {
      r.workspace_offset = best_offsets[i];
      r.workspace_bytes = it.bytes;
    } else {
      r.offset[std::size_t(it.slot)] = best_offsets[i];
      r.bytes[std::size_t(it.slot)] = it.bytes;
    }
  }
  return r;
}

// The layout of what a planned pass made in `mem`.
constexpr arena_layout lay_out(planning::counter const& mem) {
  std::vector<arena_item> items;
  for (std::size_t k = 0; k < mem.made_ids.size(); ++k) {
    planning::buffer const& b = mem.buffers[std::size_t(mem.made_ids[k])];
    items.push_back({b.bytes, b.born, b.died == std::size_t(-1) ? mem.clock : b.died, 0, int(k)});
  }
  if (mem.workspace_bytes) items.push_back({mem.workspace_bytes, mem.workspace_born, mem.workspace_died, 0, -1});
  return lay_out(static_cast<std::vector<arena_item>&&>(items), mem.made_ids.size());
}

template <class Net, class Precision>
constexpr arena_layout plan_arena(std::size_t batch, std::size_t features, std::size_t sequence, input_gradient dx,
                                  std::size_t loss_workspace) {
  planning::counter mem;
  plan_pass_into<Net, Precision>(mem, batch, features, sequence, dx, loss_workspace);
  return lay_out(mem);
}

}  // namespace detail

// The arena of a training step of model<Net, Device, Precision> on `batch` rows (sequences of
// `sequence` positions) whose loss allocates `loss_workspace` bytes of workspace: its size, and
// the lower bound it is measured against. A constant expression:
//
//   static_assert(remat::arena_plan<Net>(256).bytes == remat::arena_plan<Net>(256).lower_bound);
template <class Net, class Precision = fp32>
constexpr arena_size arena_plan(std::size_t batch, std::size_t features = Net::in_width, std::size_t sequence = 1,
                                input_gradient dx = input_gradient::none, std::size_t loss_workspace = 0) {
  detail::check_plan_shape<Net>("remat::arena_plan", batch, features, sequence, true, dx);
  arena_layout const l = detail::plan_arena<Net, Precision>(batch, features, sequence, dx, loss_workspace);
  return {l.size, l.lower_bound};
}

}  // namespace REMAT_NAMESPACE
