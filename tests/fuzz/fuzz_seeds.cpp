// Writes the fuzzer's seed corpus into the directory given: files saved by remat itself (models
// and AdamW states, fp32 and mixed precision, with and without running steps) and hand-made edge
// cases (empty, truncated, a header length past the end, overlapping and out-of-order offsets,
// every dtype, duplicate names, metadata edge values).
#include <remat/remat.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

using namespace remat;

namespace {
using Net = Seq<Linear<6, 16>, GELU, Residual<Seq<LayerNorm<16>, Linear<16, 16>, Tanh>>, RMSNorm<16>, Linear<16, 3>>;
using Mixed = mixed<bfloat16, DynamicLossScale>;

std::string dir;

void raw(std::string const& name, std::string const& header, std::string const& data = {}, long length = -1) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  std::uint64_t const n = length < 0 ? header.size() : std::uint64_t(length);
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
}

template <class M>
void trained(M& m, AdamW<float, host, typename M::compute_type>& opt) {
  tensor<float> x(4, 6), t(4, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) * 0.1f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  m.template train_step<MSE>(x, t, opt);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  dir = argv[1];
  model<Net> fp{seed{1}};
  model<Net, host, Mixed> bf{seed{2}};
  AdamW ofp(fp, {.lr = 1e-3});
  AdamW obf(bf, {.lr = 1e-3});
  save(fp, dir + "/model-fp32.safetensors");
  save(bf, dir + "/model-bf16.safetensors");
  save(ofp, dir + "/adamw-fp32-fresh.safetensors");
  trained(fp, ofp);
  trained(bf, obf);
  save(ofp, dir + "/adamw-fp32.safetensors");
  save(obf, dir + "/adamw-bf16.safetensors", {{"note", "\xc3\xa9\\u00e9"}});
  {
    SGD sfp(fp, {.lr = 1e-2, .momentum = 0.9});
    SGD plain(bf, {.lr = 1e-2});
    tensor<float> x(4, 6), t(4, 3);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.1f;
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.25f;
    fp.train_step<MSE>(x, t, sfp);
    save(sfp, dir + "/sgd-fp32.safetensors");
    save(plain, dir + "/sgd-bf16-plain.safetensors");
  }
  // Hand-made.
  raw("empty", "", "", 0);
  {
    std::ofstream(dir + "/short", std::ios::binary) << "abc";
  }
  raw("header-past-end", "{}", "", 4096);
  raw("empty-header", "{}");
  raw("metadata-only", R"({"__metadata__":{"format":"pt","remat.step":"3","remat.loss_scale":"65536"}})");
  raw("every-dtype",
      R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"F16","shape":[1],"data_offsets":[12,14]},"d":{"dtype":"BF16","shape":[1],"data_offsets":[14,16]},)"
      R"("e":{"dtype":"I64","shape":[1],"data_offsets":[16,24]},"f":{"dtype":"I32","shape":[1],"data_offsets":[24,28]},)"
      R"("g":{"dtype":"I16","shape":[1],"data_offsets":[28,30]},"h":{"dtype":"U8","shape":[1],"data_offsets":[30,31]},)"
      R"("i":{"dtype":"BOOL","shape":[1],"data_offsets":[31,32]}})",
      std::string(32, '\x01'));
  raw("overlapping", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  raw("out-of-order", R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      std::string(8, '\0'));
  raw("duplicate-names", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      std::string(8, '\0'));
  raw("gap", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, '\0'));
  raw("scalar", R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", std::string(4, '\0'));
  raw("zero-dim", R"({"a":{"dtype":"F32","shape":[0,7],"data_offsets":[0,0]}})");
  raw("deep-json", std::string(2000, '[') + std::string(2000, ']'));
  raw("escapes", R"({"a\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  raw("metadata-extremes", R"({"__metadata__":{"remat.step":"18446744073709551615","remat.loss_scale":"1e-45",)"
                           R"("remat.loss_scale_growth_tracker":"-0","remat.loss_scale_skipped_steps":"0x10"}})");
  return 0;
}
