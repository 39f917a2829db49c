// libFuzzer target for every reader of untrusted bytes: safetensors::read, load(model, path) for an
// fp32 and a mixed-precision (bf16, dynamic loss scale) model, and load(AdamW, path) and
// load(SGD, path) (with and without momentum) for both
// models' optimizers. Each input is written to a file and given to each reader. A reader may
// accept it or throw a remat::error; anything else (another exception, a crash, a sanitizer
// report, a leak) is a finding, and so is a refused load that changed the model or the optimizer.
// Built with clang's -fsanitize=fuzzer,address,undefined by scripts/fuzz.sh (tests/fuzz/CMakeLists.txt).
#include <remat/remat.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

using namespace remat;

namespace {

using Net = Seq<Linear<6, 16>, GELU, Residual<Seq<LayerNorm<16>, Linear<16, 16>, Tanh>>, RMSNorm<16>, Linear<16, 3>>;
using Mixed = mixed<bfloat16, DynamicLossScale>;

[[noreturn]] void finding(char const* what) {
  std::fprintf(stderr, "fuzz_readers: %s\n", what);
  std::abort();
}

std::string const& input_path() {
  static std::string const p = [] {
    char const* dir = std::getenv("REMAT_FUZZ_DIR");
    return std::string(dir ? dir : "/tmp") + "/remat-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  }();
  return p;
}

template <class T>
bool same(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class M>
void load_model(M& m) {
  auto const before = tensor_to_host(m.parameters());
  try {
    load(m, input_path());
  } catch (error const&) {
    if (!same(tensor_to_host(m.parameters()), before)) finding("a refused model load changed the parameters");
  }
}

template <class O>
void load_sgd(O& opt) {
  auto const b = opt.momentum_buffer().to_vector();
  auto const steps = opt.steps();
  double const scale = opt.scaler() ? opt.scaler()->scale() : 1.0;
  try {
    load(opt, input_path());
  } catch (error const&) {
    if (!same(opt.momentum_buffer().to_vector(), b) || opt.steps() != steps ||
        (opt.scaler() && opt.scaler()->scale() != scale))
      finding("a refused SGD load changed the optimizer");
  }
}

template <class O>
void load_optimizer(O& opt) {
  auto const m = opt.exp_avg().to_vector(), v = opt.exp_avg_sq().to_vector();
  auto const steps = opt.steps();
  double const scale = opt.scaler() ? opt.scaler()->scale() : 1.0;
  try {
    load(opt, input_path());
  } catch (error const&) {
    if (!same(opt.exp_avg().to_vector(), m) || !same(opt.exp_avg_sq().to_vector(), v) || opt.steps() != steps ||
        (opt.scaler() && opt.scaler()->scale() != scale))
      finding("a refused AdamW load changed the optimizer");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  static model<Net> fp{seed{1}};
  static model<Net, host, Mixed> bf{seed{1}};
  static AdamW ofp(fp, {.lr = 1e-3});
  static AdamW obf(bf, {.lr = 1e-3});
  static SGD sfp(fp, {.lr = 1e-2, .momentum = 0.9});
  static SGD sbf(bf, {.lr = 1e-2, .momentum = 0.9, .nesterov = true});
  static SGD plain(fp, {.lr = 1e-2});
  {
    std::FILE* f = std::fopen(input_path().c_str(), "wb");
    if (!f) finding("cannot write the input file (REMAT_FUZZ_DIR)");
    if (size && std::fwrite(data, 1, size, f) != size) finding("cannot write the input file");
    std::fclose(f);
  }
  try {
    safetensors::file const f = safetensors::read(input_path());
    // What read accepts is consistent: every tensor's bytes lie in the data, sized by its shape.
    for (auto const& [name, t] : f.tensors)
      if (t.end < t.begin || t.end > f.data.size()) finding("safetensors::read accepted a tensor outside its data");
  } catch (error const&) {
    // Every load reads the file through safetensors::read first and refuses it with the same error
    // before it touches anything; the loads below would only repeat this.
    return 0;
  }
  load_model(fp);
  load_model(bf);
  load_optimizer(ofp);
  load_optimizer(obf);
  load_sgd(sfp);
  load_sgd(sbf);
  load_sgd(plain);
  return 0;
}
