// ZeRO-3 (options::shard_parameters): a rank keeps its shard of the parameters only (in mixed
// precision, of the master weights and of their compute copy both: memory/backed_buffer.hpp gives
// back the rest; of the master weights also where host_master_weights put them, in the block of a
// host allocator, which OffloadedAdamW updates there: a GPU model's in host memory, beside the
// compute copy's shard in the device's granules). Every frame of the walk
// that runs a layer says which parameters it reads; they are all-gathered into one of two gather
// buffers of the wrapper's (as large as the largest frame's parameters, by the plan walk), the
// next frame's already on its way into the other (options::prefetch_parameters); or, with
// options::keep_parameters_for_backward, into the model's own pages, kept until the pass ends.
// The plan of the pass's frames (what comes after each) and of the most held at once is made as
// the wrapper is built.
#pragma once

#include "../memory/backed_buffer.hpp"
#include "../plan/activation.hpp"
#include "../plan/rank_pages.hpp"
#include "state.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

using REMAT_NAMESPACE::detail::pass_event;

// For each of a pass's gathers and reports (its events but the frames' ends, in order), the
// parameters of the next gather after it (empty: none).
inline std::vector<param_range> gathers_ahead(std::vector<pass_event> const& events) {
  std::vector<param_range> ahead;
  for (pass_event const& e : events)
    if (e.what != pass_event::kind::done) ahead.push_back(e.what == pass_event::kind::gather ? e.range : param_range{});
  param_range next{};
  for (std::size_t i = ahead.size(); i-- > 0;) {
    param_range const own = ahead[i];
    ahead[i] = next;
    if (own.size()) next = own;
  }
  return ahead;
}

template <class Model, class Transport>
class parameter_shard {
 public:
  using C = typename Model::compute_type;
  using device = typename Model::device;
  // A gather buffer and what it holds.
  struct gather_slot {
    page_buffer<device, C> buffer;
    param_range holds{};        // the parameters it holds, or receives (empty: none)
    std::uint64_t version = 0;  // the model's parameter_version when they were gathered
    bool in_flight = false;     // a gather into it started, not waited for yet
  };

  explicit parameter_shard(dp_state<Model, Transport>& s) : s_(s) {}

  // The parameter buffer's pages, the passes' frames (the model's plan walk), the gather buffers
  // and the plan of the most held at once: the pages of the model's buffer that touch this rank's
  // shard or lie partly outside the buffer, and the gather buffers'.
  void plan() {
    bool const sharded = s_.opts.shard_parameters;
    if constexpr (dp_state<Model, Transport>::on_gpu) host_master_ = s_.model.master_on_host() && s_.shards_master();
    if (host_master_)
      host_params_.place(s_.parameter_base(), n, s_.shards_master());
    else
      params_.place(s_.parameter_base(), n, s_.shards_master());
    if constexpr (Model::mixed_precision) compute_.place(s_.compute_base(), n, sharded);
    // (the GPU: the master weights, unless in host memory, and under ZeRO-3 the compute copy move
    // into the granules)
    if constexpr (dp_state<Model, Transport>::on_gpu)
      if (s_.shards_master())
        s_.model.relocate_parameters(static_cast<T*>(params_.device_data()), static_cast<C*>(compute_.device_data()));
    if (partial() && !s_.gathers_parameters()) {  // (the master weights' shard and the whole compute copy)
      planned_peak_ = held_of(master_span()) + compute_.span.whole;
      return;
    }
    if (!s_.gathers_parameters() || n == 0 || !read_copy().span.page) return;
    using net = typename Model::net;
    using precision = typename Model::precision;
    events_ = REMAT_NAMESPACE::detail::pass_events<net, precision>();
    ahead_ = gathers_ahead(events_);
    for (bool training : {false, true}) {
      forward_[training] = REMAT_NAMESPACE::detail::forward_events<net, precision>(training);
      forward_ahead_[training] = gathers_ahead(forward_[training]);
    }
    std::size_t const largest = REMAT_NAMESPACE::detail::largest_gather(events_);
    // (a prefetch's buffer too; both are touched now, so that what they hold is taken as the
    // wrapper is built, not in the middle of a pass; none when passes gather into the model's pages)
    int const buffers = s_.opts.keep_parameters_for_backward ? 0 : s_.opts.prefetch_parameters ? 2 : 1;
    for (int b = 0; b < buffers; ++b)
      slots_[b].buffer.allocate(largest * sizeof(C), read_copy().span.page,
                                "data_parallel: the gather buffer (the largest layer's parameters)");
    // A training pass that keeps what it gathers (keep_parameters_for_backward) holds, at its end,
    // the pages of every frame's parameters too, in the copy layers read.
    page_span const& read = read_copy().span;
    std::vector<char> const gathered = s_.opts.keep_parameters_for_backward
                                           ? REMAT_NAMESPACE::detail::gathered_pages(read, events_)
                                           : std::vector<char>(read.count(), 0);  // (by page)
    auto const held = [&](page_span const& sp) { return held_of(sp, &sp == &read ? &gathered : nullptr); };
    planned_peak_ = held(master_span()) + held(compute_.span) + slots_[0].buffer.bytes + slots_[1].buffer.bytes;
  }

