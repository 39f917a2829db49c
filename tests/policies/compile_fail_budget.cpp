// Must not compile: a budget of 1000 bytes of activations, below the least any storage of this
// chain needs at batch 2; the error names the smallest budget that fits (Revolve<1>'s plan,
// which tests/plan/test_budget.cpp checks is the minimum).
#include <remat/remat.hpp>

using Block = remat::Residual<remat::Seq<remat::Linear<8, 8>, remat::ReLU>>;
using Bad = remat::Budget<1000, 2, remat::Repeat<4, Block>>;

int main() {
  remat::model<Bad> m;
  remat::tensor<float> x(2, 8), t(2, 8);
  return int(m.accumulate<remat::MSE>(x, t));
}
