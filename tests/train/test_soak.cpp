// Soak: the digits and charlm examples' models (examples/digits, examples/charlm: the same types)
// trained by their loops (AdamW, dropout on, batches cycling through a data set) for many steps,
// with the charlm model on the main thread and the digits model on a second thread at the same
// time. After the first steps, the allocators' reserved bytes (per tag and in total), the calls to
// the system and the process's open file descriptors stay exactly where they were; and the digits
// model trained beside the other ends, bit for bit, where it ends trained alone.
// The short run is in every CI run; the run of 10^4 steps each (about 20 minutes on 2 cores) is
// tagged [long]: `build/default/tests/soak "[long]"` (ctest label soak, which the presets leave out).
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

using namespace remat;

namespace {

// examples/digits/main.cpp's model.
using DigitsBlock = Residual<Seq<LayerNorm<128>, Linear<128, 256>, GELU, Dropout<0.1>, Linear<256, 128>>>;
using Digits = Seq<Linear<64, 128>, GELU, Repeat<3, DigitsBlock>, LayerNorm<128>, Linear<128, 10>>;
// examples/charlm/main.cpp's checkpointed model (context 64).
constexpr std::size_t vocabulary = 97, context = 64;
using CharLM = Seq<Embedding<vocabulary, 128>, PositionEmbedding<context, 128>, Dropout<0.1>,
                   Repeat<4, Checkpointed<GPTBlock<128, 4, 0.1>>>, LayerNorm<128>, Linear<128, vocabulary>>;

std::size_t open_files() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto const& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// What must not move once a loop has run its first steps.
struct footprint {
  std::array<std::size_t, memory::tag_count> reserved{};
  std::size_t total = 0, system_calls = 0, offload_reserved = 0, offload_calls = 0;
  bool operator==(footprint const&) const = default;
};
template <class M>
footprint footprint_of(M const& m) {
  footprint f;
  auto const s = m.allocator().stats();
  for (std::size_t t = 0; t < memory::tag_count; ++t) f.reserved[t] = s.by_tag[t].reserved;
  f.total = s.total.reserved;
  f.system_calls = s.system_allocations;
  auto const o = m.offload_allocator().stats();
  f.offload_reserved = o.total.reserved;
  f.offload_calls = o.system_allocations;
  return f;
}

constexpr int warmup = 3;

// The digits loop: batches of 64 of 8 x 8 images (a fixed synthetic set of 640), 10 classes.
// `moved`: the first step whose footprint differed from the one after the warm-up (-1: none), for
// the caller to check (Catch's assertions belong to the main thread).
std::vector<float> train_digits(int steps, int* moved) {
  memory::caching_allocator<host> alloc;
  model<Digits> m(seed{3}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  constexpr std::size_t batch = 64, images = 640;
  std::vector<tensor<float>> xs;
  std::vector<tensor<std::int32_t>> ys;
  for (std::size_t b = 0; b < images / batch; ++b) {
    tensor<float> x{index_t(batch), 64};
    tensor<std::int32_t> y{index_t(batch), 1};
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.013 * double(i + b * x.size())));
    for (std::size_t i = 0; i < batch; ++i) y[i] = std::int32_t((i * 7 + b) % 10);
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
  }
  footprint first{};
  for (int s = 0; s < steps; ++s) {
    m.train_step<SoftmaxCrossEntropy>(xs[std::size_t(s) % xs.size()], ys[std::size_t(s) % ys.size()], opt);
    if (!moved) continue;
    if (s == warmup) first = footprint_of(m);
    if (s > warmup && *moved < 0 && !(footprint_of(m) == first)) *moved = s;
  }
  return tensor_to_host(m.parameters());
}

// The charlm loop: sequences of 64 characters from a fixed synthetic text, batches of 8,
// next-character targets; returns the number of checks made.
int train_charlm(int steps, std::size_t files) {
  memory::caching_allocator<host> alloc;
  model<CharLM> m(seed{4}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  constexpr std::size_t batch = 8;
  std::vector<std::int32_t> text(4096);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::int32_t((i * i + 3 * i + i / 7) % vocabulary);
  tensor<std::int32_t> ids{index_t(batch), index_t(context)}, next{index_t(batch), index_t(context)};
  footprint first{};
  int checks = 0;
  for (int s = 0; s < steps; ++s) {
    std::size_t const start = std::size_t(s) * batch * context % (text.size() - batch * context - 1);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = text[start + i];
      next[i] = text[start + i + 1];
    }
    m.train_step<SoftmaxCrossEntropy>(ids, next, opt);
    if (s == warmup) first = footprint_of(m);
    if (s > warmup) {
      INFO("charlm, step " << s);
      REQUIRE(footprint_of(m) == first);
      REQUIRE(open_files() == files);
      ++checks;
    }
  }
  return checks;
}

void soak(int digits_steps, int charlm_steps) {
  std::vector<float> const alone = train_digits(digits_steps, nullptr);
  std::size_t const files = open_files();
  std::vector<float> beside;
  int moved = -1;
  std::thread second([&] { beside = train_digits(digits_steps, &moved); });
  int checks = 0;
  try {
    checks = train_charlm(charlm_steps, files);
  } catch (...) {
    second.join();
    throw;
  }
  second.join();
  CHECK(checks > 0);
  CHECK(moved == -1);  // (the digits loop's footprint: the step where it moved)
  REQUIRE(beside.size() == alone.size());
  CHECK(std::memcmp(beside.data(), alone.data(), alone.size() * sizeof(float)) == 0);
  CHECK(open_files() == files);
}

}  // namespace

// (The sanitizer build, unoptimised, runs a tenth of the short run.)
#ifndef REMAT_SOAK_FRACTION
#define REMAT_SOAK_FRACTION 1
#endif

TEST_CASE("two training loops on two threads hold memory, system calls and files flat", "[soak]") {
  soak(400 / REMAT_SOAK_FRACTION, 120 / REMAT_SOAK_FRACTION);
}

TEST_CASE("10^4 steps each, memory, system calls and files flat", "[soak][long]") { soak(10000, 10000); }
