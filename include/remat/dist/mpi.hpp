// remat::dist: data-parallel training over an MPI communicator the caller owns.
//
//   remat::dist::data_parallel dp(model, MPI_COMM_WORLD);      // checks the ranks' models agree,
//   remat::AdamW opt(model, {.lr = 1e-3});                     // broadcasts rank 0's parameters
//   for (...) dp.train_step<remat::SoftmaxCrossEntropy>(x_local, y_local, opt);
//
// Each rank trains on its part of the batch. Backward reports each layer's gradients as they
// become final, and the wrapper all-reduces them in buckets (from the last layer's back) while
// backward goes on; the optimizer built from the model waits for them, agrees with the other ranks
// on the gradient norm and on overflow (a loss scale's skip is taken by every rank together), and
// steps. Gradients are averaged over the ranks (each rank's loss gradient is weighted 1/P).
//
// With options::shard_optimizer (ZeRO stage 1) each rank's optimizer keeps the moments of 1/P of
// the parameters: buckets are reduced to the rank that owns each part, each rank updates its part
// and the parameters are all-gathered. The fp32 master weights stay whole on every rank (the model
// keeps them for its passes, saving and loading); the optimizer state drops by P.
//
// Bad input on one rank (an id out of range, a batch of the wrong shape) is found before anything
// changes and every rank throws: the rank with the bad input its own error, the others dist_error
// naming that rank and quoting its message; all stay consistent and may go on. A rank that fails
// during a pass leaves the others waiting: every wait has a timeout (options::timeout_seconds)
// after which dist_error is thrown, and dist::environment aborts all ranks when an exception leaves
// its scope. remat calls MPI_Init only through dist::environment.
//
// A model on remat::cuda needs NCCL as well (link remat::dist_cuda, which defines REMAT_HAS_NCCL):
// its gradients and parameters then move through NCCL on a stream of the wrapper's, overlapped with
// backward in the same buckets, and MPI keeps the small host messages. Each rank uses the device
// current when its model was built. See dist/nccl.hpp.
#pragma once

#include "../error.hpp"
#include "../graph/model.hpp"
#include "../io/safetensors.hpp"
#include "../train/gradient_sync.hpp"
#include "../train/optimizers.hpp"

// The C interface only: the deprecated C++ bindings some MPIs still ship add nothing here.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#if !__has_include(<mpi.h>)
#error "<remat/dist/mpi.hpp> needs MPI: install an MPI (Debian: libopenmpi-dev) and link remat::dist"
#endif
#include <mpi.h>

// (REMAT_HAS_NCCL comes from remat::dist_cuda; NCCL serves sources that nvcc compiles)
#if defined(REMAT_HAS_NCCL) && REMAT_HAS_NCCL && REMAT_HAS_CUDA
#define REMAT_DIST_NCCL 1
#include "nccl.hpp"
#else
#define REMAT_DIST_NCCL 0
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {

namespace detail {

inline void check(int rc, char const* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  REMAT_NAMESPACE::detail::raise<dist_error>(call, " failed: ", std::string_view(text, std::size_t(len)));
}

template <class T>
MPI_Datatype datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else static_assert(sizeof(T) == 0, "remat::dist: no MPI datatype for this type");
}

// A compile-time name of a type (the compiler's spelling), hashed into the model signature.
template <class T>
constexpr std::string_view type_name() {
  return __PRETTY_FUNCTION__;
}

constexpr std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 14695981039346656037ull) {
  for (char c : s) h = (h ^ std::uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  return h;
}

}  // namespace detail

