// Must not compile: 16 channels of 32 x 32 into a convolution reading 64 channels of 16 x 16 (the
// same width, 16384, another image). The error names both layers and both images.
#include <remat/remat.hpp>

using Bad = remat::Seq<remat::Conv2d<3, 16, 3, 32, 32, 1, 1>, remat::Conv2d<64, 8, 3, 16, 16, 1, 1>>;

int main() { return int(Bad::in_width); }
