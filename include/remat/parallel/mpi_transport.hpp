// The bulk data of data_parallel for models on the host: gradients reduced and parameters
// broadcast and gathered through MPI's non-blocking collectives on the wrapper's communicator.
// Messages start when asked and finish by join(); progress() lets started ones move on while
// backward runs.
#pragma once

#include "../pass/gradient_sync.hpp"
#include "communicator.hpp"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {

// What data_parallel sends its gradients and parameters through on the host: MPI's non-blocking
// collectives on the wrapper's communicator, for values of type T. Every call starts messages on
// every rank in the same order; join() waits for them.
template <class T>
class mpi_transport {
 public:
  // Sends through `c`, which must outlive the transport.
  explicit mpi_transport(communicator& c) : c_(c) {}
  mpi_transport(mpi_transport const&) = delete;
  mpi_transport& operator=(mpi_transport const&) = delete;

  // (The host has no stream to follow, and MPI's collectives need no grouping.)
  void follow() {}
  void group_start() {}  // (what NCCL groups; nothing here)
  void group_end() {}    // (what NCCL groups; nothing here)

  // The sum of p[0, n) over the ranks, into every rank's p.
  void all_reduce(T* p, std::size_t n) {
    for_chunks(n, [&](std::size_t b, int count, MPI_Request& r) {
      detail::check(MPI_Iallreduce(MPI_IN_PLACE, p + b, count, detail::datatype<T>(), MPI_SUM, c_.get(), &r),
                    "MPI_Iallreduce");
    });
  }
  // The sum over the ranks into root's p (the other ranks' p is left as it was).
  void reduce(T* p, std::size_t n, int root) {
    for_chunks(n, [&](std::size_t b, int count, MPI_Request& r) {
      void const* send = root == c_.rank() ? MPI_IN_PLACE : static_cast<void const*>(p + b);
      detail::check(MPI_Ireduce(send, p + b, count, detail::datatype<T>(), MPI_SUM, root, c_.get(), &r),
                    "MPI_Ireduce");
    });
  }
  // Root's p[0, n) into every rank's p.
  void broadcast(T* p, std::size_t n, int root) {
    for_chunks(n, [&](std::size_t b, int count, MPI_Request& r) {
      detail::check(MPI_Ibcast(p + b, count, detail::datatype<T>(), root, c_.get(), &r), "MPI_Ibcast");
    });
  }
  // Every rank's part of p (rank q's: shards[q]) to every rank. The elements may be of another
  // type than T (a mixed-precision model's 16-bit compute copy): they are moved, not added. Past
  // MPI's int offsets (detail::mpi_message_limit) each rank broadcasts its part, in messages of
  // at most that many elements.
  template <class U>
  void all_gather(U* p, std::vector<param_range> const& shards) {
    std::size_t const limit = detail::mpi_message_limit();
    if (std::any_of(shards.begin(), shards.end(), [&](param_range const& s) { return s.end > limit; })) {
      for (std::size_t q = 0; q < shards.size(); ++q)
        for (std::size_t b = shards[q].begin; b < shards[q].end; b += limit) {
          MPI_Request r;
          detail::check(MPI_Ibcast(p + b, int(std::min(limit, shards[q].end - b)), detail::moved_datatype<U>(), int(q),
                                   c_.get(), &r),
                        "MPI_Ibcast");
          requests_.push_back(r);
        }
      return;
    }
    // (MPI reads the counts and offsets until the gather ends: each gather in flight has its own)
    std::vector<int>& counts = layouts_.emplace_back();
    std::vector<int>& displs = layouts_.emplace_back();
    for (param_range const& s : shards) {
      counts.push_back(int(s.size()));
      displs.push_back(int(s.begin));
    }
    MPI_Request r;
    detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, counts.data(), displs.data(),
                                  detail::moved_datatype<U>(), c_.get(), &r),
                  "MPI_Iallgatherv");
    requests_.push_back(r);
  }

  // Lets the messages already started move on.
  void progress() {
    if (requests_.empty()) return;
    int done = 0;
    detail::check(MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) {
      requests_.clear();
      layouts_.clear();
    }
  }
  // Whether messages started may still be in flight (not joined yet).
  bool busy() const { return !requests_.empty(); }
  // Waits for everything started, within the communicator's timeout.
  void join(char const* what) {
    c_.wait_all(requests_, what);
    requests_.clear();
    layouts_.clear();
  }

 private:
  template <class Start>
  void for_chunks(std::size_t n, Start&& start) {
    std::size_t const chunk = detail::mpi_message_limit();  // (elements per message, within int)
    for (std::size_t b = 0; b < n; b += chunk) {
      MPI_Request r;
      start(b, int(std::min(chunk, n - b)), r);
      requests_.push_back(r);
    }
  }

  communicator& c_;
  std::vector<MPI_Request> requests_;
  std::deque<std::vector<int>> layouts_;  // the counts and offsets of the gathers in flight (stable)
};

}  // namespace dist
}  // namespace REMAT_NAMESPACE
