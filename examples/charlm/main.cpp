// A character-level GPT trained on the text of Debian's `fortunes` package: the model is a type,
// GPT<vocabulary, context, width, heads, blocks, dropout, Policy>. Prints a progress bar (loss,
// tokens per second), the validation loss against the unigram baseline, a sample of generated text,
// and the memory summary.
//
//   charlm [--steps N] [--batch B] [--corpus DIR] [--seed S] [--precision fp32|bf16] [--checkpoint]
//          [--long-context] [--sample N] [--out charlm.safetensors] [--memory-trace FILE]
//
// --memory-trace records the second training step's memory timeline (allocations and frees with
// their layer and phase, each layer's time), writes it to FILE in the Chrome trace event format
// and prints the per-layer table.
//
// --checkpoint trains with every block checkpointed (Repeat<N, Checkpointed<Block>>): the same
// losses bit for bit in less activation memory; both plans are printed either way.
//
// --long-context trains at a context of 2048 characters (the default is 64), batch 2 unless --batch
// says otherwise; GPTBlock's attention core (BlockedAttentionCore) keeps memory linear in the
// context. It prints the plan of the core that keeps the probabilities (StoredAttention<...>) beside
// it (what that step would need) and the measured peak.
//
// The program exits non-zero unless the final validation loss is below the unigram baseline by 0.5
// nats (runs of 200 steps or more; a shorter run must end below its starting loss).
#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

using namespace remat;

// Characters: '\n', then printable ASCII 32..126, then one token for everything else.
constexpr std::size_t vocabulary = 97;
constexpr std::size_t short_context = 64, long_context = 2048;
constexpr std::size_t width = 128, heads = 4, blocks = 4;
constexpr double dropout = 0.1;

using Block = GPTBlock<width, heads, dropout>;
template <class Blocks, std::size_t Context = short_context>
using CharGPT = Seq<Embedding<vocabulary, width>, PositionEmbedding<Context, width>, Dropout<dropout>, Blocks,
                    LayerNorm<width>, Linear<width, vocabulary>>;
using StoredLM = CharGPT<Repeat<blocks, Block>>;
using CheckpointedLM = CharGPT<Repeat<blocks, Checkpointed<Block>>>;
// At a context of 2048, and (for its plan only) the same with the core that keeps the probabilities.
using LongLM = CharGPT<Repeat<blocks, Block>, long_context>;
using LongStoredLM = CharGPT<StoredAttention<Repeat<blocks, Block>>, long_context>;

static std::int32_t token_of(unsigned char c) {
  if (c == '\n') return 0;
  if (c == '\t') return 1;  // as a space
  if (c >= 32 && c <= 126) return std::int32_t(c - 31);
  return vocabulary - 1;
}
static char char_of(std::int32_t t) { return t == 0 ? '\n' : t == vocabulary - 1 ? '?' : char(t + 31); }

// Every fortune file of the directory (the text files; not the .dat indexes), fortunes separated by
// blank lines instead of '%' lines, in a fixed order.
static std::vector<std::int32_t> read_corpus(std::string const& dir, std::size_t& files) {
  namespace fs = std::filesystem;
  std::vector<fs::path> paths;
  std::error_code ec;
  for (auto const& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.path().has_extension()) paths.push_back(e.path());
  if (ec || paths.empty()) {
    std::fprintf(stderr, "charlm: no fortune files in %s (install Debian's `fortunes` package, or pass --corpus)\n",
                 dir.c_str());
    std::exit(1);
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::int32_t> tokens;
  for (auto const& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      if (line == "%") line.clear();
      for (unsigned char c : line) tokens.push_back(token_of(c));
      tokens.push_back(0);
    }
  }
  files = paths.size();
  return tokens;
}

struct options {
  std::size_t steps = 300, batch = 32, sample = 400;
  std::string corpus = "/usr/share/games/fortunes", out = "charlm.safetensors", precision = "fp32";
  std::uint64_t seed_value = 1;
  bool checkpoint = false, long_context = false, batch_given = false;
  std::size_t context = short_context;
  std::string memory_trace;  // a file to write the second step's memory timeline to
};

