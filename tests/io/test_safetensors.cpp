// Weights on disk: round trips, and every kind of bad file refused with the model untouched.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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

namespace {
// A file of the given JSON header and data bytes, as they are (no checks: the reader's to do).
void write_raw(std::string const& path, std::string const& header, std::size_t data_bytes = 0) {
  std::vector<char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[std::size_t(i)] = char((std::uint64_t(header.size()) >> (8 * i)) & 0xff);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0);
  spit(path, bytes);
}
}  // namespace

TEST_CASE("safetensors: JSON escapes are decoded or refused with io_error", "[io][errors]") {
  // \u escapes, a surrogate pair (U+1F600) and the short escapes decode to UTF-8.
  write_raw(tmp("escapes.safetensors"),
            R"({"a\u00e9\u20ac\ud83d\ude00\/\"\\":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  auto const f = safetensors::read(tmp("escapes.safetensors"));
  REQUIRE(f.tensors.size() == 1);
  CHECK(f.tensors.begin()->first == "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\"\\");
  // Malformed: not hex (this threw std::invalid_argument from std::stoul), too short, lone
  // surrogates, an unknown escape, a raw control character. Each is an io_error naming it.
  for (auto const& [header, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"\uzzzz":{}})", "four hex digits"},
           {R"({"\u12":{}})", "four hex digits"},
           {R"({"\u+123":{}})", "four hex digits"},
           {R"({"\ud83d":{}})", "high surrogate"},
           {R"({"\ud83dx":{}})", "high surrogate"},
           {R"({"\ude00":{}})", "low surrogate"},
           {R"({"\q":{}})", "unknown escape"},
           {std::string("{\"a\x01\":{}}"), "control character"}}) {
    INFO(header);
    write_raw(tmp("bad-escape.safetensors"), header);
    CHECK_THROWS_AS(safetensors::read(tmp("bad-escape.safetensors")), io_error);
    CHECK_THROWS_WITH(safetensors::read(tmp("bad-escape.safetensors")), Catch::Contains(says));
  }
  // Loading a model from such a file: the same error, the model untouched.
  model<Net> m{seed{3}};
  auto const before = tensor_to_host(m.parameters());
  write_raw(tmp("bad-escape.safetensors"), R"({"\uzzzz":{}})");
  CHECK_THROWS_AS(load(m, tmp("bad-escape.safetensors")), io_error);
  require_unchanged(m, before);
}

TEST_CASE("safetensors: a shape whose size overflows 64 bits is refused", "[io][errors]") {
  // [2^32, 2^32] F32 wrapped to 0 elements (so 0 data bytes passed); [2^63 + 1, 2] wrapped to 2.
  write_raw(tmp("overflow.safetensors"),
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  CHECK_THROWS_WITH(safetensors::read(tmp("overflow.safetensors")), Catch::Contains("do not fit in 64 bits"));
  write_raw(tmp("overflow.safetensors"),
            R"({"a":{"dtype":"U8","shape":[9223372036854775809,2],"data_offsets":[0,2]}})", 2);
  CHECK_THROWS_WITH(safetensors::read(tmp("overflow.safetensors")), Catch::Contains("do not fit in 64 bits"));
  // The largest that fits is checked against its offsets as before, and an empty dimension is 0.
  write_raw(tmp("overflow.safetensors"), R"({"a":{"dtype":"F32","shape":[0,4294967296],"data_offsets":[0,0]}})");
  CHECK(safetensors::read(tmp("overflow.safetensors")).tensors.at("a").shape.size() == 2);
}

TEST_CASE("safetensors: AdamW metadata out of range is refused and changes nothing", "[io][errors]") {
  using Mixed = mixed<bfloat16, DynamicLossScale>;
  model<Net, host, Mixed> a{seed{1}};
  AdamW oa(a, {.lr = 1e-3});
  tensor<float> x(4, 6), t(4, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) * 0.1f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  a.train_step<MSE>(x, t, oa);
  save(oa, tmp("adamw-good.safetensors"));
  auto const good = safetensors::read(tmp("adamw-good.safetensors"));

  model<Net, host, Mixed> b{seed{2}};
  AdamW ob(b, {.lr = 1e-3});
  auto const m0 = ob.exp_avg().to_vector();
  double const scale0 = ob.scaler()->scale();
  // (inf and 1e300 were cast from double to an integer: undefined behaviour under UBSan)
  for (auto const& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"remat.step", "inf"},
           {"remat.step", "1e300"},
           {"remat.step", "-1"},
           {"remat.step", "2.5"},
           {"remat.step", "18446744073709551616"},
           {"remat.step", ""},
           {"remat.loss_scale_growth_tracker", "1e300"},
           {"remat.loss_scale_skipped_steps", "nan"},
           {"remat.loss_scale", "inf"},
           {"remat.loss_scale", "0"},
           {"remat.loss_scale", "-2"}}) {
    INFO(key << " = '" << value << "'");
    auto meta = good.metadata;
    meta[key] = value;
    std::vector<safetensors::entry> entries;
    for (auto const& [name, info] : good.tensors)
      entries.push_back({name, info.dtype, info.shape, good.data.data() + info.begin, info.end - info.begin});
    safetensors::write(tmp("adamw-bad.safetensors"), entries, meta);
    CHECK_THROWS_WITH(load(ob, tmp("adamw-bad.safetensors")), Catch::Contains(key));
    CHECK(ob.exp_avg().to_vector() == m0);
    CHECK(ob.steps() == 0);
    CHECK(ob.scaler()->scale() == scale0);
  }
  // The good file loads, the largest counter too.
  auto meta = good.metadata;
  meta["remat.step"] = "18446744073709551615";
  std::vector<safetensors::entry> entries;
  for (auto const& [name, info] : good.tensors)
    entries.push_back({name, info.dtype, info.shape, good.data.data() + info.begin, info.end - info.begin});
  safetensors::write(tmp("adamw-max.safetensors"), entries, meta);
  load(ob, tmp("adamw-max.safetensors"));
  CHECK(ob.steps() == 18446744073709551615ull);
  load(ob, tmp("adamw-good.safetensors"));
  CHECK(ob.steps() == oa.steps());
  CHECK(ob.exp_avg().to_vector() == oa.exp_avg().to_vector());
}

