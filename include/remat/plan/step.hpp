// remat::memory_plan<Net, Precision, Optimizer, Loss>(batch): the bytes of a whole training step
// of model<Net, Device, Precision> with that optimizer and loss, per tag and in total, known at
// compile time: what the model's allocator measures, to the byte (each tensor rounded up to 256
// bytes as the caching allocator rounds it).
//
//   parameters       the fp32 master weights, and in mixed precision the 16-bit compute copy
//   gradients        one per parameter, in the master type
//   optimizer state  AdamW: two moments; SGD: a momentum buffer (none without momentum); over this
//                    rank's shard when a data-parallel run shards the optimizer (ZeRO-1);
//                    OffloadedAdamW: none on the device, its host's part apart (host_pageable,
//                    host_page_locked)
//   activations      the activation plan (plan/activation.hpp)
//   workspace        what the loss allocates while it runs (SoftmaxCrossEntropy: one fp32 value per row)
//   peak             the most in use at once: what lives for the model's life (parameters,
//                    gradients, optimizer state) plus the most activations and workspace in use
//                    together (the loss's workspace is counted at the point of the step it runs)
//   arena            the block a step's activations and workspace are laid out in
//                    (plan/arena.hpp): what the allocator reserves for them
//   reserved         everything the model's allocator reserves: persistent plus arena
//
// Not in the plan: the scratch a matrix-product library picks at run time (oneDNN's scratchpad,
// cuBLASLt's workspace, a converting product's fp32 copies, CUB's temporary storage), and on the
// host a norm's backward's column sums per chunk of 32 rows (kernels/norms.hpp). It is
// tagged workspace in the device's default allocator (memory::default_allocator<Device>()), not the
// model's, so a model on an allocator of its own measures exactly the plan; on the GPU it is at
// most 32 MiB per product (kernels/detail/cublaslt.hpp).
//
// Arguments the model would refuse of the pass they describe (detail::check_plan_shape), and a
// rank outside [0, ranks), are an argument_error; in a constant expression, a compile error at the
// line that says why.
//
//   constexpr auto plan = remat::memory_plan<Net, remat::mixed<remat::bfloat16>, remat::AdamW>(256);
//   static_assert(plan.peak <= (std::size_t(8) << 30), "the training step must fit in 8 GiB");
#pragma once