// Fills a batch of windows at random offsets: ids and the next characters.
static void fill_batch(std::vector<std::int32_t> const& text, std::size_t begin, std::size_t end, std::uint64_t seed,
                       std::uint64_t step, tensor<std::int32_t>& ids, tensor<std::int32_t>& next) {
  std::size_t const batch = ids.rows(), context = ids.cols(), span = end - begin - context - 1;
  for (std::size_t b = 0; b < batch; ++b) {
    std::size_t const at = begin + std::size_t(double(philox::uniform(seed, 500 + step, b)) * double(span));
    for (std::size_t t = 0; t < context; ++t) {
      ids(b, t) = text[at + t];
      next(b, t) = text[at + t + 1];
    }
  }
}

template <class M>
static double validation_loss(M const& m, std::vector<std::int32_t> const& text, std::size_t begin, std::size_t end,
                              std::size_t batch, std::size_t context) {
  tensor<std::int32_t> ids{index_t(batch), index_t(context)}, next{index_t(batch), index_t(context)};
  double sum = 0;
  constexpr std::size_t batches = 16;
  for (std::size_t k = 0; k < batches; ++k) {
    fill_batch(text, begin, end, 777, k, ids, next);  // the same windows every time
    sum += m.template loss<SoftmaxCrossEntropy>(ids, next);
  }
  return sum / batches;
}

// Generates n characters after `prompt`, sampling at temperature 0.8 from the last `context`
// characters' prediction.
template <class M>
static std::string generate(M const& m, std::string const& prompt, std::size_t n, std::uint64_t seed,
                            std::size_t context) {
  std::vector<std::int32_t> seq;
  for (unsigned char c : prompt) seq.push_back(token_of(c));
  std::string out = prompt;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t const len = std::min(seq.size(), context);
    tensor<std::int32_t> ids(1, index_t(len));
    for (std::size_t t = 0; t < len; ++t) ids[t] = seq[seq.size() - len + t];
    tensor<float> logits = m.forward(ids);
    double p[vocabulary], total = 0, top = -1e30;
    for (std::size_t c = 0; c < vocabulary; ++c) top = std::max(top, double(logits(len - 1, c)));
    for (std::size_t c = 0; c < vocabulary; ++c) total += p[c] = std::exp((double(logits(len - 1, c)) - top) / 0.8);
    double u = double(philox::uniform(seed, 900, i)) * total;
    std::size_t c = 0;
    while (c + 1 < vocabulary && (u -= p[c]) > 0) ++c;
    seq.push_back(std::int32_t(c));
    out.push_back(char_of(std::int32_t(c)));
  }
  return out;
}

