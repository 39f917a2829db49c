// Writes a small GPT's weights, a batch of token ids and targets, and remat's loss, logits and
// gradients as safetensors files for check_gpt_with_torch.py, which rebuilds the same model in
// PyTorch from the file alone and compares.
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace remat;
using Net = GPT<23, 12, 16, 4, 2>;  // vocabulary 23, 12 positions, width 16, 4 heads, 2 blocks

int main(int argc, char** argv) {
  std::string const dir = argc > 1 ? argv[1] : ".";
  model<Net> m{seed{21}};
  auto p = m.parameters();  // move the norms' ones and zeros off, so they are really tested
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += 0.05f * std::sin(float(i));
  constexpr std::size_t batch = 3, seq = 10;
  tensor<std::int32_t> ids(batch, seq), next(batch, seq);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::int32_t((i * 5 + i / 7) % 23);
    next[i] = std::int32_t((i * 11 + 3) % 23);
  }
  tensor<float> logits = m.forward(ids);
  double const loss = m.accumulate<SoftmaxCrossEntropy>(ids, next);
  float const loss32 = float(loss);
  save(m, dir + "/gpt_weights.safetensors");
  std::vector<safetensors::entry> out{{"ids", "I32", {batch, seq}, ids.data(), ids.bytes()},
                                      {"targets", "I32", {batch, seq}, next.data(), next.bytes()},
                                      {"logits", "F32", {batch * seq, 23}, logits.data(), logits.bytes()},
                                      {"loss", "F32", {1}, &loss32, sizeof loss32}};
  auto g = m.gradients();
  for (named_param const& t : model<Net>::parameter_table())
    out.push_back({"grad." + t.name, "F32", t.shape, g.data() + t.offset, t.size() * sizeof(float)});
  safetensors::write(dir + "/gpt_io.safetensors", out);
  std::printf("wrote %s/gpt_weights.safetensors and gpt_io.safetensors (loss %.6f)\n", dir.c_str(), loss);
  return 0;
}
