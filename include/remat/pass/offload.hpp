// What one run of an Offloaded<S> forward moved off the device (policy/offloaded.hpp), kept by the
// pass state until S's backward. Per tensor: its copy in offloaded memory (H), the slots of the
// saved stack it fills (holding a hollow tensor of its shape meanwhile), its shape, and the device
// copy while it is still held (`pending`: the copies may be in flight) or once it is back
// (`fetched`). A is the activation handle, Fence the ordering of the copies against the compute
// (memory/offload.hpp; nothing in a plan).
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <vector>

namespace REMAT_NAMESPACE {

// What one Offloaded forward moved off the device (see the top of this header).
template <class A, class H, class Fence>
struct offload_record {
  // One tensor moved.
  struct item {
    A device;                        // the device tensor, held until its copy is done (then null)
    H host;                          // its copy in offloaded memory
    std::vector<std::size_t> slots;  // the kept-tensor slots that held it (hollow meanwhile)
    std::size_t rows = 0;            // its shape
    std::size_t cols = 0;            // its shape
  };
  std::vector<item> items;  // the tensors moved
  bool pending = true;      // the copies may still be running (device memory still held)
  bool fetched = false;     // the copies back have been issued
  Fence fence;  // (declared last, so destroyed first: the compute waits before the memory goes)
};

}  // namespace REMAT_NAMESPACE
