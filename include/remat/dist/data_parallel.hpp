// remat::dist::data_parallel<Model, Transport>: data-parallel training over an MPI communicator
// the caller owns (include <remat/dist/mpi.hpp>, which brings this).
//
//   remat::dist::data_parallel dp(model, MPI_COMM_WORLD);      // checks the ranks' models agree,
//   remat::AdamW opt(model, {.lr = 1e-3});                     // broadcasts rank 0's parameters
//   for (...) dp.train_step<remat::SoftmaxCrossEntropy>(x_local, y_local, opt);
//
// Each rank trains on its part of the batch. Backward reports each layer's gradients as they
// become final, and the wrapper reduces them in buckets (from the last layer's back) while
// backward goes on; the optimizer built from the model waits for them, agrees with the other ranks
// on the gradient norm and on overflow (a loss scale's skip is taken by every rank together), and
// steps. Gradients are averaged over the ranks (each rank's loss gradient is weighted 1/P).
//
// With options::shard_optimizer (ZeRO stage 1) each rank's optimizer keeps the moments of 1/P of
// the parameters: buckets are reduced to the rank that owns each part, each rank updates its part
// and the parameters are all-gathered. The fp32 master weights stay whole on every rank (the model
// keeps them for its passes, saving and loading); the optimizer state drops by P.
//
// With options::shard_gradients as well (ZeRO stage 2) each rank keeps the gradients of its shard
// only. The buckets go to their owners as in stage 1; at each of backward's reports the rank
// waits for the buckets started at earlier reports and gives the memory pages of their non-owned
// gradients back to the system (madvise; they read as zero when touched again), so a pass holds
// the rank's shard plus about two reports' span of gradients (rounded out to buckets and pages).
// Before backward writes a span (down to the plan's next report) the wrapper takes its pages
// back (commits them). On the GPU that is what makes it work: the model's gradient buffer moves
// into granules of virtual memory (cuda/granules.hpp: cuMemMap, 2 MiB each on an H100) whose
// memory is given back (they show one shared granule of zeros, so they read as zero) and mapped
// again (zeroed) when committed; the model's offsets never change.
// The most a pass holds is planned from the model's plan walk (gradient_pages().planned_peak) and
// measured at every report, from the kernel's page tables (mincore) or the granules mapped: the
// two are equal. The allocator's gradients tag still counts a host buffer's whole address range,
// and none of a GPU model's granules: what is held is gradient_pages().
//
// With options::shard_parameters as well (ZeRO stage 3) each rank keeps its shard of the
// parameters only: the pages of the model's parameter buffer outside it are given back (in
// mixed precision, of the fp32 master weights and of their 16-bit compute copy both; a pass casts
// the shard of the compute copy only, and layers gather the compute copy: half the bytes). Every
// frame of the walk that runs a layer (graph/walk.hpp's gather_frame: each layer of a Seq, each
// block of a chain, a Residual or policy around one layer as a whole) tells the wrapper which
// parameters it reads; they are all-gathered from their owners into the wrapper's gather buffer (as
// large as the largest frame's parameters, by the model's plan walk) and the layer reads them
// there. As a layer starts, the next frame's parameters (by the plan's list of the pass's frames)
// start their all-gather into a second buffer (options::prefetch_parameters), on a transport of
// their own, so they move while the layer runs and a wait for them never waits for gradients. So a
// rank holds its shard plus two layers' parameters (one without prefetching), and the memory it
// gathers into is the same for every layer, taken as the wrapper is built (no page is faulted in
// again). With options::keep_parameters_for_backward a pass gathers each layer's parameters
// once, into the model's own pages, and keeps them until it ends (backward and recomputations read
// them there): half the gathers, the whole parameters at the pass's peak. What a gather writes
// into the model's own memory is committed first, as backward's gradients are; on the GPU the
// parameters and their compute copy move into granules as the gradients do, and the gather
// buffers are device memory. parameter_pages() says what is held (mincore, or the granules of
// their own) and what the plan says. Every pass of the model is collective then, inference
// included (model.forward, loss and training_loss are agreed as a training pass is). A rank whose
// pass fails goes on taking part in the gathers and reductions the others make, following the
// plan's list of them.
//
// Bad input on one rank (an id out of range, a batch of the wrong shape) is found before anything
// changes and every rank throws: the rank with the bad input its own error, the others dist_error
// naming that rank and quoting its message; all stay consistent and may go on. A pass that fails
// on one rank (out of memory at any allocation) is handled the same way: that rank still takes its
// part in the gradients' reductions, the ranks agree as the pass ends, and every rank throws with
// its gradients, running state and pass count as before the pass. A rank that stops taking part
// (it crashed, or left by an exception outside a pass) leaves the others waiting: every wait has a
// timeout (options::timeout_seconds) after which dist_error is thrown, and dist::environment
// aborts all ranks when an exception leaves its scope. remat calls MPI_Init only through
// dist::environment.
//
// The small messages go through the wrapper's communicator (dist/communicator.hpp); the gradients
// and parameters through Transport: MPI for a host model (dist/mpi_transport.hpp), NCCL for a
// model on remat::cuda (dist/nccl.hpp; link remat::dist_cuda). Each rank uses the device current
// when its model was built.
#pragma once

#include "../error.hpp"
#include "../io/safetensors.hpp"
#include "../runtime/model.hpp"
#include "../train/gradient_sync.hpp"
#include "../train/optimizers.hpp"
#include "communicator.hpp"
#include "mpi_transport.hpp"

// (REMAT_HAS_NCCL comes from remat::dist_cuda; NCCL serves sources that nvcc compiles)
#if defined(REMAT_HAS_NCCL) && REMAT_HAS_NCCL && REMAT_HAS_CUDA
#define REMAT_DIST_NCCL 1
#include "../cuda/granules.hpp"
#include "nccl.hpp"
#else
#define REMAT_DIST_NCCL 0
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
// Whether data_parallel can give gradient pages back and count them (Linux: madvise, mincore):
// what options::shard_gradients needs.
#define REMAT_DIST_GRADIENT_PAGES 1
#else
// Whether data_parallel can give gradient pages back and count them (Linux: madvise, mincore):
// what options::shard_gradients needs.
#define REMAT_DIST_GRADIENT_PAGES 0
#endif

// A check for tests (0 unless a test build defines it): the host pages a ZeRO-2 or ZeRO-3 wrapper
// has given back (gradients, weights, compute copy) are made read-only (mprotect) until it commits
// them again, so that a write it did not commit first faults; on the GPU such a write would land
// in the granule of zeros that every granule given back shares.
#ifndef REMAT_DIST_STRICT_PAGES
#define REMAT_DIST_STRICT_PAGES 0
#endif

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
  // ZeRO stage 3 (implies shard_gradients): each rank keeps 1/P of the parameters too (the
  // memory of the rest is given back: host pages, or on the GPU granules of virtual memory the
  // parameters move into; in mixed precision, 1/P of the master weights and 1/P of their compute
  // copy, which is what is gathered). Every layer's parameters are all-gathered into a buffer
  // of the wrapper's just before it runs (forward, a storage policy's recomputation, backward: the
  // frames of graph/walk.hpp's gather_frame), and the layer reads them there. Every pass of the model is then collective: training through the wrapper, and
  // model.forward, loss and training_loss, which every rank must call together.
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

namespace detail {

template <class Model>
struct default_transport {
  using type = mpi_transport<typename Model::value_type>;
};
#if REMAT_DIST_NCCL
template <class Net, class Precision>
struct default_transport<model<Net, cuda, Precision>> {
  using type = nccl_transport<typename Precision::master>;
};
#endif

}  // namespace detail

// The transport a model's gradients and parameters go through: MPI on the host, NCCL on the GPU.
template <class Model>
using default_transport_t = typename detail::default_transport<Model>::type;

template <class Model, class Transport = default_transport_t<Model>>
class data_parallel final : public REMAT_NAMESPACE::detail::gradient_sync {
 public:
  using model_type = Model;  // the wrapped model
  using transport_type = Transport;  // what gradients and parameters go through
  using T = typename Model::value_type;  // the master weights' and gradients' type
  using C = typename Model::compute_type;  // the weights layers read (T, or a 16-bit copy in mixed precision)
  using input_view = typename Model::input_view;  // a batch this rank trains on (the model's)
  // A target of loss Loss for this rank's batch (the model's).
  template <class Loss>
  using target_type = typename Loss::template target_type<T, typename Model::device>;
  static_assert(std::is_same_v<typename Model::device, host> || !std::is_same_v<Transport, mpi_transport<T>>,
                "remat::dist::data_parallel: a cuda model's gradients go through NCCL; link remat::dist_cuda "
                "(remat::dist with NCCL, found with the CUDA toolkit) instead of remat::dist");
  static constexpr std::size_t n = Model::parameter_count;  // the model's parameters, in all

