// Must not compile: revolve needs a chain of identical blocks (a Repeat), not any segment.
#include <remat/remat.hpp>

using Bad = remat::Revolve<2, remat::Seq<remat::Linear<8, 8>, remat::ReLU, remat::Linear<8, 8>>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
