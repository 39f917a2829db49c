// The largest GPT one GPU trains, known before anything is allocated (issue 51).
//
//   bench_offload_gpt --table [--host-gib 120]
//       For a ladder of GPT shapes (vocabulary 32,000, one sequence of 2048 tokens, bf16 with fp32
//       master weights, AdamW's update), each way's whole-step plan per place, and the largest
//       shape each way fits on a machine of one H100 (80 GB) or one H200 (141 GB) with --host-gib
//       of host memory. remat's rows are memory_plan's (what the allocators measure, to the
//       byte); PyTorch's and DeepSpeed's come from their documented formulas for the model's
//       state, with remat's planned activations of the same shape added (their estimators count
//       none).
//   bench_offload_gpt --train tiny|7b|shape [--steps 3] [--device-gb N] [--host-gib M] [--gradients-on-host]
//       Trains that GPT (7b: 32 blocks of width 4096, 6.7 billion parameters; tiny: what CI runs;
//       shape: the one compiled in, -DREMAT_OFFLOAD_GPT_SHAPE=layers,width,heads,vocabulary,
//       sequence,batch,device GB, which CMake's REMAT_OFFLOAD_GPT_SHAPE sets, by default 4 blocks
//       of width 128 for 80 GB)
//       in bf16 with the master weights in host memory (the model built with host_master_weights,
//       trained by OffloadedAdamW; with --gradients-on-host the gradients too,
//       offload_options::gradients), its storage chosen by the budget policy: Budget<Bytes, ...>
//       around the whole GPT, Bytes what a device of the size the shape is compiled for (7b: 80 GB)
//       leaves to the activations beside the bf16 weights and the fp32 gradients (tiny: a budget
//       between its stored and its least peak, so that the choice mixes). Prints the choice and the
//       plan per place, and refuses (exit 2) what does not fit --device-gb and --host-gib before
//       allocating anything; then trains `steps` steps, prints the measured peaks beside the plan
//       per place and tag, and the step's time split; exit 1 when a measured peak differs from
//       the plan.
//
// Compiled by nvcc with REMAT_BENCH_CUDA (bench_offload_gpt_cuda) the model is on the GPU (and
// --table is left to the host build); here the "device" is the model's allocator in host memory,
// apart from the optimizer's host memory.
// Each line of results is also printed as a JSON line ("json {...}").
#include <remat/remat.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

using namespace remat;

#if defined(REMAT_BENCH_CUDA)
using Dev = remat::cuda;
static void wait_for_device() { REMAT_CUDA_CHECK(cudaDeviceSynchronize()); }
#else
using Dev = host;
static void wait_for_device() {}
#endif

namespace {

using P = mixed<bfloat16, DynamicLossScale>;
constexpr std::size_t vocab = 32000, sequence = 2048;
constexpr double GB = 1e9, GiB = double(std::size_t(1) << 30);

// Each of L blocks checkpointed (a run of its own).
template <std::size_t L>
struct each_block {
  template <class Blocks>
  using policy = CheckpointSequential<L, Blocks>;
};
// A GPT of L blocks of width W (heads of 128), under a policy of its blocks.
template <std::size_t L, std::size_t W, template <class> class Policy>
using Llama = GPT<vocab, sequence, W, W / 128, L, 0.0, Policy>;

// The activation bytes a device of DeviceBytes leaves to a step of the GPT Net at Batch x Seq
// with its master weights on the host: what the bf16 weights, the fp32 gradients and the loss's
// workspace do not take. The gradients counted whole, so the budget holds with them on the device;
// on the host (their pages alone on the device) the step needs less. (Counted here rather than
// taken from memory_plan: a constant evaluation of a 7B plan is past nvcc's limits.)
template <class Net, std::size_t Batch, std::size_t Seq, std::size_t DeviceBytes>
constexpr std::size_t activations_left() {
  constexpr auto rounded = [](std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); };
  constexpr std::size_t rest = rounded(Net::param_count * sizeof(bfloat16)) + rounded(Net::param_count * sizeof(float)) +
                               SoftmaxCrossEntropy::workspace_bytes<bfloat16>(Batch * Seq, Net::out_width);
  static_assert(DeviceBytes > rest, "the device cannot hold the step's weights and gradients");
  return DeviceBytes - rest;
}

