// Must not compile: four checkpointed segments out of three layers.
#include <remat/remat.hpp>

using Bad = remat::CheckpointSequential<4, remat::Seq<remat::Linear<4, 8>, remat::ReLU, remat::Linear<8, 2>>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
