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

template <class A, class H, class Fence>
struct offload_record {
  struct item {
    A device;
    H host;
    std::vector<std::size_t> slots;
    std::size_t rows = 0, cols = 0;
  };
  std::vector<item> items;
  bool pending = true;
  bool fetched = false;
  Fence fence;  // (declared last, so destroyed first: the compute waits before the memory goes)
};

}  // namespace REMAT_NAMESPACE
