// A model of any kind (features or token ids, fp32 or mixed precision) with its AdamW and two
// batches, and a snapshot of everything a refused or failed call must leave as it was: the
// fault-injection and bad-input tests share it.
#pragma once

#include <remat/remat.hpp>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace remat_test {

using namespace remat;

template <class T>
std::vector<unsigned char> bytes_of(tensor_view<T const> v) {
  std::vector<T> h = tensor_to_host(v);
  std::vector<unsigned char> out(h.size() * sizeof(T));
  if (!h.empty()) std::memcpy(out.data(), h.data(), out.size());
  return out;
}

// A model, its AdamW and two batches, trained by train_step or by two weighted micro-batches.
template <class NetT, class P>
struct trainer {
  using M = model<NetT, host, P>;
  using T = typename M::value_type;
  static constexpr bool ids = M::reads_ids;
  // A language model's batches: 3 sequences as long as its positional table, ids below its vocabulary.
  static constexpr std::size_t seq_len = [] {
    if constexpr (ids) return M::max_sequence; else return std::size_t(1);
  }();
  static constexpr std::size_t vocab = [] {
    if constexpr (ids) return first_layer_t<NetT>::vocabulary; else return std::size_t(1);
  }();
  using In = typename M::input_element;
  using Loss = std::conditional_t<ids, SoftmaxCrossEntropy, MSE>;
  using Target = std::conditional_t<ids, std::int32_t, T>;

  M m{seed{7}};
  AdamW<T, host, typename M::compute_type> opt{m, {.lr = 1e-2}};
  tensor<In> x[2];
  tensor<Target> t[2];

  trainer() {
    if (m.scaler().dynamic()) m.scaler().configure({.init_scale = 256.0, .growth_interval = 2});
    for (int b = 0; b < 2; ++b) {
      if constexpr (ids) {
        x[b] = tensor<In>(3, index_t(seq_len));
        t[b] = tensor<Target>(3, index_t(seq_len));
        for (std::size_t i = 0; i < x[b].size(); ++i) {
          x[b][i] = In((i * 7 + std::size_t(b) * 3 + i / 5) % vocab);
          t[b][i] = Target((i * 5 + std::size_t(b)) % vocab);
        }
      } else {
        x[b] = tensor<In>(6, index_t(M::in_width));
        t[b] = tensor<Target>(6, index_t(M::out_width));
        for (std::size_t i = 0; i < x[b].size(); ++i) x[b][i] = In(std::sin(0.37 * double(i) + double(b)));
        for (std::size_t i = 0; i < t[b].size(); ++i) t[b][i] = Target(std::cos(0.11 * double(i) - double(b)));
      }
    }
  }

  // Step `s` as a whole train_step on batch s % 2.
  void train_step(int s) { m.template train_step<Loss>(x[s % 2], t[s % 2], opt); }
  // Micro-batch `mb` (0 or 1) of a step made of two: the first zeroes the gradients, the second
  // (on gradients holding the first's) ends with the optimizer's step.
  void accumulate(int mb) { m.template accumulate<Loss>(x[mb], t[mb], 0.5); }
  void micro_batch(int mb) {
    if (mb == 0) m.zero_grad();
    accumulate(mb);
    if (mb == 1) opt.step();
  }

  // Everything a failed call must leave as it was.
  struct snapshot {
    std::vector<unsigned char> params, grads, buffers, m1, m2, compute;
    std::uint64_t steps, passes, tracker, skipped;
    double scale;
    bool operator==(snapshot const&) const = default;
  };
  // (The compute copy of a mixed-precision model's weights is a cache of the master weights, cast
  // when a pass first reads them: compared at the end of a run, when the optimizer has written it.)
  snapshot state(bool with_compute = false) const {
    M const& c = m;
    snapshot s{bytes_of<T>(c.parameters()), bytes_of<T>(c.gradients()), bytes_of<T>(c.buffers()),
               bytes_of<T>(opt.exp_avg().view()), bytes_of<T>(opt.exp_avg_sq().view()), {},
               opt.steps(), c.passes(), c.scaler().growth_tracker(), c.scaler().skipped_steps(),
               c.scaler().scale()};
    if constexpr (M::mixed_precision)
      if (with_compute) s.compute = bytes_of<typename M::compute_type>(const_cast<M&>(c).compute_parameters());
    return s;
  }
};

}  // namespace remat_test
