// Choosing a storage policy to fit a memory budget, at compile time.
//
// A 48-block pre-norm residual MLP (width 512) at batch 512 keeps about 290 MiB of activations
// for backward when every activation is stored; checkpointing every block, 48 MiB. Each policy
// below is the same model with a different type; activation_plan gives each one's peak at compile
// time. Budget<Bytes, Batch, S> lets the compiler choose: the least recomputation whose plan fits
// (it would refuse to compile, naming the smallest feasible budget, if none did). The whole step
// (weights, gradients, AdamW's moments, activations) is planned too, and a static_assert refuses
// to build a step that does not fit. The program then trains a few steps of the chosen model and
// prints the allocator's measured peaks and reserved bytes next to the plan (the step's
// activations lie in one arena laid out by the plan, so nothing is reserved beyond it).
//
//   memory_budget            (plans of every policy, then 3 steps of the chosen one)
//   memory_budget_cuda       (the same on the GPU: built by nvcc from main.cu)
#include <remat/remat.hpp>

#include <cstdio>
#include <vector>

using namespace remat;

#if defined(REMAT_EXAMPLE_CUDA)
using Device = remat::cuda;
#else
using Device = host;
#endif

constexpr std::size_t width = 512, depth = 48, batch = 512;
using Block = Residual<Seq<LayerNorm<width>, Linear<width, 2 * width>, GELU, Linear<2 * width, width>>>;

using Stored = Seq<Repeat<depth, Block>, Linear<width, 16>>;
using EveryBlock = Seq<Repeat<depth, Checkpointed<Block>>, Linear<width, 16>>;
using SqrtN = Seq<CheckpointSequential<7, Repeat<depth, Block>>, Linear<width, 16>>;
using Binomial = Seq<Revolve<4, Repeat<depth, Block>>, Linear<width, 16>>;
using SelectiveBlocks = Seq<Repeat<depth, Selective<Block>>, Linear<width, 16>>;
using OffloadedBlocks = Seq<Repeat<depth, Offloaded<Block>>, Linear<width, 16>>;

// The budget for activations, and the model the compiler chooses to fit it.
constexpr std::size_t budget = std::size_t(256) << 20;  // 256 MiB
using Chosen = Budget<budget, batch, Stored>;
constexpr auto chosen_plan = activation_plan<Chosen, fp32>(batch);
static_assert(chosen_plan.peak_bytes <= budget);
// The whole training step with AdamW: 48 blocks of 1.05 M parameters, four copies of each
// (weights, gradients, two moments), and the activations.
// (Its arena, the layout of about 420 activations, is planned at run time below: a constant
// expression that large passes nvcc's evaluation limits.)
constexpr auto step_plan = memory_plan<Chosen, fp32, AdamW>(batch, {.arena = false});
static_assert(step_plan.peak <= (std::size_t(5) << 28), "the training step must fit in 1.25 GiB");

template <class Net>
void print_plan(char const* name) {
  constexpr auto p = activation_plan<Net, fp32>(batch);
  std::printf("  %-28s peak %9s  kept by forward %9s  block forwards recomputed %4llu  %s", name,
              memory::format_bytes(p.peak_bytes).c_str(), memory::format_bytes(p.saved_bytes).c_str(),
              static_cast<unsigned long long>(p.recomputed), p.peak_bytes <= budget ? "fits" : "too big");
  if (p.offloaded_bytes) std::printf("  (+ %s in host memory)", memory::format_bytes(p.offloaded_bytes).c_str());
  std::printf("\n");
}

int main() {
  std::printf("activation plans, %zu blocks of width %zu at batch %zu (budget %s):\n", depth, width, batch,
              memory::format_bytes(budget).c_str());
  print_plan<Stored>("stored");
  print_plan<EveryBlock>("Checkpointed every block");
  print_plan<SqrtN>("CheckpointSequential<7>");
  print_plan<Binomial>("Revolve<4>");
  print_plan<SelectiveBlocks>("Selective every block");
  print_plan<OffloadedBlocks>("Offloaded every block");
  constexpr budget_choice c = Chosen::chosen<float>;
  std::printf("Budget<%s> chose: ", memory::format_bytes(budget).c_str());
  if (c.kind == budget_choice::revolve)
    std::printf("revolve with %u slots", c.slots);
  else
    std::printf("the first %u blocks checkpointed, %u selective, %zu stored", c.checkpointed, c.selective,
                depth - c.checkpointed - c.selective);
  std::printf(" (%llu block forwards recomputed)\n", static_cast<unsigned long long>(chosen_plan.recomputed));
  print_plan<Chosen>("Budget<256 MiB>");
  auto const whole_step = memory_plan<Chosen, fp32, AdamW>(batch);  // the same, with the arena laid out
  std::printf("the whole step: %s\n", whole_step.describe().c_str());

#if defined(REMAT_EXAMPLE_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to train\n");
    return 77;
  }
#endif
  memory::caching_allocator<Device> alloc;
  model<Chosen, Device> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-4});
  index_t const rows = batch;
  tensor<float, Device> x(rows, index_t(width)), t(rows, 16);
  std::vector<float> hx(x.size()), ht(t.size());
  for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = float(philox::uniform(2, 0, i)) - 0.5f;
  for (std::size_t i = 0; i < ht.size(); ++i) ht[i] = float(philox::uniform(2, 1, i)) - 0.5f;
  x.copy_from(hx);
  t.copy_from(ht);
  for (int step = 0; step < 3; ++step) {
    alloc.reset_peak();
    double const loss = m.train_step<MSE>(x, t, opt);
    std::printf(
        "step %d: loss %.5f, activation peak measured %s, planned %s; step peak measured %s, planned %s; "
        "reserved %s, planned %s\n",
        step, loss, memory::format_bytes(alloc.stats()[memory::tag::activations].peak).c_str(),
        memory::format_bytes(chosen_plan.peak_bytes).c_str(), memory::format_bytes(alloc.stats().total.peak).c_str(),
        memory::format_bytes(step_plan.peak).c_str(), memory::format_bytes(alloc.stats().total.reserved).c_str(),
        memory::format_bytes(whole_step.reserved).c_str());
    if (alloc.stats()[memory::tag::activations].peak != chosen_plan.peak_bytes) return 1;
    for (memory::tag t : memory::all_tags)
      if (alloc.stats()[t].peak != step_plan[t]) return 1;
    if (alloc.stats().total.peak != step_plan.peak) return 1;
    // The step's activations lie in one arena laid out by the plan: reserved is the plan too.
    if (alloc.stats().total.reserved != whole_step.reserved || m.last_pass().unplanned != 0) return 1;
  }
  std::printf("%s", alloc.summary().c_str());
  return 0;
}