namespace {
// The names in a directory (a save must leave no temporary file behind).
std::vector<std::string> listing(std::filesystem::path const& dir) {
  std::vector<std::string> names;
  for (auto const& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
// Runs f with files limited to `bytes` (a write past it fails with EFBIG, as one on a full disk
// fails with ENOSPC), then lifts the limit.
template <class F>
void with_file_size_limit(rlim_t bytes, F&& f) {
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto const previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = bytes;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  f();
  REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, previous);
}
}  // namespace

TEST_CASE("safetensors: an exception between the writes of a file leaves the previous file and no temporary",
          "[io][errors]") {
  // What a save does when its data source fails half-way (a GPU model's copy to the host, say):
  // the exception unwinds through the file being written.
  std::filesystem::path const dir = tmp("atomic-exception");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string const path = (dir / "m.safetensors").string();
  model<Net> a{seed{1}};
  save(a, path);
  std::vector<char> const good = slurp(path);
  std::vector<char> const other(good.size(), 'x');
  bool caught = false;
  try {
    safetensors::detail::atomic_file out(path);
    out.write(other.data(), other.size() / 2);
    throw std::runtime_error("the data source failed half-way");
  } catch (std::runtime_error const&) {
    caught = true;
  }
  CHECK(caught);
  CHECK(slurp(path) == good);
  CHECK(listing(dir) == std::vector<std::string>{"m.safetensors"});
  // The same writer, committed, replaces the file whole.
  {
    safetensors::detail::atomic_file out(path);
    out.write(other.data(), other.size());
    out.commit();
  }
  CHECK(slurp(path) == other);
  CHECK(listing(dir) == std::vector<std::string>{"m.safetensors"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors: a save that fails leaves the previous file byte for byte, and no temporary", "[io][errors]") {
  std::filesystem::path const dir = tmp("atomic-saves");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string const path = (dir / "m.safetensors").string();
  model<Net> a{seed{1}}, b{seed{2}};
  save(a, path);
  std::vector<char> const good = slurp(path);
  REQUIRE(good.size() > 1024);
  REQUIRE(listing(dir) == std::vector<std::string>{"m.safetensors"});

  SECTION("the disk fills up half-way") {
    // A file-size limit fails a write the way a full disk does (EFBIG instead of ENOSPC).
    bool threw = false;
    std::string message;
    with_file_size_limit(1024, [&] {
      try {
        save(b, path);
      } catch (io_error const& e) {
        threw = true;
        message = e.what();
      }
    });
    CHECK(threw);
    INFO(message);
    CHECK(message.find("writing failed after 1024 bytes") != std::string::npos);
    CHECK(message.find("left as it was") != std::string::npos);
  }
  SECTION("an AdamW state, the disk full as well") {
    AdamW opt(b, {.lr = 1e-3});
    bool threw = false;
    with_file_size_limit(1024, [&] {
      try {
        save(opt, path);
      } catch (io_error const&) {
        threw = true;
      }
    });
    CHECK(threw);
  }
  SECTION("the directory is read-only") {
    REQUIRE(chmod(dir.c_str(), 0555) == 0);
    // Root writes into any directory: as root, the save runs as the user nobody (the effective
    // user id only, so that root comes back after it).
    bool const root = geteuid() == 0;
    if (root) REQUIRE(seteuid(65534) == 0);
    std::string message;
    try {
      save(b, path);
    } catch (io_error const& e) {
      message = e.what();
    }
    if (root) REQUIRE(seteuid(0) == 0);
    REQUIRE(chmod(dir.c_str(), 0755) == 0);
    INFO(message);
    CHECK(message.find("cannot create") != std::string::npos);
    CHECK(message.find("left as it was") != std::string::npos);
  }
  CHECK(slurp(path) == good);
  CHECK(listing(dir) == std::vector<std::string>{"m.safetensors"});
  model<Net> c{seed{3}};
  load(c, path);
  require_unchanged(c, tensor_to_host(a.parameters()));

  // A save into a directory that does not exist creates nothing.
  CHECK_THROWS_AS(save(b, (dir / "missing" / "m.safetensors").string()), io_error);
  CHECK_FALSE(std::filesystem::exists(dir / "missing"));
  // And one that succeeds replaces the file, with nothing left beside it.
  save(b, path);
  CHECK(listing(dir) == std::vector<std::string>{"m.safetensors"});
  load(c, path);
  require_unchanged(c, tensor_to_host(b.parameters()));
  std::filesystem::remove_all(dir);
}