// Halfway between the GPT Stored's activation peak stored and its least under a budget policy:
// a budget that stores some blocks and recomputes others.
template <class Stored, std::size_t Batch, std::size_t Seq>
constexpr std::size_t halfway() {
  using B = Budget<1, Batch, Stored, Seq>;  // (only its candidates are planned)
  std::size_t most = 0;
  for (budget_choice const& c : B::template candidates<bfloat16>()) most = c.peak > most ? c.peak : most;
  return (most + B::template minimum<bfloat16>) / 2;
}

// The GPT of --train shape: a model is a type, so its shape is compiled in.
#if defined(REMAT_OFFLOAD_GPT_SHAPE)
constexpr std::size_t compiled_shape[] = {REMAT_OFFLOAD_GPT_SHAPE};
#else
constexpr std::size_t compiled_shape[] = {4, 128, 4, 512, 128, 2, 80};
#endif
static_assert(std::size(compiled_shape) == 7,
              "REMAT_OFFLOAD_GPT_SHAPE: expected layers,width,heads,vocabulary,sequence,batch,device GB");
struct shape_of {
  static constexpr std::size_t layers = compiled_shape[0], width = compiled_shape[1], heads = compiled_shape[2],
                               vocabulary = compiled_shape[3], sequence = compiled_shape[4], batch = compiled_shape[5],
                               device_gb = compiled_shape[6];
  static_assert(layers > 0 && heads > 0 && width % heads == 0 && vocabulary > 1 && sequence > 0 && batch > 0,
                "REMAT_OFFLOAD_GPT_SHAPE: expected layers, heads, sequence and batch above 0, a vocabulary above "
                "1, and a width that the heads divide");
  using gpt = GPT<vocabulary, sequence, width, heads, layers, 0.0>;
};

// The budget policy around the whole GPT Stored (so that its bytes bound all of the step's
// activations), planned at Batch x Seq.
template <class Stored, std::size_t Batch, std::size_t Seq, std::size_t Bytes>
using budgeted = Budget<Bytes, Batch, Stored, Seq>;

// What a budget_choice stores, in words.
std::string describe(budget_choice const& c, std::size_t blocks) {
  if (c.kind == budget_choice::revolve) return "the blocks under Revolve with " + std::to_string(c.slots) + " slots";
  std::size_t const stored = blocks - c.checkpointed - c.selective;
  std::string s;
  auto add = [&](std::size_t n, char const* what) {
    if (n == 0) return;
    s += (s.empty() ? "" : ", ") + std::to_string(n) + (n == 1 ? " block " : " blocks ") + what;
  };
  add(c.checkpointed, "checkpointed");
  add(c.selective, "Selective");
  add(stored, "stored");
  return s;
}

#if !defined(REMAT_BENCH_CUDA)  // (the table is plans only: the host build makes it)
// The plan of a step of the GPT Graph (blocks checkpointed: the least activations but for
// Revolve's) with the master weights and the gradients on the host, at Batch x Seq, on Device.
template <class Graph, std::size_t Batch, std::size_t Seq, class Device>
constexpr memory_plan_result least_plan() {
  return memory_plan<Graph, P, OffloadedAdamW, SoftmaxCrossEntropy, Device>(
      Batch, {.sequence = Seq, .offload_master_weights = true, .offload_gradients = true});
}

struct place {
  double device = 0, host = 0;  // bytes
};
struct way_result {
  char const* way;
  place p;
};

