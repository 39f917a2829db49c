// The host side of remat::dist, over MPI: dist::environment (MPI_Init and MPI_Finalize, and every
// rank aborted when an exception leaves its scope), and dist::communicator, remat's own duplicate
// of a caller's communicator that carries the small messages (agreement on errors, signatures,
// sums, gathers of host vectors) with every wait bounded by a timeout. The bulk data (gradients,
// parameters) goes through a transport (parallel/mpi_transport.hpp, parallel/nccl.hpp).
#pragma once

#include "../error.hpp"
#include "../pass/gradient_sync.hpp"

// The C interface only: the deprecated C++ bindings some MPIs still ship add nothing here.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
// (MPICH's switch for the same: <mpi.h> without the C++ bindings)
#define MPICH_SKIP_MPICXX 1
#endif
#if !__has_include(<mpi.h>)
#error "<remat/parallel/mpi.hpp> needs MPI: install an MPI (Debian: libopenmpi-dev) and link remat::dist"
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {

namespace detail {

// The most elements one bulk message carries, and the largest offset passed to MPI: MPI 3.1
// counts and places elements in int, so the parameters of a larger model go in parts of this many
// (a test lowers it to reach those paths with a small model).
inline std::size_t& mpi_message_limit() {
  static std::size_t limit = std::size_t(1) << 30;
  return limit;
}

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

// The MPI type that moves values of T bit for bit (gathers, broadcasts): T's own, or for a 16-bit
// float (half, bfloat16) MPI_UINT16_T (never added).
template <class T>
MPI_Datatype moved_datatype() {
  if constexpr (sizeof(T) == 2 && !std::is_arithmetic_v<T>) return MPI_UINT16_T;
  else return datatype<T>();
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
  // Initialises MPI (MPI_THREAD_FUNNELED: only the thread that made it calls MPI) unless the
  // program has already; MPI may take its own options out of argc and argv.
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
  // This process's rank in MPI_COMM_WORLD.
  static int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  // The number of processes in MPI_COMM_WORLD.
  static int world_size() {
    int p = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
  }

 private:
  bool owns_ = false;
};

// A duplicate of the caller's communicator (remat's messages never mix with the caller's), with
// MPI_ERRORS_RETURN. Every wait polls (which also moves the messages on) and throws dist_error
// past `timeout_seconds`: a rank that failed or diverged never leaves the others blocked. After
// such a timeout, or when it is destroyed with messages in flight (abandon()), the communicator
// and the buffers small messages use are left alive, since MPI may still use them.
class communicator {
 public:
  // Duplicates `comm` (a collective call: every rank of `comm` makes it); every later wait throws
  // dist_error after `timeout_seconds`.
  communicator(MPI_Comm comm, double timeout_seconds) : timeout_(timeout_seconds) {
    detail::check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  communicator(communicator const&) = delete;
  communicator& operator=(communicator const&) = delete;
  ~communicator() {
    if (abandoned_) {
      (void)k_.release();
      return;
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }  // this process's rank in the communicator
  int size() const { return size_; }  // the number of ranks
  MPI_Comm get() const { return comm_; }  // the duplicate itself (for a transport's messages)
  double timeout_seconds() const { return timeout_; }  // the longest wait before dist_error
  // Whether a wait has timed out (or messages were abandoned): the communicator is unusable.
  bool timed_out() const { return abandoned_; }
  // Leaves the communicator and the small messages' buffers to MPI (messages may be in flight).
  void abandon() { abandoned_ = true; }

  // Throws dist_error naming `what` after a wait longer than the timeout (and abandons).
  [[noreturn]] void fail_wait(double waited, char const* what, char const* through = "") {
    abandoned_ = true;
    REMAT_NAMESPACE::detail::raise<dist_error>("data_parallel: rank ", rank_, " of ", size_, " waited ", waited,
                                               " s for ", what, through,
                                               " (timeout_seconds); another rank has failed or is not running "
                                               "the same step; this communicator is unusable now");
  }
  // Polls until every request is done, or throws after the timeout. After the first polls it
  // yields the processor between polls: with more ranks than cores, a waiting rank would
  // otherwise take the time of the rank it waits for.
  void wait_all(std::vector<MPI_Request>& rs, char const* what) {
    if (rs.empty()) return;
    auto const start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      detail::check(MPI_Testall(int(rs.size()), rs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) return;
      if (polls >= 64) std::this_thread::yield();
      double const waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_) fail_wait(waited, what);
    }
  }
  // Polls until one request is done, or throws after the timeout.
  void wait(MPI_Request& r, char const* what) {
    std::vector<MPI_Request> one{r};
    wait_all(one, what);
    r = MPI_REQUEST_NULL;
  }

  // ---- small messages (through heap buffers: a message abandoned by a timeout never writes into
  // a stack frame that is gone)

  // The sum (or the minimum, the maximum) of a double or an int over the ranks.
  template <class V>
    requires std::is_same_v<V, double> || std::is_same_v<V, int>
  V all_reduce(V x, MPI_Op op, char const* what) {
    auto& [in, out] = k_->scalars(V{});
    in = x;
    MPI_Request r;
    detail::check(MPI_Iallreduce(&in, &out, 1, std::is_same_v<V, int> ? MPI_INT : MPI_DOUBLE, op, comm_, &r),
                  "MPI_Iallreduce");
    wait(r, what);
    return out;
  }
  // `bytes` bytes of root's buffer to every rank's.
  void broadcast(void* data, std::size_t bytes, int root, char const* what) {
    k_->bytes.assign(static_cast<unsigned char const*>(data), static_cast<unsigned char const*>(data) + bytes);
    std::size_t const chunk = detail::mpi_message_limit();  // (bytes per message, within int)
    for (std::size_t b = 0; b < bytes; b += chunk) {
      MPI_Request r;
      detail::check(MPI_Ibcast(k_->bytes.data() + b, int(std::min(chunk, bytes - b)), MPI_BYTE, root, comm_, &r),
                    "MPI_Ibcast");
      wait(r, what);
    }
    if (bytes) std::memcpy(data, k_->bytes.data(), bytes);
  }
  std::uint64_t broadcast(std::uint64_t v, int root, char const* what) {
    broadcast(&v, sizeof v, root, what);
    return v;
  }
  // Every rank's `mine` (the same length on every rank), in rank order.
  std::vector<std::uint64_t> all_gather(std::vector<std::uint64_t> const& mine, char const* what) {
    k_->u_mine = mine;
    k_->u_all.assign(mine.size() * std::size_t(size_), 0);
    MPI_Request r;
    detail::check(MPI_Iallgather(k_->u_mine.data(), int(mine.size()), MPI_UINT64_T, k_->u_all.data(),
                                 int(mine.size()), MPI_UINT64_T, comm_, &r),
                  "MPI_Iallgather");
    wait(r, what);
    return k_->u_all;
  }
  // Rank 0 gets the ranks' parts of a vector of `total` elements in rank order (rank q's part is
  // parts[q], `mine` on rank q); the other ranks get an empty vector. Past MPI's int offsets
  // (detail::mpi_message_limit) each rank sends its part to rank 0 in messages of at most that many.
  template <class T>
  std::vector<T> gather(std::vector<T> const& mine, std::size_t total, std::vector<param_range> const& parts,
                        char const* what) {
    k_->send.resize(mine.size() * sizeof(T));
    if (!mine.empty()) std::memcpy(k_->send.data(), mine.data(), k_->send.size());
    k_->gathered.assign(rank_ == 0 ? total * sizeof(T) : 0, 0);
    std::size_t const limit = detail::mpi_message_limit();
    if (std::any_of(parts.begin(), parts.end(), [&](param_range const& s) { return s.end > limit; })) {
      std::vector<MPI_Request> rs;
      auto const in_parts = [&](int q, auto&& f) {  // f(where in the vector, where in q's part, count, tag)
        param_range const s = parts[std::size_t(q)];
        for (std::size_t b = 0, tag = 0; b < s.size(); b += limit, ++tag)
          f(s.begin + b, b, int(std::min(limit, s.size() - b)), int(tag));
      };
      if (rank_ == 0) {
        if (!mine.empty())
          std::memcpy(k_->gathered.data() + parts[0].begin * sizeof(T), k_->send.data(), k_->send.size());
        for (int q = 1; q < size_; ++q)
          in_parts(q, [&](std::size_t at, std::size_t, int count, int tag) {
            rs.emplace_back();
            detail::check(MPI_Irecv(k_->gathered.data() + at * sizeof(T), count, detail::datatype<T>(), q, tag, comm_,
                                    &rs.back()),
                          "MPI_Irecv");
          });
      } else {
        in_parts(rank_, [&](std::size_t, std::size_t b, int count, int tag) {
          rs.emplace_back();
          detail::check(MPI_Isend(k_->send.data() + b * sizeof(T), count, detail::datatype<T>(), 0, tag, comm_,
                                  &rs.back()),
                        "MPI_Isend");
        });
      }
      wait_all(rs, what);
    } else {
      std::vector<int> counts, displs;
      for (param_range const& s : parts) {
        counts.push_back(int(s.size()));
        displs.push_back(int(s.begin));
      }
      MPI_Request r;
      detail::check(MPI_Igatherv(k_->send.data(), int(mine.size()), detail::datatype<T>(), k_->gathered.data(),
                                 counts.data(), displs.data(), detail::datatype<T>(), 0, comm_, &r),
                    "MPI_Igatherv");
      wait(r, what);
    }
    std::vector<T> out(rank_ == 0 ? total : 0);
    if (!out.empty()) std::memcpy(out.data(), k_->gathered.data(), total * sizeof(T));
    return out;
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
    int const first = all_reduce(err ? rank_ : size_, MPI_MIN, what);
    if (first == size_) return;
    std::uint64_t const length = broadcast(std::min<std::uint64_t>(msg.size(), INT_MAX), first, what);
    msg.resize(length);
    broadcast(msg.data(), length, first, what);
    if (err) std::rethrow_exception(err);
    REMAT_NAMESPACE::detail::raise<dist_error>(what, ": rank ", first, " of ", size_, " failed, so every rank stops: ",
                                               msg);
  }

 private:
  struct buffers {
    std::pair<int, int> ints{};  // (in, out) of an all-reduce
    std::pair<double, double> doubles{};
    std::pair<int, int>& scalars(int) { return ints; }
    std::pair<double, double>& scalars(double) { return doubles; }
    std::vector<unsigned char> bytes, send, gathered;
    std::vector<std::uint64_t> u_mine, u_all;
  };

  std::unique_ptr<buffers> k_ = std::make_unique<buffers>();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_;
  bool abandoned_ = false;
};

}  // namespace dist
}  // namespace REMAT_NAMESPACE