  // What dist::data_parallel::parameter_pages() reports.
  gradient_memory memory() const {
    gradient_memory g{master_span().whole + compute_.span.whole, planned_peak_, last_peak_, held_bytes()};
    if (!partial()) g.planned_peak = g.whole;
    return g;
  }
  backed_buffer<device>& master() { return params_; }  // (a GPU model's master weights on the device)
  // As the wrapper goes: a GPU model's master weights in host memory have every page writable
  // again (the pages given back read as zero; REMAT_DIST_STRICT_PAGES made them read-only).
  void restore_host_master() noexcept {
    if (!host_master_) return;
    try {
      host_params_.commit(0, n);
    } catch (...) {
    }
  }
  // The master weights' pages [lo, hi) are taken again (before something writes them).
  void commit_master(std::size_t lo, std::size_t hi) const {
    if (host_master_)
      host_params_.commit(lo, hi);
    else
      params_.commit(lo, hi);
  }
  backed_buffer<device>& compute() { return compute_; }
  gather_slot* slots() { return slots_; }
  // The model's buffer holds every parameter (after a broadcast or a gather, until released).
  bool whole() const { return whole_; }
  // Between passes this rank holds its shard of the master weights only (more than one rank).
  bool partial() const { return s_.shards_master() && s_.size() > 1; }
  void set_whole() { whole_ = true; }
  // A training pass's gathers and reports by the plan, and a pass outside training's (inference,
  // training mode).
  std::vector<pass_event> const& training_events() const { return events_; }
  std::vector<pass_event> const& forward_events(int training) const { return forward_[training]; }

  // ---- where a pass stands: of its gathers and reports, those this rank took part in
  std::size_t taken = 0;
  int collective = -1;  // a pass outside training running: which (0 inference, 1 training mode; -1: none)

  void pass_starting() {
    pass_peak_ = 0;
    taken = 0;
  }
  void pass_succeeded() { last_peak_ = std::max(pass_peak_, held_bytes()); }

