// Must not compile: revolve with no slot to keep a block input in.
#include <remat/remat.hpp>

using Block = remat::Residual<remat::Seq<remat::Linear<8, 8>, remat::ReLU>>;
using Bad = remat::Seq<remat::Revolve<0, remat::Repeat<4, Block>>>;

int main() {
  remat::model<Bad> m;
  return int(m.parameter_count);
}
