// What a remat::dist::data_parallel is built with and reports: its options (the ZeRO stage among
// them), reduce::now and reduce::later, the memory of its buffers and the traffic of a step.
#pragma once

#include "../config.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace dist {

// How a data_parallel wrapper sends and waits (every rank must pass the same).
struct options {
  // Gradients are reduced in messages of about this many bytes, the last layers' first.
  std::size_t bucket_bytes = std::size_t(4) << 20;
  // ZeRO stage 1: each rank's optimizer keeps the state of 1/P of the parameters.
  bool shard_optimizer = false;
  // ZeRO stage 2 (implies shard_optimizer): each rank keeps the gradients of its shard only.
  // Backward's buckets are reduced to their owners as they become final and the memory of the
  // rest (host pages; on the GPU, granules of virtual memory the gradient buffer moves into) is
  // given back as soon as their reduction is done (at most two reports of backward in flight);
  // every pass is reduced, so a step of gradient accumulation reduces each micro-batch
  // (reduce::later is taken as reduce::now).
  bool shard_gradients = false;
  // A mixed-precision model under ZeRO-1 or 2 (implies shard_optimizer; ZeRO-3 does it anyway):
  // each rank keeps the fp32 master weights of its shard only (the memory of the rest is given
  // back, as ZeRO-3's is), 4 bytes a parameter down to 4/P, as DeepSpeed partitions them. The
  // 16-bit compute copy stays whole: after each step the ranks all-gather it (2 bytes a parameter
  // instead of the master weights' 4), as each rank's optimizer wrote its part while it updated.
  // model.parameters() then holds this rank's shard only (the rest read as zero) unless
  // dp.gather_parameters() made them whole (dist::save does; until the next pass or
  // dp.release_parameters()). Refused for an fp32 model, whose layers read the master weights
  // (shard_parameters keeps a shard of those).
  bool shard_master_weights = false;
  // ZeRO stage 3 (implies shard_gradients and shard_master_weights): each rank keeps 1/P of the
  // parameters too (the memory of the rest is given back: host pages, or on the GPU granules of
  // virtual memory the parameters move into; in mixed precision, 1/P of the master weights and 1/P
  // of their compute copy, which is what is gathered). Every layer's parameters are all-gathered
  // into a buffer of the wrapper's just before it runs (forward, a storage policy's recomputation,
  // backward: the frames of graph/walk.hpp's gather_frame), and the layer reads them there. Every
  // pass of the model is then collective: training through the wrapper, and model.forward, loss
  // and training_loss, which every rank must call together.
  bool shard_parameters = false;
  // ZeRO-3: as a layer starts, the parameters of the next frame that gathers (the model's plan
  // walk lists them) start their all-gather into a second buffer, so they move while the layer
  // runs (FSDP's prefetch); a second buffer as large as the first is held for it.
  bool prefetch_parameters = true;
  // ZeRO-3: a pass keeps each layer's parameters, once gathered (into the model's own memory
  // pages, with no gather buffer), until the pass ends, so backward and a storage policy's
  // recomputations gather nothing again (FSDP's reshard_after_forward = false): half the gathers,
  // for a pass that holds the whole parameters at its peak, as ZeRO-2 does. Between passes a rank
  // holds its shard only.
  bool keep_parameters_for_backward = false;
  // A wait for the other ranks longer than this throws dist_error (a rank failed or diverged).
  double timeout_seconds = 300;
};

// Whether a pass's gradients are reduced (overlapped with its backward), or left to add to (a
// micro-batch of gradient accumulation that is not the last).
enum class reduce { now, later };

// The memory of a rank's gradient buffer, in bytes of whole pages of the system (what the process
// holds: pages given back take none). With options::shard_gradients the pages of the gradients
// the rank does not own are given back once reduced; otherwise every page is kept.
struct gradient_memory {
  std::size_t whole = 0;         // the pages the buffer spans (what a rank keeps without ZeRO-2)
  std::size_t planned_peak = 0;  // the most held at once during a pass, by the plan
  std::size_t last_peak = 0;     // the most held at once during the last pass (ZeRO-2: measured)
  std::size_t now = 0;           // held now (measured)
};

// What crossed the communicator in the last optimizer step, per rank, in bytes.
struct traffic {
  std::size_t reduced = 0;     // gradients sent into all-reduces (or reduces, when sharded)
  std::size_t gathered = 0;    // parameters all-gathered (sharded)
  std::size_t prefetched = 0;  // of them, gathered while the frame before theirs ran (ZeRO-3)
  std::size_t buckets = 0;     // gradient messages
  std::size_t overlapped = 0;  // of them, started before backward finished
  std::size_t launches = 0;    // points in backward that started some (a block's gradients final)
};

}  // namespace dist
}  // namespace REMAT_NAMESPACE