  // Parameters [offset, offset + count) for a layer to read: null when they are in the model's own
  // pages (kept for the pass), or the gather buffer that holds them; then the next frame's, by the
  // plan, start into the other buffer (prefetch).
  void const* needed(std::size_t offset, std::size_t count) {
    param_range const r{offset, offset + count};
    // The pass's frames by the plan: what comes after this one.
    std::vector<param_range> const* ahead =
        s_.inside ? &ahead_ : collective >= 0 ? &forward_ahead_[collective] : nullptr;
    std::size_t const index = taken;  // (this frame's place among the pass's gathers and reports)
    if (ahead) ++taken;
    bool const prefetch_next = s_.opts.prefetch_parameters && ahead && index < ahead->size();
    if (ahead && s_.opts.keep_parameters_for_backward) {  // (in the model's own pages, until the pass ends)
      keep(r, false);
      if (prefetch_next && (*ahead)[index].size()) keep((*ahead)[index], true);
      note_peak();
      return nullptr;
    }
    int const b = bring(r);
    reading_ = b;
    if (prefetch_next) prefetch((*ahead)[index], 1 - b);
    note_peak();
    return slots_[b].buffer.data;
  }
  // A layer has run: a prefetch in flight is moved on (MPI progresses inside MPI calls; a failure
  // shows at its wait).
  void layer_done() noexcept {
    if (!s_.gathers || !s_.gathers->busy()) return;
    try {
      s_.gathers->progress();
    } catch (...) {
    }
  }
  // After the parameters were made whole (a gather, a broadcast), the pages of those this rank
  // does not own are given back. With the master weights' shard only (ZeRO-1 or 2), the whole
  // compute copy is cast first, while they are whole, unless it is current: the next passes cast
  // nothing but the shard (if a cast fails they stay whole).
  void release() noexcept {
    if (!s_.shards_master() || !whole_) return;
    if (s_.shards_master_only()) try {
        s_.model.refresh_compute_copy();
      } catch (...) {
        return;
      }
    whole_ = false;
    if (host_master_)
      give_back_outside_shard(host_params_);
    else
      give_back_outside_shard(params_);
    if (s_.opts.shard_parameters) give_back_outside_shard(compute_);  // (mixed precision: the 16-bit copy's)
  }
  // The parameters a pass kept (keep_parameters_for_backward) are let go: the pages of those this
  // rank does not own are given back.
  void release_kept() noexcept {
    if (kept_.empty()) return;
    if (arriving_.size()) {
      try {
        finish_gathers();
      } catch (...) {
      }
    }
    kept_.clear();
    give_back_outside_shard(read_copy());
  }
  // Waits for the gathers started (a buffer whose wait fails holds nothing).
  void finish_gathers() {
    if (s_.gathers && s_.gathers->busy()) {
      try {
        s_.gathers->join("the parameters' gather");
      } catch (...) {
        for (gather_slot& slot : slots_)
          if (slot.in_flight) slot.holds = {};
        if (arriving_.size()) std::erase(kept_, arriving_);
        arriving_ = {};
        throw;
      }
    }
    for (gather_slot& slot : slots_) slot.in_flight = false;
    arriving_ = {};
  }

 private:
  using T = typename Model::value_type;
  static constexpr std::size_t n = Model::parameter_count;

  // The bytes of the pages of span sp that this rank holds between passes: those that touch its
  // shard or lie partly outside the buffer, and (ZeRO-3 keeping a pass's parameters) the pages
  // marked in `gathered`.
  std::size_t held_of(page_span const& sp, std::vector<char> const* gathered = nullptr) const {
    param_range const s = s_.shard();
    return REMAT_NAMESPACE::detail::held_pages(sp, s.begin, s.end, gathered);
  }

  void note_peak() {
    if (s_.inside) pass_peak_ = std::max(pass_peak_, held_bytes());
  }
  // The pages of the parameters held now: the model's buffers' and the gather buffers'.
  std::size_t held_bytes() const {
    return (host_master_ ? host_params_.resident() : params_.resident()) + compute_.resident() +
           slots_[0].buffer.resident(buffer_residency_) +
           slots_[1].buffer.resident(buffer_residency_);
  }
  // The memory of the copy of the parameters layers read (and ZeRO-3 gathers): the compute copy
  // in mixed precision, the master weights otherwise.
  backed_buffer<device> const& read_copy() const { return Model::mixed_precision ? compute_ : params_; }

  // The master weights' pages: a GPU model's in host memory, or where the model's buffer is.
  page_span const& master_span() const { return host_master_ ? host_params_.span : params_.span; }

  // The pages of a buffer wholly inside it that hold nothing of this rank's shard are given back.
  template <class D>
  void give_back_outside_shard(backed_buffer<D> const& b) const noexcept {
    param_range const s = s_.shard();
#if REMAT_HAS_CUDA
    // (the GPU: layers issued before may still read them; the zero granule is zeroed on this stream)
    [[maybe_unused]] auto const on_stream = s_.model.stream_scope();
    if constexpr (dp_state<Model, Transport>::on_gpu)
      if (b.span.count()) (void)cudaStreamSynchronize(current_cuda_stream());
#endif
    b.give_back_outside(s.begin, s.end);
  }