#include "../error.hpp"
#include "../layers/loss.hpp"
#include "activation.hpp"
#include "arena.hpp"
#include "optimizer_state.hpp"
#include "rank_pages.hpp"

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {

// Memory of a step that lies on the host, beside the model's device: an optimizer's state kept
// there (OffloadedAdamW), per tag, in bytes rounded as the allocator rounds.
struct host_place_plan {
  std::size_t parameters = 0;       // the model's master weights (offload_options::master_weights)
  std::size_t gradients = 0;        // the slots the gradients come down through (a GPU model)
  std::size_t optimizer_state = 0;  // moments, the master weights' host copy, the compute copy's slots
  constexpr std::size_t total() const { return parameters + gradients + optimizer_state; }  // all of it
  // The bytes of tag t (the host allocator's stats()[t].peak and reserved).
  constexpr std::size_t operator[](memory::tag t) const {
    return t == memory::tag::parameters        ? parameters
           : t == memory::tag::gradients       ? gradients
           : t == memory::tag::optimizer_state ? optimizer_state
                                               : 0;
  }
};

// A whole training step's memory, per tag of the allocator, as plan_step computes it at compile
// time (in bytes, rounded as the allocator rounds): what the allocator's peaks measure. The tags
// are the model's allocator's (the device's); an optimizer that keeps its state on the host
// (OffloadedAdamW) has it in host_pageable and host_page_locked, and none in optimizer_state.
struct memory_plan_result {
  std::size_t master_weights = 0;  // tag parameters
  std::size_t compute_copy = 0;    // tag parameters (mixed precision's 16-bit weights)
  std::size_t buffers = 0;         // tag parameters (running state and the copy a pass updates)
  std::size_t gradients = 0;        // tag gradients: one per parameter, in the master type
  std::size_t optimizer_state = 0;  // tag optimizer_state: this rank's (a shard of it when sharded)
  activation_plan_result activations{};  // activations.peak_bytes: the tag's peak
  std::size_t workspace = 0;             // the tag's peak
  std::size_t persistent = 0;            // in use for the model's and optimizer's life
  std::size_t peak = 0;                  // the total in use at the step's peak
  std::size_t arena = 0;                 // reserved for activations and workspace (>= their peak; 0: not laid out)
  std::size_t reserved = 0;              // the total reserved: persistent + arena
  // Device memory beside the model's allocator: the pages of the gradient buffer held at most
  // when the gradients live on the host (OffloadedAdamW's offload_options::gradients; tag
  // gradients is then 0), what OffloadedAdamW::gradient_pages() measures.
  // Under ZeRO-2 (step_options::shard_gradients) the pages of the gradient buffer a rank holds
  // during a pass at most (its shard and the buckets in flight; the wrapper's
  // gradient_pages().planned_peak) in place of the allocator's block (tag gradients), whose
  // pages the wrapper gives back (on the GPU it moves into granules of the wrapper's).
  std::size_t gradient_pages = 0;
  // Under step_options::shard_master_weights the pages of the master weights a rank holds (its
  // shard's; the wrapper's parameter_pages() but for a host model's compute copy) in place of
  // their block: on the device, or with the master weights on the host (master_pages_on_host:
  // OffloadedAdamW's offload_master_weights) in place of host_pageable.parameters.
  std::size_t master_pages = 0;
  bool master_pages_on_host = false;  // (see master_pages)
  // Under ZeRO-3 (step_options::shard_parameters) the pages of the compute copy a rank holds (its
  // shard's; with keep_parameters_for_backward every frame's at a pass's end) in place of its
  // block, and the wrapper's gather buffers (two of the largest layer's parameters with
  // prefetch_parameters, one without, none when a pass keeps what it gathers).
  std::size_t compute_pages = 0;
  std::size_t gather_pages = 0;  // (see compute_pages)
  // The allocators' blocks whose pages the fields above count instead: on the device and on the
  // host. A GPU's pages are counted exactly (the wrapper's granules start on a granule); where a
  // host buffer starts in its 4 KiB page is known at run time only, and the plan counts what any
  // start would hold: at most 5 pages more than the wrapper's plan for the gradients and 3 for
  // each buffer of weights (the master weights, ZeRO-3's compute copy).
  std::size_t device_paged = 0;
  std::size_t host_paged = 0;  // (see device_paged)
  // On the host, beside the device (OffloadedAdamW): in the optimizer's host_allocator(), pageable
  // memory (for a model on the host, the buffers that cross too)...
  host_place_plan host_pageable{};
  // ... and in its staging_allocator(), page-locked memory, for a model on the GPU.
  host_place_plan host_page_locked{};

  // All of the step's host memory: the optimizer's (host_pageable, host_page_locked) and the
  // activations Offloaded<S> keeps there at its peak (activations.offloaded_bytes).
  // A sharded data-parallel rank's master weights there count as the pages it holds.
  constexpr std::size_t host_bytes() const {
    return host_pageable.total() + host_page_locked.total() + activations.offloaded_bytes - host_paged +
           (master_pages_on_host ? master_pages : 0);
  }
  // All of the step's device memory: what the model's allocator reserves (the arena's plan, or
  // the peak without one) and the gradient pages held beside it; a sharded data-parallel rank's
  // gradients and master weights count as the pages it holds.
  constexpr std::size_t device_bytes() const {
    return (arena ? reserved : peak) + gradient_pages + (master_pages_on_host ? 0 : master_pages) + compute_pages +
           gather_pages - device_paged;
  }
  // Whether the step fits a device of `device_bytes` (device_bytes()) and a host of `host_bytes`
  // (host_bytes()).
  constexpr bool fits(std::size_t device_bytes_available, std::size_t host_bytes_available) const {
    return device_bytes() <= device_bytes_available && host_bytes() <= host_bytes_available;
  }

  // Tag parameters in all: master weights, compute copy and running state.
  constexpr std::size_t parameters() const { return master_weights + compute_copy + buffers; }
  // "weights 1.00 MiB, gradients ..., peak ...": one line for a program's log.
  std::string describe() const {
    return "weights " + memory::format_bytes(parameters()) + ", gradients " + memory::format_bytes(gradients) +
           ", optimizer state " + memory::format_bytes(optimizer_state) + ", activations " +
           memory::format_bytes(activations.peak_bytes) + ", workspace " + memory::format_bytes(workspace) +
           "; peak " + memory::format_bytes(peak) + (arena ? ", reserved " + memory::format_bytes(reserved) : "");
  }
  // The peak of tag t, as the model's allocator reports it in stats()[t].peak after reset_peak
  // (0 for the program's own tags, user1 to user3: the step allocates nothing under them).
  constexpr std::size_t operator[](memory::tag t) const {
    switch (t) {
      case memory::tag::parameters:
        return parameters();
      case memory::tag::gradients:
        return gradients;
      case memory::tag::optimizer_state:
        return optimizer_state;
      case memory::tag::activations:
        return activations.peak_bytes;
      case memory::tag::workspace:
        return workspace;
      case memory::tag::user1:
      case memory::tag::user2:
      case memory::tag::user3:
        return 0;
    }
    return 0;
  }
};

namespace detail {

// The pages a sharded data-parallel rank holds (plan/rank_pages.hpp), into r: of the gradient
// buffer under ZeRO-2 (`sunk`: its shard's sum lives on the host, OffloadedAdamW's gradients), of
// the master weights under shard_master_weights (`master_on_host`: in the host's memory), and
// under ZeRO-3 of the compute copy and the gather buffers. A GPU's buffers are granules of the
// wrapper's from a granule's start: the wrapper's own count; a host's may start anywhere in a
// page: the most any start holds.
template <class Net, class Precision, class Device>
constexpr void plan_rank_pages(memory_plan_result& r, step_options const& o, bool master_on_host, bool sunk) {
  using T = typename Precision::master;
  using C = typename Precision::compute;
  constexpr std::size_t n = Net::param_count;
  constexpr bool gpu = !std::is_same_v<Device, host>;
  std::size_t const page = o.gradient_page ? o.gradient_page : gpu ? std::size_t(2) << 20 : 4096;
  param_range const shard{n * o.rank / o.ranks, n * (o.rank + 1) / o.ranks};
  if (!o.shard_gradients && !o.shard_master_weights) return;
  if (o.shard_master_weights && !o.shard_parameters && !is_mixed_v<Precision>)
    throw argument_error("remat::memory_plan: shard_master_weights expects a mixed-precision model (an fp32 "
                         "model's layers read its master weights: ZeRO-3, shard_parameters, shards them)");
  std::vector<std::size_t> reports;
  std::vector<pass_event> events;
  planning::counter mem;
  plan_pass_into<Net, Precision>(mem, 1, o.features ? o.features : Net::in_width, 1, input_gradient::none, 0, &reports,
                                 &events);
  if (o.shard_gradients && n > 0) {
    reports.push_back(0);  // (the model's own, after backward)
    page_span const span = page_span::aligned(n, sizeof(T), page);
    std::vector<param_range> const buckets = gradient_bucket_ranges(n, gradient_bucket_size(o.bucket_bytes, sizeof(T)));
    r.gradient_pages = sharded_gradient_peak(reports, buckets, n, [&](std::size_t touched, std::size_t released) {
      if (gpu) return held_gradient_pages(span, shard, sunk, touched, released);
      // (the span written and not yet reduced, and the shard unless it goes to the host)
      param_range const written{touched < released ? touched : released, released};
      if (sunk) return pages_bound({written}, n, sizeof(T), page);
      return pages_bound({written, shard}, n, sizeof(T), page);
    });
    r.device_paged += r.gradients;
  }
  if (!o.shard_master_weights) return;
  // What the rank holds of one of the model's buffers of weights (values of `element` bytes), in
  // pages of `p` (`granules`: from a granule's start): its shard's, and where the layers `read`
  // it with keep_parameters_for_backward every frame's; on one rank all of it.
  bool const gathers = o.shard_parameters && o.ranks > 1;
  bool const keeps = gathers && o.keep_parameters_for_backward;
  std::vector<param_range> kept{shard};
  if (keeps)
    for (pass_event const& e : events)
      if (e.what == pass_event::kind::gather && e.range.size()) kept.push_back(e.range);
  auto const held = [&](std::size_t element, std::size_t p, bool granules, bool read) {
    std::size_t const count = n > 0 ? n : 1;
    if (o.ranks == 1) return granules ? page_span::aligned(count, element, p).whole : page_bound(count * element, p);
    if (!granules) {
      if (read) return pages_bound(kept, count, element, p);
      return pages_bound({shard}, count, element, p);
    }
    page_span const span = page_span::aligned(count, element, p);
    if (!read || !keeps) return held_pages(span, shard.begin, shard.end);
    std::vector<char> const gathered = gathered_pages(span, events);
    return held_pages(span, shard.begin, shard.end, &gathered);
  };
  constexpr bool mixed = is_mixed_v<Precision>;
  std::size_t const master_page = gpu && master_on_host ? 4096 : page;
  r.master_pages = held(sizeof(T), master_page, gpu && !master_on_host, !mixed);
  r.master_pages_on_host = master_on_host;
  (master_on_host ? r.host_paged : r.device_paged) += master_on_host ? r.host_pageable.parameters : r.master_weights;
  if (!o.shard_parameters) return;
  if (mixed) {  // (ZeRO-3: the compute copy's shard, which is what layers' frames gather)
    r.compute_pages = held(sizeof(C), page, gpu, true);
    r.device_paged += r.compute_copy;
  }
  std::size_t const largest = largest_gather(events) * sizeof(C);
  std::size_t const buffers = !gathers || o.keep_parameters_for_backward ? 0 : o.prefetch_parameters ? 2 : 1;
  r.gather_pages = buffers * ((largest + page - 1) / page * page);
}

// Whatever a step option implies of another (as remat::dist::options does).
constexpr step_options implied(step_options o) {
  if (o.shard_parameters) o.shard_master_weights = o.shard_gradients = true;
  if (o.offload_gradients && o.shard_optimizer) o.shard_gradients = true;
  if (o.shard_gradients || o.shard_master_weights) o.shard_optimizer = true;
  return o;
}

// The step's memory without a data-parallel rank's pages (memory_plan).
template <class Net, class Precision, template <class, class, class> class Optimizer, class Loss>
constexpr memory_plan_result plan_step(std::size_t batch, step_options o) {
  using T = typename Precision::master;
  using C = typename Precision::compute;
  constexpr auto rounded = [](std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); };
  // A model holds at least one element (a graph without parameters still has its buffers).
  constexpr std::size_t n = Net::param_count > 0 ? Net::param_count : 1;
  detail::check_plan_shape<Net>("remat::memory_plan", batch, o.features ? o.features : Net::in_width, o.sequence,
                                true, o.dx);
  if (o.ranks == 0 || o.rank >= o.ranks)
    detail::raise<argument_error>("remat::memory_plan: expected a rank in [0, ranks) and ranks >= 1, found rank ",
                                  o.rank, " of ", o.ranks);
  memory_plan_result r;
  r.master_weights = rounded(n * sizeof(T));
  r.compute_copy = is_mixed_v<Precision> ? rounded(n * sizeof(C)) : 0;
  r.gradients = rounded(n * sizeof(T));
  r.buffers = buffer_count_v<Net> > 0 ? 2 * rounded(buffer_count_v<Net> * sizeof(T)) : 0;
  std::size_t const shard = optimizer_shard(Net::param_count, o);
  static_assert(requires { optimizer_state_buffers<Optimizer>::count(o); },
                "remat::memory_plan: the optimizer's state is unknown here: include <remat/train/optimizers.hpp> "
                "(AdamW, SGD), or specialise remat::optimizer_state_buffers for your own optimizer");
  r.optimizer_state = optimizer_state_buffers<Optimizer>::count(o) * rounded(shard * sizeof(T));
  std::size_t const features = o.features ? o.features : Net::in_width;
  std::size_t const rows = batch * o.sequence;
  std::size_t const out = Net::out_width == any_width ? features : Net::out_width;
  std::size_t const loss_workspace = Loss::template workspace_bytes<C>(rows, out);
  planning::counter mem;
  auto const pass = detail::plan_pass_into<Net, Precision>(mem, batch, features, o.sequence, o.dx, loss_workspace);
  r.activations = pass.activations;
  r.workspace = loss_workspace;
  r.persistent = r.parameters() + r.gradients + r.optimizer_state;
  r.peak = r.persistent + pass.transient_peak;
  if (o.arena) {
    r.arena = detail::lay_out(mem).size;
    r.reserved = r.persistent + r.arena;
  }
  return r;
}

}  // namespace detail

