// What the data-parallel wrapper (remat::dist, parallel/) plugs into a model: its hooks
// (pass/gradient_sync.hpp), the replica whose dropout streams the model draws, and whether the
// model holds one rank's shard of its parameters only; and how a model's passes call those hooks
// (collective passes, the parameters each layer reads, the gradients backward makes final).
#pragma once

#include "../error.hpp"
#include "../memory/offload.hpp"
#include "../pass/gradient_sync.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>

namespace REMAT_NAMESPACE {

// What a data-parallel wrapper (remat::dist) plugs into a model, and the optimizers built from the
// model read: the wrapper told of the passes and gradients (null when training alone), and the
// replica, whose dropout streams are its own (replica 0, the default, draws those of a model on
// its own; remat::dist sets it to the rank).
class model_link {
 public:
  // The wrapper plugged in (null when training alone).
  detail::gradient_sync* gradient_sync() const { return sync_; }
  // Plugs a wrapper in (null: none); remat::dist::data_parallel does it when built.
  void set_gradient_sync(detail::gradient_sync* s) { sync_ = s; }
  // The slot the wrapper is read from, so an optimizer built before it still sees it.
  detail::gradient_sync* const* gradient_sync_slot() const { return &sync_; }
  // Whose dropout streams the model draws (0: a model's own).
  std::uint64_t replica() const { return replica_; }
  // Sets the replica (below 65536); remat::dist sets each rank's.
  void set_replica(std::uint64_t r) {
    if (r >= (std::uint64_t(1) << 16))
      detail::raise<argument_error>("model::link().set_replica: expected a replica below 65536, found ", r);
    replica_ = r;
  }
  // Whether the model holds one rank's shard of its parameters only (the rest read as zero): a
  // ZeRO-3 wrapper went without making them whole (dist::data_parallel::gather_parameters). Its
  // passes then refuse to run alone, until a file is loaded into it.
  bool partial_parameters() const { return partial_; }
  void set_partial_parameters(bool p) { partial_ = p; }  // (what the wrapper and load set)

 private:
  detail::gradient_sync* sync_ = nullptr;
  std::uint64_t replica_ = 0;
  bool partial_ = false;
};

// Where a model's Offloaded<S> segments put their activations (memory/offload.hpp): pinned host
// memory for a GPU model, host memory apart from the activations for a host model.
template <class Device>
using offload_allocator_t = memory::caching_allocator<memory::offload_space_t<Device>>;

namespace detail {

// A pass outside training under a wrapper whose passes are collective (ZeRO-3): the wrapper is
// told it starts and how it ended (see gradient_sync::collective_pass_ended); otherwise f().
template <class F>
auto collective_pass(model_link const& link, bool training, F&& f) {
  gradient_sync* const sync = link.gradient_sync();
  if (!sync || !sync->gathers_parameters()) return f();
  sync->collective_pass_starting(training);
  std::optional<decltype(f())> result;
  std::exception_ptr failed;
  try {
    result.emplace(f());
  } catch (...) {
    failed = std::current_exception();
  }
  sync->collective_pass_ended(failed);
  return std::move(*result);
}

// ZeRO-3: pass state s tells a data-parallel wrapper that keeps a shard of the parameters which
// parameters each layer reads (of `weights`), before it runs.
template <class S, class C>
void listen_parameters(model_link const& link, S& s, C const* weights) {
  gradient_sync* const sync = link.gradient_sync();
  if (!sync || !sync->gathers_parameters()) return;
  s.listen_parameters(weights, {sync,
                                [](void* to, std::size_t offset, std::size_t count) -> void const* {
                                  return static_cast<gradient_sync*>(to)->parameters_needed(offset, count);
                                },
                                [](void* to) noexcept { static_cast<gradient_sync*>(to)->parameters_done(); }});
}

// A pass outside training listens to the gathering (listen_parameters) and, as it ends, has the
// wrapper let go of parameters made whole before it (dist::save's gather).
struct gathering {
  gradient_sync* sync;
  template <class S, class C>
  gathering(model_link const& link, S& s, C const* weights) : sync(link.gradient_sync()) {
    if (sync && !sync->gathers_parameters()) sync = nullptr;
    listen_parameters(link, s, weights);
  }
  gathering(gathering const&) = delete;
  gathering& operator=(gathering const&) = delete;
  ~gathering() {
    if (sync) sync->release_parameters();
  }
};

// A training pass tells the wrapper as backward makes gradients final (from an offset on).
template <class S, class T>
void listen_gradients(model_link const& link, S& s, T* gradients) {
  if (gradient_sync* const sync = link.gradient_sync())
    s.listen_gradients(gradients, {sync, [](void* to, std::size_t offset) {
                                     static_cast<gradient_sync*>(to)->gradients_ready(offset);
                                   }});
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