// MPI_Init_thread and MPI_Finalize for a program that does not initialise MPI itself. If MPI is
// already initialised it owns nothing. If an exception leaves its scope it aborts every rank
// (MPI_Abort), so one failing rank never leaves the others waiting in a collective.
class environment {
 public:
  environment(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    detail::check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_ = true;
  }
  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;
  ~environment() {
    if (!owns_) return;
    if (std::uncaught_exceptions() > 0) {
      std::fprintf(stderr, "remat::dist: rank %d is leaving with an exception; aborting every rank\n", world_rank());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  }
  // Ends every rank of MPI_COMM_WORLD with this exit code.
  [[noreturn]] void abort(int code) const {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
  }
  static int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  static int world_size() {
    int p = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
  }

 private:
  bool owns_ = false;
};

struct options {
  // Gradients are reduced in messages of about this many bytes, the last layers' first.
  std::size_t bucket_bytes = std::size_t(4) << 20;
  // ZeRO stage 1: each rank's optimizer keeps the state of 1/P of the parameters.
  bool shard_optimizer = false;
  // A wait for the other ranks longer than this throws dist_error (a rank failed or diverged).
  double timeout_seconds = 300;
};

// Whether a pass's gradients are reduced (overlapped with its backward), or left to add to (a
// micro-batch of gradient accumulation that is not the last).
enum class reduce { now, later };

// What crossed the communicator in the last optimizer step, per rank, in bytes.
struct traffic {
  std::size_t reduced = 0;   // gradients sent into all-reduces (or reduces, when sharded)
  std::size_t gathered = 0;  // parameters all-gathered (sharded)
  std::size_t buckets = 0;   // gradient messages
  std::size_t overlapped = 0;  // of them, started before backward finished
};

template <class Model>
class data_parallel final : public REMAT_NAMESPACE::detail::gradient_sync {
 public:
  using model_type = Model;
  using T = typename Model::value_type;
  using input_view = typename Model::input_view;
  template <class Loss>
  using target_type = typename Loss::template target_type<T, typename Model::device>;
  static constexpr bool on_gpu = !std::is_same_v<typename Model::device, host>;
  static_assert(!on_gpu || REMAT_DIST_NCCL,
                "remat::dist::data_parallel: a cuda model's gradients go through NCCL; link remat::dist_cuda "
                "(remat::dist with NCCL, found with the CUDA toolkit) instead of remat::dist");
  static constexpr std::size_t n = Model::parameter_count;

