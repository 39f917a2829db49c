// Writes a small convolutional model (Conv2d, BatchNorm2d, MaxPool2d, GroupNorm, Upsample2d,
// AvgPool2d, a head), a batch, and remat's inference output, training loss, gradients and updated
// running statistics as safetensors files for check_conv_with_torch.py, which rebuilds the model
// in PyTorch from the file alone and compares.
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace remat;
using Net = Seq<Conv2d<2, 4, 3, 8, 8, 1, 1>, BatchNorm2d<4, 8, 8>, ReLU, MaxPool2d<4, 8, 8>,
                Conv2d<4, 6, 3, 4, 4, 2, 1, false>, GroupNorm<2, 6, 2, 2>, GELU, Upsample2d<6, 2, 2>,
                AvgPool2d<6, 4, 4, 2, 1>, Linear<54, 5>>;

int main(int argc, char** argv) {
  std::string const dir = argc > 1 ? argv[1] : ".";
  model<Net> m{seed{31}};
  auto p = m.parameters();  // move the norms' ones and zeros off, so they are really tested
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += 0.05f * std::sin(float(i));
  auto b = m.buffers();  // running statistics that are not the initial ones, so inference tests them
  for (std::size_t i = 0; i < 4; ++i) {
    b[i] = 0.1f * std::sin(float(i) + 1);
    b[4 + i] = 1.0f + 0.3f * std::cos(float(i));
  }
  save(m, dir + "/conv_weights.safetensors");
  constexpr std::size_t batch = 3;
  tensor<float> x(batch, 2 * 8 * 8), t(batch, 5);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)) + 0.2);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.5 * double(i)));
  tensor<float> const inference = m.forward(x);
  double const loss = m.accumulate<MSE>(x, t);
  float const loss32 = float(loss);
  std::vector<safetensors::entry> out{{"x", "F32", {batch, 2, 8, 8}, x.data(), x.bytes()},
                                      {"t", "F32", {batch, 5}, t.data(), t.bytes()},
                                      {"inference", "F32", {batch, 5}, inference.data(), inference.bytes()},
                                      {"loss", "F32", {1}, &loss32, sizeof loss32}};
  auto g = m.gradients();
  for (named_param const& n : model<Net>::parameter_table())
    out.push_back({"grad." + n.name, "F32", n.shape, g.data() + n.offset, n.size() * sizeof(float)});
  auto const after = m.buffers();
  for (named_param const& n : model<Net>::buffer_table())
    out.push_back({"after." + n.name, "F32", n.shape, after.data() + n.offset, n.size() * sizeof(float)});
  safetensors::write(dir + "/conv_io.safetensors", out);
  std::printf("wrote %s/conv_weights.safetensors and conv_io.safetensors (loss %.6f)\n", dir.c_str(), loss);
  return 0;
}
