// remat::dist::data_parallel<Model, Transport>: data-parallel training over an MPI communicator
// the caller owns (include <remat/parallel/mpi.hpp>, which brings this).
//
// It puts together the parts beside it: the communicator (communicator.hpp) and a transport
// (mpi_transport.hpp, nccl.hpp), the options and the ZeRO stage (options.hpp, sharding.hpp), the
// gradient buckets (buckets.hpp), ZeRO-2's gradient shard (gradient_shard.hpp), ZeRO-3's parameter
// shard and gathers (parameter_shard.hpp), the agreement between ranks (agreement.hpp), the hooks
// it plugs into the model (hooks.hpp); the files are checkpoint.hpp's.
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
// keeps them for its passes, saving and loading); the optimizer state drops by P. With
// options::shard_master_weights (a mixed-precision model) each rank keeps its shard of the master
// weights only (the pages of the rest are given back, as ZeRO-3's are), and after a step the
// ranks all-gather the 16-bit compute copy, which each rank's optimizer wrote for its shard.
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
// The small messages go through the wrapper's communicator (parallel/communicator.hpp); the gradients
// and parameters through Transport: MPI for a host model (parallel/mpi_transport.hpp), NCCL for a
// model on remat::cuda (parallel/nccl.hpp; link remat::dist_cuda). Master weights in host memory
// (model::master_on_host(): OffloadedAdamW's master_weights, host_master_weights) go through MPI
// on either (a GPU model's at ZeRO-0 to 2; after a sharded step their compute copy goes through
// Transport, not cast again). Each rank uses the device current when its model was built.
#pragma once

#include "../error.hpp"
#include "../runtime/model.hpp"
#include "agreement.hpp"
#include "buckets.hpp"
#include "communicator.hpp"
#include "gradient_shard.hpp"
#include "hooks.hpp"
#include "mpi_transport.hpp"
#include "options.hpp"
#include "parameter_shard.hpp"
#include "state.hpp"

// A cuda model's gradients and parameters go through NCCL (remat::dist_cuda).
#if defined(REMAT_HAS_NCCL) && REMAT_HAS_NCCL && REMAT_HAS_CUDA
#define REMAT_DIST_NCCL 1
#include "nccl.hpp"
#else
#define REMAT_DIST_NCCL 0
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
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
class data_parallel {
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
      : s_(m, comm, detail::checked_options(m, o)), buckets_(s_), grads_(s_), params_(s_),
        hooks_(s_, buckets_, grads_, params_) {
    detail::check_signatures(s_);
    s_.transport = std::make_unique<Transport>(s_.c);
    // (ZeRO-3: gathers are waited for apart from the gradients' reductions)
    if (s_.gathers_parameters()) s_.gathers = std::make_unique<Transport>(s_.c);
    broadcast_parameters();
    grads_.plan(buckets_);
    params_.plan();
    params_.set_whole();
    release_parameters();  // (ZeRO-3: this rank keeps its shard of the parameters)
    m.link().set_replica(std::uint64_t(s_.rank()));
    m.link().set_gradient_sync(&hooks_);
    if (s_.opts.shard_gradients) m.zero_grad();  // (the pages of the parameters it does not own go)
  }
  data_parallel(data_parallel const&) = delete;
  data_parallel& operator=(data_parallel const&) = delete;
  // With ZeRO-3 or shard_master_weights on more than one rank, the model is left with this rank's
  // shard of its parameters (its passes refuse to run alone) unless gather_parameters() was called
  // last.
  ~data_parallel() {
    Model& m = s_.model;
    if (params_.partial() && !params_.whole()) m.link().set_partial_parameters(true);
    if (m.link().gradient_sync() == &hooks_) m.link().set_gradient_sync(nullptr);
    bool const abandoned = (s_.transport && s_.transport->busy()) || (s_.gathers && s_.gathers->busy()) ||
                           (s_.host_side && s_.host_side->busy());
    backed_buffer* const buffers[] = {&grads_.buffer(), &params_.master(), &params_.compute()};
    if constexpr (on_gpu) {
      // ZeRO-2 and ZeRO-3 on the GPU: the gradients and parameters move back into memory of the
      // model's allocator (what this rank does not own reads as zero). If that fails, or a
      // collective may still write them, the granules are left alive for the model.
      bool moved = false;
      if (!abandoned) try {
          if (grads_.buffer().has_granules()) m.relocate_gradients(nullptr);
          if (params_.master().has_granules() || params_.compute().has_granules())
            m.relocate_parameters(nullptr, nullptr);
          moved = true;
        } catch (...) {
        }
      if (!moved)
        for (backed_buffer* b : buffers) b->abandon_granules();
      if (!abandoned) params_.restore_host_master();  // (master weights in host memory)
    } else if (!abandoned) {
      try {  // (REMAT_DIST_STRICT_PAGES: the pages are writable again, for whatever the memory serves next)
        for (backed_buffer* b : buffers) b->commit(0, n);
      } catch (...) {
      }
    }
    // Messages abandoned in flight may still use the communicator and its buffers.
    if (abandoned) s_.c.abandon();
    // (a gather abandoned in flight or by a timeout may still write into its buffer: it is kept;
    // the slots go before the transport, which on the GPU waits for its stream only as it goes)
    if (s_.c.timed_out() || abandoned)
      for (int b = 0; b < 2; ++b) params_.slots()[b].buffer.leak();
  }