// Every way's plan for L blocks of width W, batch 1 x 2048.
template <std::size_t L, std::size_t W>
std::vector<way_result> ways() {
  using Stored = Llama<L, W, NoPolicy>;
  using Each = Llama<L, W, each_block<L>::template policy>;
  step_options const o{.sequence = sequence};
  step_options const master{.sequence = sequence, .offload_master_weights = true};
  step_options const all{.sequence = sequence, .offload_master_weights = true, .offload_gradients = true};
  auto const stored = memory_plan<Stored, P, AdamW, SoftmaxCrossEntropy>(1, o);
  auto const each = memory_plan<Each, P, AdamW, SoftmaxCrossEntropy>(1, o);
  auto const offloaded = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, o);
  auto const full = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, master);
  auto const both = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, all);
  // A node of 8 GPUs, rank 0's plan (the ranks' shards differ by a parameter at most): ZeRO-3 on
  // the devices; ZeRO-3 and ZeRO-2 with the master weights (each rank's shard of them) and the
  // gradients on the host. The host's column is the node's: 8 ranks' host plans.
  step_options const zero3{.sequence = sequence, .ranks = 8, .rank = 0, .shard_parameters = true};
  step_options const zero3_offload{.sequence = sequence, .ranks = 8, .rank = 0, .offload_master_weights = true,
                                   .offload_gradients = true, .shard_parameters = true};
  step_options const zero2{.sequence = sequence, .ranks = 8, .rank = 0, .shard_optimizer = true,
                           .offload_master_weights = true, .offload_gradients = true, .shard_master_weights = true};
  step_options whole_master = zero2;
  whole_master.shard_master_weights = false;
  auto const node3 = memory_plan<Each, P, AdamW, SoftmaxCrossEntropy, remat::cuda>(1, zero3);
  auto const node3_offload = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, zero3_offload);
  auto const node2 = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, zero2);
  auto const node2_whole = memory_plan<Each, P, OffloadedAdamW, SoftmaxCrossEntropy, remat::cuda>(1, whole_master);
  double const n = double(Each::param_count), act = double(each.arena);
  return {
      {"remat stored, AdamW", {double(stored.reserved), 0}},
      {"remat blocks checkpointed, AdamW", {double(each.reserved), 0}},
      {"remat blocks checkpointed, OffloadedAdamW", {double(offloaded.reserved), double(offloaded.host_bytes())}},
      {"remat blocks checkpointed, OffloadedAdamW + master weights on the host",
       {double(full.reserved), double(full.host_bytes())}},
      {"remat blocks checkpointed, OffloadedAdamW + master weights and gradients on the host",
       {double(both.device_bytes()), double(both.host_bytes())}},
      {"8 GPUs a node (per GPU / the node's host): remat ZeRO-3, blocks checkpointed, AdamW",
       {double(node3.device_bytes()), double(node3.host_bytes()) * 8}},
      {"8 GPUs a node (per GPU / the node's host): remat ZeRO-3, OffloadedAdamW, each rank's shard of the master "
       "weights and its gradients on the host",
       {double(node3_offload.device_bytes()), double(node3_offload.host_bytes()) * 8}},
      {"8 GPUs a node (per GPU / the node's host): remat ZeRO-2, OffloadedAdamW, each rank's shard of the master "
       "weights and its gradients on the host",
       {double(node2.device_bytes()), double(node2.host_bytes()) * 8}},
      {"8 GPUs a node (per GPU / the node's host): the same with each rank's master weights whole",
       {double(node2_whole.device_bytes()), double(node2_whole.host_bytes()) * 8}},
      // torch.autocast + checkpoint: fp32 weights, gradients and Adam's two moments on the device.
      {"PyTorch autocast + checkpoint (16 B/param)", {16 * n + act, 0}},
      // estimate_zero2_model_states_mem_needs(cpu_offload=True), one GPU: 2 bytes a parameter on
      // the device; on the host max(4, 16) bytes a parameter times additional_buffer_factor 1.5.
      {"DeepSpeed ZeRO-2 Offload (its estimator: 2 / 24 B/param)", {2 * n + act, 24 * n}},
  };
}

struct shape_row {
  std::size_t layers, width, params;
  std::vector<way_result> ways;
  // The budget policy around the whole GPT: every storage it weighs, planned, and the device
  // bytes beside the activations with the master weights and the gradients on the host.
  std::vector<budget_choice> candidates;
  double rest = 0;
};

template <std::size_t L, std::size_t W>
shape_row row() {
  using Stored = Llama<L, W, NoPolicy>;
  auto const least = least_plan<Llama<L, W, each_block<L>::template policy>, 1, sequence, remat::cuda>();
  return {L, W, Stored::param_count, ways<L, W>(),
          Budget<1, 1, Stored, sequence>::template candidates<bfloat16>(),  // (only its candidates are planned)
          double(least.device_bytes() - least.arena + least.workspace)};
}

