// Run-time bad input, all of it, against every kind of model: each bad call throws its remat::error
// subclass with "expected ..., found ..." and leaves the parameters, gradients (holding a sum: the
// model has trained), running state, optimizer moments and step, loss scale and pass count (the
// dropout stream) bit for bit as they were. Each input is tried through train_step, accumulate and
// (for what inference checks too) loss and forward.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "train/trainer.hpp"

#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

using namespace remat;
using remat_test::trainer;

namespace {

constexpr std::size_t W = 16;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 32>, GELU, Dropout<0.25>, Linear<32, W>>>;
using MLP = Seq<Linear<8, W>, Repeat<2, Checkpointed<Block>>, Linear<W, 4>>;
using Budgeted = Seq<Linear<8, W>, Budget<64 * 1024, 6, Repeat<2, Block>>, Linear<W, 4>>;
constexpr std::size_t C = 3, H = 6;
using ConvNet = Seq<Conv2d<1, C, 3, H, H, 1, 1>, BatchNorm2d<C, H, H>, ReLU, AvgPool2d<C, H, H>, Linear<C * H * H / 4, 4>>;
using LM = Seq<Embedding<11, W>, PositionEmbedding<8, W>, Dropout<0.1>, Repeat<2, Checkpointed<GPTBlock<W, 2, 0.1>>>,
               LayerNorm<W>, Linear<W, 11>>;
using FeatureSequences = Seq<Linear<8, W>, GPTBlock<W, 2, 0.1>, Linear<W, 4>>;

int refusals = 0;

// `call` must throw E whose message holds every one of `says`, and change nothing.
template <class E, class Tr, class F>
void refused(Tr& tr, std::string const& what, F&& call, std::vector<std::string> const& says) {
  INFO(what);
  auto const before = tr.state();
  try {
    call();
    FAIL("accepted");
  } catch (E const& e) {
    for (std::string const& s : says) CHECK_THAT(e.what(), Catch::Contains(s));
    CHECK_THAT(e.what(), Catch::Contains("expected"));
    CHECK_THAT(e.what(), Catch::Contains("found"));
  } catch (error const& e) {
    FAIL("the wrong remat::error subclass: " << e.what());
  }
  CHECK(tr.state() == before);
  ++refusals;
}

// A bad (input, target) pair through every training entry point, and inference where it checks too.
template <class E, class Loss, class Tr, class X, class Y>
void refused_everywhere(Tr& tr, std::string const& what, X const& x, Y const& t, std::vector<std::string> const& says,
                        bool inference_checks) {
  auto& m = tr.m;
  refused<E>(tr, what + " (train_step)", [&] { m.template train_step<Loss>(x, t, tr.opt); }, says);
  refused<E>(tr, what + " (accumulate)", [&] { m.template accumulate<Loss>(x, t); }, says);
  if (inference_checks) refused<E>(tr, what + " (loss)", [&] { (void)m.template loss<Loss>(x, t); }, says);
}

template <class T>
tensor<T> copy_of(tensor<T> const& a, std::size_t rows, std::size_t cols) {
  tensor<T> b{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = a[i % a.size()];
  return b;
}

// Features: NaN and inf in input and target, an empty batch, the wrong width, a target of the
// wrong shape, labels out of range or not one per row.
template <class Tr>
void feature_rows(Tr& tr) {
  using T = typename Tr::T;
  auto const& x = tr.x[0];
  auto const& t = tr.t[0];
  std::size_t const rows = x.rows(), cols = x.cols();
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    auto nx = copy_of(x, rows, cols);
    nx[5] = T(bad);
    refused_everywhere<argument_error, MSE>(tr, "a non-finite input", nx, t, {"model input: expected finite values"},
                                            true);
    auto nt = copy_of(t, t.rows(), t.cols());
    nt[3] = T(-bad);
    refused_everywhere<argument_error, MSE>(tr, "a non-finite target", x, nt, {"MSE target: expected finite"}, true);
  }
  for (double w : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()})
    refused<argument_error>(tr, "a micro-batch weight that is not finite",
                            [&] { tr.m.template accumulate<MSE>(x, t, w); },
                            {"model::accumulate: expected a finite weight, found "});
  refused_everywhere<argument_error, MSE>(tr, "an empty batch", x.row_range(0, 0), t.row_range(0, 0),
                                          {"at least one row, found 0"}, true);
  auto wide = copy_of(x, rows, cols + 1);
  refused_everywhere<shape_error, MSE>(tr, "a batch of the wrong width", wide, t,
                                       {"expected " + std::to_string(cols) + " features per row, found " +
                                        std::to_string(cols + 1)},
                                       true);
  auto narrow_t = copy_of(t, t.rows(), t.cols() - 1);
  refused_everywhere<shape_error, MSE>(tr, "a target of the wrong shape", x, narrow_t, {"MSE target"}, true);
  tensor<std::int32_t> labels(index_t(rows), 1);
  for (std::size_t i = 0; i < rows; ++i) labels[i] = std::int32_t(i % 4);
  labels[2] = 4;
  refused_everywhere<argument_error, SoftmaxCrossEntropy>(tr, "a label out of range", x, labels,
                                                          {"classes in [0, 4), found 4 at label 2"}, true);
  labels[2] = -1;
  refused_everywhere<argument_error, SoftmaxCrossEntropy>(tr, "a negative label", x, labels, {"found -1"}, true);
  labels[2] = 1;
  refused_everywhere<shape_error, SoftmaxCrossEntropy>(tr, "labels not one per row", x, labels.row_range(0, rows - 1),
                                                       {"expected " + std::to_string(rows) + " labels"}, true);
}