  int rank() const { return s_.rank(); }  // this process's rank among the wrapper's
  int size() const { return s_.size(); }  // the number of ranks
  options const& config() const { return s_.opts; }  // the options it was built with
  Model& model() { return s_.model; }  // the wrapped model
  // The parameters this rank's optimizer updates: all, or its 1/P when sharded.
  param_range shard() const { return s_.shard(); }
  // The parameters rank r's optimizer updates.
  param_range shard_of(int r) const { return s_.shards.of(r); }
  // What the last optimizer step moved.
  traffic const& last_step_traffic() const { return s_.last; }
  // The number of gradient messages a step sends (options::bucket_bytes each, or less).
  std::size_t bucket_count() const { return buckets_.all().size(); }
  // The gradient buffer's memory: its pages, the plan's peak and the last pass's measured one
  // (options::shard_gradients), and what it holds now: a host model's pages; a GPU model's
  // granules under shard_gradients (all 0 without).
  gradient_memory gradient_pages() const { return grads_.memory(); }

  // Rank 0's parameters (and pass count) to every rank; done at construction.
  void broadcast_parameters() {
    Model& m = s_.model;
    {
      [[maybe_unused]] auto const on_stream = m.stream_scope();
      params_.commit_master(0, n);  // (ZeRO-3, shard_master_weights: the pages given back are written)
      s_.with_master_transport([&](auto& t) {  // (where the master weights live)
        t.follow();
        t.broadcast(m.parameters().data(), n, 0);
        t.join("the parameters' broadcast from rank 0");
      });
    }
    m.set_passes(s_.c.broadcast(m.passes(), 0, "the pass count's broadcast from rank 0"));
    m.parameters_changed();
    if constexpr (Model::mixed_precision && !on_gpu) {
      // ZeRO-3: every page of the compute copy is touched once (the next pass casts the shard, or
      // on one rank all of it), so that the pages it shares with other memory are held, as the
      // plan counts them, and those of other ranks' shards are given back below whatever they held.
      // (A GPU model's compute copy lives in granules of the wrapper's, zeroed as they are mapped.)
      if (s_.opts.shard_parameters) {
        params_.compute().commit(0, n);
        tensor_view<C, typename Model::device> const c = m.compute_parameters();
        std::memset(static_cast<void*>(c.data()), 0, c.size() * sizeof(C));
      }
    }
    params_.set_whole();
    release_parameters();  // (ZeRO-3: this rank keeps its shard)
  }

  // ZeRO-3 (options::shard_parameters) or options::shard_master_weights: every rank's shard of the
  // parameters (master weights) to every rank, so the model holds them whole until its next pass
  // or release_parameters() (dist::save does this). Every rank calls it. Without either the
  // parameters are always whole and nothing is sent.
  void gather_parameters() {
    if (!s_.shards_master()) return;
    [[maybe_unused]] auto const on_stream = s_.model.stream_scope();
    params_.commit_master(0, n);  // (the pages it gathers into: held before they are written)
    s_.with_master_transport([&](auto& t) {  // (where the master weights live)
      t.follow();
      t.all_gather(s_.parameter_base(), s_.shards.all());
      t.join("the parameters' all-gather");
    });
    params_.set_whole();
  }
  // ZeRO-3 or shard_master_weights: after the parameters were made whole (gather_parameters, a
  // broadcast), the pages of those this rank does not own are given back.
  void release_parameters() noexcept { params_.release(); }
  // The parameters' memory, in bytes of whole pages of the system: the pages the model's buffer
  // spans, the plan's peak during a training pass, the last training pass's measured peak
  // (options::shard_parameters) and what is held now (a GPU model's: its granules, and under
  // shard_master_weights its master weights' host pages).
  // With ZeRO-3 on more than one rank, what is held is the pages of the model's buffer that hold
  // this rank's shard (and the two it shares at its ends) plus the gather buffers layers'
  // parameters are gathered into (two with options::prefetch_parameters, one without), each as
  // large as the largest layer's, held from the wrapper's construction; with shard_master_weights
  // alone, the master weights' pages that hold this rank's shard and every page of the compute
  // copy; without either, every page. In mixed precision the compute copy's pages count too, and
  // the gather buffers hold compute values.
  gradient_memory parameter_pages() const { return params_.memory(); }