template <class Net, class P>
static int run(options const& o, std::vector<std::int32_t> const& text) {
  std::size_t const split = text.size() * 9 / 10;  // the last tenth validates
  // The unigram baseline: the training text's character frequencies, scored on the validation text.
  std::vector<double> freq(vocabulary, 1.0);  // add-one smoothing
  for (std::size_t i = 0; i < split; ++i) freq[std::size_t(text[i])] += 1;
  double total = 0, unigram = 0;
  for (double f : freq) total += f;
  for (std::size_t i = split; i < text.size(); ++i) unigram -= std::log(freq[std::size_t(text[i])] / total);
  unigram /= double(text.size() - split);

  memory::caching_allocator<host> alloc;
  model<Net, host, P> m{seed{o.seed_value}, alloc};
  std::size_t const context = o.context;
  std::printf("model: GPT, %zu blocks of width %zu, %zu heads, context %zu, %zu parameters; %s, %s\n", blocks, width,
              heads, context, std::size_t(model<Net>::parameter_count), P::name,
              o.long_context ? "blocked attention (memory linear in the context)"
              : o.checkpoint ? "every block checkpointed"
                             : "activations stored");
  AdamW opt(m, {.lr = 3e-3, .weight_decay = 0.05, .clip_norm = 1.0});
  warmup_cosine schedule{.base_lr = 3e-3, .warmup = o.steps / 20 + 1, .total = o.steps};
  tensor<std::int32_t> ids(index_t(o.batch), index_t(context)), next(index_t(o.batch), index_t(context));
  bool const tty = isatty(fileno(stdout));
  double const start_loss = validation_loss(m, text, split, text.size(), o.batch, context);
  std::printf("validation loss at start %.3f nats/char; unigram baseline %.3f\n", start_loss, unigram);
  auto const t0 = std::chrono::steady_clock::now();
  double smooth = 0;
  std::size_t const every = std::max<std::size_t>(1, o.steps / 10);
  memory::timeline tl;
  if (!o.memory_trace.empty()) alloc.attach(tl);
  for (std::size_t s = 0; s < o.steps; ++s) {
    fill_batch(text, 0, split, o.seed_value, s, ids, next);
    opt.set_lr(schedule(opt.steps()));
    std::optional<memory::timeline::scope> recording;
    if (!o.memory_trace.empty() && s == 1) recording.emplace(tl);
    double const l = m.template train_step<SoftmaxCrossEntropy>(ids, next, opt);
    recording.reset();
    smooth = s == 0 ? l : 0.95 * smooth + 0.05 * l;
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double const tps = double((s + 1) * o.batch * context) / seconds;
    int const done = int(30 * (s + 1) / o.steps);
    if (tty) {
      std::printf("\rstep %5zu/%zu [%.*s%.*s] loss %.3f  %6.0f tokens/s", s + 1, o.steps, done,
                  "##############################", 30 - done, "------------------------------", smooth, tps);
      std::fflush(stdout);
    }
    if ((s + 1) % every == 0 || s + 1 == o.steps) {
      double const val = validation_loss(m, text, split, text.size(), o.batch, context);
      std::printf("%sstep %5zu/%zu  train loss %.3f  validation loss %.3f  %6.0f tokens/s  peak %s\n",
                  tty ? "\r" : "", s + 1, o.steps, smooth, val, tps,
                  memory::format_bytes(alloc.stats().total.peak).c_str());
    }
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double const val = validation_loss(m, text, split, text.size(), o.batch, context);
  std::printf("\nvalidation loss %.3f nats/char (unigram baseline %.3f, start %.3f) after %zu steps, %.0f s\n", val,
              unigram, start_loss, o.steps, seconds);

  // Activation memory of a training step, both ways: the compile-time plans, and this run's measure.
  std::printf("\nactivations per step (batch %zu x %zu characters, %s):\n", o.batch, context, P::name);
  if (o.long_context) {
    auto const stored = sequence_plan<LongStoredLM, P>(o.batch, context);
    auto const blocked = sequence_plan<LongLM, P>(o.batch, context);
    std::printf("  stored attention core  peak %10s  kept by forward %10s  (not run: the seq x seq probabilities)\n",
                memory::format_bytes(stored.peak_bytes).c_str(), memory::format_bytes(stored.saved_bytes).c_str());
    std::printf("  blocked attention core peak %10s  kept by forward %10s  (%.1fx less at the peak)\n",
                memory::format_bytes(blocked.peak_bytes).c_str(), memory::format_bytes(blocked.saved_bytes).c_str(),
                double(stored.peak_bytes) / double(blocked.peak_bytes));
  } else {
    auto const stored = sequence_plan<StoredLM, P>(o.batch, context);
    auto const ckpt = sequence_plan<CheckpointedLM, P>(o.batch, context);
    std::printf("  stored        peak %10s  kept by forward %10s\n", memory::format_bytes(stored.peak_bytes).c_str(),
                memory::format_bytes(stored.saved_bytes).c_str());
    std::printf("  checkpointed  peak %10s  kept by forward %10s  (%.0f%% of stored, %llu block forwards again)\n",
                memory::format_bytes(ckpt.peak_bytes).c_str(), memory::format_bytes(ckpt.saved_bytes).c_str(),
                100.0 * double(ckpt.saved_bytes) / double(stored.saved_bytes),
                static_cast<unsigned long long>(ckpt.recomputed));
  }
  std::printf("  this run      peak %10s  kept by forward %10s\n\n",
              memory::format_bytes(alloc.stats()[memory::tag::activations].peak).c_str(),
              memory::format_bytes(m.last_pass().saved_bytes).c_str());
  auto const step_plan = memory_plan<Net, P, AdamW, SoftmaxCrossEntropy>(o.batch, {.sequence = context});
  std::printf("the whole step planned: %s\n", step_plan.describe().c_str());
  std::printf("%s\n", alloc.summary().c_str());
  // The validation losses run in the step's arena too: the program's plan is the step's with the
  // arena as large as the larger of the two layouts.
  std::size_t const arena =
      std::max(step_plan.arena, forward_plan<Net, P>(forward_kind::loss, o.batch, Net::in_width, context,
                                                     SoftmaxCrossEntropy::workspace_bytes<float>(o.batch * context,
                                                                                                 vocabulary))
                                    .bytes);
  auto const st = alloc.stats();
  std::printf("reserved as planned: activations %s of %s, in all %s of %s\n\n",
              memory::format_bytes(st[memory::tag::activations].reserved).c_str(), memory::format_bytes(arena).c_str(),
              memory::format_bytes(st.total.reserved).c_str(),
              memory::format_bytes(step_plan.reserved - step_plan.arena + arena).c_str());
  if (st[memory::tag::activations].reserved != arena || st.total.reserved != step_plan.reserved - step_plan.arena + arena) {
    std::fprintf(stderr, "charlm: the memory reserved differs from the plan\n");
    return 3;
  }
  if (!o.memory_trace.empty()) {
    alloc.detach();
    memory_trace(tl, o.memory_trace);
    std::printf("the second training step, per layer (memory timeline in %s):\n%s\n", o.memory_trace.c_str(),
                tl.table().c_str());
  }

  std::printf("sample:\n----\n%s\n----\n", generate(m, "\n", o.sample, o.seed_value, context).c_str());
  save(m, o.out);
  std::printf("weights saved to %s\n", o.out.c_str());
  if (o.steps >= 200 && !(val < unigram - 0.5)) {
    std::fprintf(stderr, "charlm: validation loss %.3f is not 0.5 nats below the unigram baseline %.3f\n", val,
                 unigram);
    return 2;
  }
  if (o.steps < 200 && !(val < start_loss)) {
    std::fprintf(stderr, "charlm: validation loss %.3f is not below the starting %.3f\n", val, start_loss);
    return 2;
  }
  return 0;
}

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    bool const has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--checkpoint")) o.checkpoint = true;
    else if (!std::strcmp(argv[i], "--long-context")) o.long_context = true;
    else if (has_value && !std::strcmp(argv[i], "--steps")) o.steps = std::strtoull(argv[++i], nullptr, 10);
    else if (has_value && !std::strcmp(argv[i], "--batch")) {
      o.batch = std::strtoull(argv[++i], nullptr, 10);
      o.batch_given = true;
    }
    else if (has_value && !std::strcmp(argv[i], "--sample")) o.sample = std::strtoull(argv[++i], nullptr, 10);
    else if (has_value && !std::strcmp(argv[i], "--corpus")) o.corpus = argv[++i];
    else if (has_value && !std::strcmp(argv[i], "--out")) o.out = argv[++i];
    else if (has_value && !std::strcmp(argv[i], "--precision")) o.precision = argv[++i];
    else if (has_value && !std::strcmp(argv[i], "--seed")) o.seed_value = std::strtoull(argv[++i], nullptr, 10);
    else if (has_value && !std::strcmp(argv[i], "--memory-trace")) o.memory_trace = argv[++i];
    else {
      std::fprintf(stderr, "charlm: unknown or incomplete option '%s'\n", argv[i]);
      return 1;
    }
  }
  if (o.precision != "fp32" && o.precision != "bf16") {
    std::fprintf(stderr, "charlm: --precision must be fp32 or bf16, found '%s'\n", o.precision.c_str());
    return 1;
  }
  if (o.steps == 0 || o.batch == 0) {
    std::fprintf(stderr, "charlm: --steps and --batch must be positive\n");
    return 1;
  }
  std::size_t files = 0;
  std::vector<std::int32_t> const text = read_corpus(o.corpus, files);
  std::printf("charlm: %zu characters from %zu fortune files in %s\n", text.size(), files, o.corpus.c_str());
  bool const bf16 = o.precision == "bf16";
  if (o.long_context) {
    if (o.checkpoint) {
      std::fprintf(stderr, "charlm: --long-context and --checkpoint are separate demonstrations; pick one\n");
      return 1;
    }
    o.context = long_context;
    if (!o.batch_given) o.batch = 2;
    return bf16 ? run<LongLM, mixed<bfloat16>>(o, text) : run<LongLM, fp32>(o, text);
  }
  if (o.checkpoint) return bf16 ? run<CheckpointedLM, mixed<bfloat16>>(o, text) : run<CheckpointedLM, fp32>(o, text);
  return bf16 ? run<StoredLM, mixed<bfloat16>>(o, text) : run<StoredLM, fp32>(o, text);
}
