// The pages a rank of a sharded data-parallel run holds (remat::dist::data_parallel): of its
// gradient buffer under ZeRO-2 (options::shard_gradients), of its master weights under
// shard_master_weights, and under ZeRO-3 of the compute copy and the gather buffers. One set of
// rules for the wrapper's plan, made at run time from the buffers' addresses, and for
// memory_plan's, made before there are any: a GPU buffer lives in granules of the wrapper's that
// start on a granule's boundary, so there both plans are the same bytes; where a host buffer
// starts within its page is known at run time only, so memory_plan counts there at most what any
// start would hold (pages_bound).
#pragma once

#include "../memory/backed_buffer.hpp"
#include "../pass/gradient_sync.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace REMAT_NAMESPACE {
namespace detail {

// The pages of span sp held between passes by a rank that keeps [lo, hi): those touching it, those
// that lie partly outside the buffer (shared with other memory, never given back) and those marked
// in `also` (by page; null: none), in bytes.
constexpr std::size_t held_pages(page_span const& sp, std::size_t lo, std::size_t hi,
                                 std::vector<char> const* also = nullptr) {
  std::size_t pages = 0;
  for (std::size_t k = 0; k < sp.count(); ++k)
    pages += !sp.inside(k) || sp.touches(k, lo, hi) || (also && (*also)[k]);
  return pages * sp.page;
}

// The most pages a range of `bytes` touches, wherever it starts: one more than it fills.
constexpr std::size_t page_bound(std::size_t bytes, std::size_t page) {
  return ((bytes + page - 1) / page + 1) * page;
}

// The most pages any start of a buffer of `count` elements of `element` bytes holds of it when
// it keeps elements `ranges` (empty ones too: a page around the point) and the two pages at its
// ends, which it shares with other memory: the ranges that meet taken as one, each touching one
// page more than it fills; never more than the whole buffer can touch.
constexpr std::size_t pages_bound(std::vector<param_range> ranges, std::size_t count, std::size_t element,
                                  std::size_t page) {
  std::sort(ranges.begin(), ranges.end(), [](param_range a, param_range b) { return a.begin < b.begin; });
  std::size_t held = 2 * page;
  for (std::size_t i = 0; i < ranges.size();) {
    param_range one = ranges[i++];
    while (i < ranges.size() && ranges[i].begin <= one.end) one.end = std::max(one.end, ranges[i++].end);
    held += page_bound(one.size() * element, page);
  }
  return std::min(held, page_bound(count * element, page));
}

// The pages of span sp that a pass keeping the parameters it gathers (ZeRO-3's
// keep_parameters_for_backward) holds at its end: those touching any frame's (`events`, the plan
// walk's), by page.
constexpr std::vector<char> gathered_pages(page_span const& sp, std::vector<pass_event> const& events) {
  std::vector<char> gathered(sp.count(), 0);
  for (pass_event const& e : events)
    if (e.what == pass_event::kind::gather && e.range.size())
      std::fill(gathered.begin() + std::ptrdiff_t(sp.page_of(sp.at(e.range.begin))),
                gathered.begin() + std::ptrdiff_t(sp.page_of(sp.at(e.range.end) - 1) + 1), 1);
  return gathered;
}

// The most parameters one frame of a pass gathers (`events`, the plan walk's): what ZeRO-3's
// gather buffers hold.
constexpr std::size_t largest_gather(std::vector<pass_event> const& events) {
  std::size_t largest = 0;
  for (pass_event const& e : events)
    if (e.what == pass_event::kind::gather) largest = std::max(largest, e.range.size());
  return largest;
}

// The parameters of `element` bytes a gradient bucket of about `bucket_bytes` holds
// (options::bucket_bytes): at least one, and within one message's count (2^30, within an int).
constexpr std::size_t gradient_bucket_size(std::size_t bucket_bytes, std::size_t element) {
  return std::max<std::size_t>(1, std::min(bucket_bytes / element, std::size_t(1) << 30));
}

// The buckets a data-parallel wrapper reduces the gradients of `count` parameters in, at most
// `per` each, from the buffer's end (backward finishes the last layers first).
constexpr std::vector<param_range> gradient_bucket_ranges(std::size_t count, std::size_t per) {
  std::vector<param_range> buckets;
  for (std::size_t e = count; e > 0;) {
    std::size_t const b = e > per ? e - per : 0;
    buckets.push_back({b, e});
    e = b;
  }
  return buckets;
}

// The pages of a ZeRO-2 rank's gradient buffer held while backward has written down to `touched`
// and the buckets from `released` up are reduced: a page is given back when it lies wholly in the
// buffer, holds nothing of the rank's shard (or the shard goes to a sink on the host, `sunk`), and
// lies wholly below `touched` or wholly at or above `released`.
constexpr std::size_t held_gradient_pages(page_span const& span, param_range shard, bool sunk, std::size_t touched,
                                          std::size_t released) {
  std::size_t count = 0;
  auto const page = std::uintptr_t(span.page);
  for (std::uintptr_t p = span.first; p < span.first + span.whole; p += page) {
    bool const inside = p >= span.begin && p + page <= span.end;
    bool const shard_free = sunk || shard.size() == 0 || p + page <= span.at(shard.begin) || p >= span.at(shard.end);
    bool const given = inside && shard_free && (p + page <= span.at(touched) || p >= span.at(released));
    count += !given;
  }
  return count * span.page;
}

// The most of a ZeRO-2 rank's gradient buffer of `count` parameters held at once during a pass:
// backward's reports (`reports`, the plan's, with the model's own 0 last) replayed through the
// wrapper's rules, the buckets (gradient_bucket_ranges) starting as they become final and each
// given back once the next report has come. `held(touched, released)`: the bytes held at a report.
template <class Held>
constexpr std::size_t sharded_gradient_peak(std::vector<std::size_t> const& reports,
                                            std::vector<param_range> const& buckets, std::size_t count,
                                            Held const& held) {
  std::size_t released = count, low = count, next = 0, peak = 0;
  bool in_flight = false;
  for (std::size_t r : reports) {
    std::size_t const now = held(r, released);
    peak = now > peak ? now : peak;
    if (in_flight) released = low;
    in_flight = false;
    while (next < buckets.size() && buckets[next].begin >= r) {
      low = buckets[next++].begin;
      in_flight = true;
    }
  }
  return peak;
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
