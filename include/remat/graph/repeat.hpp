// Repeat<N, Block>: one block type, N parameter sets, run in a loop (no N-deep instantiation).
// Its two loops over blocks are the ones every chain of blocks runs, here and in the storage
// policies that schedule a Repeat (CheckpointSequential, Revolve): backward reports each block's
// gradients as final as soon as the block is done, so a data-parallel wrapper overlaps them.
#pragma once

#include "walk.hpp"

#include <cstddef>
#include <string>
#include <utility>

namespace REMAT_NAMESPACE {

namespace detail {

// Blocks [first, last) of a chain of B, forward (block k's parameters at p + k * B::param_count).
template <class B, class S>
constexpr typename S::act_type forward_blocks(S& s, typename S::param_ptr p, typename S::act_type x,
                                              std::size_t first, std::size_t last) {
  static_assert(layer_pass_contract<B, S>::ok);
  for (std::size_t k = first; k < last; ++k) {
    if constexpr (!handles_hollow_v<B>) s.need_input();
    auto const frame = trace_layer<B>(s, k, false);
    auto const gathered = gather_frame<B>(s, p + k * B::param_count);
    x = B::forward(s, gathered.at(p + k * B::param_count), std::move(x));
  }
  return x;
}

// The backward of blocks [first, last), last first; each block's gradients are reported final
// when it is done.
template <class B, class S>
constexpr typename S::act_type backward_blocks(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                               typename S::act_type dy, std::size_t first, std::size_t last) {
  for (std::size_t k = last; k-- > first;) {
    auto const frame = trace_layer<B>(s, k, true);
    auto const gathered = gather_frame<B>(s, p + k * B::param_count);
    dy = B::backward(s, gathered.at(p + k * B::param_count), g + k * B::param_count, std::move(dy));
    if constexpr (B::param_count > 0) s.grads_ready(g + k * B::param_count);
  }
  return dy;
}

}  // namespace detail

template <std::size_t N, class Block>
struct Repeat {
  static_assert(N >= 1, "remat::Repeat<N, Block>: N must be at least 1");
  static_assert(layer_contract<Block>::ok, "remat::Repeat<N, Block>: Block must be a layer (see layer_contract above)");
  static_assert(Block::in_width == Block::out_width || Block::out_width == any_width,
                "remat::Repeat<N, Block>: the block must keep its width to be chained");
  // Its block (what walks over the graph visit).
  using children = type_list<Block>;
  // The same repetition of another block (what a policy that rewrites the graph builds).
  template <class C>
  using rebuild = Repeat<N, C>;
  // N, the number of blocks.
  static constexpr std::size_t count = N;
  // The block type.
  using block = Block;
  // (Each block's layers ask for their input themselves.)
  static constexpr bool handles_hollow = true;
  // The block's input width.
  static constexpr std::size_t in_width = Block::in_width;
  // The block's output width.
  static constexpr std::size_t out_width = Block::out_width;
  // N blocks' parameters, each block its own.
  static constexpr std::size_t param_count = N * Block::param_count;

  // Calls f on each parameter tensor, blocks named "0.", "1.", ... as in nn.Sequential.
  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    for (std::size_t k = 0; k < N; ++k)
      detail::visit_params<Block>(prefix + std::to_string(k) + ".", offset + k * Block::param_count, f);
  }
  // Initialises each block's parameters.
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    for (std::size_t k = 0; k < N; ++k)
      Block::init(p + k * Block::param_count, global_offset + k * Block::param_count, seed);
  }

  // Runs the N blocks in order, each with its own parameters.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    return detail::forward_blocks<Block>(s, p, std::move(x), 0, N);
  }
  // Runs the blocks' backwards in reverse order; each block's gradients are final when it returns
  // (a data-parallel wrapper starts reducing them then).
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    return detail::backward_blocks<Block>(s, p, g, std::move(dy), 0, N);
  }
};

}  // namespace REMAT_NAMESPACE
