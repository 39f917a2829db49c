// Weights on disk: round trips, and every kind of bad file refused with the model untouched.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

using namespace remat;

namespace {
using Net = Seq<Linear<6, 16>, GELU, Residual<Seq<LayerNorm<16>, Linear<16, 16>, Tanh>>, RMSNorm<16>, Linear<16, 3>>;
using Other = Seq<Linear<6, 16>, GELU, Linear<16, 3>>;

std::string tmp(char const* name) { return std::string(REMAT_TEST_BINARY_DIR "/") + name; }

std::vector<char> slurp(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(std::string const& path, std::vector<char> const& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

template <class M>
void require_unchanged(M const& m, std::vector<float> const& before) {
  auto now = tensor_to_host(m.parameters());
  REQUIRE(now.size() == before.size());
  REQUIRE(std::memcmp(now.data(), before.data(), before.size() * sizeof(float)) == 0);
}
}  // namespace

TEST_CASE("safetensors: save then load gives the same parameters and outputs", "[io]") {
  model<Net> a{seed{1}}, b{seed{2}};
  save(a, tmp("roundtrip.safetensors"));
  load(b, tmp("roundtrip.safetensors"));
  auto pa = tensor_to_host(a.parameters()), pb = tensor_to_host(b.parameters());
  REQUIRE(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
  tensor<float> x(4, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i));
  auto ya = a.forward(x), yb = b.forward(x);
  for (std::size_t i = 0; i < ya.size(); ++i) REQUIRE(ya[i] == yb[i]);
  auto f = safetensors::read(tmp("roundtrip.safetensors"));
  CHECK(f.tensors.at("2.1.weight").shape == std::vector<std::size_t>{16, 16});
  CHECK(f.tensors.at("3.weight").shape == std::vector<std::size_t>{16});
  CHECK(f.metadata.at("format") == "pt");
}

TEST_CASE("safetensors: a file for another model is refused and changes nothing", "[io][errors]") {
  model<Other> other{seed{5}};
  save(other, tmp("other.safetensors"));
  model<Net> m{seed{1}};
  auto const before = tensor_to_host(m.parameters());
  CHECK_THROWS_AS(load(m, tmp("other.safetensors")), io_error);
  CHECK_THROWS_WITH(load(m, tmp("other.safetensors")), Catch::Contains("another model"));
  require_unchanged(m, before);
  model<Other> o2{seed{6}};
  save(m, tmp("net.safetensors"));
  CHECK_THROWS_WITH(load(o2, tmp("net.safetensors")), Catch::Contains("expected a tensor '2.weight'") &&
                                                          Catch::Contains("another model"));
}

TEST_CASE("safetensors: truncated and corrupt files are refused and change nothing", "[io][errors]") {
  model<Net> a{seed{1}}, m{seed{9}};
  save(a, tmp("good.safetensors"));
  auto const bytes = slurp(tmp("good.safetensors"));
  auto const before = tensor_to_host(m.parameters());

  spit(tmp("truncated.safetensors"), std::vector<char>(bytes.begin(), bytes.end() - 100));
  CHECK_THROWS_WITH(load(m, tmp("truncated.safetensors")), Catch::Contains("truncated"));
  spit(tmp("tiny.safetensors"), std::vector<char>(bytes.begin(), bytes.begin() + 5));
  CHECK_THROWS_WITH(load(m, tmp("tiny.safetensors")), Catch::Contains("at least the 8-byte header"));
  auto garbled = bytes;
  garbled[12] = '#';  // inside the JSON header
  spit(tmp("garbled.safetensors"), garbled);
  CHECK_THROWS_AS(load(m, tmp("garbled.safetensors")), io_error);
  auto huge = bytes;
  huge[7] = 0x40;  // header length far past the end of the file
  spit(tmp("huge.safetensors"), huge);
  CHECK_THROWS_WITH(load(m, tmp("huge.safetensors")), Catch::Contains("announces a header"));
  CHECK_THROWS_WITH(load(m, tmp("does-not-exist.safetensors")), Catch::Contains("cannot open"));
  require_unchanged(m, before);
}

TEST_CASE("safetensors: a wrong dtype is refused and changes nothing", "[io][errors]") {
  model<Net, host, fp64> d{seed{1}};
  save(d, tmp("f64.safetensors"));
  model<Net> m{seed{2}};
  auto const before = tensor_to_host(m.parameters());
  CHECK_THROWS_WITH(load(m, tmp("f64.safetensors")), Catch::Contains("expected dtype F32, found F64"));
  require_unchanged(m, before);
}

TEST_CASE("safetensors: inconsistent offsets are refused", "[io][errors]") {
  float v[4] = {1, 2, 3, 4};
  safetensors::write(tmp("offsets.safetensors"), {{"a", "F32", {2}, v, 8}, {"b", "F32", {3}, v, 8}});
  CHECK_THROWS_WITH(safetensors::read(tmp("offsets.safetensors")), Catch::Contains("expected 12 bytes"));
}