  // Duplicates `comm` (remat's messages never mix with the caller's), checks that every rank
  // holds the same model type with the same options (dist_error on every rank otherwise),
  // broadcasts rank 0's parameters and pass count, and plugs itself into the model.
  data_parallel(Model& m, MPI_Comm comm, options o = {})
      : model_(m), o_(checked(m, o)), c_(comm, o.timeout_seconds) {
    for (int q = 0; q < c_.size(); ++q) shards_.push_back(shard_of(q));
    check_signatures();
    transport_ = std::make_unique<Transport>(c_);
    // (ZeRO-3: gathers are waited for apart from the gradients' reductions)
    if (gathers_parameters()) gathers_ = std::make_unique<Transport>(c_);
    plan_buckets();
    broadcast_parameters();
    plan_gradient_pages();
    plan_parameter_pages();
    zero3_.whole = true;
    release_parameters();  // (ZeRO-3: this rank keeps its shard of the parameters)
    model_.link().set_replica(std::uint64_t(c_.rank()));
    model_.link().set_gradient_sync(this);
    if (o_.shard_gradients) model_.zero_grad();  // (the pages of the parameters it does not own go)
  }
  data_parallel(data_parallel const&) = delete;
  data_parallel& operator=(data_parallel const&) = delete;
  // With ZeRO-3 on more than one rank, the model is left with this rank's shard of its parameters
  // (its passes refuse to run alone) unless gather_parameters() was called last.
  ~data_parallel() override {
    if (gathers_parameters() && !zero3_.whole) model_.link().set_partial_parameters(true);
    if (model_.link().gradient_sync() == this) model_.link().set_gradient_sync(nullptr);
    bool const abandoned = (transport_ && transport_->busy()) || (gathers_ && gathers_->busy());
#if REMAT_DIST_NCCL
    // ZeRO-2 and ZeRO-3 on the GPU: the gradients and parameters move back into memory of the
    // model's allocator (what this rank does not own reads as zero). If that fails, or a
    // collective may still write them, the granules are left alive for the model.
    if constexpr (on_gpu) {
      bool moved = false;
      if (!abandoned) try {
          if (pages_.grads.granules.count()) model_.relocate_gradients(nullptr);
          if (zero3_.params.granules.count()) model_.relocate_parameters(nullptr, nullptr);
          moved = true;
        } catch (...) {
        }
      if (!moved)
        for (backed_buffer* b : {&pages_.grads, &zero3_.params, &zero3_.compute})
          if (b->granules.count()) (void)new REMAT_NAMESPACE::detail::device_granules(std::move(b->granules));
    }
#endif
    if constexpr (!on_gpu)
      if (!abandoned) try {
          // (REMAT_DIST_STRICT_PAGES: the pages are writable again, for whatever the memory serves next)
          commit_in(pages_.grads, {0, n});
          commit_in(zero3_.params, {0, n});
          commit_in(zero3_.compute, {0, n});
        } catch (...) {
        }
    // Messages abandoned in flight may still use the communicator and its buffers.
    if (abandoned) c_.abandon();
    // (a gather abandoned in flight or by a timeout may still write into its buffer: it is kept;
    // the slots go before the transport, which on the GPU waits for its stream only as it goes)
    if (c_.timed_out() || abandoned)
      for (gather_slot& b : zero3_.slots) b.buffer.leak();
  }

  int rank() const { return c_.rank(); }  // this process's rank among the wrapper's
  int size() const { return c_.size(); }  // the number of ranks
  options const& config() const { return o_; }  // the options it was built with
  Model& model() { return model_; }  // the wrapped model
  // The parameters this rank's optimizer updates: all, or its 1/P when sharded.
  param_range shard() const override { return shard_of(c_.rank()); }
  // The parameters rank r's optimizer updates.
  param_range shard_of(int r) const {
    if (!o_.shard_optimizer) return {0, n};
    std::size_t const p = std::size_t(c_.size());
    return {n * std::size_t(r) / p, n * std::size_t(r + 1) / p};
  }
  // What the last optimizer step moved.
  traffic const& last_step_traffic() const { return last_; }
  // The number of gradient messages a step sends (options::bucket_bytes each, or less).
  std::size_t bucket_count() const { return buckets_.size(); }
  // The gradient buffer's memory: its pages, the plan's peak and the last pass's measured one
  // (options::shard_gradients), and what it holds now: a host model's pages; a GPU model's
  // granules under shard_gradients (all 0 without).
  gradient_memory gradient_pages() const {
    gradient_memory g{pages_.grads.span.whole, pages_.planned_peak, pages_.last_peak, resident_gradient_bytes()};
    if (!o_.shard_gradients) g.planned_peak = g.whole;
    return g;
  }

  // Rank 0's parameters (and pass count) to every rank; done at construction.
  void broadcast_parameters() {
    {
      [[maybe_unused]] auto const on_stream = model_.stream_scope();
      commit_in(zero3_.params, {0, n});  // (ZeRO-3: the pages given back are written)
      transport_->follow();
      transport_->broadcast(model_.parameters().data(), n, 0);
      transport_->join("the parameters' broadcast from rank 0");
    }
    model_.set_passes(c_.broadcast(model_.passes(), 0, "the pass count's broadcast from rank 0"));
    model_.parameters_changed();
    if constexpr (Model::mixed_precision && !on_gpu) {
      // ZeRO-3: every page of the compute copy is touched once (the next pass casts the shard, or
      // on one rank all of it), so that the pages it shares with other memory are held, as the
      // plan counts them, and those of other ranks' shards are given back below whatever they held.
      // (A GPU model's compute copy lives in granules of the wrapper's, zeroed as they are mapped.)
      if (o_.shard_parameters) {
        commit_in(zero3_.compute, {0, n});
        tensor_view<C, typename Model::device> const c = model_.compute_parameters();
        std::memset(static_cast<void*>(c.data()), 0, c.size() * sizeof(C));
      }
    }
    zero3_.whole = true;
    release_parameters();  // (ZeRO-3: this rank keeps its shard)
  }

  // ZeRO-3 (options::shard_parameters): every rank's shard of the parameters to every rank, so the
  // model holds them whole until its next pass or release_parameters() (dist::save does this).
  // Every rank calls it. Without ZeRO-3 the parameters are always whole and nothing is sent.
  void gather_parameters() {
    if (!o_.shard_parameters) return;
    [[maybe_unused]] auto const on_stream = model_.stream_scope();
    commit_in(zero3_.params, {0, n});  // (the pages it gathers into: held before they are written)
    transport_->follow();
    transport_->all_gather(parameter_base(), shards_);
    transport_->join("the parameters' all-gather");
    zero3_.whole = true;
  }
  // The parameters' memory, in bytes of whole pages of the system: the pages the model's buffer
  // spans, the plan's peak during a training pass, the last training pass's measured peak
  // (options::shard_parameters) and what is held now (a host model's; all 0 for a GPU model's).
  // With ZeRO-3 on more than one rank, what is held is the pages of the model's buffer that hold
  // this rank's shard (and the two it shares at its ends) plus the gather buffers layers'
  // parameters are gathered into (two with options::prefetch_parameters, one without), each as
  // large as the largest layer's, held from the wrapper's construction; without ZeRO-3, every
  // page. In mixed precision the compute copy's pages count too, and the gather buffers hold
  // compute values.
  gradient_memory parameter_pages() const {
    gradient_memory g{zero3_.params.span.whole + zero3_.compute.span.whole, zero3_.planned_peak, zero3_.last_peak,
                      held_parameter_bytes()};
    if (!gathers_parameters()) g.planned_peak = g.whole;
    return g;
  }

  // A training pass on this rank's part of the batch; its gradients, weighted weight / P, are
  // added to the model's. With reduce::now (the default) they are reduced across the ranks while
  // backward runs; with reduce::later (all micro-batches of an accumulated step but the last) they
  // stay local until a later pass or the optimizer's step reduces them (with
  // options::shard_gradients every pass is reduced: reduce::later is taken as reduce::now, since
  // the rank keeps no whole gradients to add to). Returns this rank's loss.
  template <class Loss>
  double accumulate(input_view x, target_type<Loss> target, double weight = 1.0, reduce when = reduce::now) {
    agree("data_parallel::accumulate", [&] {
      model_.template validate<Loss>(x, target);
      if (reduced_ || (started_ && !o_.shard_gradients))
        REMAT_NAMESPACE::detail::raise<argument_error>(
            "data_parallel::accumulate: expected gradients not yet reduced, found them reduced by an earlier pass "
            "of this step; zero them first (model.zero_grad(), or train_step), and pass reduce::later for every "
            "micro-batch but the last");
    });
    return as_pass(when == reduce::now || o_.shard_gradients,
                   [&] { return model_.template accumulate<Loss>(x, target, weight / double(size())); });
  }

  // zero_grad, accumulate (reduced while backward runs), the optimizer's step. Returns the loss
  // averaged over the ranks (on every rank).
  template <class Loss, class Optimizer>
  double train_step(input_view x, target_type<Loss> target, Optimizer& opt) {
    agree("data_parallel::train_step", [&] {
      model_.template validate<Loss>(x, target);
      if constexpr (requires { opt.range(); })
        if (opt.range() != shard())
          REMAT_NAMESPACE::detail::raise<argument_error>(
              "data_parallel::train_step: the optimizer updates parameters [", opt.range().begin, ", ",
              opt.range().end, ") but this rank's shard is [", shard().begin, ", ", shard().end,
              "); build the optimizer after the remat::dist::data_parallel");
    });
    model_.zero_grad();
    double const local =
        as_pass(true, [&] { return model_.template accumulate<Loss>(x, target, 1.0 / double(size())); });
    {
      [[maybe_unused]] auto const on_stream = model_.stream_scope();  // (the GPU: the model's stream)
      opt.step();
    }
    return sum(local) / double(size());
  }

