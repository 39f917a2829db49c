// Must fail to compile: a type without the layer contract's init() in a Seq. The error names the
// type (layer_contract<no_init>) and what it lacks.
#include <remat/remat.hpp>

using namespace remat;

struct no_init {
  static constexpr std::size_t in_width = 4, out_width = 4, param_count = 0;
  static std::vector<param_desc> params() { return {}; }
  template <class S>
  static constexpr typename S::act_type forward(S&, typename S::param_ptr, typename S::act_type x) {
    return x;
  }
  template <class S>
  static constexpr typename S::act_type backward(S&, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    return dy;
  }
};

int main() {
  model<Seq<Linear<3, 4>, no_init>> m;
  (void)m;
}
