// The plans of a model's passes outside training: an inference forward (model::forward, with its
// output returned or written into the caller's tensor), the loss of one (model::loss) and a
// training-mode forward that keeps nothing (model::training_loss). Each is the model's own forward
// run on a planning::state (as the training step's plan is: plan/activation.hpp), then laid out in
// an arena (plan/arena.hpp), so a program that trains, validates and infers holds one arena, the
// largest of the layouts of the passes it ran, and reserves nothing more for activations.
//
//   // model::forward(x, out) on up to 4096 rows, served from an arena of this many bytes:
//   constexpr std::size_t bytes = remat::inference_plan<Net, remat::fp32>(4096).bytes;
//
// A forward's layout at a batch serves every smaller batch too (each activation is no larger, and
// the order of makes does not depend on the batch): model::reserve_inference. (Where a shorter
// sequence makes a tensor the layout did not foresee, that one comes from the caching allocator,
// counted as unplanned; the allocator never serves an arena's bytes to two live blocks.)
#pragma once

#include "arena.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {

// Which pass outside training a plan is of.
enum class forward_kind : std::uint8_t {
  inference,      // model::forward(x): the output, in the master type, handed to the caller
  into_caller,    // model::forward(x, out): the output copied into the caller's tensor
  loss,           // model::loss: an inference forward's output in the master type, then the loss
  training_loss,  // model::training_loss: dropout on, nothing kept, the loss on the compute type
};

namespace detail {

// Runs the forward of `kind` on `mem`; loss_workspace: the bytes of the loss's workspace (the
// loss kinds).
template <class Net, class Precision>
constexpr void plan_forward_into(planning::counter& mem, forward_kind kind, std::size_t batch, std::size_t features,
                                 std::size_t sequence, std::size_t loss_workspace) {
  using C = typename Precision::compute;
  using T = typename Precision::master;
  planning::counter offloaded;
  std::size_t const rows = batch * sequence;
  bool const training = kind == forward_kind::training_loss;
  pass_options o{.training = training, .keep = false, .sequence_length = sequence};
  if constexpr (reads_ids_v<Net>) o.ids.count = rows;
  planning::state<C> s(mem, offloaded, o);
  planning::ref y;
  {
    planning::ref x = input_activation<Net, Precision>(s, planning::input_shape{rows, features}, training);
    auto const gathered = gather_frame<Net>(s, planning::no_params{});
    y = Net::forward(s, gathered.at(planning::no_params{}), std::move(x));
  }
  planning::ref out;  // the output in the master type, when the pass makes one (model::take)
  if ((kind == forward_kind::inference || kind == forward_kind::loss) &&
      (!std::is_same_v<C, T> || y.use_count() > 1)) {
    out = mem.make(y->rows(), y->cols(), sizeof(T));
    y.reset();
  }
  if (kind == forward_kind::loss || kind == forward_kind::training_loss)
    if (loss_workspace) mem.workspace_while(loss_workspace);
}

template <class Net, class Precision>
constexpr arena_layout plan_forward_arena(forward_kind kind, std::size_t batch, std::size_t features,
                                          std::size_t sequence, std::size_t loss_workspace) {
  planning::counter mem;
  plan_forward_into<Net, Precision>(mem, kind, batch, features, sequence, loss_workspace);
  return lay_out(mem);
}

}  // namespace detail

// The arena of a pass of `kind` outside training on `batch` rows (sequences of `sequence`
// positions) whose loss, if any, allocates `loss_workspace` bytes: its size and lower bound. A
// constant expression, as arena_plan is (and, like it, never smaller than the run-time layout).
template <class Net, class Precision = fp32>
constexpr arena_size forward_plan(forward_kind kind, std::size_t batch, std::size_t features = Net::in_width,
                                  std::size_t sequence = 1, std::size_t loss_workspace = 0) {
  detail::check_plan_shape<Net>("remat::forward_plan", batch, features, sequence, false);  // (inference: any batch)
  arena_layout const l = detail::plan_forward_arena<Net, Precision>(kind, batch, features, sequence, loss_workspace);
  return {l.size, l.lower_bound};
}

// The arena model::forward(x, out) runs in for up to `batch` rows: what model::reserve_inference
// holds (the inference call that allocates nothing).
template <class Net, class Precision = fp32>
constexpr arena_size inference_plan(std::size_t batch, std::size_t features = Net::in_width, std::size_t sequence = 1) {
  detail::check_plan_shape<Net>("remat::inference_plan", batch, features, sequence, false);
  return forward_plan<Net, Precision>(forward_kind::into_caller, batch, features, sequence);
}

}  // namespace REMAT_NAMESPACE
