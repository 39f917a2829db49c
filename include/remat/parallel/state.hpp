// What the parts of a remat::dist::data_parallel share (parallel/data_parallel.hpp puts them
// together): the wrapped model, the options, the communicator and the transports, the sharding,
// where the running step stands and what it moved.
#pragma once

#include "../device.hpp"
#include "../memory/backed_buffer.hpp"
#include "communicator.hpp"
#include "mpi_transport.hpp"
#include "options.hpp"
#include "sharding.hpp"

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

// (the memory whose pages the shards give back and take again)
using REMAT_NAMESPACE::detail::backed_buffer;
using REMAT_NAMESPACE::detail::copy_device_bytes;
using REMAT_NAMESPACE::detail::page_buffer;
using REMAT_NAMESPACE::detail::page_span;
using REMAT_NAMESPACE::detail::zero_device_bytes;

template <class Model, class Transport>
struct dp_state {
  using T = typename Model::value_type;    // the master weights' and gradients' type
  using C = typename Model::compute_type;  // the weights layers read
  using device = typename Model::device;
  static constexpr std::size_t n = Model::parameter_count;
  static constexpr bool on_gpu = !std::is_same_v<device, host>;

  // `o` as checked and implied (data_parallel's constructor).
  dp_state(Model& m, MPI_Comm comm, options const& o)
      : model(m), opts(o), c(comm, o.timeout_seconds), shards(o, n, c.size()) {}
  dp_state(dp_state const&) = delete;
  dp_state& operator=(dp_state const&) = delete;

  Model& model;
  options opts;
  communicator c;  // (before the transports, which use it until they go)
  sharding shards;
  std::unique_ptr<Transport> transport;  // the gradients' reductions (and broadcasts, gathers after a step)
  std::unique_ptr<Transport> gathers;    // ZeRO-3 on more than one rank: the layers' parameters' gathers
  // Master weights in host memory apart from the model's (model::master_on_host()): what they
  // are broadcast and gathered through (MPI, which reaches them where NCCL does not; on the host
  // backend too, so that its tests take the GPU's path). Made when first needed.
  std::unique_ptr<mpi_transport<T>> host_side;
  bool pending = false;  // local gradient contributions not reduced yet
  bool reduced = false;  // the gradients hold the ranks' sum (since the last zero_grad)
  bool started = false;  // a pass of this step reduced (or started reducing) its buckets
  bool overlap = false;  // the running pass reduces its buckets as backward finishes them
  bool inside = false;   // a pass started by the wrapper is running
  traffic step{};        // what the running step has moved
  traffic last{};        // what the last optimizer step moved

  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  param_range shard() const { return shards.of(c.rank()); }  // this rank's
  // ZeRO-3 on more than one rank: every pass gathers each layer's parameters.
  bool gathers_parameters() const { return opts.shard_parameters && size() > 1; }
  // The master weights' pages outside this rank's shard are given back (shard_master_weights, or
  // ZeRO-3, which implies it): the wrapper holds their pages.
  bool shards_master() const { return opts.shard_master_weights; }
  // ... and only the master weights: the compute copy stays whole (ZeRO-1 or 2, mixed precision).
  bool shards_master_only() const { return opts.shard_master_weights && !opts.shard_parameters; }

  T* gradient_base() const { return const_cast<T*>(std::as_const(model).gradients().data()); }
  T* parameter_base() const { return const_cast<T*>(std::as_const(model).parameters().data()); }
  // Runs f(t) with the transport t that reaches the master weights where they are: the wrapper's,
  // or host_side for master weights in host memory (model::master_on_host()).
  template <class F>
  void with_master_transport(F&& f) {
    if (model.master_on_host()) {
      if (!host_side) host_side = std::make_unique<mpi_transport<T>>(c);
      return f(*host_side);
    }
    f(*transport);
  }
  // The weights layers read: the master weights, or (mixed precision) their compute copy, of which
  // a pass has cast this rank's shard (model::weights).
  C const* compute_base() const {
    if constexpr (Model::mixed_precision)
      return model.compute_parameters().data();
    else
      return parameter_base();
  }
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