// Something trained, so that the gradients, moments and step are worth protecting.
template <class Tr>
void trained(Tr& tr) {
  tr.train_step(0);
  tr.m.zero_grad();
  tr.accumulate(1);
}

}  // namespace

TEST_CASE("bad input: every kind of model refuses every bad input and changes nothing", "[errors][bad-input]") {

  {  // features, fp32
    trainer<MLP, fp32> tr;
    trained(tr);
    feature_rows(tr);
    CHECK_THROWS_WITH(tr.m.forward(copy_of(tr.x[0], 6, 9)), Catch::Contains("expected 8 features per row, found 9"));
  }
  {  // features, mixed<bfloat16> with a dynamic loss scale
    trainer<MLP, mixed<bfloat16, DynamicLossScale>> tr;
    trained(tr);
    feature_rows(tr);
  }
  {  // features, mixed<half>: values beyond half's range
    trainer<MLP, mixed<half, DynamicLossScale>> tr;
    trained(tr);
    feature_rows(tr);
    auto big = copy_of(tr.x[0], 6, 8);
    big[4] = 70000.0f;
    refused_everywhere<argument_error, MSE>(tr, "an input beyond half's range", big, tr.t[0],
                                            {"within half's range", "found 70000"}, true);
  }
  {  // convolutions with running statistics
    trainer<ConvNet, fp32> tr;
    trained(tr);
    feature_rows(tr);
  }
  {  // a Budget planned for a batch of 6: a batch of 7 trains nowhere, infers anywhere
    trainer<Budgeted, fp32> tr;
    trained(tr);
    feature_rows(tr);
    auto x7 = copy_of(tr.x[0], 7, 8);
    auto t7 = copy_of(tr.t[0], 7, 4);
    refused_everywhere<argument_error, MSE>(tr, "a batch above the planned one", x7, t7,
                                            {"expected a training pass of at most 6 x 1 rows", "found 7 x 1"}, false);
    CHECK(tr.m.forward(x7).rows() == 7);
  }
  {  // sequences of features: whole sequences, a length set first
    trainer<FeatureSequences, fp32> tr;
    tr.m.set_sequence_length(3);
    trained(tr);
    feature_rows(tr);
    auto x5 = copy_of(tr.x[0], 5, 8);
    auto t5 = copy_of(tr.t[0], 5, 4);
    refused_everywhere<shape_error, MSE>(tr, "rows that are not whole sequences", x5, t5,
                                         {"expected whole sequences of 3 rows, found 5 rows"}, true);
    refused<argument_error>(tr, "a sequence length of 0", [&] { tr.m.set_sequence_length(0); }, {"found 0"});
    trainer<FeatureSequences, fp32> fresh;
    refused_everywhere<argument_error, MSE>(fresh, "no sequence length", fresh.x[0], fresh.t[0],
                                            {"call set_sequence_length first"}, true);
  }
  {  // token ids
    trainer<LM, fp32> tr;
    trained(tr);
    using SCE = SoftmaxCrossEntropy;
    auto const& ids = tr.x[0];
    auto const& next = tr.t[0];
    auto bad = copy_of(ids, 3, 8);
    bad[9] = 11;
    refused_everywhere<argument_error, SCE>(tr, "a token id past the vocabulary", bad, next,
                                            {"token ids in [0, 11), found 11 at element 9"}, true);
    bad[9] = -3;
    refused_everywhere<argument_error, SCE>(tr, "a negative token id", bad, next, {"found -3"}, true);
    auto long_ids = copy_of(ids, 3, 9);
    auto long_next = copy_of(next, 3, 9);
    refused_everywhere<argument_error, SCE>(tr, "a sequence longer than the positional table", long_ids, long_next,
                                            {"at most 8 tokens", "found 9"}, true);
    refused_everywhere<argument_error, SCE>(tr, "an empty batch", ids.row_range(0, 0), next.row_range(0, 0),
                                            {"at least one row, found 0"}, true);
    tensor_view<std::int32_t const> no_tokens(ids.data(), 3, 0), no_labels(next.data(), 3, 0);
    refused_everywhere<argument_error, SCE>(tr, "empty sequences", no_tokens, no_labels, {"found length 0"}, true);
    auto wrong = copy_of(next, 3, 8);
    wrong[4] = 11;
    refused_everywhere<argument_error, SCE>(tr, "a label past the vocabulary", ids, wrong,
                                            {"classes in [0, 11), found 11 at label 4"}, true);
    refused_everywhere<shape_error, SCE>(tr, "labels not one per position", ids, next.row_range(0, 2),
                                         {"expected 24 labels"}, true);
  }
  std::printf("bad input: %d refusals checked\n", refusals);
  CHECK(refusals > 0);
}