  // A training pass on this rank's part of the batch; its gradients, weighted weight / P, are
  // added to the model's. With reduce::now (the default) they are reduced across the ranks while
  // backward runs; with reduce::later (all micro-batches of an accumulated step but the last) they
  // stay local until a later pass or the optimizer's step reduces them (with
  // options::shard_gradients every pass is reduced: reduce::later is taken as reduce::now, since
  // the rank keeps no whole gradients to add to). Returns this rank's loss.
  template <class Loss>
  double accumulate(input_view x, target_type<Loss> target, double weight = 1.0, reduce when = reduce::now) {
    agree("data_parallel::accumulate", [&] {
      s_.model.template validate<Loss>(x, target);
      if (s_.reduced || (s_.started && !s_.opts.shard_gradients))
        REMAT_NAMESPACE::detail::raise<argument_error>(
            "data_parallel::accumulate: expected gradients not yet reduced, found them reduced by an earlier pass "
            "of this step; zero them first (model.zero_grad(), or train_step), and pass reduce::later for every "
            "micro-batch but the last");
    });
    return as_pass(when == reduce::now || s_.opts.shard_gradients,
                   [&] { return s_.model.template accumulate<Loss>(x, target, weight / double(size())); });
  }

  // zero_grad, accumulate (reduced while backward runs), the optimizer's step. Returns the loss
  // averaged over the ranks (on every rank).
  template <class Loss, class Optimizer>
  double train_step(input_view x, target_type<Loss> target, Optimizer& opt) {
    agree("data_parallel::train_step", [&] {
      s_.model.template validate<Loss>(x, target);
      if constexpr (requires { opt.range(); })
        if (opt.range() != shard())
          REMAT_NAMESPACE::detail::raise<argument_error>(
              "data_parallel::train_step: the optimizer updates parameters [", opt.range().begin, ", ",
              opt.range().end, ") but this rank's shard is [", shard().begin, ", ", shard().end,
              "); build the optimizer after the remat::dist::data_parallel");
    });
    s_.model.zero_grad();
    double const local =
        as_pass(true, [&] { return s_.model.template accumulate<Loss>(x, target, 1.0 / double(size())); });
    {
      [[maybe_unused]] auto const on_stream = s_.model.stream_scope();  // (the GPU: the model's stream)
      opt.step();
    }
    return sum(local) / double(size());
  }
  // Waits until the gradients of the passes so far are reduced (an optimizer's step does this).
  void finish() { hooks_.finish(); }

  // The sum of a value over the ranks (every rank gets it).
  double sum(double x) { return s_.c.all_reduce(x, MPI_SUM, "a sum over the ranks"); }

  // Runs f on every rank; if it throws on any, every rank throws: a failing rank its own
  // exception, the others dist_error quoting the first failing rank's message.
  template <class F>
  void agree(char const* what, F&& f) {
    s_.c.agree(what, static_cast<F&&>(f));
  }

  // Rank 0 gets every rank's shard of a per-parameter vector, in order (the whole vector when
  // the optimizer is not sharded; other ranks get an empty vector).
  std::vector<T> gather_shards(std::vector<T> const& mine) {
    if (!s_.opts.shard_optimizer) return rank() == 0 ? mine : std::vector<T>{};
    return s_.c.gather(mine, n, s_.shards.all(), "the optimizer state's gather to rank 0");
  }

 private:
  static constexpr bool on_gpu = detail::dp_state<Model, Transport>::on_gpu;
  using backed_buffer = REMAT_NAMESPACE::detail::backed_buffer<typename Model::device>;

  // Runs a training pass started by this wrapper (which the model's check_pass accepts), reducing
  // its buckets during backward when `overlap`.
  template <class F>
  double as_pass(bool overlap, F&& pass) {
    struct reset {
      detail::dp_state<Model, Transport>& s;
      ~reset() { s.inside = s.overlap = false; }
    } guard{s_};
    s_.overlap = overlap;
    s_.inside = true;
    return pass();
  }

  // (declared in the order they are built; the parameters' gather buffers go before the
  // transports in s_, which on the GPU wait for their streams only as they go)
  detail::dp_state<Model, Transport> s_;
  detail::gradient_buckets<Model, Transport> buckets_;
  detail::gradient_shard<Model, Transport> grads_;
  detail::parameter_shard<Model, Transport> params_;
  detail::model_hooks<Model, Transport> hooks_;
};

}  // namespace dist
}  // namespace REMAT_NAMESPACE
