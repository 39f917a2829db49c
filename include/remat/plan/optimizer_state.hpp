// What an optimizer tells the whole-step plan (plan/step.hpp): the options a plan takes beyond the
// batch, and how many parameter-sized buffers of state the optimizer keeps. Each optimizer
// specialises optimizer_state_buffers beside its own definition (train/), so a new optimizer is
// planned without touching plan/.
#pragma once

#include "../config.hpp"
#include "../pass/vocabulary.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {

// What a whole-step plan needs beyond the batch.
struct step_options {
  std::size_t features = 0;                  // the input width when the graph's is not fixed (0: Net::in_width)
  std::size_t sequence = 1;                  // positions per sequence (a sequence model's batch counts sequences)
  input_gradient dx = input_gradient::none;  // accumulate asked for the input's gradient
  // Data parallelism (remat::dist::data_parallel): the number of ranks and this rank's index;
  // with shard_optimizer (ZeRO-1) the optimizer keeps the state of this rank's 1/ranks only.
  std::size_t ranks = 1;         // data-parallel ranks (1: training alone)
  std::size_t rank = 0;          // this rank's index, in [0, ranks)
  bool shard_optimizer = false;  // ZeRO-1: this rank's optimizer keeps 1/ranks of the state
  bool momentum = true;  // SGD only: a momentum buffer (SGD with momentum 0 keeps no state)
  // OffloadedAdamW only (offload_options::master_weights): a mixed-precision model's master
  // weights live in the host's memory, not the device's.
  bool offload_master_weights = false;
  // OffloadedAdamW only, a GPU model: its set_chunk (parameters a step moves at a time; 0: all).
  std::size_t offload_chunk = std::size_t(8) << 20;
  // OffloadedAdamW only (offload_options::gradients): the gradients live in the host's memory,
  // and the device holds the pages of the span backward writes and of the one coming down
  // (memory_plan_result::gradient_pages, in pages of gradient_page bytes: 0, the device's own,
  // 4 KiB on the host and a granule of 2 MiB on the GPU). Under a ZeRO-2 wrapper (shard_optimizer
  // set) the host holds the rank's shard, and the wrapper plans the pages.
  bool offload_gradients = false;
  std::size_t gradient_page = 0;  // the page size of the plan's pages (0: the device's; see offload_gradients)
  // With offload_gradients, a program that adds passes onto a sum (accumulation over micro-batches)
  // with the model's failure backup on (model::set_failure_backup, the default): the host keeps a
  // second copy of the gradients to restore when a pass fails.
  bool offload_gradients_backup = false;
  // Data parallelism whose ranks give pages back (remat::dist::options names them alike):
  // shard_gradients, ZeRO-2 (implies shard_optimizer; offload_gradients under shard_optimizer
  // implies it), and for a mixed-precision model under ZeRO-1 or 2 shard_master_weights (implies
  // shard_optimizer). The plan counts the pages the rank holds of the gradient buffer
  // (memory_plan_result::gradient_pages, the wrapper's gradient_pages().planned_peak, its buckets
  // of bucket_bytes as options::bucket_bytes) and of the master weights (master_pages) in place of
  // the allocator's blocks for them (see memory_plan_result::device_bytes).
  bool shard_gradients = false;
  bool shard_master_weights = false;  // (see shard_gradients)
  // ZeRO-3 (implies shard_gradients and shard_master_weights), with the options of its gathers:
  // the plan counts the rank's pages of the compute copy and the gather buffers too
  // (memory_plan_result::compute_pages, gather_pages).
  bool shard_parameters = false;
  bool prefetch_parameters = true;            // (see shard_parameters)
  bool keep_parameters_for_backward = false;  // (see shard_parameters)
  std::size_t bucket_bytes = std::size_t(4) << 20;  // (see shard_gradients)
  // Also lay out the step's arena (fills `arena` and `reserved`). A constant expression over a
  // model of hundreds of activations can pass a compiler's evaluation limits with it (nvcc's
  // front end first): there, leave it out and plan the arena at run time.
  bool arena = true;
};

// The parameters of `count` whose optimizer state this rank keeps: all, or with o.shard_optimizer
// (or an option that implies it) its shard (remat::dist::data_parallel::shard's size).
constexpr std::size_t optimizer_shard(std::size_t count, step_options const& o) {
  std::size_t const p = o.ranks > 0 ? o.ranks : 1;
  bool const sharded = o.shard_optimizer || o.shard_gradients || o.shard_master_weights;
  return sharded ? count * (o.rank + 1) / p - count * o.rank / p : count;
}

// How many parameter-sized buffers of state an optimizer keeps. A user's optimizer specialises it.
template <template <class, class, class> class Optimizer>
struct optimizer_state_buffers;

// The default optimizer of memory_plan (its definition and its specialisation of
// optimizer_state_buffers: train/optimizers.hpp).
template <class T, class D, class C>
class AdamW;

}  // namespace REMAT_NAMESPACE
