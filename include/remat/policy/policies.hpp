// Storage policies: wrapper types around a segment of the graph that change what its forward keeps
// for backward, and so the peak memory of training, without changing a single value. One file
// each:
//
//   Checkpointed<S>               keeps S's input and RNG offset; backward re-runs S's forward
//   CheckpointSequential<K, S>    S (a Seq or a Repeat) cut into K equal runs, each checkpointed
//                                 (with last_run::stored PyTorch's checkpoint_sequential: K - 1
//                                 runs of N / K checkpointed, the rest kept in a last run)
//   Revolve<C, Repeat<N, B>>      at most C block inputs kept; the binomial schedule
//   Selective<S>                  keeps S's input and its matrix products' outputs; backward
//                                 recomputes only the point-wise work (norms, activations)
//   Offloaded<S>                  S's saved activations in (pinned) host memory between S's forward
//                                 and its backward, copied on a side stream beside the compute
//   RecomputeAttention<S>         every attention core of S checkpointed
//   Budget<Bytes, Batch, S>       one of the above for each block of S's chain, chosen at compile
//                                 time: the least recomputation whose plan fits Bytes at Batch
//
// What every policy guarantees (each is tested):
// - The recomputation runs with the same RNG offsets and precision as the first forward, so losses
//   and gradients are bit-for-bit those of the stored run (dropout included).
// - A recomputing forward runs with s.recomputing() set: a layer with side effects (a step
//   counter, a running statistic) does them once.
// - Parameters of a segment get their gradients whether or not its input needs one.
// - Parameter layout and names are those of S: a checkpointed model reads a stored model's file.
//
// Policies nest (a Checkpointed block inside a Revolve, a Selective block in a checkpointed
// run); inside another policy's forward that keeps nothing, a policy just runs its segment.
#pragma once

#include "budget.hpp"
#include "checkpoint_sequential.hpp"
#include "checkpointed.hpp"
#include "offloaded.hpp"
#include "recompute_attention.hpp"
#include "revolve.hpp"
#include "selective.hpp"
#include "wraps.hpp"
