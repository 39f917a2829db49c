// Device memory whose physical backing comes and goes by granules under a fixed address range:
// CUDA's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap), the device's
// counterpart of giving host pages back with madvise. A data-parallel wrapper that keeps a shard
// of a GPU model's gradients (dist::data_parallel, ZeRO-2) moves the model's gradient buffer into
// one and maps the granules a pass is about to write, unmapping those it no longer needs; the
// model's offsets into the buffer never change.
//
// A granule given back shows one shared granule of zeros, so it reads as zero as a host page
// given back does; unlike such a page it does not come back by itself when written, so the owner
// maps (commits) it before any write, following the pass's plan. A granule mapped again holds
// whatever the device had there: map() zeroes it, on the current stream.
//
// The driver's functions are looked up through the runtime (cudaGetDriverEntryPointByVersion), so
// a program links the runtime only, as remat::cuda does.
#pragma once

#include "runtime.hpp"

#if REMAT_HAS_CUDA
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace detail {

// The driver's virtual memory functions, found once.
struct vmm_driver {
  using reserve_fn = CUresult (*)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long);
  using free_fn = CUresult (*)(CUdeviceptr, std::size_t);
  using create_fn = CUresult (*)(CUmemGenericAllocationHandle*, std::size_t, CUmemAllocationProp const*,
                                 unsigned long long);
  using release_fn = CUresult (*)(CUmemGenericAllocationHandle);
  using map_fn = CUresult (*)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle, unsigned long long);
  using unmap_fn = CUresult (*)(CUdeviceptr, std::size_t);
  using access_fn = CUresult (*)(CUdeviceptr, std::size_t, CUmemAccessDesc const*, std::size_t);
  using granularity_fn = CUresult (*)(std::size_t*, CUmemAllocationProp const*, CUmemAllocationGranularity_flags);

  reserve_fn reserve = nullptr;
  free_fn address_free = nullptr;
  create_fn create = nullptr;
  release_fn release = nullptr;
  map_fn map = nullptr;
  unmap_fn unmap = nullptr;
  access_fn set_access = nullptr;
  granularity_fn granularity = nullptr;

  static vmm_driver const& get() {
    static vmm_driver const d = [] {
      vmm_driver v;
      find("cuMemAddressReserve", v.reserve);
      find("cuMemAddressFree", v.address_free);
      find("cuMemCreate", v.create);
      find("cuMemRelease", v.release);
      find("cuMemMap", v.map);
      find("cuMemUnmap", v.unmap);
      find("cuMemSetAccess", v.set_access);
      find("cuMemGetAllocationGranularity", v.granularity);
      return v;
    }();
    return d;
  }

  static void check(CUresult r, char const* call) {
    if (r != CUDA_SUCCESS) raise<cuda_error>(call, " failed: CUresult ", int(r));
  }

 private:
  template <class F>
  static void find(char const* name, F& f) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    REMAT_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !p)
      raise<cuda_error>("the CUDA driver has no ", name, " (virtual memory management needs a driver for CUDA 12 or later)");
    f = reinterpret_cast<F>(p);
  }
};

