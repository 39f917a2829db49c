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
//   bench_offload_gpt --train tiny|7b [--steps 3] [--device-gb N] [--host-gib M] [--gradients-on-host]
//       Plans that GPT (7b: 32 blocks of width 4096, 6.7 billion parameters; tiny: what CI runs)
//       with each block checkpointed and the master weights in host memory (the model built with
//       host_master_weights, trained by OffloadedAdamW; with --gradients-on-host the gradients
//       too, offload_options::gradients), prints the plan per place and refuses
//       (exit 2) what does not fit the budgets before allocating anything; then trains `steps`
//       steps, prints the measured peaks beside the plan per place and tag, and the step's time
//       split; exit 1 when a measured peak differs from the plan.
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

#if !defined(REMAT_BENCH_CUDA)  // (the table is plans only: the host build makes it)
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
  double const n = double(Each::param_count), act = double(each.arena);
  return {
      {"remat stored, AdamW", {double(stored.reserved), 0}},
      {"remat blocks checkpointed, AdamW", {double(each.reserved), 0}},
      {"remat blocks checkpointed, OffloadedAdamW", {double(offloaded.reserved), double(offloaded.host_bytes())}},
      {"remat blocks checkpointed, OffloadedAdamW + master weights on the host",
       {double(full.reserved), double(full.host_bytes())}},
      {"remat blocks checkpointed, OffloadedAdamW + master weights and gradients on the host",
       {double(both.device_bytes()), double(both.host_bytes())}},
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
};

template <std::size_t L, std::size_t W>
shape_row row() {
  return {L, W, Llama<L, W, NoPolicy>::param_count, ways<L, W>()};
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
  std::printf("%s: %zu parameters, batch %zu x %zu tokens, each block checkpointed, bf16, OffloadedAdamW with the "
              "master weights%s on the host\n",
              name, n, batch, seq, gradients_on_host ? " and the gradients" : "");
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
                "are %s and %s\n",
                mib(plan.device_bytes()).c_str(), mib(plan.host_bytes()).c_str(), mib(std::size_t(device_budget)).c_str(),
                mib(std::size_t(host_budget)).c_str());
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
      std::fprintf(stderr, "usage: bench_offload_gpt --table [--host-gib M] | --train tiny|7b [--steps S] "
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
  if (mode == "train" && shape == "7b") return train<Llama<32, 4096, each_block<32>::policy>, vocab>("7b", 1, sequence, steps, device_budget, host_budget,
                                                                     gradients_on_host);
  if (mode == "train" && shape == "tiny")
    return train<GPT<512, 128, 128, 4, 4, 0.0, each_block<4>::policy>, 512>("tiny", 2, 128, steps, device_budget, host_budget,
                                                                             gradients_on_host);
  std::fprintf(stderr, "bench_offload_gpt: expected --table or --train tiny|7b\n");
  return 64;
}
