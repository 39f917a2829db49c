// How the ranks of a remat::dist::data_parallel agree: on the options (checked against the model
// before anything changes), on the model and options as the wrapper is built (every rank's
// signature against rank 0's), and on how a pass ended (whether a failure was a wait that timed
// out; what a failed pass restores).
#pragma once

#include "../error.hpp"
#include "../memory/backed_buffer.hpp"
#include "state.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

// The options, checked against the model (argument_error, nothing changed), with what each ZeRO
// stage implies set.
template <class Model>
options checked_options(Model const& m, options o) {
  using REMAT_NAMESPACE::detail::raise;
  if (m.link().gradient_sync())
    raise<argument_error>("data_parallel: expected a model without a data-parallel wrapper, found one already plugged in",
                          m.link().gradient_sync()->gradients_elsewhere()
                              ? " (OffloadedAdamW's gradients on the host: build the data_parallel first, with "
                                "shard_gradients, and the optimizer after it)"
                              : "");
  if (m.link().partial_parameters())
    raise<argument_error>(
        "data_parallel: expected a model with whole parameters, found one rank's shard of them only (a ZeRO-3 "
        "wrapper went without gather_parameters()); load the parameters from a file first");
  if (o.shard_master_weights && !o.shard_parameters && !Model::mixed_precision)
    raise<argument_error>("data_parallel: shard_master_weights expects a mixed-precision model, found an fp32 one, whose "
                          "layers read its master weights; shard_parameters (ZeRO-3) keeps a shard of those");
  if (!(o.timeout_seconds > 0)) raise<argument_error>("data_parallel: expected timeout_seconds > 0, found ", o.timeout_seconds);
  if (o.bucket_bytes < sizeof(typename Model::value_type))
    raise<argument_error>("data_parallel: expected bucket_bytes of at least one parameter (",
                          sizeof(typename Model::value_type), "), found ", o.bucket_bytes);
  o = sharding::implied(o);
  if (o.shard_gradients && std::is_same_v<typename Model::device, host> && !REMAT_HOST_PAGES)
    raise<argument_error>(
        "data_parallel: shard_gradients (ZeRO-2) gives back memory pages through Linux's madvise; this system has none");
  return o;
}

inline char const* yes_no(std::uint64_t bit) { return bit ? "true" : "false"; }

// Every rank's signature against rank 0's: the model's type, its parameters (names and shapes),
// precision and the options that shape the messages. dist_error on every rank when they differ.
template <class Model, class Transport>
void check_signatures(dp_state<Model, Transport>& s) {
  using REMAT_NAMESPACE::detail::raise;
  options const& o = s.opts;
  std::string table;
  for (auto const& p : Model::parameter_table()) {
    table += p.name;
    for (auto d : p.shape) table += "," + std::to_string(d);
    table += ";";
  }
  constexpr std::size_t K = 7;
  std::vector<std::uint64_t> const all = s.c.all_gather(
      {s.n, fnv1a(table), fnv1a(type_name<typename Model::net>()),
       sizeof(typename Model::value_type) * 256 + sizeof(typename Model::compute_type), o.bucket_bytes,
       (o.shard_optimizer ? 1u : 0u) + (o.shard_gradients ? 2u : 0u) + (o.shard_parameters ? 4u : 0u) +
           (o.prefetch_parameters ? 8u : 0u) + (o.keep_parameters_for_backward ? 16u : 0u) +
           (o.shard_master_weights ? 32u : 0u),
       std::uint64_t(Model::mixed_precision)},
      "the model signatures' exchange");
  for (int q = 1; q < s.size(); ++q) {
    std::uint64_t const* a = all.data();
    std::uint64_t const* b = all.data() + K * std::size_t(q);
    if (a[0] != b[0] || a[1] != b[1] || a[2] != b[2])
      raise<dist_error>("data_parallel: expected the same model on every rank, found rank 0 with ", a[0],
                        " parameters (signature ", std::hex, a[1] ^ a[2], std::dec, ") and rank ", q, " with ", b[0],
                        " parameters (signature ", std::hex, b[1] ^ b[2], std::dec, ")",
                        a[0] == b[0] ? (a[1] == b[1] ? ": the layer types differ" : ": the parameter names or shapes differ")
                                     : "");
    if (a[3] != b[3] || a[6] != b[6])
      raise<dist_error>("data_parallel: expected the same precision on every rank, found rank 0 with ", a[3] / 256,
                        "-byte master / ", a[3] % 256, "-byte compute values and rank ", q, " with ", b[3] / 256,
                        " / ", b[3] % 256);
    if (a[4] != b[4] || a[5] != b[5])
      raise<dist_error>("data_parallel: expected the same options on every rank, found rank 0 with bucket_bytes ", a[4],
                        ", shard_optimizer ", yes_no(a[5] & 1), ", shard_gradients ", yes_no(a[5] & 2),
                        ", shard_parameters ", yes_no(a[5] & 4), ", prefetch_parameters ", yes_no(a[5] & 8),
                        ", keep_parameters_for_backward ", yes_no(a[5] & 16), " and shard_master_weights ",
                        yes_no(a[5] & 32), ", rank ", q, " with bucket_bytes ", b[4], ", shard_optimizer ",
                        yes_no(b[5] & 1), ", shard_gradients ", yes_no(b[5] & 2), ", shard_parameters ",
                        yes_no(b[5] & 4), ", prefetch_parameters ", yes_no(b[5] & 8),
                        ", keep_parameters_for_backward ", yes_no(b[5] & 16), " and shard_master_weights ",
                        yes_no(b[5] & 32));
  }
}

// Whether a failure was a wait that timed out (the other ranks are not there to take part with).
inline bool timed_out(std::exception_ptr failed) {
  try {
    std::rethrow_exception(failed);
  } catch (dist_error const&) {
    return true;
  } catch (...) {
    return false;
  }
}

// Where a step stood as a pass started: what a pass that fails on any rank restores.
struct pass_start {
  bool pending = false, started = false;
  std::size_t next = 0;  // the next bucket to start
  traffic moved{};
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