  // Duplicates `comm` (remat's messages never mix with the caller's), checks that every rank
  // holds the same model type with the same options (dist_error on every rank otherwise),
  // broadcasts rank 0's parameters and pass count, and plugs itself into the model.
  data_parallel(Model& m, MPI_Comm comm, options o = {}) : model_(m), o_(o) {
    if (m.gradient_sync())
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "data_parallel: expected a model without a data-parallel wrapper, found one already plugged in");
    if (!(o.timeout_seconds > 0))
      REMAT_NAMESPACE::detail::raise<argument_error>("data_parallel: expected timeout_seconds > 0, found ",
                                                     o.timeout_seconds);
    if (o.bucket_bytes < sizeof(T))
      REMAT_NAMESPACE::detail::raise<argument_error>("data_parallel: expected bucket_bytes of at least one parameter (",
                                                     sizeof(T), "), found ", o.bucket_bytes);
    detail::check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    for (int q = 0; q < size_; ++q) {
      k_->counts.push_back(int(shard_of(q).size()));
      k_->displs.push_back(int(shard_of(q).begin));
    }
    try {
      check_signatures();
      if constexpr (on_gpu) this->open_nccl();  // (declared with NCCL only)
      plan_buckets();
      broadcast_parameters();
    } catch (...) {
      if (timed_out_)
        (void)k_.release();
      else
        MPI_Comm_free(&comm_);
      throw;
    }
    model_.set_replica(std::uint64_t(rank_));
    model_.set_gradient_sync(this);
  }
  data_parallel(data_parallel const&) = delete;
  data_parallel& operator=(data_parallel const&) = delete;
  ~data_parallel() override {
    if (model_.gradient_sync() == this) model_.set_gradient_sync(nullptr);
    // After a timeout, messages abandoned in flight may still write into the scratch buffers and
    // use the communicator: both are left alive (the run is over anyway).
    if (timed_out_ || !requests_.empty()) {
      (void)k_.release();
      return;
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  options const& config() const { return o_; }
  Model& model() { return model_; }
  // The parameters this rank's optimizer updates: all, or its 1/P when sharded.
  param_range shard() const override { return shard_of(rank_); }
  param_range shard_of(int r) const {
    if (!o_.shard_optimizer) return {0, n};
    return {n * std::size_t(r) / std::size_t(size_), n * std::size_t(r + 1) / std::size_t(size_)};
  }
  // What the last optimizer step moved.
  traffic const& last_step_traffic() const { return last_; }
  std::size_t bucket_count() const { return buckets_.size(); }

  // Rank 0's parameters (and pass count) to every rank; done at construction.
  void broadcast_parameters() {
    T* p = model_.parameters().data();
    if constexpr (on_gpu) {
#if REMAT_DIST_NCCL
      [[maybe_unused]] auto const on_stream = model_.stream_scope();
      nccl_->follow(current_cuda_stream());
      nccl_->broadcast(p, n, 0);
      join_nccl("the parameters' broadcast from rank 0");
#endif
    } else {
      for (std::size_t b = 0; b < n; b += chunk) {
        MPI_Request r;
        detail::check(MPI_Ibcast(p + b, int(std::min(chunk, n - b)), detail::datatype<T>(), 0, comm_, &r),
                      "MPI_Ibcast");
        wait(r, "the parameters' broadcast from rank 0");
      }
    }
    k_->u = model_.passes();
    MPI_Request r;
    detail::check(MPI_Ibcast(&k_->u, 1, MPI_UINT64_T, 0, comm_, &r), "MPI_Ibcast");
    wait(r, "the pass count's broadcast from rank 0");
    model_.set_passes(k_->u);
    model_.parameters_changed();
  }

  // A training pass on this rank's part of the batch; its gradients, weighted weight / P, are
  // added to the model's. With reduce::now (the default) they are reduced across the ranks while
  // backward runs; with reduce::later (all micro-batches of an accumulated step but the last) they
  // stay local until a later pass or the optimizer's step reduces them. Returns this rank's loss.
  template <class Loss>
  double accumulate(input_view x, target_type<Loss> target, double weight = 1.0, reduce when = reduce::now) {
    agree("data_parallel::accumulate", [&] {
      model_.template validate<Loss>(x, target);
      if (reduced_ || started_)
        REMAT_NAMESPACE::detail::raise<argument_error>(
            "data_parallel::accumulate: expected gradients not yet reduced, found them reduced by an earlier pass "
            "of this step; zero them first (model.zero_grad(), or train_step), and pass reduce::later for every "
            "micro-batch but the last");
    });
    return as_pass(when == reduce::now, [&] { return model_.template accumulate<Loss>(x, target, weight / double(size_)); });
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
    double const local = as_pass(true, [&] { return model_.template accumulate<Loss>(x, target, 1.0 / double(size_)); });
    {
      [[maybe_unused]] auto const on_stream = model_.stream_scope();  // (the GPU: the model's stream)
      opt.step();
    }
    return sum(local) / double(size_);
  }

  // The sum of a value over the ranks (every rank gets it).
  double sum(double x) {
    k_->d_in = x;
    MPI_Request r;
    detail::check(MPI_Iallreduce(&k_->d_in, &k_->d_out, 1, MPI_DOUBLE, MPI_SUM, comm_, &r), "MPI_Iallreduce");
    wait(r, "a sum over the ranks");
    return k_->d_out;
  }

  // Runs f on every rank; if it throws on any, every rank throws: a failing rank its own
  // exception, the others dist_error quoting the first failing rank's message.
  template <class F>
  void agree(char const* what, F&& f) {
    std::exception_ptr err;
    std::string msg;
    try {
      f();
    } catch (std::exception const& e) {
      err = std::current_exception();
      msg = e.what();
    } catch (...) {
      err = std::current_exception();
      msg = "an exception that is not a std::exception";
    }
    k_->i_in = err ? rank_ : size_;
    MPI_Request r;
    detail::check(MPI_Iallreduce(&k_->i_in, &k_->i_out, 1, MPI_INT, MPI_MIN, comm_, &r), "MPI_Iallreduce");
    wait(r, what);
    int const first = k_->i_out;
    if (first == size_) return;
    k_->u = std::min<std::uint64_t>(msg.size(), INT_MAX);
    detail::check(MPI_Ibcast(&k_->u, 1, MPI_UINT64_T, first, comm_, &r), "MPI_Ibcast");
    wait(r, what);
    k_->msg = msg;
    k_->msg.resize(k_->u);
    if (k_->u) {
      detail::check(MPI_Ibcast(k_->msg.data(), int(k_->u), MPI_CHAR, first, comm_, &r), "MPI_Ibcast");
      wait(r, what);
    }
    msg = k_->msg;
    if (err) std::rethrow_exception(err);
    REMAT_NAMESPACE::detail::raise<dist_error>(what, ": rank ", first, " of ", size_, " failed, so every rank stops: ",
                                               msg);
  }

  // Rank 0 gets every rank's shard of a per-parameter vector, in order (the whole vector when
  // the optimizer is not sharded; other ranks get an empty vector).
  std::vector<T> gather_shards(std::vector<T> const& mine) {
    if (!o_.shard_optimizer) return rank_ == 0 ? mine : std::vector<T>{};
    k_->send = mine;
    k_->gathered.assign(rank_ == 0 ? n : 0, T(0));
    MPI_Request r;
    detail::check(MPI_Igatherv(k_->send.data(), int(k_->send.size()), detail::datatype<T>(), k_->gathered.data(),
                               k_->counts.data(), k_->displs.data(), detail::datatype<T>(), 0, comm_, &r),
                  "MPI_Igatherv");
    wait(r, "the optimizer state's gather to rank 0");
    return std::move(k_->gathered);
  }

  // --- the model's and the optimizer's side (remat::detail::gradient_sync) ---
  void check_pass() const override {
    if (!inside_)
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "model: this model is wrapped in a remat::dist::data_parallel; train it through the wrapper "
          "(dp.accumulate or dp.train_step) so that every rank takes part");
  }
  void pass_starting() override {
    pending_ = true;
    next_ = 0;
    if (overlap_) started_ = true;
  }
  void gradients_ready(std::size_t offset) override {
    if (!overlap_) return;
    launch_ready(offset);
    if (!requests_.empty()) {  // lets the messages already started move on
      int done = 0;
      detail::check(MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) requests_.clear();
    }
  }
  void zeroing_gradients() override {
    if (in_flight()) wait_all("the gradients' reduction");
    pending_ = reduced_ = started_ = false;
    next_ = 0;
  }
  void finish() override {
    if (pending_ && next_ < buckets_.size()) launch_ready(0);  // passes left local (reduce::later): reduce them now
    wait_all("the gradients' reduction");
    if (pending_) reduced_ = true;
    pending_ = false;
  }
  double agree_squares(double local) override {
    k_->d_in = local;
    MPI_Request r;
    // Sharded: the parts add up. Whole: every rank holds the same gradients; the maximum makes the
    // decision one even if an MPI sums in different orders on different ranks.
    detail::check(
        MPI_Iallreduce(&k_->d_in, &k_->d_out, 1, MPI_DOUBLE, o_.shard_optimizer ? MPI_SUM : MPI_MAX, comm_, &r),
        "MPI_Iallreduce");
    wait(r, "the gradient norm's agreement");
    return k_->d_out;
  }
  void after_update(bool stepped) override {
    last_ = traffic_;
    traffic_ = {};
    if (!stepped || !o_.shard_optimizer) return;
    if constexpr (on_gpu) {
#if REMAT_DIST_NCCL
      T* p = model_.parameters().data();
      nccl_->follow(current_cuda_stream());
      detail::nccl_channel::group_start();
      for (int q = 0; q < size_; ++q) nccl_->broadcast(p + shard_of(q).begin, shard_of(q).size(), q);
      detail::nccl_channel::group_end();
      join_nccl("the parameters' all-gather");
#endif
    } else {
      MPI_Request r;
      detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, model_.parameters().data(),
                                    k_->counts.data(), k_->displs.data(), detail::datatype<T>(), comm_, &r),
                    "MPI_Iallgatherv");
      wait(r, "the parameters' all-gather");
    }
    last_.gathered = (n - shard().size()) * sizeof(T);
    model_.parameters_changed();
  }

 private:
  static constexpr std::size_t chunk = std::size_t(1) << 30;  // elements per message, within int

  struct bucket {
    std::size_t begin, end;
  };

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
  // What small messages read and write: on the heap, so that a message abandoned by a timeout
  // never writes into a stack frame that is gone.
  struct scratch {
    int i_in = 0, i_out = 0;
    double d_in = 0, d_out = 0;
    std::uint64_t u = 0;
    std::string msg;
    std::vector<std::uint64_t> sig_mine, sig_all;
    std::vector<int> counts, displs;  // the shards, for gathers
    std::vector<T> send, gathered;
#if REMAT_DIST_NCCL
    ncclUniqueId nccl_id{};
#endif
  };

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
    std::array<std::uint64_t, K> const mine{n,
                                      detail::fnv1a(table),
                                      detail::fnv1a(detail::type_name<typename Model::net>()),
                                      sizeof(T) * 256 + sizeof(typename Model::compute_type),
                                      o_.bucket_bytes,
                                      o_.shard_optimizer ? 1u : 0u,
                                      std::uint64_t(Model::mixed_precision)};
    k_->sig_mine.assign(mine.begin(), mine.end());
    k_->sig_all.assign(K * std::size_t(size_), 0);
    MPI_Request r;
    detail::check(MPI_Iallgather(k_->sig_mine.data(), int(K), MPI_UINT64_T, k_->sig_all.data(), int(K), MPI_UINT64_T,
                                 comm_, &r),
                  "MPI_Iallgather");
    wait(r, "the model signatures' exchange");
    std::vector<std::uint64_t> const all = k_->sig_all;
    for (int q = 1; q < size_; ++q) {
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
            "data_parallel: expected the same precision on every rank, found rank 0 with ", a[3] / 256, "-byte master / ",
            a[3] % 256, "-byte compute values and rank ", q, " with ", b[3] / 256, " / ", b[3] % 256);
      if (a[4] != b[4] || a[5] != b[5])
        REMAT_NAMESPACE::detail::raise<dist_error>(
            "data_parallel: expected the same options on every rank, found rank 0 with bucket_bytes ", a[4],
            " and shard_optimizer ", a[5] ? "true" : "false", ", rank ", q, " with bucket_bytes ", b[4],
            " and shard_optimizer ", b[5] ? "true" : "false");
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
    if (offset > 0) traffic_.overlapped += next_ - first;
    if constexpr (on_gpu) {
#if REMAT_DIST_NCCL
      // The NCCL stream starts once the model's stream has written these gradients.
      nccl_->follow(current_cuda_stream());
      detail::nccl_channel::group_start();
      for (std::size_t i = first; i < next_; ++i) launch(buckets_[i]);
      detail::nccl_channel::group_end();
#endif
    } else {
      for (std::size_t i = first; i < next_; ++i) launch(buckets_[i]);
    }
  }

  void launch(bucket const& b) {
    T* g = model_.gradients().data();
    ++traffic_.buckets;
    if constexpr (on_gpu) {
#if REMAT_DIST_NCCL
      if (!o_.shard_optimizer) {
        nccl_->all_reduce(g + b.begin, b.end - b.begin);
        traffic_.reduced += (b.end - b.begin) * sizeof(T);
        return;
      }
      for (int q = 0; q < size_; ++q) {  // each part to the rank whose optimizer owns it
        param_range const s = shard_of(q);
        std::size_t const lo = std::max(b.begin, s.begin), hi = std::min(b.end, s.end);
        if (lo >= hi) continue;
        nccl_->reduce(g + lo, hi - lo, q);
        traffic_.reduced += (hi - lo) * sizeof(T);
      }
      return;
#endif
    }
    if (!o_.shard_optimizer) {
      MPI_Request r;
      detail::check(MPI_Iallreduce(MPI_IN_PLACE, g + b.begin, int(b.end - b.begin), detail::datatype<T>(), MPI_SUM,
                                   comm_, &r),
                    "MPI_Iallreduce");
      requests_.push_back(r);
      traffic_.reduced += (b.end - b.begin) * sizeof(T);
      return;
    }
    // Sharded: each part of the bucket goes to the rank whose optimizer owns it.
    for (int q = 0; q < size_; ++q) {
      param_range const s = shard_of(q);
      std::size_t const lo = std::max(b.begin, s.begin), hi = std::min(b.end, s.end);
      if (lo >= hi) continue;
      MPI_Request r;
      void const* send = q == rank_ ? MPI_IN_PLACE : static_cast<void const*>(g + lo);
      detail::check(MPI_Ireduce(send, g + lo, int(hi - lo), detail::datatype<T>(), MPI_SUM, q, comm_, &r),
                    "MPI_Ireduce");
      requests_.push_back(r);
      traffic_.reduced += (hi - lo) * sizeof(T);
    }
  }

  void wait(MPI_Request& r, char const* what) {
    std::vector<MPI_Request> one{r};
    wait_on(one, what);
    r = MPI_REQUEST_NULL;
  }
  void wait_all(char const* what) {
    if constexpr (on_gpu) this->join_nccl(what);
    wait_on(requests_, what);
    requests_.clear();
  }
  bool in_flight() const {
#if REMAT_DIST_NCCL
    if constexpr (on_gpu) return nccl_->busy();
#endif
    return !requests_.empty();
  }

