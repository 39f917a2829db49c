// A small language model trained a few steps the same way under two storage policies (the tests
// of tests/transformer): token batches, what the run ends with (losses, weights, gradients, the
// block forwards recomputed and the bytes kept), the check that a policy trains bit for bit as
// the stored model does while keeping less, and the check that its plan equals its measured peak.
#pragma once

#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "values.hpp"

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace lm_training {

// `batch` sequences of `seq` token ids below `vocabulary`, a fixed pattern that `salt` shifts.
inline remat::tensor<std::int32_t> token_batch(std::size_t vocabulary, std::size_t batch, std::size_t seq,
                                               std::size_t salt = 0) {
  remat::tensor<std::int32_t> ids{remat::index_t(batch), remat::index_t(seq)};
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t((i * 7 + salt * 3 + i / 5) % vocabulary);
  return ids;
}

// What a run ends with.
struct run_result {
  std::vector<double> losses;
  std::vector<float> params, grads;
  std::uint64_t recomputed = 0;  // block forwards recomputed, all steps
  std::size_t saved = 0;         // bytes the last pass kept
};

// Runs of models whose first layer is an Embedding of Vocabulary tokens: `steps` steps of AdamW
// (lr 3e-3, from seed 5) on one batch of `batch` sequences of `seq` positions and their next
// tokens (the pattern shifted by one salt).
template <std::size_t Vocabulary>
struct runs {
  int steps;
  std::size_t batch, seq;

  // Net trained so.
  template <class Net, class P = remat::fp32>
  run_result train() const {
    remat::model<Net, remat::host, P> m(remat::seed{5});
    remat::AdamW opt(m, {.lr = 3e-3});
    remat::tensor<std::int32_t> const ids = token_batch(Vocabulary, batch, seq);
    remat::tensor<std::int32_t> const next = token_batch(Vocabulary, batch, seq, 1);
    run_result r;
    for (int k = 0; k < steps; ++k) {
      r.losses.push_back(m.template train_step<remat::SoftmaxCrossEntropy>(ids, next, opt));
      r.recomputed += m.last_pass().recomputed;
    }
    r.saved = m.last_pass().saved_bytes;
    r.params = remat::tensor_to_host(m.parameters());
    r.grads = remat::tensor_to_host(m.gradients());
    return r;
  }

  // Net trains as `stored` did, bit for bit, recomputing recomputed_per_step block forwards a
  // step and keeping fewer bytes.
  template <class Net, class P = remat::fp32>
  void require_same_training(run_result const& stored, std::uint64_t recomputed_per_step) const {
    run_result const r = train<Net, P>();
    for (std::size_t k = 0; k < r.losses.size(); ++k) CHECK(r.losses[k] == stored.losses[k]);
    CHECK(same_bits(r.params, stored.params));
    CHECK(same_bits(r.grads, stored.grads));
    CHECK(r.recomputed == std::uint64_t(steps) * recomputed_per_step);
    CHECK(r.saved < stored.saved);
  }
};

// Net's activation plan (sequence_plan) equals the allocator's measured peak, and what two passes
// kept and recomputed, at each (batch, sequence length) of `shapes`, in fp32 and in bf16.
template <class Net, std::size_t Vocabulary>
void require_plan_matches(std::initializer_list<std::pair<std::size_t, std::size_t>> shapes) {
  auto const check = [&]<class P>(P, std::size_t batch, std::size_t seq) {
    INFO("batch " << batch << ", seq " << seq << ", precision " << P::name);
    remat::memory::caching_allocator<remat::host> alloc;
    remat::model<Net, remat::host, P> m(remat::seed{11}, alloc);
    remat::tensor<std::int32_t> const ids = token_batch(Vocabulary, batch, seq);
    remat::tensor<std::int32_t> const next = token_batch(Vocabulary, batch, seq, 2);
    auto const plan = remat::sequence_plan<Net, P>(batch, seq);
    for (int step = 0; step < 2; ++step) {
      REQUIRE(alloc.stats()[remat::memory::tag::activations].in_use == 0);
      alloc.reset_peak();
      m.template accumulate<remat::SoftmaxCrossEntropy>(ids, next);
      CHECK(alloc.stats()[remat::memory::tag::activations].peak == plan.peak_bytes);
      CHECK(m.last_pass().saved_bytes == plan.saved_bytes);
      CHECK(m.last_pass().recomputed == plan.recomputed);
    }
  };
  for (auto [batch, seq] : shapes) {
    check(remat::fp32{}, batch, seq);
    check(remat::mixed<remat::bfloat16>{}, batch, seq);
  }
}

}  // namespace lm_training