// The whole step of model<Net, Device, Precision> with Optimizer (AdamW, SGD, or one of the
// user's that specialises optimizer_state_buffers) and Loss, at `batch` rows (see the top of this
// file); for a rank of a sharded data-parallel run (o.ranks, o.rank and the wrapper's options) with
// the pages it holds. Device matters only there: the GPU's granules or the host's pages.
template <class Net, class Precision = fp32, template <class, class, class> class Optimizer = AdamW, class Loss = MSE,
          class Device = host>
constexpr memory_plan_result memory_plan(std::size_t batch, step_options o = {}) {
  o = detail::implied(o);
  memory_plan_result r = detail::plan_step<Net, Precision, Optimizer, Loss>(batch, o);
  detail::plan_rank_pages<Net, Precision, Device>(r, o, false, false);
  return r;
}

template <class Model>
class OffloadedAdamW;

// The whole step with OffloadedAdamW (ZeRO-Offload's optimizer) for a model on Device: AdamW's
// step with its state moved out of the device's allocator, to the host's: the two moments in its
// host allocator (pageable); the master weights' host copy, page-locked for a model on the GPU
// (in the host allocator for a model on the host); and for a GPU model the page-locked slots the
// gradients and, in mixed precision, the compute copy cross through: two of o.offload_chunk
// values each, or one of the whole shard when a chunk holds it (memory/transfer_ring.hpp; a host
// model reads and writes them in place). Over this rank's shard when a data-parallel run shards
// the optimizer. With o.offload_master_weights (a
// mixed-precision model, offload_options::master_weights) the model's master weights leave the
// device's plan for the host's pageable memory (tag parameters, all of them on every rank), and
// the optimizer keeps no copy of its own. The same signature as the other memory_plan, with the
// device named last:
//   memory_plan<Net, mixed<bfloat16>, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(8, {.sequence = 1024})
template <class Net, class Precision, template <class> class Optimizer, class Loss = MSE, class Device = host>
  requires std::is_same_v<Optimizer<void>, OffloadedAdamW<void>>
