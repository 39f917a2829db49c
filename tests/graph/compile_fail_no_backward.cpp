// Must fail to compile: a layer without backward in a model. The error names the layer and the
// pass state it cannot run on (layer_pass_contract<no_backward, ...>) and what it lacks.
#include <remat/remat.hpp>

using namespace remat;

struct no_backward {
  static constexpr std::size_t in_width = 4, out_width = 4, param_count = 0;
  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}
  template <class S>
  static constexpr typename S::act_type forward(S&, typename S::param_ptr, typename S::act_type x) {
    return x;
  }
};

int main() {
  model<Seq<Linear<3, 4>, no_backward>> m;
  tensor<float> x(2, 3), t(2, 4);
  m.accumulate<MSE>(x, t);
}