#if REMAT_DIST_NCCL
  // Rank 0's NCCL id to every rank (over MPI), then the communicator.
  void open_nccl() {
    ncclUniqueId id{};
    if (rank_ == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    k_->nccl_id = id;
    MPI_Request r;
    detail::check(MPI_Ibcast(&k_->nccl_id, int(sizeof(ncclUniqueId)), MPI_BYTE, 0, comm_, &r), "MPI_Ibcast");
    wait(r, "the NCCL id's broadcast from rank 0");
    nccl_ = std::make_unique<detail::nccl_channel>(k_->nccl_id, rank_, size_);
  }
  // The current stream waits for NCCL's work, and the host too, within the timeout.
  void join_nccl(char const* what) {
    if (nccl_->join(current_cuda_stream(), o_.timeout_seconds)) return;
    timed_out_ = true;
    REMAT_NAMESPACE::detail::raise<dist_error>("data_parallel: rank ", rank_, " of ", size_, " waited more than ",
                                               o_.timeout_seconds, " s for ", what,
                                               " through NCCL (timeout_seconds), or NCCL failed; another rank has "
                                               "failed or is not running the same step; this communicator is "
                                               "unusable now");
  }
#endif
  // Polls (which also moves the messages on) until done, or throws dist_error after the timeout.
  void wait_on(std::vector<MPI_Request>& rs, char const* what) {
    if (rs.empty()) return;
    auto const start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      detail::check(MPI_Testall(int(rs.size()), rs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) return;
      double const waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > o_.timeout_seconds) {
        timed_out_ = true;
        REMAT_NAMESPACE::detail::raise<dist_error>("data_parallel: rank ", rank_, " of ", size_, " waited ", waited,
                                                   " s for ", what,
                                                   " (timeout_seconds); another rank has failed or is not running "
                                                   "the same step; this communicator is unusable now");
      }
    }
  }

  Model& model_;
  options o_;
  std::unique_ptr<scratch> k_ = std::make_unique<scratch>();
  bool timed_out_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<bucket> buckets_;
  std::vector<MPI_Request> requests_;