  // The sum of a value over the ranks (every rank gets it).
  double sum(double x) { return c_.all_reduce(x, MPI_SUM, "a sum over the ranks"); }

  // Runs f on every rank; if it throws on any, every rank throws: a failing rank its own
  // exception, the others dist_error quoting the first failing rank's message.
  template <class F>
  void agree(char const* what, F&& f) {
    c_.agree(what, static_cast<F&&>(f));
  }

  // Rank 0 gets every rank's shard of a per-parameter vector, in order (the whole vector when
  // the optimizer is not sharded; other ranks get an empty vector).
  std::vector<T> gather_shards(std::vector<T> const& mine) {
    if (!o_.shard_optimizer) return rank() == 0 ? mine : std::vector<T>{};
    std::vector<int> counts, displs;
    for (param_range const& s : shards_) {
      counts.push_back(int(s.size()));
      displs.push_back(int(s.begin));
    }
    return c_.gather(mine, n, counts, displs, "the optimizer state's gather to rank 0");
  }

  // --- the model's and the optimizer's side (remat::detail::gradient_sync) ---
  void check_pass() const override {
    if (!inside_)
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "model: this model is wrapped in a remat::dist::data_parallel; train it through the wrapper "
          "(dp.accumulate or dp.train_step) so that every rank takes part");
  }
  // A pass started by this wrapper begins: its buckets start afresh.
  void pass_starting() override {
    before_ = {pending_, started_, next_, traffic_};
    pending_ = true;
    next_ = 0;
    in_flight_low_ = n;
    pages_.pass_peak = 0;
    zero3_.pass_peak = 0;
    zero3_.taken = 0;
    release_parameters();  // (ZeRO-3: parameters made whole for a while are let go)
    release_kept();
    if (o_.shard_gradients) commit_first_span();  // (the GPU: mapped before backward writes them)
    if (overlap_) started_ = true;
  }
  // Starts the buckets whose gradients are final (from `offset` to the end), when the pass reduces.
  void gradients_ready(std::size_t offset) override {
    ++zero3_.taken;
    if (!overlap_) return;
    if (o_.shard_gradients) {
      // The pages held now are the most since the last report (backward only adds); then the
      // buckets started at earlier reports are waited for and their pages given back.
      pages_.pass_peak = std::max(pages_.pass_peak, resident_gradient_bytes());
      if (transport_->busy()) transport_->join("the gradients' reduction");
      release_from(in_flight_low_);
    }
    launch_ready(offset);
    if (o_.shard_gradients) commit_next_span(offset);
    transport_->progress();
    if (gathers_ && gathers_->busy()) gathers_->progress();  // (a prefetch in flight)
  }
  // Agrees with the other ranks on how the pass ended; see gradient_sync::pass_ended.
  void pass_ended(std::exception_ptr failed) override {
    // A rank that failed starts the buckets the others start as their backward ends (its values
    // are discarded), so that no rank waits for it.
    if (failed && overlap_) {
      if (o_.shard_parameters) take_part_after_failing(failed);
      launch_ready(0);
    }
    if (!failed || !timed_out(failed)) finish_gathers();  // (none is left in flight when the pass follows its plan)
    try {
      c_.agree("data_parallel: a training pass", [&] {
        if (failed) std::rethrow_exception(failed);
      });
      if (o_.shard_gradients) {  // every pass ends reduced: this rank keeps its shard's gradients
        transport_->join("the gradients' reduction");
        release_from(0);
        pages_.last_peak = pages_.pass_peak;
      }
      zero3_.last_peak = std::max(zero3_.pass_peak, held_parameter_bytes());
      release_kept();
    } catch (...) {
      // Every rank undoes the pass: once the reductions are done with the gradients, the model
      // restores them, and this wrapper is as before the pass.
      if (transport_->busy()) transport_->join("a failed pass's reductions");
      release_kept();
      pending_ = before_.pending;
      started_ = before_.started;
      next_ = before_.next;
      traffic_ = before_.moved;
      throw;
    }
  }
  // Waits for reductions in flight (they write the gradients) and forgets the step's state.
  void zeroing_gradients() override {
    if (transport_->busy()) transport_->join("the gradients' reduction");
    pending_ = reduced_ = started_ = false;
    next_ = 0;
  }
  // ZeRO-2: between passes only this rank's shard of the gradients holds values.
  param_range kept_gradients(std::size_t count) const override {
    return o_.shard_gradients ? shard() : param_range{0, count};
  }
  // ZeRO-2: zeroes this rank's shard of the gradients and gives back the pages of the rest.
  bool clear_gradients() override {
    if (!o_.shard_gradients) return false;
    release_from(0);
    param_range const s = shard();
    if (s.size()) zero_bytes(gradient_base() + s.begin, s.size() * sizeof(T));
    return true;
  }
  // Before an optimizer's step: starts what is left (passes kept local) and waits for all of it.
  void finish() override {
    if (pending_ && next_ < buckets_.size()) launch_ready(0);  // passes left local (reduce::later): reduce them now
    transport_->join("the gradients' reduction");
    if (pending_) reduced_ = true;
    pending_ = false;
  }
  double agree_squares(double local) override {
    // Sharded: the parts add up. Whole: every rank holds the same gradients; the maximum makes the
    // decision one even if an MPI sums in different orders on different ranks.
    return c_.all_reduce(local, o_.shard_optimizer ? MPI_SUM : MPI_MAX, "the gradient norm's agreement");
  }
  // ZeRO-3 on more than one rank: every pass says which parameters each layer reads.
  bool gathers_parameters() const override { return o_.shard_parameters && size() > 1; }
  // ZeRO-3: whether the model holds every parameter now (after gather_parameters, until the next
  // pass or step).
  bool parameters_whole() const override { return !gathers_parameters() || zero3_.whole; }
  // ZeRO-3: a layer's parameters are brought into a gather buffer (waited for when prefetched,
  // kept when a buffer holds them already, unchanged, gathered now otherwise), where the layer
  // reads them; then the next frame's, by the plan, start into the other buffer (prefetch).
  void const* parameters_needed(std::size_t offset, std::size_t count) override {
    param_range const r{offset, offset + count};
    // The pass's frames by the plan: what comes after this one.
    std::vector<param_range> const* ahead =
        inside_ ? &zero3_.ahead : zero3_.collective >= 0 ? &zero3_.forward_ahead[zero3_.collective] : nullptr;
    std::size_t const index = zero3_.taken;  // (this frame's place among the pass's gathers and reports)
    if (ahead) ++zero3_.taken;
    if (ahead && o_.keep_parameters_for_backward) {  // (in the model's own pages, until the pass ends)
      keep(r, false);
      if (o_.prefetch_parameters && index < ahead->size() && (*ahead)[index].size()) keep((*ahead)[index], true);
      if (inside_) zero3_.pass_peak = std::max(zero3_.pass_peak, held_parameter_bytes());
      return nullptr;
    }
    int const b = bring(r);
    zero3_.reading = b;
    if (o_.prefetch_parameters && ahead && index < ahead->size()) prefetch((*ahead)[index], 1 - b);
    if (inside_) zero3_.pass_peak = std::max(zero3_.pass_peak, held_parameter_bytes());
    return zero3_.slots[b].buffer.data;
  }
  // ZeRO-3 in mixed precision: a pass casts this rank's shard of the compute copy only (each
  // layer's is gathered from the shards of all ranks).
  param_range kept_parameters(std::size_t count) const override {
    return gathers_parameters() ? shard() : param_range{0, count};
  }
  // ZeRO-3: a pass outside training starts; its gathers are counted (see collective_pass_ended).
  void collective_pass_starting(bool training) override {
    zero3_.collective = training ? 1 : 0;
    zero3_.taken = 0;
  }
  // ZeRO-3: a rank whose pass outside training failed takes its part in the gathers that the
  // others' forward still makes (the plan's, from where its own stopped); then the ranks agree on
  // how it ended, and parameters made whole for a while are let go.
  void collective_pass_ended(std::exception_ptr failed) override {
    struct end {
      data_parallel* d;
      ~end() {
        d->zero3_.collective = -1;
        d->release_parameters();
        d->release_kept();
      }
    } const after{this};
    if (failed && !timed_out(failed)) take_part(zero3_.forward[zero3_.collective]);
    if (!failed || !timed_out(failed)) finish_gathers();
    c_.agree("data_parallel: a pass outside training (model.forward, loss or training_loss)", [&] {
      if (failed) std::rethrow_exception(failed);
    });
  }
  // ZeRO-3: a layer has run; nothing to let go (the next layer's gather reuses a buffer), but a
  // prefetch in flight is moved on (MPI progresses inside MPI calls; a failure shows at its wait).
  void parameters_done() noexcept override {
    if (!gathers_ || !gathers_->busy()) return;
    try {
      gathers_->progress();
    } catch (...) {
    }
  }
  // ZeRO-3: after the parameters were made whole (gather_parameters, a broadcast), the pages of
  // those this rank does not own are given back.
  void release_parameters() noexcept override {
    if (!o_.shard_parameters || !zero3_.whole) return;
    zero3_.whole = false;
    give_back_outside_shard(zero3_.params);
    give_back_outside_shard(zero3_.compute);  // (mixed precision: the 16-bit copy's)
  }

  // After an optimizer's step: a sharded optimizer's updated parts go to every rank (ZeRO-3: they
  // stay in their shards).
  void after_update(bool stepped) override {
    last_ = traffic_;
    traffic_ = {};
    if (!stepped || !o_.shard_optimizer) return;
    if (o_.shard_parameters) {  // (a gathered layer, and parameters made whole, are stale)
      release_parameters();
      return model_.parameters_changed();
    }
    transport_->follow();
    transport_->all_gather(model_.parameters().data(), shards_);
    transport_->join("the parameters' all-gather");
    last_.gathered = (n - shard().size()) * sizeof(T);
    model_.parameters_changed();
  }

 private:
  static constexpr std::size_t chunk = std::size_t(1) << 30;  // elements per message, within int

  struct bucket {
    std::size_t begin, end;
  };

  static options checked(Model const& m, options o) {
    if (m.link().gradient_sync())
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "data_parallel: expected a model without a data-parallel wrapper, found one already plugged in");
    if (m.link().partial_parameters())
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "data_parallel: expected a model with whole parameters, found one rank's shard of them only (a ZeRO-3 "
          "wrapper went without gather_parameters()); load the parameters from a file first");
    if (!(o.timeout_seconds > 0))
      REMAT_NAMESPACE::detail::raise<argument_error>("data_parallel: expected timeout_seconds > 0, found ",
                                                     o.timeout_seconds);
    if (o.bucket_bytes < sizeof(T))
      REMAT_NAMESPACE::detail::raise<argument_error>("data_parallel: expected bucket_bytes of at least one parameter (",
                                                     sizeof(T), "), found ", o.bucket_bytes);
    if (o.shard_parameters) o.shard_gradients = true;
    if (o.shard_gradients) {
      if (std::is_same_v<typename Model::device, host> && !REMAT_DIST_GRADIENT_PAGES)
        REMAT_NAMESPACE::detail::raise<argument_error>(
            "data_parallel: shard_gradients (ZeRO-2) gives back memory pages through Linux's madvise; this system "
            "has none");
      o.shard_optimizer = true;
    }
    return o;
  }

  // Runs a training pass started by this wrapper (which the model's check_pass accepts), reducing
  // its buckets during backward when `overlap`.
  template <class F>
  double as_pass(bool overlap, F&& pass) {
    struct reset {
      data_parallel* d;
      ~reset() { d->inside_ = d->overlap_ = false; }
    } guard{this};
    overlap_ = overlap;
    inside_ = true;
    return pass();
  }

  // Every rank's signature against rank 0's: the model's type, its parameters (names and shapes),
  // precision and the options that shape the messages.
  void check_signatures() {
    std::string table;
    for (named_param const& p : Model::parameter_table()) {
      table += p.name;
      for (auto d : p.shape) table += "," + std::to_string(d);
      table += ";";
    }
    constexpr std::size_t K = 7;
    std::vector<std::uint64_t> const all = c_.all_gather(
        {n, detail::fnv1a(table), detail::fnv1a(detail::type_name<typename Model::net>()),
         sizeof(T) * 256 + sizeof(typename Model::compute_type), o_.bucket_bytes,
         (o_.shard_optimizer ? 1u : 0u) + (o_.shard_gradients ? 2u : 0u) + (o_.shard_parameters ? 4u : 0u) +
             (o_.prefetch_parameters ? 8u : 0u) + (o_.keep_parameters_for_backward ? 16u : 0u),
         std::uint64_t(Model::mixed_precision)},
        "the model signatures' exchange");
    for (int q = 1; q < size(); ++q) {
      std::uint64_t const* a = all.data();
      std::uint64_t const* b = all.data() + K * std::size_t(q);
      if (a[0] != b[0] || a[1] != b[1] || a[2] != b[2])
        REMAT_NAMESPACE::detail::raise<dist_error>(
            "data_parallel: expected the same model on every rank, found rank 0 with ", a[0],
            " parameters (signature ", std::hex, a[1] ^ a[2], std::dec, ") and rank ", q, " with ", b[0],
            " parameters (signature ", std::hex, b[1] ^ b[2], std::dec, ")",
            a[0] == b[0] ? (a[1] == b[1] ? ": the layer types differ" : ": the parameter names or shapes differ")
                         : "");
      if (a[3] != b[3] || a[6] != b[6])
        REMAT_NAMESPACE::detail::raise<dist_error>(
            "data_parallel: expected the same precision on every rank, found rank 0 with ", a[3] / 256,
            "-byte master / ", a[3] % 256, "-byte compute values and rank ", q, " with ", b[3] / 256, " / ",
            b[3] % 256);
      if (a[4] != b[4] || a[5] != b[5])
        REMAT_NAMESPACE::detail::raise<dist_error>(
            "data_parallel: expected the same options on every rank, found rank 0 with bucket_bytes ", a[4],
            ", shard_optimizer ", a[5] & 1 ? "true" : "false", ", shard_gradients ", a[5] & 2 ? "true" : "false",
            ", shard_parameters ", a[5] & 4 ? "true" : "false", ", prefetch_parameters ",
            a[5] & 8 ? "true" : "false", " and keep_parameters_for_backward ", a[5] & 16 ? "true" : "false",
            ", rank ", q, " with bucket_bytes ", b[4],
            ", shard_optimizer ", b[5] & 1 ? "true" : "false", ", shard_gradients ", b[5] & 2 ? "true" : "false",
            ", shard_parameters ", b[5] & 4 ? "true" : "false", ", prefetch_parameters ",
            b[5] & 8 ? "true" : "false", " and keep_parameters_for_backward ", b[5] & 16 ? "true" : "false");
    }
  }

  // Buckets from the end of the buffer (backward finishes the last layers first).
  void plan_buckets() {
    std::size_t const per = std::max<std::size_t>(1, std::min(o_.bucket_bytes / sizeof(T), chunk));
    for (std::size_t e = n; e > 0;) {
      std::size_t const b = e > per ? e - per : 0;
      buckets_.push_back({b, e});
      e = b;
    }
  }

  // Starts every bucket not started yet that lies at or above `offset` (final gradients).
  void launch_ready(std::size_t offset) {
    std::size_t const first = next_;
    while (next_ < buckets_.size() && buckets_[next_].begin >= offset) ++next_;
    if (next_ == first) return;
    if (offset > 0) {
      traffic_.overlapped += next_ - first;
      ++traffic_.launches;
    }
    transport_->follow();  // (on the GPU: once the model's stream has written these gradients)
    transport_->group_start();
    for (std::size_t i = first; i < next_; ++i) launch(buckets_[i]);
    transport_->group_end();
    in_flight_low_ = buckets_[next_ - 1].begin;
  }

  // ---- the system's pages of a buffer of host memory (ZeRO-2's gradients, ZeRO-3's parameters)

  struct page_span {
    std::size_t page = 0;                   // the system's page size (0: not a host buffer)
    std::uintptr_t begin = 0, end = 0;      // the buffer's bytes
    std::uintptr_t first = 0;               // the first page it touches
    std::size_t whole = 0;                  // the bytes of the pages it touches
    std::size_t element = sizeof(T);       // the bytes of one of its elements
    std::size_t count() const { return page ? whole / page : 0; }  // the pages it touches
    std::uintptr_t at(std::size_t i) const { return begin + i * element; }  // where element i is
    // Whether page k lies wholly in the buffer (pages shared with other memory are never given back).
    bool inside(std::size_t k) const { return first + k * page >= begin && first + (k + 1) * page <= end; }
    // Whether page k holds any of elements r.
    bool touches(std::size_t k, param_range r) const {
      return r.size() && first + k * page < at(r.end) && at(r.begin) < first + (k + 1) * page;
    }
  };
  // The pages of `count` elements at `data` (a host buffer), kept from huge pages when `split`.
  template <class U>
  static page_span span_of(U const* data, std::size_t count, bool split) {
    page_span s;
    s.element = sizeof(U);
#if REMAT_DIST_GRADIENT_PAGES
    if constexpr (!std::is_same_v<typename Model::device, host>) return s;  // (device memory: not pages of ours)
    long const sys_page = sysconf(_SC_PAGESIZE);
    s.page = sys_page > 0 ? std::size_t(sys_page) : 4096;
    s.begin = reinterpret_cast<std::uintptr_t>(data);
    s.end = s.begin + count * sizeof(U);
    s.first = s.begin / s.page * s.page;
    s.whole = count ? std::size_t((s.end + s.page - 1) / s.page * s.page - s.first) : 0;
    // (pages given back one by one: never gathered into huge pages)
    if (split && s.whole) (void)madvise(reinterpret_cast<void*>(s.first), s.whole, MADV_NOHUGEPAGE);
#else
    (void)data;
    (void)count;
    (void)split;
#endif
    return s;
  }
  // The bytes of a span's pages the process holds now (mincore).
  static std::size_t resident_bytes(page_span const& s, std::vector<unsigned char>& in) {
#if REMAT_DIST_GRADIENT_PAGES
    if (!s.page || s.whole == 0) return 0;
    in.resize(s.count());
    if (mincore(reinterpret_cast<void*>(s.first), s.whole, in.data()) != 0) return 0;
    std::size_t count = 0;
    for (unsigned char c : in) count += c & 1u;
    return count * s.page;
#else
    (void)s;
    (void)in;
    return 0;
#endif
  }

  // One of the model's buffers whose memory comes and goes (see zero_in_page and the functions
  // beside it): its pages (granules), which of them are held, and on the GPU the granules.
  struct backed_buffer {
    page_span span;
    mutable std::vector<unsigned char> held;       // per page: 1 when it holds memory that may be written
    mutable std::vector<unsigned char> residency;  // (mincore's answer)
#if REMAT_DIST_NCCL
    mutable REMAT_NAMESPACE::detail::device_granules granules;  // a GPU model's (its buffer lives there)
#endif
  };

  // ---- the memory of the model's buffers: host pages, or (GPU) granules
  //
  // A backed_buffer's `held` says which of its pages (granules) hold memory a pass may write: a
  // page given back is not held until commit_in() takes it again, just before something writes
  // it (backward the next span of gradients, by the plan's reports; a gather into the model's own
  // parameters). A page given back reads as zero on both devices. On the host it would also come
  // back by itself when written; on the GPU it shows a granule of zeros shared by all such
  // granules (cuda/granules.hpp), which must not be written, so commit_in() maps it first.
  // REMAT_DIST_STRICT_PAGES makes the host's pages given back read-only, for the tests: a write
  // the wrapper did not commit first faults, as it would corrupt the GPU's shared granule.

  static constexpr bool on_gpu = !std::is_same_v<typename Model::device, host>;

  // Sets `bytes` at `p` (memory of the model's device) to zero (on the GPU: on the current stream).
  static void zero_bytes(void* p, std::size_t bytes) {
    if (bytes == 0) return;
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) {
      REMAT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_cuda_stream()));
      return;
    }
