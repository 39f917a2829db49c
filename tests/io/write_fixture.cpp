// Writes a model's weights and one (input, output) pair as safetensors files for
// check_with_torch.py, which recomputes the output with PyTorch from the file alone.
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <string>

using namespace remat;
using Net = Seq<Linear<6, 16>, GELU, Residual<Seq<LayerNorm<16>, Linear<16, 16>, Tanh>>, RMSNorm<16>, Linear<16, 3>>;

int main(int argc, char** argv) {
  std::string const dir = argc > 1 ? argv[1] : ".";
  model<Net> m{seed{11}};
  // Move LayerNorm's and RMSNorm's scales off 1 so they are really tested.
  auto p = m.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += 0.05f * std::sin(float(i));
  tensor<float> x(5, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2.0f * std::sin(0.37f * float(i)) + 0.1f;
  tensor<float> y = m.forward(x);
  save(m, dir + "/fixture_weights.safetensors");
  safetensors::write(dir + "/fixture_io.safetensors", {{"x", "F32", {5, 6}, x.data(), x.bytes()},
                                                        {"y", "F32", {5, 3}, y.data(), y.bytes()}});
  std::printf("wrote %s/fixture_weights.safetensors and fixture_io.safetensors\n", dir.c_str());
  return 0;
}