TEST_CASE("bad input: loads of another model's, another precision's or another size's files change nothing",
          "[errors][bad-input][io]") {
  std::string const dir = REMAT_TEST_BINARY_DIR;
  trainer<MLP, fp32> tr;
  trained(tr);
  // Another shape: the same layers, wider.
  model<Seq<Linear<8, 32>, Linear<32, 4>>> other{seed{1}};
  save(other, dir + "/bad_input_other.safetensors");
  refused<io_error>(tr, "a model file for another model", [&] { load(tr.m, dir + "/bad_input_other.safetensors"); },
                    {"bad_input_other.safetensors"});
  // Another precision: fp64 master weights.
  model<MLP, host, fp64> wide{seed{1}};
  save(wide, dir + "/bad_input_fp64.safetensors");
  refused<io_error>(tr, "a model file of another precision", [&] { load(tr.m, dir + "/bad_input_fp64.safetensors"); },
                    {"expected dtype F32, found F64"});
  // An optimizer state of another model's size.
  AdamW other_opt(other);
  save(other_opt, dir + "/bad_input_other_adamw.safetensors");
  refused<io_error>(tr, "an AdamW state for another model",
                    [&] { load(tr.opt, dir + "/bad_input_other_adamw.safetensors"); }, {"bad_input_other_adamw"});
  // And a good file still loads (the refusals were not the reader failing on everything).
  save(tr.m, dir + "/bad_input_good.safetensors");
  load(tr.m, dir + "/bad_input_good.safetensors");
}