#endif
    std::memset(p, 0, bytes);
  }
  // Copies `bytes` within the model's device (on the GPU: on the current stream).
  static void copy_bytes(void* to, void const* from, std::size_t bytes) {
    if (bytes == 0) return;
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) {
      REMAT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, current_cuda_stream()));
      return;
    }
#endif
    std::memcpy(to, from, bytes);
  }
  // Zeroes [a, e) of one page of b, if it is held (a page given back reads as zero).
  static void zero_in_page(backed_buffer const& b, char* a, char* e) {
    if (a >= e) return;
    std::size_t const k = std::size_t((reinterpret_cast<std::uintptr_t>(a) - b.span.first) / b.span.page);
    if (k < b.held.size() && !b.held[k]) return;
    zero_bytes(a, std::size_t(e - a));
  }
  // Pages [k, e) of b (all wholly inside it) are given back.
  static void release_pages(backed_buffer const& b, std::size_t k, std::size_t e) noexcept {
    if (k >= e) return;
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) b.granules.release(k, e);
#endif
    if constexpr (!on_gpu) {
#if REMAT_DIST_GRADIENT_PAGES
      char* const pa = reinterpret_cast<char*>(b.span.first + k * b.span.page);
      std::size_t const bytes = (e - k) * b.span.page;
      if (madvise(pa, bytes, MADV_DONTNEED) != 0)
        std::memset(pa, 0, bytes);  // (the memory stays; the values are what matters)
#if REMAT_DIST_STRICT_PAGES
      if (mprotect(pa, bytes, PROT_READ) != 0) std::abort();
#endif
#endif
    }
    for (std::size_t q = k; q < e && q < b.held.size(); ++q) b.held[q] = 0;
  }
  // The whole pages of b inside its elements [lo, hi) (of type U, from `base`) are given back
  // (they read as zero); the elements of [lo, hi) on pages partly outside it are zeroed.
  template <class U>
  static void give_back_in(backed_buffer const& b, U* base, std::size_t lo, std::size_t hi) {
    if (lo >= hi || b.span.page == 0) return;
    auto const page = std::uintptr_t(b.span.page);
    char* const x = reinterpret_cast<char*>(base + lo);
    char* const y = reinterpret_cast<char*>(base + hi);
    char* const px = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(x) + page - 1) / page * page);
    char* const py = reinterpret_cast<char*>(reinterpret_cast<std::uintptr_t>(y) / page * page);
    if (px >= py) return zero_in_page(b, x, y);
    zero_in_page(b, x, px);
    zero_in_page(b, py, y);
    release_pages(b, std::size_t((reinterpret_cast<std::uintptr_t>(px) - b.span.first) / page),
                  std::size_t((reinterpret_cast<std::uintptr_t>(py) - b.span.first) / page));
  }
  // The pages of b holding its elements r are held again (zero), before something writes them.
  static void commit_in(backed_buffer const& b, param_range r) {
    if (r.size() == 0 || b.span.page == 0) return;
    std::size_t const last = std::min(b.held.size(), std::size_t((b.span.at(r.end) - 1 - b.span.first) / b.span.page) + 1);
    for (std::size_t k = std::size_t((b.span.at(r.begin) - b.span.first) / b.span.page); k < last; ++k) {
      if (b.held[k]) continue;
      std::size_t e = k;
      while (e < last && !b.held[e]) ++e;
#if REMAT_DIST_NCCL
      if constexpr (on_gpu) b.granules.map(k, e);  // (zeroed)
#endif
#if REMAT_DIST_STRICT_PAGES && REMAT_DIST_GRADIENT_PAGES
      if constexpr (!on_gpu)
        if (mprotect(reinterpret_cast<void*>(b.span.first + k * b.span.page), (e - k) * b.span.page,
                     PROT_READ | PROT_WRITE) != 0)
          std::abort();
#endif
      for (std::size_t q = k; q < e; ++q) b.held[q] = 1;
      k = e;
    }
  }
  // The bytes of b's pages the process holds now (mincore; on the GPU, its granules of their own).
  static std::size_t resident(backed_buffer const& b) {
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) return b.span.page ? b.granules.mapped_bytes() : 0;
#endif
    return resident_bytes(b.span, b.residency);
  }
  // b's pages: a host buffer's (`data`), or on the GPU, when `sharded`, granules of virtual memory
  // that the buffer moves into (the caller relocates the model's buffer to b.granules.data()).
  template <class U>
  static void place(backed_buffer& b, U const* data, std::size_t count, bool sharded) {
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) {
      if (!sharded) return;  // (device memory that stays where it is: not pages of ours)
      b.granules = REMAT_NAMESPACE::detail::device_granules(std::max<std::size_t>(count, 1) * sizeof(U));
      b.span.page = b.granules.granule();
      b.span.begin = b.span.first = reinterpret_cast<std::uintptr_t>(b.granules.data());
      b.span.end = b.span.begin + count * sizeof(U);
      b.span.whole = b.granules.count() * b.granules.granule();
      b.span.element = sizeof(U);
    }
