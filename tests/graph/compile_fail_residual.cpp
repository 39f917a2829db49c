// Must not compile: a residual branch that changes the width cannot be added to its input.
#include <remat/remat.hpp>

using Bad = remat::Seq<remat::Residual<remat::Seq<remat::Linear<8, 16>, remat::ReLU>>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
