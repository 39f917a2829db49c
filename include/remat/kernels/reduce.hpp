// Reductions of f(i) over i in [0, n): sums and maxima of fused expressions without writing the
// expression out. Host: a fixed-order reduction in lanes per fixed-size chunk, chunks on OpenMP threads;
// CUDA: CUB's device reduction on the current stream, its temporary storage in the allocator's
// workspace; the result is read back (the host waits for it), or, as a pending_scalar, read when
// asked for (a loss read after the rest of the step is issued).
#pragma once

#include "../device.hpp"
#include "../memory/allocator.hpp"
#include "../memory/offload.hpp"
#include "detail/thrust.hpp"
#include "profile.hpp"

#if REMAT_HAS_CUDA
#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/transform_iterator.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace kernels {

// The sum of two values.
struct plus_op {
  // a + b.
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    return a + b;
  }
};

// The larger of two values; NaN wins, so a NaN anywhere makes the maximum NaN.
struct max_op {
  // The larger of a and b, or the NaN among them.
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};

namespace detail {
// One chunk on one thread: element i goes to lane (i - lo) % lanes, and the lanes are folded in
// order at the end. The lanes are written out, so the order of every operation is fixed by the
// chunk's length alone; the vectoriser maps them onto registers (a plain running sum would be a
// chain it may not reorder).
template <class Acc, class F, class Op>
REMAT_HOST_CLONES Acc host_reduce(std::size_t lo, std::size_t hi, F const& f_, Acc init, Op op) {
  F const f = f_;  // (a local copy: see host_for_each)
  constexpr std::size_t lanes = 16;
  Acc lane[lanes];
  for (std::size_t l = 0; l < lanes; ++l) lane[l] = init;
  std::size_t i = lo;
  for (; i + lanes <= hi; i += lanes)
    for (std::size_t l = 0; l < lanes; ++l) lane[l] = op(lane[l], f(i + l));
  for (std::size_t l = 0; i < hi; ++i, ++l) lane[l] = op(lane[l], f(i));
  Acc r = init;
  for (std::size_t l = 0; l < lanes; ++l) r = op(r, lane[l]);
  return r;
}
}  // namespace detail

// `init` must be the identity of `op` (0 for a sum, -inf for a maximum): each chunk starts from it.
// The host splits [0, n) into fixed chunks of parallel_threshold elements, reduces each in 16
// lanes (detail::host_reduce; on as many OpenMP threads as there are) and folds the partial
// results in order, so the result depends on n alone, not on the thread count or the instruction
// set, and no temporary storage is allocated behind the allocator's back.
template <class Acc, class F, class Op>
Acc transform_reduce(host, std::size_t n, F const& f, Acc init, Op op) {
  profile::timed<host> const timing(profile::work::reduction);
  constexpr std::size_t chunk = detail::parallel_threshold;
  if (n <= chunk) return detail::host_reduce(0, n, f, init, op);
  std::int64_t const chunks = std::int64_t((n + chunk - 1) / chunk);
  std::vector<Acc> partial(std::size_t(chunks), init);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::size_t const lo = std::size_t(c) * chunk, hi = std::min(n, lo + chunk);
    partial[std::size_t(c)] = detail::host_reduce(lo, hi, f, init, op);
  }
  Acc result = init;
  for (Acc const& p : partial) result = op(result, p);
  return result;
}

// A sum reduced on the device and read later: get() gives value / divisor, waiting (on the GPU)
// for the reduction and its copy to page-locked memory only, not for work issued after them.
template <class D>
class pending_scalar {
 public:
  explicit pending_scalar(double value = 0) : value_(value) {}  // a value known now
  double get() const { return value_ / divisor_; }  // the value over the divisor
  void divide_by(double d) { divisor_ = d; }  // get() divides by d (the default is 1)

 private:
  double value_;
  double divisor_ = 1;
};

#if REMAT_HAS_CUDA
namespace detail {

// f reduced over [0, n) by CUB on the current stream, into a device scalar that lives, with CUB's
// temporary storage, in a workspace block of the allocator (held as long as the reduction is).
template <class Acc, class F, class Op>
class device_reduction {
 public:
  device_reduction(std::size_t n, F const& f, Acc init, Op op)
      : first_(detail::index_iterator(0), f), n_(n), init_(init), op_(op), space_(bytes()) {
    REMAT_CUDA_CHECK(cub::DeviceReduce::Reduce(space_.get(), temp_bytes_, first_, result(), n_, op_, init_,
                                               current_cuda_stream()));
  }
  Acc* result() const { return reinterpret_cast<Acc*>(space_.as<unsigned char>() + offset_); }

 private:
  std::size_t bytes() {
    REMAT_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, temp_bytes_, first_, static_cast<Acc*>(nullptr), n_, op_,
                                               init_, current_cuda_stream()));
    offset_ = (temp_bytes_ + alignof(Acc) - 1) / alignof(Acc) * alignof(Acc);
    return offset_ + sizeof(Acc);
  }
  thrust::transform_iterator<F, detail::index_iterator> first_;
  std::size_t n_;
  Acc init_;
  Op op_;
  std::size_t temp_bytes_ = 0, offset_ = 0;
  memory::scratch_buffer<cuda> space_;  // (last: sized by bytes(), after the members it reads)
};

}  // namespace detail

template <class Acc, class F, class Op>
Acc transform_reduce(cuda, std::size_t n, F const& f, Acc init, Op op) {
  profile::timed<cuda> const timing(profile::work::reduction);
  if (n == 0) return init;
  detail::device_reduction<Acc, F, Op> const r(n, f, init, op);
  Acc out = init;
  REMAT_CUDA_CHECK(cudaMemcpyAsync(&out, r.result(), sizeof(Acc), cudaMemcpyDeviceToHost, current_cuda_stream()));
  synchronize_current_stream();
  return out;
}

