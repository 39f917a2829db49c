// Must not compile: Linear<8, 16> feeds 16 features into Linear<32, 4>, which expects 32.
#include <remat/remat.hpp>

using Bad = remat::Seq<remat::Linear<4, 8>, remat::ReLU, remat::Linear<8, 16>, remat::GELU, remat::Linear<32, 4>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