TEST_CASE("SGD state: a saved one resumes bit for bit, and another optimizer's, momentum's or size's is refused "
          "and changes nothing",
          "[errors][bad-input][io][optim]") {
  std::string const dir = REMAT_TEST_BINARY_DIR;
  using M = model<MLP, host, mixed<bfloat16, DynamicLossScale>>;
  sgd_options const o{.lr = 1e-2, .momentum = 0.9, .nesterov = true};
  tensor<float> x{6, 8}, t{6, 4};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.3 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.2 * double(i)));
  auto run = [&](M& m, auto& opt, int steps) {
    for (int s = 0; s < steps; ++s) m.train_step<MSE>(x, t, opt);
  };
  M a{seed{3}};
  a.scaler().configure({.init_scale = 256.0, .growth_interval = 2});
  SGD sa(a, o);
  run(a, sa, 3);
  save(a, dir + "/sgd_model.safetensors");
  save(sa, dir + "/sgd_state.safetensors");
  run(a, sa, 3);

  M b{seed{3}};  // (the dropout stream is the seed's and the pass count's)
  b.scaler().configure({.init_scale = 256.0, .growth_interval = 2});  // (the schedule is the program's)
  SGD sb(b, o);
  load(b, dir + "/sgd_model.safetensors");
  load(sb, dir + "/sgd_state.safetensors");
  b.set_passes(3);
  CHECK(sb.steps() == 3);
  run(b, sb, 3);
  CHECK(remat_test::bytes_of<float>(b.parameters()) == remat_test::bytes_of<float>(a.parameters()));
  CHECK(remat_test::bytes_of<float>(sb.momentum_buffer().view()) ==
        remat_test::bytes_of<float>(sa.momentum_buffer().view()));
  CHECK(b.scaler().scale() == a.scaler().scale());
  CHECK(b.scaler().growth_tracker() == a.scaler().growth_tracker());
  CHECK(sb.steps() == sa.steps());

  // Refusals change nothing: the buffer, the step, the loss scale.
  auto const buffer = remat_test::bytes_of<float>(sb.momentum_buffer().view());
  auto const steps = sb.steps();
  double const scale = b.scaler().scale();
  auto refused = [&](auto& opt, std::string const& file, std::string const& says) {
    INFO(file);
    CHECK_THROWS_AS(load(opt, dir + "/" + file), io_error);
    CHECK_THROWS_WITH(load(opt, dir + "/" + file), Catch::Contains(says));
    CHECK(remat_test::bytes_of<float>(sb.momentum_buffer().view()) == buffer);
    CHECK(sb.steps() == steps);
    CHECK(b.scaler().scale() == scale);
  };
  AdamW adam(b);
  save(adam, dir + "/sgd_adamw_state.safetensors");
  refused(sb, "sgd_adamw_state.safetensors", "expected the state of SGD, found the state of AdamW");
  refused(adam, "sgd_state.safetensors", "expected the state of AdamW, found the state of SGD");
  SGD plain(b, {.lr = 1e-2});
  save(plain, dir + "/sgd_plain_state.safetensors");
  refused(sb, "sgd_plain_state.safetensors", "found none");
  refused(plain, "sgd_state.safetensors", "expected an SGD state without momentum");
  model<Seq<Linear<8, 4>>> small{seed{1}};
  SGD other(small, o);
  save(other, dir + "/sgd_other_state.safetensors");
  refused(sb, "sgd_other_state.safetensors", "tensor 'momentum_buffer' expected F32 [");
  // Without momentum, a state is the step and the loss scale.
  load(plain, dir + "/sgd_plain_state.safetensors");
  CHECK(plain.steps() == 0);
}