constexpr memory_plan_result memory_plan(std::size_t batch, step_options o = {}) {
  using T = typename Precision::master;
  using C = typename Precision::compute;
  constexpr auto rounded = [](std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); };
  if (o.offload_master_weights && !is_mixed_v<Precision>)
    throw argument_error("remat::memory_plan: offload_master_weights expects a mixed-precision model");
  if (o.offload_gradients && o.ranks > 1 && !o.shard_optimizer && !o.shard_gradients && !o.shard_parameters)
    throw argument_error("remat::memory_plan: offload_gradients under data parallelism expects shard_gradients "
                         "(a ZeRO-2 or ZeRO-3 wrapper, which shards the gradients and the optimizer)");
  o = detail::implied(o);
  memory_plan_result r = detail::plan_step<Net, Precision, AdamW, Loss>(batch, o);
  std::size_t moved = r.optimizer_state;  // (AdamW's two moments, over the shard)
  r.persistent -= moved;
  r.peak -= moved;
  if (o.arena) r.reserved -= moved;
  r.optimizer_state = 0;
  std::size_t const shard = optimizer_shard(Net::param_count, o);
  r.host_pageable.optimizer_state = moved;
  host_place_plan& staged = std::is_same_v<Device, host> ? r.host_pageable : r.host_page_locked;
  staged.optimizer_state += o.offload_master_weights ? 0 : rounded(shard * sizeof(T));
  if (!std::is_same_v<Device, host> && shard > 0) {  // (the transfer ring's slots)
    std::size_t const len = o.offload_chunk && o.offload_chunk < shard ? o.offload_chunk : shard;
    std::size_t const slots = len < shard ? 2 : 1;
    staged.gradients += slots * rounded(len * sizeof(T));
    staged.optimizer_state += is_mixed_v<Precision> ? slots * rounded(len * sizeof(C)) : 0;
  }
  if (o.offload_master_weights) {
    moved = r.master_weights;
    r.host_pageable.parameters = moved;
    r.master_weights = 0;
    r.persistent -= moved;
    r.peak -= moved;
    if (o.arena) r.reserved -= moved;
  }
  if (o.offload_gradients && o.shard_gradients) {
    // A rank of a ZeRO-2 or ZeRO-3 wrapper (which shards the optimizer, on any number of ranks):
    // the sum of its shard on the host; the buffer's pages are the wrapper's (gradient_pages).
    r.host_pageable.gradients += (o.offload_gradients_backup ? 2 : 1) * rounded(shard * sizeof(T));
  } else if (o.offload_gradients) {  // (the buffer's pages leave the allocator; the sum lives on the host)
    moved = r.gradients;
    r.gradients = 0;
    r.persistent -= moved;
    r.peak -= moved;
    if (o.arena) r.reserved -= moved;
    r.host_pageable.gradients += (o.offload_gradients_backup ? 2 : 1) * moved;
    std::vector<std::size_t> reports;
    planning::counter mem;
    detail::plan_pass_into<Net, Precision>(mem, 1, o.features ? o.features : Net::in_width, 1, input_gradient::none,
                                           0, &reports);
    std::size_t const page = o.gradient_page ? o.gradient_page : std::is_same_v<Device, host> ? 4096 : 2u << 20;
    r.gradient_pages = detail::offloaded_gradient_peak(reports, Net::param_count > 0 ? Net::param_count : 1,
                                                       sizeof(T), page);
  }
  detail::plan_rank_pages<Net, Precision, Device>(r, o, o.offload_master_weights, o.offload_gradients);
  return r;
}

}  // namespace REMAT_NAMESPACE