// On the GPU the sum is copied to an 8-byte page-locked slot after the reduction, and an event
// marks the copy; get() waits for that event alone.
template <>
class pending_scalar<cuda> {
 public:
  explicit pending_scalar(double value = 0) : value_(value), read_(true) {}
  template <class Acc>
    requires(std::is_same_v<Acc, float> || std::is_same_v<Acc, double> || std::is_same_v<Acc, std::uint64_t>)
  explicit pending_scalar(Acc const* device_value)
      : slot_(memory::default_offload_allocator<cuda>(), sizeof(double), memory::tag::workspace),
        kind_(std::is_same_v<Acc, float> ? kind::f32 : std::is_same_v<Acc, double> ? kind::f64 : kind::u64) {
    cudaStream_t const stream = current_cuda_stream();
    REMAT_CUDA_CHECK(cudaMemcpyAsync(slot_.get(), device_value, sizeof(Acc), cudaMemcpyDeviceToHost, stream));
    REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    REMAT_CUDA_CHECK(cudaEventRecord(ready_, stream));
  }
  pending_scalar(pending_scalar&& o) noexcept
      : slot_(std::move(o.slot_)), ready_(std::exchange(o.ready_, nullptr)), kind_(o.kind_),
        value_(o.value_), divisor_(o.divisor_), read_(std::exchange(o.read_, true)) {}
  pending_scalar& operator=(pending_scalar&& o) noexcept {
    if (this != &o) {
      release();
      slot_ = std::move(o.slot_);
      ready_ = std::exchange(o.ready_, nullptr);
      kind_ = o.kind_;
      value_ = o.value_;
      divisor_ = o.divisor_;
      read_ = std::exchange(o.read_, true);
    }
    return *this;
  }
  ~pending_scalar() { release(); }

  double get() const {
    if (!read_) {
      REMAT_CUDA_CHECK(cudaEventSynchronize(ready_));
      void const* p = slot_.get();
      value_ = kind_ == kind::f64   ? *static_cast<double const*>(p)
               : kind_ == kind::f32 ? double(*static_cast<float const*>(p))
                                    : double(*static_cast<std::uint64_t const*>(p));
      read_ = true;
    }
    return value_ / divisor_;
  }
  void divide_by(double d) { divisor_ = d; }

 private:
  // A copy still in flight finishes before its slot goes back (another result may reuse it).
  void release() noexcept {
    if (!ready_) return;
    if (!read_) (void)cudaEventSynchronize(ready_);
    (void)cudaEventDestroy(ready_);
    ready_ = nullptr;
  }
  memory::held_block<memory::pinned_host> slot_;
  cudaEvent_t ready_ = nullptr;
  enum class kind : std::uint8_t { f32, f64, u64 } kind_ = kind::f64;
  mutable double value_ = 0;
  double divisor_ = 1;
  mutable bool read_ = false;
};
#endif

// transform_reduce whose result is read later (see pending_scalar).
template <class Acc, class F, class Op>
pending_scalar<host> transform_reduce_pending(host, std::size_t n, F const& f, Acc init, Op op) {
  profile::timed<host> const timing(profile::work::reduction);
  return pending_scalar<host>(double(transform_reduce(host{}, n, f, init, op)));
}
#if REMAT_HAS_CUDA
template <class Acc, class F, class Op>
pending_scalar<cuda> transform_reduce_pending(cuda, std::size_t n, F const& f, Acc init, Op op) {
  profile::timed<cuda> const timing(profile::work::reduction);
  if (n == 0) return pending_scalar<cuda>(double(init));
  detail::device_reduction<Acc, F, Op> const r(n, f, init, op);
  return pending_scalar<cuda>(static_cast<Acc const*>(r.result()));  // (the copy is ordered after the reduction)
}
#endif

// The smaller of two values.
struct min_op {
  // The smaller of a and b (a when they are equal).
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

// The first i in [0, n) with v[i] outside [lo, hi), or n when there is none: the check of token
// ids and class labels, on the device that holds them. The pending form is read later (an input
// check issued together with the target's, read with one wait).
template <class D>
pending_scalar<D> first_out_of_range_pending(D, std::int32_t const* v, std::size_t n, std::int64_t lo,
                                             std::int64_t hi) {
  using index = std::uint64_t;  // (exact in the pending double up to 2^53 elements)
  auto const outside = [=] REMAT_LAMBDA(std::size_t i) -> index {
    return (std::int64_t(v[i]) < lo || std::int64_t(v[i]) >= hi) ? index(i) : index(n);
  };
  return transform_reduce_pending(D{}, n, outside, index(n), min_op{});
}
// The first i in [0, n) with v[i] outside [lo, hi), or n: first_out_of_range_pending, waited for.
template <class D>
std::size_t first_out_of_range(D, std::int32_t const* v, std::size_t n, std::int64_t lo, std::int64_t hi) {
  return std::size_t(first_out_of_range_pending(D{}, v, n, lo, hi).get());
}

// One element of device memory, read on the host.
template <class D, class T>
T read_element(D, T const* p) {
  T out{};
  memory::system<D>::copy_to_host(&out, p, sizeof(T));
  return out;
}

}  // namespace kernels

// Device memory where a GPU model expects it; host memory is refused with what was found.
template <class D>
void require_device_memory(void const* p, char const* what) {
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>)
    if (p && !detail::device_accessible(p))
      detail::raise<argument_error>(what, ": expected memory on the cuda device, found host memory (copy it with "
                                          "tensor::copy_from or tensor_from_host first)");
#endif
  (void)p, (void)what;
}

}  // namespace REMAT_NAMESPACE
