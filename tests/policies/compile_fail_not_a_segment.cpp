// Must not compile: a storage policy around something that is not a layer or segment.
#include <remat/remat.hpp>

using Bad = remat::Seq<remat::Linear<4, 8>, remat::Checkpointed<float>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
