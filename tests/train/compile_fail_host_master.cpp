// Must not compile: an fp32 model whose master weights would live in host memory (its layers read
// them: only a mixed-precision model can keep them there); the error says so.
#include <remat/remat.hpp>

int main() {
  remat::memory::caching_allocator<remat::host> host_side;
  remat::model<remat::Seq<remat::Linear<8, 8>>> m(remat::seed{1}, remat::memory::default_allocator<remat::host>(),
                                                  remat::host_master_weights{host_side});
  return int(m.parameter_count);
}