// What Budget<Bytes> would run: the least work among the candidates that fit, then the least peak
// (nullptr: none fits).
budget_choice const* choose(std::vector<budget_choice> const& candidates, double bytes) {
  budget_choice const* best = nullptr;
  for (auto const& c : candidates)
    if (double(c.peak) <= bytes && (!best || c.work < best->work || (c.work == best->work && c.peak < best->peak)))
      best = &c;
  return best;
}

int table(double host_budget) {
  std::vector<shape_row> const rows = {row<24, 2048>(), row<32, 2560>(), row<32, 3072>(), row<32, 4096>(),
                                       row<40, 4096>(), row<48, 4096>(), row<40, 5120>(), row<48, 6144>(),
                                       row<60, 6656>(), row<80, 8192>()};
  std::printf("GPT shapes: vocabulary %zu, one sequence of %zu tokens, bf16 with fp32 master weights, AdamW\n", vocab,
              sequence);
  std::printf("each cell: device GiB / host GiB (the whole step, activations included)\n\n");
  std::printf("| way |");
  for (auto const& r : rows) std::printf(" %zu x %zu (%.1fB) |", r.layers, r.width, double(r.params) / 1e9);
  std::printf("\n|---|");
  for (std::size_t i = 0; i < rows.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::size_t const ways_count = rows.front().ways.size();
  for (std::size_t w = 0; w < ways_count; ++w) {
    std::printf("| %s |", rows.front().ways[w].way);
    for (auto const& r : rows) std::printf(" %.1f / %.1f |", r.ways[w].p.device / GiB, r.ways[w].p.host / GiB);
    std::printf("\n");
  }
  // The machine of the issue (128 GiB of host memory, 120 of them for the step), and one with four
  // times the host memory, where the device's share decides.
  double const devices[] = {80 * GB, 141 * GB};
  double const hosts[] = {host_budget, 4 * host_budget};
  auto fits = [&](shape_row const& r, std::size_t w, double device, double host_bytes) {
    return r.ways[w].p.device <= device && r.ways[w].p.host <= host_bytes;
  };
  std::printf("\nThe largest that fits:\n\n| way | H100 80 GB, host %.0f GiB | H200 141 GB, host %.0f GiB | "
              "H100 80 GB, host %.0f GiB | H200 141 GB, host %.0f GiB |\n|---|---|---|---|---|\n",
              hosts[0] / GiB, hosts[0] / GiB, hosts[1] / GiB, hosts[1] / GiB);
  for (std::size_t w = 0; w < ways_count; ++w) {
    std::printf("| %s |", rows.front().ways[w].way);
    for (double host_bytes : hosts)
      for (double device : devices) {
        shape_row const* best = nullptr;
        for (auto const& r : rows)
          if (fits(r, w, device, host_bytes) && (!best || r.params > best->params)) best = &r;
        if (best)
          std::printf(" %zu x %zu (%.1fB) |", best->layers, best->width, double(best->params) / 1e9);
        else
          std::printf(" none |");
      }
    std::printf("\n");
  }
  // The storage the budget policy chooses for each shape on each GPU, fully offloaded.
  std::printf("\nThe budget policy's storage with the master weights and the gradients on the host (Budget around "
              "the whole GPT, its bytes what the device leaves to the activations; the host's share apart):\n\n"
              "| shape | H100 80 GB | H200 141 GB |\n|---|---|---|\n");
  for (auto const& r : rows) {
    std::printf("| %zu x %zu (%.1fB) |", r.layers, r.width, double(r.params) / 1e9);
    for (double device : devices) {
      budget_choice const* c = choose(r.candidates, device - r.rest);
      if (c)
        std::printf(" %s: activations %.1f GiB, device %.1f GiB |", describe(*c, r.layers).c_str(),
                    double(c->peak) / GiB, (r.rest + double(c->peak)) / GiB);
      else
        std::printf(" does not fit |");
    }
    std::printf("\n");
    for (double device : devices) {
      budget_choice const* c = choose(r.candidates, device - r.rest);
      std::printf("json {\"bench\":\"offload_gpt_budget_table\",\"layers\":%zu,\"width\":%zu,\"device_budget\":%.0f,"
                  "\"fits\":%s,\"kind\":\"%s\",\"checkpointed\":%u,\"selective\":%u,\"slots\":%u,"
                  "\"activations\":%zu,\"device_bytes\":%.0f,\"recomputed\":%llu}\n",
                  r.layers, r.width, device, c ? "true" : "false",
                  c && c->kind == budget_choice::revolve ? "revolve" : "blocks", c ? unsigned(c->checkpointed) : 0u,
                  c ? unsigned(c->selective) : 0u, c ? unsigned(c->slots) : 0u, c ? c->peak : 0,
                  c ? r.rest + double(c->peak) : 0.0, static_cast<unsigned long long>(c ? c->recomputed : 0));
    }
  }
  std::printf("\n");
  for (std::size_t w = 0; w < ways_count; ++w)
    for (double device : devices)
      for (auto const& r : rows)  // (at the budget given)
        std::printf("json {\"bench\":\"offload_gpt_table\",\"way\":\"%s\",\"layers\":%zu,\"width\":%zu,"
                    "\"params\":%zu,\"device_bytes\":%.0f,\"host_bytes\":%.0f,\"device_budget\":%.0f,"
                    "\"host_budget\":%.0f,\"fits\":%s}\n",
                    r.ways[w].way, r.layers, r.width, r.params, r.ways[w].p.device, r.ways[w].p.host, device,
                    host_budget, fits(r, w, device, host_budget) ? "true" : "false");
  return 0;
}

#endif

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string mib(std::size_t bytes) { return memory::format_bytes(bytes); }

// Trains Net (batch x seq tokens) with its master weights on the host, against its plan.
template <class Net, std::size_t Vocab>
int train(char const* name, std::size_t batch, std::size_t seq, int steps, double device_budget, double host_budget,
          bool gradients_on_host) {
  step_options const o{.sequence = seq, .offload_master_weights = true, .offload_gradients = gradients_on_host};
  auto const plan = memory_plan<Net, P, OffloadedAdamW, SoftmaxCrossEntropy, Dev>(batch, o);
  constexpr std::size_t n = Net::param_count;
  constexpr budget_choice choice = Net::template chosen<bfloat16>;
  std::printf("%s: %zu parameters, batch %zu x %zu tokens, bf16, OffloadedAdamW with the master weights%s on the "
              "host\n",
              name, n, batch, seq, gradients_on_host ? " and the gradients" : "");
  std::printf("the budget policy, for %s of activations: %s (activations %s, %llu block forwards run again)\n",
              mib(Net::budget_bytes).c_str(), describe(choice, Net::runner::N).c_str(), mib(choice.peak).c_str(),
              static_cast<unsigned long long>(choice.recomputed));
  std::printf("json {\"bench\":\"offload_gpt_budget\",\"model\":\"%s\",\"budget\":%zu,\"kind\":\"%s\","
              "\"checkpointed\":%u,\"selective\":%u,\"slots\":%u,\"peak\":%zu,\"recomputed\":%llu}\n",
              name, Net::budget_bytes, choice.kind == budget_choice::revolve ? "revolve" : "blocks",
              unsigned(choice.checkpointed), unsigned(choice.selective), unsigned(choice.slots), choice.peak,
              static_cast<unsigned long long>(choice.recomputed));
  std::printf("plan, device: %s (arena %s, gradient pages beside it %s)\n", plan.describe().c_str(),
              mib(plan.arena).c_str(), mib(plan.gradient_pages).c_str());
  std::printf("plan, host: %s pageable (master weights %s, optimizer state %s, gradients %s), %s page-locked "
              "(optimizer state %s, gradients %s)\n",
              mib(plan.host_pageable.total()).c_str(), mib(plan.host_pageable.parameters).c_str(),
              mib(plan.host_pageable.optimizer_state).c_str(), mib(plan.host_pageable.gradients).c_str(),
              mib(plan.host_page_locked.total()).c_str(), mib(plan.host_page_locked.optimizer_state).c_str(),
              mib(plan.host_page_locked.gradients).c_str());
  std::printf("json {\"bench\":\"offload_gpt_plan\",\"model\":\"%s\",\"params\":%zu,\"device_bytes\":%zu,"
              "\"host_bytes\":%zu,\"device_budget\":%.0f,\"host_budget\":%.0f}\n",
              name, n, plan.device_bytes(), plan.host_bytes(), device_budget, host_budget);
  if (!plan.fits(std::size_t(device_budget), std::size_t(host_budget))) {
    std::printf("refused before allocating anything: the step needs %s on the device and %s on the host; the budgets "
                "are %s and %s (the budget policy chose the storage at compile time, for %s of activations)\n",
                mib(plan.device_bytes()).c_str(), mib(plan.host_bytes()).c_str(), mib(std::size_t(device_budget)).c_str(),
                mib(std::size_t(host_budget)).c_str(), mib(Net::budget_bytes).c_str());
    return 2;
  }
  double const t_build = now();
  memory::caching_allocator<Dev> device;
  memory::caching_allocator<host> host_side;
  memory::caching_allocator<Dev> inputs;  // (the batch is not the step's: another allocator)
  model<Net, Dev, P> m(seed{1}, device, host_master_weights{host_side});
  OffloadedAdamW opt(m, {.lr = 1e-4, .clip_norm = 1.0}, {0, n}, &host_side,
                     {.master_weights = true, .gradients = gradients_on_host ? gradient_place::host : gradient_place::device});
  tensor<std::int32_t, Dev> x(index_t(batch), index_t(seq), memory::tag::workspace, inputs);
  tensor<std::int32_t, Dev> t(index_t(batch), index_t(seq), memory::tag::workspace, inputs);
  {
    std::vector<std::int32_t> hx(x.size()), ht(t.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = std::int32_t(philox::uniform(3, 0, i) * float(Vocab)) % std::int32_t(Vocab);
      ht[i] = std::int32_t(philox::uniform(3, 1, i) * float(Vocab)) % std::int32_t(Vocab);
    }
    x.copy_from(hx);
    t.copy_from(ht);
  }
  wait_for_device();
  std::printf("built in %.1f s (the model initialised in host memory, the optimizer's state)\n", now() - t_build);
  device.reset_peak();
  host_side.reset_peak();
  auto& staging = opt.staging_allocator();
  staging.reset_peak();
  for (int k = 0; k < steps; ++k) {
    double const t0 = now();
    m.zero_grad();
    double const loss = m.template accumulate<SoftmaxCrossEntropy>(x, t);
    wait_for_device();
    double const t1 = now();
    bool const stepped = opt.step();
    double const t2 = now();
    wait_for_device();
    double const t3 = now();
    auto const& split = opt.last_step_times();
    double const reports_waited = opt.last_pass_copy_wait();
    std::printf("step %d: loss %.4f%s; forward + backward %.3f s (of it waiting for gradients down at backward's reports "
                "%.3f s), optimizer %.3f s (gradients down %.3f s, host update with the copies up issued %.3f s), "
                "copies up left %.3f s\n",
                k, loss, stepped ? "" : " (skipped)", t1 - t0, reports_waited, t2 - t1, split.copy_down, split.update,
                t3 - t2);
    std::printf("json {\"bench\":\"offload_gpt_step\",\"model\":\"%s\",\"step\":%d,\"loss\":%.6f,\"forward_backward\":"
                "%.4f,\"reports_waited\":%.4f,\"optimizer\":%.4f,\"copy_down\":%.4f,\"update\":%.4f,"
                "\"copy_up_left\":%.4f}\n",
                name, k, loss, t1 - t0, reports_waited, t2 - t1, split.copy_down, split.update, t3 - t2);
  }
  // The measured peaks beside the plan, per place and tag.
  int status = 0;
  auto compare = [&](char const* where, char const* what, std::size_t measured, std::size_t planned) {
    bool const same = measured == planned;
    if (!same) status = 1;
    if (measured || planned)
      std::printf("  %-9s %-16s measured %12zu  plan %12zu  %s\n", where, what, measured, planned,
                  same ? "equal" : "DIFFERENT");
  };
  std::printf("peaks after %d steps (bytes):\n", steps);
  auto const d = device.stats(), h = host_side.stats(), s = staging.stats();
  bool const staged_apart = static_cast<void*>(&staging) != static_cast<void*>(&host_side);
  for (memory::tag g : memory::all_tags) {
    compare("device", memory::name(g), d[g].peak, plan[g]);
    compare(staged_apart ? "pageable" : "host", memory::name(g), h[g].peak, plan.host_pageable[g]);
    if (staged_apart) compare("locked", memory::name(g), s[g].peak, plan.host_page_locked[g]);
  }
  compare("device", "reserved", d.total.reserved, plan.reserved);
  if (gradients_on_host) compare("device", "gradient pages", opt.gradient_pages().last_peak, plan.gradient_pages);
  std::size_t const host_measured = h.total.peak + (staged_apart ? s.total.peak : 0);
  compare("host", "in all", host_measured, plan.host_pageable.total() + plan.host_page_locked.total());
  std::size_t const device_measured = d.total.reserved + (gradients_on_host ? opt.gradient_pages().last_peak : 0);
  std::printf("device %s (plan %s), host %s (plan %s): %s\n", mib(device_measured).c_str(),
              mib(plan.device_bytes()).c_str(), mib(host_measured).c_str(),
              mib(plan.host_pageable.total() + plan.host_page_locked.total()).c_str(),
              status == 0 ? "every peak equals its plan" : "a peak differs from its plan");
  std::printf("json {\"bench\":\"offload_gpt_peaks\",\"model\":\"%s\",\"device_reserved\":%zu,\"device_plan\":%zu,"
              "\"host_peak\":%zu,\"host_plan\":%zu,\"equal\":%s}\n",
              name, device_measured, plan.device_bytes(), host_measured,
              plan.host_pageable.total() + plan.host_page_locked.total(), status == 0 ? "true" : "false");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, shape;
  int steps = 3;
  bool gradients_on_host = false;
  double device_budget = 80 * GB, host_budget = 120 * GiB;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_offload_gpt: %s expects a value\n", a.c_str());
        std::exit(64);
      }
      return std::string(argv[++i]);
    };
    if (a == "--table")
      mode = "table";
    else if (a == "--train")
      mode = "train", shape = value();
    else if (a == "--steps")
      steps = std::stoi(value());
    else if (a == "--device-gb")
      device_budget = std::stod(value()) * GB;
    else if (a == "--host-gib")
      host_budget = std::stod(value()) * GiB;
    else if (a == "--gradients-on-host")
      gradients_on_host = true;
    else {
      std::fprintf(stderr, "usage: bench_offload_gpt --table [--host-gib M] | --train tiny|7b|shape [--steps S] "
                           "[--device-gb N] [--host-gib M] [--gradients-on-host]\n");
      return 64;
    }
  }