#endif
    if constexpr (!on_gpu) b.span = span_of(data, count, sharded);
    (void)data;
    b.held.assign(b.span.count(), 1);
  }

  // ---- ZeRO-2: the gradient buffer's memory

  T* gradient_base() const { return const_cast<T*>(std::as_const(model_).gradients().data()); }
  void give_back(std::size_t lo, std::size_t hi) const { give_back_in(pages_.grads, gradient_base(), lo, hi); }
  void commit(std::size_t lo, std::size_t hi) { commit_in(pages_.grads, {lo, hi}); }
  // A pass starts writing gradients: the pages of backward's first span (by the plan's reports)
  // are held; all of them when the pass does not follow the plan's reports (no overlap).
  void commit_first_span() {
    pages_.report = 0;
    commit(overlap_ && !pages_.reports.empty() ? pages_.reports.front() : 0, n);
  }
  // Backward reported gradients final from `offset` on: the pages of the span it writes next
  // (down to the plan's next report) are held. A report the plan did not foresee holds all below.
  void commit_next_span(std::size_t offset) {
    std::vector<std::size_t> const& r = pages_.reports;
    std::size_t next = 0;
    if (pages_.report < r.size() && r[pages_.report] == offset) {
      ++pages_.report;
      next = pages_.report < r.size() ? std::min(r[pages_.report], offset) : 0;
    } else {
      pages_.report = r.size();  // (off the plan: everything below is held from now on)
    }
    commit(next, offset);
  }
  // Gives back what this rank does not own from parameter `from` to the end (reductions done).
  void release_from(std::size_t from) const {
    param_range const s = shard();
    if (s.size() == 0) return give_back(from, n);
    give_back(from, std::max(from, s.begin));
    give_back(std::max(from, s.end), n);
  }
  // The bytes of the gradient buffer's pages the process holds now (mincore; on the GPU, the
  // granules of their own).
  std::size_t resident_gradient_bytes() const { return resident(pages_.grads); }

  // The buffer's pages, and the plan of the most a pass holds at once: backward's reports (where
  // its gradients become final: the model's plan walk) replayed through this wrapper's rules.
  void plan_gradient_pages() {
    place(pages_.grads, gradient_base(), n, o_.shard_gradients);
#if REMAT_DIST_NCCL
    // (the GPU: the gradient buffer moves into the granules, which come and go as host pages do)
    if constexpr (on_gpu)
      if (o_.shard_gradients) model_.relocate_gradients(static_cast<T*>(pages_.grads.granules.data()));
#endif
    page_span const& span = pages_.grads.span;
    if (!o_.shard_gradients || n == 0 || span.page == 0) return;
    pages_.reports = REMAT_NAMESPACE::detail::gradient_reports<typename Model::net, typename Model::precision>();
    pages_.reports.push_back(0);  // (the model's own, after backward)
    auto const page = std::uintptr_t(span.page);
    auto const begin = span.begin, end = span.end, first = span.first;
    std::uintptr_t const last = first + span.whole;
    param_range const s = shard();
    auto const at = [&](std::size_t i) { return begin + i * sizeof(T); };
    // A page is given back when it lies wholly in the buffer, holds nothing of this rank's
    // shard, and lies wholly below `touched` (not written yet in this pass) or wholly at or above
    // `released` (reduced).
    auto const held = [&](std::size_t touched, std::size_t released) {
      std::size_t count = 0;
      for (std::uintptr_t p = first; p < last; p += page) {
        bool const inside = p >= begin && p + page <= end;
        bool const shard_free = s.size() == 0 || p + page <= at(s.begin) || p >= at(s.end);
        bool const given = inside && shard_free && (p + page <= at(touched) || p >= at(released));
        count += !given;
      }
      return count * span.page;
    };
    std::size_t released = n, low = n, next = 0, peak = 0;
    bool in_flight = false;
    for (std::size_t r : pages_.reports) {
      peak = std::max(peak, held(r, released));
      if (in_flight) released = low;
      in_flight = false;
      while (next < buckets_.size() && buckets_[next].begin >= r) {
        low = buckets_[next++].begin;
        in_flight = true;
      }
    }
    pages_.planned_peak = peak;
  }

  // ---- ZeRO-3: the parameter buffer's pages and the gather buffer (host memory)

  // A rank whose training pass failed takes its part in the gathers and reports that the other
  // ranks' pass still makes (the plan's, from where this rank's stopped), so that none waits for
  // it; the values it gathers go unread. Not when a wait timed out (the others are not there).
  void take_part_after_failing(std::exception_ptr failed) {
    if (!timed_out(failed)) take_part(zero3_.events);
  }
  // Whether a failure was a wait that timed out (the other ranks are not there to take part with).
  static bool timed_out(std::exception_ptr failed) {
    try {
      std::rethrow_exception(failed);
    } catch (dist_error const&) {
      return true;
    } catch (...) {
      return false;
    }
  }
  // Takes part in the gathers and reports of `events` (a pass's, by the plan) from the first this
  // rank has not taken part in yet (zero3_.taken of them); the values it gathers go unread.
  void take_part(std::vector<REMAT_NAMESPACE::detail::pass_event> const& events) {
    using kind = REMAT_NAMESPACE::detail::pass_event::kind;
    std::size_t seen = 0;
    std::size_t const from = zero3_.taken;
    for (REMAT_NAMESPACE::detail::pass_event const& e : events) {
      if (e.what == kind::done || seen++ < from) continue;
      if (e.what == kind::report) {
        gradients_ready(e.range.begin);
        continue;
      }
      parameters_needed(e.range.begin, e.range.size());
      parameters_done();
    }
  }

  T* parameter_base() const { return const_cast<T*>(std::as_const(model_).parameters().data()); }
  // The weights layers read: the master weights, or (mixed precision) their compute copy, of which
  // a pass has cast this rank's shard (model::weights).
  C const* compute_base() const {
    if constexpr (Model::mixed_precision)
      return model_.compute_parameters().data();
    else
      return parameter_base();
  }

  // The pages of a span wholly inside its buffer that hold nothing of this rank's shard are given
  // back to the system.
  void give_back_outside_shard(backed_buffer const& b) const noexcept {
    param_range const s = shard();
    page_span const& sp = b.span;
#if REMAT_DIST_NCCL
    // (the GPU: layers issued before may still read them; the zero granule is zeroed on this stream)
    [[maybe_unused]] auto const on_stream = model_.stream_scope();
    if constexpr (on_gpu)
      if (sp.count()) (void)cudaStreamSynchronize(current_cuda_stream());
#endif
    for (std::size_t k = 0; k < sp.count();) {
      auto const free_page = [&](std::size_t q) { return sp.inside(q) && !sp.touches(q, s) && b.held[q]; };
      if (!free_page(k)) {
        ++k;
        continue;
      }
      std::size_t e = k + 1;
      while (e < sp.count() && free_page(e)) ++e;
      release_pages(b, k, e);
      k = e;
    }
  }

  // The pages of the parameters held now (mincore): the model's buffer's and, with ZeRO-3 on more
  // than one rank, the gather buffer's.
  std::size_t held_parameter_bytes() const {
    return resident(zero3_.params) + resident(zero3_.compute) + zero3_.slots[0].buffer.resident(zero3_.buffer_residency) +
           zero3_.slots[1].buffer.resident(zero3_.buffer_residency);
  }

  // Parameters r in a gather buffer, to read now: the buffer that holds them (unchanged since,
  // waited for if a prefetch brings them), or, after any prefetch of others is done with, the one
  // read least recently, gathered into now. Returns the buffer's index.
  int bring(param_range r) {
    std::uint64_t const version = model_.parameter_version();
    for (int b = 0; b < 2; ++b) {
      gather_slot const& slot = zero3_.slots[b];
      if (slot.holds != r || slot.version != version) continue;
      if (slot.in_flight) finish_gathers();
      return b;
    }
    finish_gathers();
    int const b = o_.prefetch_parameters ? 1 - zero3_.reading : 0;
    start_gather(r, b);
    finish_gathers();
    return b;
  }
  // Starts the gather of parameters r into buffer b (which nothing reads now) unless a buffer
  // holds them already.
  void prefetch(param_range r, int b) {
    if (r.size() == 0) return;
    for (gather_slot const& slot : zero3_.slots)
      if (slot.holds == r && slot.version == model_.parameter_version()) return;
    start_gather(r, b, true);
  }
  // Starts every rank's part of parameters r on its way into buffer b (this rank's copied in
  // first: the all-gather works in place); finish_gathers waits for it.
  void start_gather(param_range r, int b, bool ahead = false) {
    gather_slot& slot = zero3_.slots[b];
    C* const to = slot.buffer.data;
    slot.holds = {};
    std::vector<param_range> const& parts = parts_of(r);
    param_range const own = parts[std::size_t(rank())];
    if (own.size()) copy_bytes(to + own.begin, compute_base() + r.begin + own.begin, own.size() * sizeof(C));
    gathers_->follow();
    gathers_->all_gather(to, parts);
    slot.holds = r;
    slot.version = model_.parameter_version();
    slot.in_flight = true;
    if (!inside_) return;
    traffic_.gathered += (r.size() - own.size()) * sizeof(C);
    if (ahead) traffic_.prefetched += (r.size() - own.size()) * sizeof(C);
  }
  // Each rank's part of parameters r, from r's start (what a gather of r sends).
  std::vector<param_range> const& parts_of(param_range r) {
    std::vector<param_range>& parts = zero3_.parts;
    parts.clear();
    for (param_range const& s : shards_) {
      std::size_t const lo = std::clamp(s.begin, r.begin, r.end), hi = std::clamp(s.end, r.begin, r.end);
      parts.push_back({lo - r.begin, std::max(lo, hi) - r.begin});
    }
    return parts;
  }
  // Waits for the gathers started (a buffer whose wait fails holds nothing).
  void finish_gathers() {
    if (gathers_ && gathers_->busy()) {
      try {
        gathers_->join("the parameters' gather");
      } catch (...) {
        for (gather_slot& slot : zero3_.slots)
          if (slot.in_flight) slot.holds = {};
        if (zero3_.arriving.size()) std::erase(zero3_.kept, zero3_.arriving);
        zero3_.arriving = {};
        throw;
      }
    }
    for (gather_slot& slot : zero3_.slots) slot.in_flight = false;
    zero3_.arriving = {};
  }
  // options::keep_parameters_for_backward: parameters r gathered in place, into the model's
  // compute copy (the master weights in fp32), unless this pass has them already; waited for
  // unless `ahead` (a prefetch: the next frame's wait).
  void keep(param_range r, bool ahead) {
    bool const kept = std::find(zero3_.kept.begin(), zero3_.kept.end(), r) != zero3_.kept.end();
    if (kept && (ahead || zero3_.arriving != r)) return;
    if (!kept) {
      finish_gathers();
      commit_in(read_copy(), r);  // (the pages it gathers into: held before they are written)
      std::vector<param_range> const& parts = parts_of(r);
      gathers_->follow();  // (this rank's part is in place already)
      gathers_->all_gather(const_cast<C*>(compute_base()) + r.begin, parts);
      zero3_.kept.push_back(r);
      zero3_.arriving = r;
      std::size_t const bytes = (r.size() - parts[std::size_t(rank())].size()) * sizeof(C);
      traffic_.gathered += bytes;
      if (ahead) traffic_.prefetched += bytes;
    }
    if (!ahead) finish_gathers();
  }
  // The parameters a pass kept (keep_parameters_for_backward) are let go: the pages of those this
  // rank does not own are given back.
  void release_kept() noexcept {
    if (zero3_.kept.empty()) return;
    if (zero3_.arriving.size()) {
      try {
        finish_gathers();
      } catch (...) {
      }
    }
    zero3_.kept.clear();
    give_back_outside_shard(read_copy());
  }
  // The memory of the copy of the parameters layers read (and ZeRO-3 gathers): the compute copy
  // in mixed precision, the master weights otherwise.
  backed_buffer const& read_copy() const { return Model::mixed_precision ? zero3_.compute : zero3_.params; }

  // The parameter buffer's pages, the training pass's frames (the model's plan walk), the gather
  // buffer (as large as the largest frame's parameters) and the plan of the most held at once:
  // the pages of the model's buffer that touch this rank's shard or lie partly outside the buffer,
  // and the gather buffer's.
  void plan_parameter_pages() {
    place(zero3_.params, parameter_base(), n, o_.shard_parameters);
    if constexpr (Model::mixed_precision) place(zero3_.compute, compute_base(), n, o_.shard_parameters);
#if REMAT_DIST_NCCL
    // (the GPU: the master weights and the compute copy move into the granules)
    if constexpr (on_gpu)
      if (o_.shard_parameters) {
        C* const compute = Model::mixed_precision ? static_cast<C*>(zero3_.compute.granules.data()) : nullptr;
        model_.relocate_parameters(static_cast<T*>(zero3_.params.granules.data()), compute);
      }
#endif
    if (!gathers_parameters() || n == 0 || !zero3_.params.span.page) return;
    using kind = REMAT_NAMESPACE::detail::pass_event::kind;
    zero3_.events = REMAT_NAMESPACE::detail::pass_events<typename Model::net, typename Model::precision>();
    zero3_.ahead = gathers_ahead(zero3_.events);
    for (bool training : {false, true}) {
      zero3_.forward[training] =
          REMAT_NAMESPACE::detail::forward_events<typename Model::net, typename Model::precision>(training);
      zero3_.forward_ahead[training] = gathers_ahead(zero3_.forward[training]);
    }
    std::size_t largest = 0;
    for (REMAT_NAMESPACE::detail::pass_event const& e : zero3_.events)
      if (e.what == kind::gather) largest = std::max(largest, e.range.size());
    // (a prefetch's buffer too; both are touched now, so that what they hold is taken as the
    // wrapper is built, not in the middle of a pass; none when passes gather into the model's pages)
    int const buffers = o_.keep_parameters_for_backward ? 0 : o_.prefetch_parameters ? 2 : 1;
    for (int b = 0; b < buffers; ++b) {
      gather_buffer& buffer = zero3_.slots[b].buffer;
      buffer.allocate(largest * sizeof(C), zero3_.params.span.page);
      if constexpr (!on_gpu) {
        buffer.span = span_of(buffer.data, largest, false);
        if (buffer.data) std::memset(static_cast<void*>(buffer.data), 0, buffer.bytes);
      }
    }
    param_range const s = shard();
    // A training pass that keeps what it gathers (keep_parameters_for_backward) holds, at its end,
    // the pages of every frame's parameters too, in the copy layers read.
    page_span const& read = read_copy().span;
    std::vector<char> gathered(read.count(), 0);  // (by page)
    if (o_.keep_parameters_for_backward)
      for (REMAT_NAMESPACE::detail::pass_event const& e : zero3_.events)
        if (e.what == kind::gather && e.range.size())
          std::fill(gathered.begin() + std::ptrdiff_t((read.at(e.range.begin) - read.first) / read.page),
                    gathered.begin() + std::ptrdiff_t((read.at(e.range.end) - 1 - read.first) / read.page + 1), 1);
    auto const held = [&](page_span const& sp) {
      std::size_t pages = 0;
      for (std::size_t k = 0; k < sp.count(); ++k)
        pages += !sp.inside(k) || sp.touches(k, s) || (&sp == &read && gathered[k]);
      return pages * sp.page;
    };
    zero3_.planned_peak = held(zero3_.params.span) + held(zero3_.compute.span) + zero3_.slots[0].buffer.bytes +
                          zero3_.slots[1].buffer.bytes;
  }
  // For each of a pass's gathers and reports (its events but the frames' ends, in order), the
  // parameters of the next gather after it (empty: none).
  static std::vector<param_range> gathers_ahead(std::vector<REMAT_NAMESPACE::detail::pass_event> const& events) {
    using kind = REMAT_NAMESPACE::detail::pass_event::kind;
    std::vector<param_range> ahead;
    for (REMAT_NAMESPACE::detail::pass_event const& e : events)
      if (e.what != kind::done) ahead.push_back(e.what == kind::gather ? e.range : param_range{});
    param_range next{};
    for (std::size_t i = ahead.size(); i-- > 0;) {
      param_range const own = ahead[i];
      ahead[i] = next;
      if (own.size()) next = own;
    }
    return ahead;
  }

  void launch(bucket const& b) {
    T* g = model_.gradients().data();
    ++traffic_.buckets;
    if (!o_.shard_optimizer) {
      transport_->all_reduce(g + b.begin, b.end - b.begin);
      traffic_.reduced += (b.end - b.begin) * sizeof(T);
      return;
    }
    for (int q = 0; q < size(); ++q) {  // each part to the rank whose optimizer owns it
      param_range const s = shards_[std::size_t(q)];
      std::size_t const lo = std::max(b.begin, s.begin), hi = std::min(b.end, s.end);
      if (lo >= hi) continue;
      transport_->reduce(g + lo, hi - lo, q);
      traffic_.reduced += (hi - lo) * sizeof(T);
    }
  }

  Model& model_;
  options o_;
  communicator c_;  // (before the transport, which uses it until it goes)
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Transport> gathers_;  // ZeRO-3 on more than one rank: the parameters' gathers
  std::vector<param_range> shards_;  // each rank's
  std::vector<bucket> buckets_;
  std::size_t next_ = 0;    // the next bucket to start
  std::size_t in_flight_low_ = 0;  // the first parameter of the last bucket started
  struct {
    backed_buffer grads;          // the gradient buffer's memory
    std::vector<std::size_t> reports;         // the offsets of backward's reports, by the plan
    std::size_t report = 0;       // the next of them in the running pass
    std::size_t planned_peak = 0;
    std::size_t pass_peak = 0;    // measured in the running pass
    std::size_t last_peak = 0;    // measured in the last pass that succeeded
  } pages_;
  bool pending_ = false;    // local gradient contributions not reduced yet
  bool reduced_ = false;    // the gradients hold the ranks' sum (since the last zero_grad)
  bool started_ = false;
  bool overlap_ = false;    // the running pass reduces its buckets as backward finishes them
  bool inside_ = false;     // a pass started by this wrapper
  // The memory a layer's parameters are gathered into (ZeRO-3): pages of its own, for the
  // wrapper's life.
  struct gather_buffer {
    C* data = nullptr;
    std::size_t bytes = 0;  // (whole pages, or granules)
    page_span span;         // (a host buffer's pages, to count them)
#if REMAT_DIST_NCCL
    REMAT_NAMESPACE::detail::device_granules device;  // (a GPU model's: all held, zeroed)
#endif
    gather_buffer() = default;
    gather_buffer(gather_buffer const&) = delete;
    gather_buffer& operator=(gather_buffer const&) = delete;
    ~gather_buffer() {
      if constexpr (!on_gpu) {
#if REMAT_DIST_GRADIENT_PAGES
        if (data) munmap(data, bytes);
#endif
      }
    }
    void allocate(std::size_t need, std::size_t page) {
      if (need == 0) return;
#if REMAT_DIST_NCCL
      if constexpr (on_gpu) {
        device = REMAT_NAMESPACE::detail::device_granules(need);
        data = static_cast<C*>(device.data());
        bytes = device.count() * device.granule();
        return;
      }
#endif
      if constexpr (!on_gpu) {
#if REMAT_DIST_GRADIENT_PAGES
        bytes = (need + page - 1) / page * page;
        void* const p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
          REMAT_NAMESPACE::detail::raise<out_of_memory>("data_parallel: the gather buffer of ", bytes,
                                                        " bytes (the largest layer's parameters) could not be mapped");
        data = static_cast<C*>(p);
#endif
      }
      (void)page;
    }
    // The bytes of it held now (mincore; on the GPU, all of it).
    std::size_t resident(std::vector<unsigned char>& in) const {
      if constexpr (on_gpu) return bytes;
      return resident_bytes(span, in);
    }
    void leak() noexcept {  // (NCCL or MPI may still write into it)
#if REMAT_DIST_NCCL
      if constexpr (on_gpu)
        if (data) (void)new REMAT_NAMESPACE::detail::device_granules(std::move(device));
#endif
      data = nullptr;
    }
  };
  // A gather buffer and what it holds.
  struct gather_slot {
    gather_buffer buffer;
    param_range holds{};        // the parameters it holds, or receives (empty: none)
    std::uint64_t version = 0;  // the model's parameter_version when they were gathered
    bool in_flight = false;     // a gather into it started, not waited for yet
  };
  struct {
    backed_buffer params;               // the parameter buffer's memory
    backed_buffer compute;              // the compute copy's (mixed precision; none otherwise)
    gather_slot slots[2];               // what layers' parameters are gathered into (the second: prefetch)
    int reading = 0;                    // the slot the last frame read
    // keep_parameters_for_backward: the frames' parameters this pass gathered into the model's
    // pages, and of them the one whose gather is in flight (empty: none).
    std::vector<param_range> kept;
    param_range arriving{};
    bool whole = false;                 // the model's buffer holds every parameter (gathered, broadcast)
    std::vector<param_range> parts;     // (what a gather sends)
    std::vector<REMAT_NAMESPACE::detail::pass_event> events;  // a training pass's, by the plan
    // A pass outside training's gathers, by the plan: an inference forward's, a training-mode one's.
    std::vector<REMAT_NAMESPACE::detail::pass_event> forward[2];
    std::vector<param_range> ahead, forward_ahead[2];  // each's next gather after each event (gathers_ahead)
    int collective = -1;                // such a pass running: which (-1: none)
    std::size_t taken = 0;              // of its gathers and reports, those this rank took part in
    std::size_t planned_peak = 0;
    std::size_t pass_peak = 0;          // measured in the running training pass
    std::size_t last_peak = 0;          // measured in the last training pass that succeeded
    mutable std::vector<unsigned char> buffer_residency;  // (mincore's answer)
  } zero3_;
  traffic traffic_{}, last_{};
  struct pass_start {
    bool pending = false, started = false;
    std::size_t next = 0;
    traffic moved{};
  } before_;  // what a failed pass restores
};