  // Parameters r in a gather buffer, to read now: the buffer that holds them (unchanged since,
  // waited for if a prefetch brings them), or, after any prefetch of others is done with, the one
  // read least recently, gathered into now. Returns the buffer's index.
  int bring(param_range r) {
    std::uint64_t const version = s_.model.parameter_version();
    for (int b = 0; b < 2; ++b) {
      gather_slot const& slot = slots_[b];
      if (slot.holds != r || slot.version != version) continue;
      if (slot.in_flight) finish_gathers();
      return b;
    }
    finish_gathers();
    int const b = s_.opts.prefetch_parameters ? 1 - reading_ : 0;
    start_gather(r, b);
    finish_gathers();
    return b;
  }
  // Starts the gather of parameters r into buffer b (which nothing reads now) unless a buffer
  // holds them already.
  void prefetch(param_range r, int b) {
    if (r.size() == 0) return;
    for (gather_slot const& slot : slots_)
      if (slot.holds == r && slot.version == s_.model.parameter_version()) return;
    start_gather(r, b, true);
  }
  // Starts every rank's part of parameters r on its way into buffer b (this rank's copied in
  // first: the all-gather works in place); finish_gathers waits for it.
  void start_gather(param_range r, int b, bool ahead = false) {
    gather_slot& slot = slots_[b];
    C* const to = slot.buffer.data;
    slot.holds = {};
    s_.shards.parts_of(r, parts_);
    param_range const own = parts_[std::size_t(s_.rank())];
    if (own.size()) copy_device_bytes<device>(to + own.begin, s_.compute_base() + r.begin + own.begin, own.size() * sizeof(C));
    s_.gathers->follow();
    s_.gathers->all_gather(to, parts_);
    slot.holds = r;
    slot.version = s_.model.parameter_version();
    slot.in_flight = true;
    if (s_.inside) count_gathered(r, own, ahead);
  }
  // options::keep_parameters_for_backward: parameters r gathered in place, into the model's
  // compute copy (the master weights in fp32), unless this pass has them already; waited for
  // unless `ahead` (a prefetch: the next frame's wait).
  void keep(param_range r, bool ahead) {
    bool const kept = std::find(kept_.begin(), kept_.end(), r) != kept_.end();
    if (kept && (ahead || arriving_ != r)) return;
    if (!kept) {
      finish_gathers();
      read_copy().commit(r.begin, r.end);  // (the pages it gathers into: held before they are written)
      s_.shards.parts_of(r, parts_);
      s_.gathers->follow();  // (this rank's part is in place already)
      s_.gathers->all_gather(const_cast<C*>(s_.compute_base()) + r.begin, parts_);
      kept_.push_back(r);
      arriving_ = r;
      count_gathered(r, parts_[std::size_t(s_.rank())], ahead);
    }
    if (!ahead) finish_gathers();
  }
  void count_gathered(param_range r, param_range own, bool ahead) {
    std::size_t const bytes = (r.size() - own.size()) * sizeof(C);
    s_.step.gathered += bytes;
    if (ahead) s_.step.prefetched += bytes;
  }

  dp_state<Model, Transport>& s_;
  backed_buffer<device> params_;   // the parameter buffer's memory
  // A GPU model's master weights in host memory under shard_master_weights or ZeRO-3
  // (model::master_on_host() as the wrapper was built): the pages of this rank's shard of them are
  // kept; under ZeRO-3 the compute copy's shard is kept in the device's granules (compute_).
  backed_buffer<host> host_params_;
  bool host_master_ = false;
  backed_buffer<device> compute_;  // the compute copy's (mixed precision; none otherwise)
  gather_slot slots_[2];           // what layers' parameters are gathered into (the second: prefetch)
  int reading_ = 0;                // the slot the last frame read
  // keep_parameters_for_backward: the frames' parameters this pass gathered into the model's
  // pages, and of them the one whose gather is in flight (empty: none).
  std::vector<param_range> kept_;
  param_range arriving_{};
  bool whole_ = false;
  std::vector<param_range> parts_;  // (what a gather sends)
  std::vector<pass_event> events_;  // a training pass's, by the plan
  std::vector<pass_event> forward_[2];
  std::vector<param_range> ahead_, forward_ahead_[2];  // each's next gather after each event (gathers_ahead)
  std::size_t planned_peak_ = 0;
  std::size_t pass_peak_ = 0;  // measured in the running training pass
  std::size_t last_peak_ = 0;  // measured in the last training pass that succeeded
  mutable std::vector<unsigned char> buffer_residency_;  // (mincore's answer)
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