// `bytes` of device memory at a fixed address, in granules that hold memory of their own or are
// given back; built with every granule holding its own. A granule given back is not left
// unmapped (a read of it would fault, fatal to the context): it shows one granule of zeros shared
// by all of them, so it reads as zero as a host page given back does. It must not be written (the
// write would land in the shared granule, which is zeroed again at every release()): map() it
// first. Move-only.
class device_granules {
 public:
  device_granules() = default;
  explicit device_granules(std::size_t bytes) {
    vmm_driver const& d = vmm_driver::get();
    int device = 0;
    REMAT_CUDA_CHECK(cudaGetDevice(&device));
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    vmm_driver::check(d.granularity(&granule_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                      "cuMemGetAllocationGranularity");
    std::size_t const count = (bytes + granule_ - 1) / granule_;
    if (count == 0) return;
    vmm_driver::check(d.reserve(&base_, count * granule_, granule_, 0, 0), "cuMemAddressReserve");
    handles_.assign(count, 0);
    try {
      map(0, count);
    } catch (...) {
      reset();
      throw;
    }
  }
  device_granules(device_granules&& o) noexcept { take(o); }
  device_granules& operator=(device_granules&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  device_granules(device_granules const&) = delete;
  device_granules& operator=(device_granules const&) = delete;
  ~device_granules() { reset(); }

  void* data() const { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(base_)); }  // the first byte
  std::size_t granule() const { return granule_; }                  // bytes per granule
  std::size_t count() const { return handles_.size(); }              // granules in all
  bool mapped(std::size_t k) const { return handles_[k] != 0; }      // whether granule k holds its own
  // The memory held now in granules of their own (the shared zero granule is one more, once any
  // granule was given back).
  std::size_t mapped_bytes() const { return mapped_ * granule_; }

  // Granules [first, last) that were given back get memory of their own again, zeroed on the
  // current stream. Throws out_of_memory when the device has none left (what is mapped stays).
  void map(std::size_t first, std::size_t last) {
    vmm_driver const& d = vmm_driver::get();
    for (std::size_t k = first; k < last && k < count(); ++k) {
      if (handles_[k]) continue;
      CUdeviceptr const at = base_ + k * granule_;
      CUmemGenericAllocationHandle h = 0;
      if (d.create(&h, granule_, &prop_, 0) != CUDA_SUCCESS)
        raise<out_of_memory>("mapping a granule of ", granule_, " bytes of a sharded buffer on the GPU: the device "
                             "has no memory left");
      if (zero_mapped(k)) (void)d.unmap(at, granule_);
      CUresult r = d.map(at, granule_, 0, h, 0);
      if (r == CUDA_SUCCESS) r = allow(at);
      if (r != CUDA_SUCCESS) {
        (void)d.unmap(at, granule_);
        (void)d.release(h);
        show_zero(k);
        vmm_driver::check(r, "cuMemMap or cuMemSetAccess");
      }
      handles_[k] = h;
      ++mapped_;
      REMAT_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(static_cast<std::uintptr_t>(at)), 0, granule_,
                                       current_cuda_stream()));
    }
  }
  // Gives back the memory of granules [first, last): they show the shared zero granule from now
  // on, which is zeroed again on the current stream. Nothing may still be using their memory: the
  // caller has waited for the work that read or wrote them.
  // (The shared granule is made at the first release; a device without room for it keeps the
  // granules' own memory.)
  void release(std::size_t first, std::size_t last) noexcept {
    vmm_driver const& d = vmm_driver::get();
    if (!zero_ && d.create(&zero_, granule_, &prop_, 0) != CUDA_SUCCESS) {
      zero_ = 0;
      return;
    }
    std::size_t shown = count();
    for (std::size_t k = first; k < last && k < count(); ++k) {
      if (!handles_[k]) continue;
      (void)d.unmap(base_ + k * granule_, granule_);
      (void)d.release(handles_[k]);
      handles_[k] = 0;
      --mapped_;
      if (show_zero(k)) shown = k;
    }
    if (shown < count())
      (void)cudaMemsetAsync(reinterpret_cast<void*>(static_cast<std::uintptr_t>(base_ + shown * granule_)), 0,
                            granule_, current_cuda_stream());
  }

 private:
  CUresult allow(CUdeviceptr at) const {
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return vmm_driver::get().set_access(at, granule_, &access, 1);
  }
  // Maps the shared zero granule at granule k (which holds nothing now); whether it could.
  bool show_zero(std::size_t k) noexcept {
    CUdeviceptr const at = base_ + k * granule_;
    if (!zero_ || vmm_driver::get().map(at, granule_, 0, zero_, 0) != CUDA_SUCCESS) return false;
    if (allow(at) != CUDA_SUCCESS) {
      (void)vmm_driver::get().unmap(at, granule_);
      return false;
    }
    zero_shown_.resize(count(), 0);
    zero_shown_[k] = 1;
    return true;
  }
  bool zero_mapped(std::size_t k) {
    bool const was = k < zero_shown_.size() && zero_shown_[k];
    if (was) zero_shown_[k] = 0;
    return was;
  }
  void take(device_granules& o) noexcept {
    base_ = o.base_;
    granule_ = o.granule_;
    prop_ = o.prop_;
    handles_ = std::move(o.handles_);
    zero_shown_ = std::move(o.zero_shown_);
    zero_ = o.zero_;
    mapped_ = o.mapped_;
    o.base_ = 0;
    o.handles_.clear();
    o.zero_shown_.clear();
    o.zero_ = 0;
    o.mapped_ = 0;
  }
  void reset() noexcept {
    vmm_driver const& d = vmm_driver::get();
    if (base_) {
      for (std::size_t k = 0; k < count(); ++k) {
        if (handles_[k]) {
          (void)d.unmap(base_ + k * granule_, granule_);
          (void)d.release(handles_[k]);
        } else if (zero_mapped(k)) {
          (void)d.unmap(base_ + k * granule_, granule_);
        }
      }
      (void)d.address_free(base_, count() * granule_);
    }
    if (zero_) (void)d.release(zero_);
    base_ = 0;
    zero_ = 0;
    handles_.clear();
    zero_shown_.clear();
    mapped_ = 0;
  }

  CUdeviceptr base_ = 0;
  std::size_t granule_ = 0;
  CUmemAllocationProp prop_{};
  std::vector<CUmemGenericAllocationHandle> handles_;  // a granule's own memory (0: given back)
  std::vector<unsigned char> zero_shown_;              // 1: the granule shows the shared zero granule
  CUmemGenericAllocationHandle zero_ = 0;              // the shared zero granule
  std::size_t mapped_ = 0;
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
#endif