// Saves the model's parameters from rank 0 only (every rank calls it; an error on rank 0 is
// thrown on every rank). With options::shard_parameters the shards are gathered first, and let
// go again after.
template <class Model, class Transport>
void save(data_parallel<Model, Transport>& dp, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  struct let_go {
    data_parallel<Model, Transport>& dp;
    ~let_go() { dp.release_parameters(); }
  } const after{dp};
  dp.gather_parameters();
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::save(dp.model(), path, metadata);
  });
}

namespace detail {

// The optimizers whose state is AdamW's (moments exp_avg and exp_avg_sq, the step count, the loss
// scale) and saves in its format: AdamW on either device, and OffloadedAdamW.
template <class Opt>
inline constexpr bool adamw_family = false;
template <class T, class D, class C>
inline constexpr bool adamw_family<AdamW<T, D, C>> = true;
template <class M>
inline constexpr bool adamw_family<OffloadedAdamW<M>> = true;

// Throws argument_error naming `who` unless the optimizer is over this rank's shard.
template <class Model, class Transport, class Opt>
void require_shard(data_parallel<Model, Transport> const& dp, Opt const& opt, char const* who) {
  param_range const r = dp.shard(), o = opt.range();
  if (o != r)
    REMAT_NAMESPACE::detail::raise<argument_error>(who, ": the optimizer is over parameters [", o.begin, ", ", o.end,
                                                   ") but this rank's shard is [", r.begin, ", ", r.end, ")");
}

}  // namespace detail

