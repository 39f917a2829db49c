// The ZeRO stage of a remat::dist::data_parallel as one value: which of the optimizer state, the
// gradients and the parameters each rank keeps a shard of (each stage implies the ones before it),
// and each rank's shard of the model's flat parameter buffer.
#pragma once

#include "../pass/gradient_sync.hpp"
#include "options.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

// ZeRO's stages: what each rank keeps 1/P of.
enum class stage : unsigned char {
  replicated = 0,  // nothing: every rank keeps everything (plain data parallelism)
  optimizer = 1,   // the optimizer's state (options::shard_optimizer)
  gradients = 2,   // and the gradients (options::shard_gradients)
  parameters = 3,  // and the parameters (options::shard_parameters)
};

class sharding {
 public:
  // The options with what each stage implies set (parameters → gradients → optimizer).
  static options implied(options o) {
    if (o.shard_parameters) o.shard_gradients = o.shard_master_weights = true;
    if (o.shard_gradients || o.shard_master_weights) o.shard_optimizer = true;
    return o;
  }
  // The stage of `o` (as implied) over `n` parameters and `ranks` ranks.
  sharding(options const& o, std::size_t n, int ranks)
      : level_(o.shard_parameters  ? stage::parameters
               : o.shard_gradients ? stage::gradients
               : o.shard_optimizer ? stage::optimizer
                                   : stage::replicated),
        n_(n) {
    for (int q = 0; q < ranks; ++q) shards_.push_back(of(q, ranks));
  }

  stage level() const { return level_; }  // the stage
  bool optimizer() const { return level_ >= stage::optimizer; }    // ZeRO-1 and above
  bool gradients() const { return level_ >= stage::gradients; }    // ZeRO-2 and above
  bool parameters() const { return level_ >= stage::parameters; }  // ZeRO-3
  // The parameters rank r's optimizer updates: all, or its 1/P when the optimizer is sharded.
  param_range of(int r) const { return of(r, int(shards_.size())); }
  // Every rank's, in rank order.
  std::vector<param_range> const& all() const { return shards_; }
  // Each rank's part of parameters r, from r's start (what a gather of r sends), into `parts`.
  void parts_of(param_range r, std::vector<param_range>& parts) const {
    parts.clear();
    for (param_range const& s : shards_) {
      std::size_t const lo = std::clamp(s.begin, r.begin, r.end), hi = std::clamp(s.end, r.begin, r.end);
      parts.push_back({lo - r.begin, std::max(lo, hi) - r.begin});
    }
  }
  // Calls f(rank, lo, hi) for each rank that owns part [lo, hi) of parameters [begin, end).
  template <class F>
  void owners(std::size_t begin, std::size_t end, F&& f) const {
    for (int q = 0; q < int(shards_.size()); ++q) {
      param_range const s = shards_[std::size_t(q)];
      std::size_t const lo = std::max(begin, s.begin), hi = std::min(end, s.end);
      if (lo < hi) f(q, lo, hi);
    }
  }

 private:
  param_range of(int r, int ranks) const {
    if (!optimizer()) return {0, n_};
    std::size_t const p = std::size_t(ranks);
    return {n_ * std::size_t(r) / p, n_ * std::size_t(r + 1) / p};
  }

  stage level_;
  std::size_t n_;
  std::vector<param_range> shards_;
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
