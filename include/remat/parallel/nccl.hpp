// The bulk data of data_parallel for models on the GPU: gradients, parameters and the sharded
// all-gather of a cuda model move through NCCL, while the communicator (parallel/communicator.hpp)
// still carries the small host messages over MPI (agreement on errors, the signatures, the
// gradient norm). Included by <remat/parallel/mpi.hpp> when REMAT_HAS_NCCL is 1 (the
// remat::dist_cuda target); each rank uses the CUDA device current when its model was built
// (cudaSetDevice(local rank) first).
//
// NCCL's collectives run on a stream of their own: one that waits (by an event) for the model's
// stream to reach the point where a bucket's gradients are final, so reductions overlap the rest of
// backward. Before anything reads the reduced values, the reader's stream waits for them, and the
// host polls (with the wrapper's timeout, aborting the communicator when it runs out: a rank that
// died must not leave the others blocked forever inside NCCL).
#pragma once

#include "../cuda/runtime.hpp"
#include "../error.hpp"
#include "../numeric/small_float.hpp"
#include "../pass/gradient_sync.hpp"
#include "communicator.hpp"

#if REMAT_HAS_CUDA
#if !__has_include(<nccl.h>)
#error "<remat/parallel/nccl.hpp> needs NCCL (nccl.h): install it or point CUDAToolkit_ROOT at a toolkit that has it"
#endif
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

inline void nccl_check(ncclResult_t rc, char const* call) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  REMAT_NAMESPACE::detail::raise<dist_error>(call, " failed: ", std::string_view(ncclGetErrorString(rc)));
}

template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, half>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, bfloat16>) return ncclBfloat16;
  else static_assert(sizeof(T) == 0, "remat::dist: no NCCL type for this type");
}

// One NCCL communicator with its stream and events.
class nccl_channel {
 public:
  // Every rank calls this with the id rank 0 made (ncclGetUniqueId) and sent to all.
  nccl_channel(ncclUniqueId const& id, int rank, int size) {
    try {
      REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
    } catch (...) {
      release();
      throw;
    }
  }
  nccl_channel(nccl_channel const&) = delete;
  nccl_channel& operator=(nccl_channel const&) = delete;
  ~nccl_channel() { release(); }

  // What is issued next starts once `s` has reached this point.
  void follow(cudaStream_t s) {
    REMAT_CUDA_CHECK(cudaEventRecord(ready_, s));
    REMAT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    busy_ = true;
  }
  template <class T>
  void all_reduce(T* p, std::size_t count) {
    nccl_check(ncclAllReduce(p, p, count, nccl_type<T>(), ncclSum, comm_, stream_), "ncclAllReduce");
  }
  // The sum over the ranks into root's p (the other ranks' p is left as it was).
  template <class T>
  void reduce(T* p, std::size_t count, int root) {
    nccl_check(ncclReduce(p, p, count, nccl_type<T>(), ncclSum, root, comm_, stream_), "ncclReduce");
  }
  template <class T>
  void broadcast(T* p, std::size_t count, int root) {
    nccl_check(ncclBroadcast(p, p, count, nccl_type<T>(), root, comm_, stream_), "ncclBroadcast");
  }
  // Collectives between group_start and group_end are issued as one (a reduce per shard, a
  // broadcast per shard).
  static void group_start() { nccl_check(ncclGroupStart(), "ncclGroupStart"); }
  static void group_end() { nccl_check(ncclGroupEnd(), "ncclGroupEnd"); }

  bool busy() const { return busy_; }

  // `s` waits for everything issued so far, and the host until it is done. False when
  // `timeout_seconds` ran out or NCCL reported an asynchronous error: the communicator is aborted
  // then (and unusable).
  bool join(cudaStream_t s, double timeout_seconds) {
    if (!busy_) return true;
    REMAT_CUDA_CHECK(cudaEventRecord(done_, stream_));
    auto const start = std::chrono::steady_clock::now();
    for (;;) {
      cudaError_t const q = cudaEventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) REMAT_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      double const waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (async != ncclSuccess || waited > timeout_seconds) {
        aborted_ = true;
        (void)ncclCommAbort(comm_);
        comm_ = nullptr;
        return false;
      }
      std::this_thread::yield();
    }
    REMAT_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
    busy_ = false;
    return true;
  }

 private:
  void release() noexcept {
    if (stream_ && !aborted_) (void)cudaStreamSynchronize(stream_);
    if (comm_) (void)ncclCommDestroy(comm_);
    if (done_) (void)cudaEventDestroy(done_);
    if (ready_) (void)cudaEventDestroy(ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool busy_ = false;
  bool aborted_ = false;
};

}  // namespace detail

// What data_parallel asks of its transport, through one NCCL communicator per wrapper (rank 0's
// NCCL id sent to every rank over the wrapper's MPI communicator). Collectives are issued on
// NCCL's stream behind an event of the current stream (follow), so reductions overlap the rest of
// backward; join makes the current stream and the host wait, within the communicator's timeout.
template <class T>
class nccl_transport {
 public:
  explicit nccl_transport(communicator& c) : c_(c) {
    ncclUniqueId id{};
    if (c.rank() == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    c.broadcast(&id, sizeof id, 0, "the NCCL id's broadcast from rank 0");
    channel_ = std::make_unique<detail::nccl_channel>(id, c.rank(), c.size());
  }
  nccl_transport(nccl_transport const&) = delete;
  nccl_transport& operator=(nccl_transport const&) = delete;

  // What is issued next starts once the current stream has reached this point.
  void follow() { channel_->follow(current_cuda_stream()); }
  void group_start() { detail::nccl_channel::group_start(); }
  void group_end() { detail::nccl_channel::group_end(); }
  void all_reduce(T* p, std::size_t n) { channel_->all_reduce(p, n); }
  void reduce(T* p, std::size_t n, int root) { channel_->reduce(p, n, root); }
  void broadcast(T* p, std::size_t n, int root) { channel_->broadcast(p, n, root); }
  // Every rank's part of p (rank q's: shards[q]) to every rank: one broadcast per part, issued as
  // one group. The elements may be of another type than T (a 16-bit compute copy).
  template <class U>
  void all_gather(U* p, std::vector<param_range> const& shards) {
    group_start();
    for (std::size_t q = 0; q < shards.size(); ++q) channel_->broadcast(p + shards[q].begin, shards[q].size(), int(q));
    group_end();
  }
  void progress() {}
  bool busy() const { return channel_->busy(); }
  // The current stream waits for everything issued, and the host until it is done; past the
  // timeout (or on an asynchronous NCCL error) the NCCL communicator is aborted and dist_error
  // thrown.
  void join(char const* what) {
    auto const start = std::chrono::steady_clock::now();
    if (channel_->join(current_cuda_stream(), c_.timeout_seconds())) return;
    c_.fail_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), what,
                 " through NCCL (or NCCL failed)");
  }

 private:
  communicator& c_;
  std::unique_ptr<detail::nccl_channel> channel_;
};

}  // namespace dist
}  // namespace REMAT_NAMESPACE
#endif