// Saves an AdamW state (AdamW on either device, or OffloadedAdamW) from rank 0 in the format of
// remat::save(AdamW), so a sharded run's file loads into an unsharded optimizer and the other way
// round: the shards' moments are gathered. Every rank calls it; an error on rank 0 is thrown on
// every rank.
template <class Model, class Transport, class Opt>
  requires detail::adamw_family<Opt>
void save(data_parallel<Model, Transport>& dp, Opt const& opt, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  using T = typename Model::value_type;
  std::vector<T> const m = dp.gather_shards(tensor_to_host(opt.exp_avg().view()));
  std::vector<T> const v = dp.gather_shards(tensor_to_host(opt.exp_avg_sq().view()));
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::detail::save_adamw(m, v, opt, path, std::move(metadata));
  });
}

// Loads parameters on rank 0 and broadcasts them (an error on rank 0 is thrown on every rank and
// changes nothing anywhere).
template <class Model, class Transport>
void load(data_parallel<Model, Transport>& dp, std::string const& path) {
  dp.gather_parameters();  // (ZeRO-3: rank 0 writes them all, into memory that holds them)
  dp.agree("dist::load", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::detail::load_parameters(dp.model(), path);
  });
  dp.broadcast_parameters();
}

// Loads an AdamW-format state saved by either save() (AdamW or OffloadedAdamW, whole or sharded,
// on any number of ranks) on every rank, each keeping its shard: every rank reads and checks the
// file before any applies it, so an error on any rank is thrown on every rank and changes no
// optimizer.
template <class Model, class Transport, class Opt>
  requires detail::adamw_family<Opt>
