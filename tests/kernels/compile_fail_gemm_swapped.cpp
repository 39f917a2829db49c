// Must fail to compile: the operands of a product given in the wrong places (B first, A second).
// The roles are part of the operands' types, so this is a compile error, not a wrong result.
#include <remat/kernels/gemm.hpp>

int main() {
  float a[6] = {}, b[6] = {}, c[4] = {};
  using namespace remat::kernels;
  gemm(remat::host{}, rhs(b, 3, 2), lhs(a, 2, 3), result(c, 2, 2));
}