#if REMAT_DIST_NCCL
  std::unique_ptr<detail::nccl_channel> nccl_;  // (a cuda model's)
#endif
  std::size_t next_ = 0;    // the next bucket to start
  bool pending_ = false;    // local gradient contributions not reduced yet
  bool reduced_ = false;    // the gradients hold the ranks' sum (since the last zero_grad)
  bool started_ = false;
  bool overlap_ = false;    // the running pass reduces its buckets as backward finishes them
  bool inside_ = false;     // a pass started by this wrapper
  traffic traffic_{}, last_{};
};

// Saves the model's parameters from rank 0 only (every rank calls it; an error on rank 0 is
// thrown on every rank).
template <class Model>
void save(data_parallel<Model>& dp, std::string const& path, std::map<std::string, std::string> metadata = {}) {
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::save(dp.model(), path, metadata);
  });
}

// Saves an AdamW state from rank 0 in the format of remat::save(AdamW), so a sharded run's file
// loads into an unsharded optimizer and the other way round: the shards' moments are gathered.
template <class Model, class T, class C>
void save(data_parallel<Model>& dp, AdamW<T, host, C> const& opt, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  std::vector<T> const m = dp.gather_shards(tensor_to_host(opt.exp_avg().view()));
  std::vector<T> const v = dp.gather_shards(tensor_to_host(opt.exp_avg_sq().view()));
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::detail::save_adamw(m, v, opt, path, std::move(metadata));
  });
}

// Loads parameters on rank 0 and broadcasts them (an error on rank 0 is thrown on every rank and
// changes nothing anywhere).
template <class Model>
void load(data_parallel<Model>& dp, std::string const& path) {
  dp.agree("dist::load", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::load(dp.model(), path);
  });
  dp.broadcast_parameters();
}

// Loads an AdamW state saved by either save() on every rank, each keeping its shard; all or
// nothing on every rank.
template <class Model, class T, class C>
void load(data_parallel<Model>& dp, AdamW<T, host, C>& opt, std::string const& path) {
  dp.agree("dist::load",
           [&] { REMAT_NAMESPACE::detail::load_adamw(opt, path, Model::parameter_count, dp.shard().begin); });
}

}  // namespace dist
}  // namespace REMAT_NAMESPACE