void load(data_parallel<Model, Transport>& dp, Opt& opt, std::string const& path) {
  std::optional<decltype(REMAT_NAMESPACE::detail::read_adamw(opt, path, 0, 0))> read;
  dp.agree("dist::load", [&] {
    detail::require_shard(dp, opt, "dist::load");
    read = REMAT_NAMESPACE::detail::read_adamw(opt, path, Model::parameter_count, dp.shard().begin);
  });
  REMAT_NAMESPACE::detail::apply_adamw(opt, *read);
}

// ---- per-rank files of a sharded optimizer (each rank writes and reads its own shard)

// The file of `rank`'s shard among `ranks`: path + ".rank<rank>-of-<ranks>".
inline std::string shard_file(std::string const& path, int rank, int ranks) {
  return path + ".rank" + std::to_string(rank) + "-of-" + std::to_string(ranks);
}

namespace detail {

// What load_shards says when this rank's file is missing: the shard files beside it, if any,
// name the number of ranks they were saved by.
inline std::string other_shard_files(std::string const& path, int rank) {
  namespace fs = std::filesystem;
  fs::path const p(path);
  fs::path const dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string const prefix = p.filename().string() + ".rank" + std::to_string(rank) + "-of-";
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::string const name = it->path().filename().string(); name.rfind(prefix, 0) == 0) found.push_back(name);
  if (found.empty()) return "no shard files of that name";
  std::sort(found.begin(), found.end());
  std::string s = "shard files for another number of ranks (";
  for (std::size_t i = 0; i < found.size(); ++i) s += (i ? ", " : "") + found[i];
  return s + "); per-rank files reload on the number of ranks that saved them only (dist::save and "
             "dist::load write and read one gathered file for any number)";
}

}  // namespace detail

// Saves this rank's part of an optimizer's state (AdamW or OffloadedAdamW) to a file of its own,
// shard_file(path, rank, ranks), with no gather to rank 0: the moments of the rank's shard, the
// step count and loss scale, and the shard's place (rank, ranks, first and last parameter, the
// model's parameter count). Every rank calls it; an error on any rank is thrown on every rank.
// load_shards reads the files back on the same number of ranks; dist::save writes one file that
// loads on any number.
template <class Model, class Transport, class Opt>
  requires detail::adamw_family<Opt>
void save_shards(data_parallel<Model, Transport>& dp, Opt const& opt, std::string const& path,
                 std::map<std::string, std::string> metadata = {}) {
  param_range const r = dp.shard();
  metadata["remat.shard.rank"] = std::to_string(dp.rank());
  metadata["remat.shard.ranks"] = std::to_string(dp.size());
  metadata["remat.shard.begin"] = std::to_string(r.begin);
  metadata["remat.shard.end"] = std::to_string(r.end);
  metadata["remat.shard.parameters"] = std::to_string(Model::parameter_count);
  dp.agree("dist::save_shards", [&] {
    detail::require_shard(dp, opt, "dist::save_shards");
    REMAT_NAMESPACE::detail::save_adamw(tensor_to_host(opt.exp_avg().view()), tensor_to_host(opt.exp_avg_sq().view()),
                                        opt, shard_file(path, dp.rank(), dp.size()), std::move(metadata));
  });
}

// Reads what save_shards wrote, each rank its own file, on the same number of ranks with the same
// shards: all or nothing on every rank (every file is read and checked before any is applied). A
// missing file (files saved by another number of ranks are named), a file of another rank, shard
// or model, or a corrupt one throws io_error on its rank and dist_error on the others, and
// changes no optimizer.
template <class Model, class Transport, class Opt>
  requires detail::adamw_family<Opt>
void load_shards(data_parallel<Model, Transport>& dp, Opt& opt, std::string const& path) {
  param_range const r = dp.shard();
  std::string const file = shard_file(path, dp.rank(), dp.size());
  std::optional<decltype(REMAT_NAMESPACE::detail::read_adamw(opt, file, 0, 0))> read;
  dp.agree("dist::load_shards", [&] {
    if (!std::filesystem::exists(file))
      REMAT_NAMESPACE::detail::raise<io_error>("dist::load_shards: expected '", file, "' (rank ", dp.rank(), " of ",
                                               dp.size(), "), found none; beside it: ",
                                               detail::other_shard_files(path, dp.rank()));
    detail::require_shard(dp, opt, "dist::load_shards");
    safetensors::file const f = safetensors::read(file);
    std::map<std::string, std::string> const& meta = f.metadata;
    auto const expect = [&](char const* key, std::string const& want, char const* what) {
      auto const it = meta.find(key);
      std::string const found = it == meta.end() ? std::string("none") : it->second;
      if (found != want)
        REMAT_NAMESPACE::detail::raise<io_error>("dist::load_shards '", file, "': expected ", what, " ", want,
                                                 " (metadata '", key, "'), found ", found);
    };
    expect("remat.shard.ranks", std::to_string(dp.size()), "a shard saved by a run of");
    expect("remat.shard.rank", std::to_string(dp.rank()), "the shard of rank");
    expect("remat.shard.parameters", std::to_string(Model::parameter_count), "a model of parameter count");
    expect("remat.shard.begin", std::to_string(r.begin), "a shard starting at parameter");
    expect("remat.shard.end", std::to_string(r.end), "a shard ending before parameter");
    read = REMAT_NAMESPACE::detail::read_adamw(opt, f, file, r.size(), 0);
  });
  REMAT_NAMESPACE::detail::apply_adamw(opt, *read);
}

}  // namespace dist
}  // namespace REMAT_NAMESPACE