#if !defined(REMAT_BENCH_CUDA)
  if (mode == "table") return table(host_budget);
#else
  if (mode == "table") {
    std::fprintf(stderr, "bench_offload_gpt_cuda: the table is made by the host build (bench_offload_gpt --table)\n");
    return 64;
  }
#endif
  if (mode == "train" && shape == "7b") {
    // Planned for one H100's 80 GB, the gradients on either side (on an H200 the budget policy
    // chooses the same: nothing is recomputed at 80 GB already).
    using Stored = Llama<32, 4096, NoPolicy>;
    constexpr std::size_t bytes = activations_left<Stored, 1, sequence, std::size_t(80 * GB)>();
    return train<budgeted<Stored, 1, sequence, bytes>, vocab>("7b", 1, sequence, steps, device_budget, host_budget,
                                                              gradients_on_host);
  }
  if (mode == "train" && shape == "shape") {
    using S = shape_of;
    constexpr std::size_t bytes = activations_left<S::gpt, S::batch, S::sequence, std::size_t(S::device_gb * GB)>();
    char name[96];
    std::snprintf(name, sizeof name, "%zu x %zu (%zu heads), vocabulary %zu, for %zu GB", S::layers, S::width, S::heads,
                  S::vocabulary, S::device_gb);
    return train<budgeted<S::gpt, S::batch, S::sequence, bytes>, S::vocabulary>(
        name, S::batch, S::sequence, steps, device_budget, host_budget, gradients_on_host);
  }
  if (mode == "train" && shape == "tiny") {
    using Stored = GPT<512, 128, 128, 4, 4, 0.0>;
    return train<budgeted<Stored, 2, 128, halfway<Stored, 2, 128>()>, 512>("tiny", 2, 128, steps, device_budget,
                                                                          host_budget, gradients_on_host);
  }
  std::fprintf(stderr, "bench_offload_gpt: expected --table or --train tiny|7b|shape\n");
  return 64;
}
