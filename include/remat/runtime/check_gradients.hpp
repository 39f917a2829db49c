// remat::check_gradients<Net>(): the backward pass of a layer or a whole model against central
// differences, in double precision, for the input and every parameter tensor. The objective is
// L = sum(y * r) for a fixed random r, so every output element's gradient path is exercised.
// Dropout stays on: its mask is a function of the pass, which is replayed for every difference.
#pragma once

#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace REMAT_NAMESPACE {

// What check_gradients checks and how closely.
struct gradient_check_options {
  std::size_t batch = 3;   // rows (or sequences) of the random batch
  std::uint64_t seed = 7;  // of the model's parameters and the batch
  double step = 1e-6;                  // relative to max(1, |value|)
  double tolerance = 1e-6;             // on |analytic - numeric| / max(1, |analytic|, |numeric|)
  std::size_t max_checks_per_tensor = 48;  // larger tensors are sampled evenly
  std::size_t vocabulary = 0;          // for models that read token ids: ids drawn below this (0: all)
  std::size_t sequence = 4;            // for sequence models: positions per sequence (batch sequences)
};

// What check_gradients found.
struct gradient_check_report {
  double max_error = 0;     // the largest relative error (see gradient_check_options::tolerance); NaN
                            // where a derivative was not finite (a failure)
  std::string worst;  // where the largest error was
  std::size_t checked = 0;  // derivatives compared
  bool passed = true;       // every error within the tolerance
  // One line: "N derivatives checked, max error E at WHERE: passed" (or FAILED).
  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%zu derivatives checked, max error %.3g at %s: %s", checked, max_error,
                  worst.c_str(), passed ? "passed" : "FAILED");
    return buf;
  }
};

namespace detail {

// L = sum(y * r): value and dL/dy = scale * r.
struct projection_loss {
  template <class T, class D>
  using target_type = tensor_view<T const, D>;
  template <class T, class D>
  static void validate(std::size_t rows, std::size_t cols, tensor_view<T const, D> r) {
    if (r.rows() != rows || r.cols() != cols)
      raise<shape_error>("check_gradients: projection of ", r.rows(), " x ", r.cols(), " for an output of ", rows,
                         " x ", cols);
  }
  template <class T, class D>
  static double forward_backward(tensor<T, D> const& y, tensor_view<T const, D> r, double scale, tensor<T, D>* dy) {
    if (dy) evaluate(*dy, to_expr(r) * scale);
    return double(sum(y * r));
  }
};

// check_gradients' options, checked before anything is built: argument_error naming the one out of
// range (a tolerance of infinity, say, would make a check that cannot fail). `vocabulary`: the
// model's, when it reads token ids (else 0).
inline void check_gradient_options(gradient_check_options const& o, bool sequence_model, std::size_t vocabulary) {
  auto const refuse = [](char const* name, char const* expected, auto found) {
    raise<argument_error>("check_gradients: expected ", name, " ", expected, ", found ", found);
  };
  if (o.batch == 0) refuse("batch", ">= 1", o.batch);
  if (!(std::isfinite(o.step) && o.step > 0)) refuse("step", "finite and > 0", o.step);
  if (!(std::isfinite(o.tolerance) && o.tolerance >= 0)) refuse("tolerance", "finite and >= 0", o.tolerance);
  if (o.max_checks_per_tensor == 0) refuse("max_checks_per_tensor", ">= 1", o.max_checks_per_tensor);
  if (sequence_model && o.sequence == 0) refuse("sequence", ">= 1 for a sequence model", o.sequence);
  if (vocabulary && o.vocabulary > vocabulary) {
    raise<argument_error>("check_gradients: expected vocabulary at most the model's ", vocabulary, " (0: all), found ",
                          o.vocabulary);
  }
}

}  // namespace detail

template <class Net>
gradient_check_report check_gradients(gradient_check_options o = {}) {
  using M = model<Net, host, fp64>;
  detail::check_gradient_options(o, M::sequence_model, [] {
    if constexpr (M::reads_ids)
      return std::size_t(first_layer_t<Net>::vocabulary);
    else
      return std::size_t(0);
  }());
  constexpr std::size_t in_w = M::reads_ids ? 1 : (M::in_width == any_width ? 5 : M::in_width);
  constexpr std::size_t out_w = M::out_width == any_width ? in_w : M::out_width;
  M m{seed{o.seed}};
  std::size_t const seq = M::sequence_model ? o.sequence : 1;
  // Ids: one sequence per row; features: sequences of `seq` consecutive rows.
  std::size_t const b = M::reads_ids ? o.batch : o.batch * seq;
  std::size_t const x_cols = M::reads_ids ? seq : in_w, out_rows = o.batch * seq;
  if constexpr (M::sequence_model && !M::reads_ids) m.set_sequence_length(seq);
  tensor<typename M::input_element> x{static_cast<index_t>(b), static_cast<index_t>(x_cols)};
  tensor<double> r{static_cast<index_t>(out_rows), static_cast<index_t>(out_w)};
  tensor<double> dx{static_cast<index_t>(b), static_cast<index_t>(in_w)};
  std::size_t k = 0;
  for (std::size_t i = 0; i < x.size(); ++i, ++k) {
    double const u = double(philox::uniform(o.seed, 99, k));
    if constexpr (M::reads_ids) {
      std::size_t const v = o.vocabulary ? o.vocabulary : first_layer_t<Net>::vocabulary;
      x[i] = std::int32_t(u * double(v)) % std::int32_t(v);
    } else {
      x[i] = 4.0 * u - 2.0;
    }
  }
  for (std::size_t i = 0; i < r.size(); ++i, ++k) r[i] = 2.0 * double(philox::uniform(o.seed, 99, k)) - 1.0;
  // Parameters of a fresh model can be special (LayerNorm's ones and zeros): move them off.
  auto p = m.parameters();
  for (std::size_t i = 0; i < p.size(); ++i, ++k) p[i] += 0.2 * (double(philox::uniform(o.seed, 99, k)) - 0.5);

  std::uint64_t const pass = m.passes();
  m.zero_grad();
  m.template accumulate<detail::projection_loss>(x, r, 1.0, M::reads_ids ? nullptr : &dx);
  auto g = m.gradients();

  gradient_check_report rep;
  auto numeric = [&](auto& cell) {
    double const v = cell, h = o.step * std::max(1.0, std::fabs(v));
    cell = v + h;
    m.set_passes(pass);
    double const fp = m.template training_loss<detail::projection_loss>(x, r);
    cell = v - h;
    m.set_passes(pass);
    double const fm = m.template training_loss<detail::projection_loss>(x, r);
    cell = v;
    return (fp - fm) / (2 * h);
  };
  // (a NaN error, from a NaN or infinite derivative on either side, is the worst and stays so:
  // comparisons with it are false, so it would otherwise go unseen after the first check)
  auto record = [&](double a, double n, std::string const& where) {
    double const err = std::fabs(a - n) / std::max({1.0, std::fabs(a), std::fabs(n)});
    ++rep.checked;
    bool const worse = rep.worst.empty() || (!std::isnan(rep.max_error) && (std::isnan(err) || err > rep.max_error));
    if (worse) {
      rep.max_error = err;
      rep.worst = where + " (analytic " + std::to_string(a) + ", numeric " + std::to_string(n) + ")";
    }
  };
  auto indices = [&](std::size_t n) {
    std::vector<std::size_t> idx;
    std::size_t const stride = n > o.max_checks_per_tensor ? (n + o.max_checks_per_tensor - 1) / o.max_checks_per_tensor : 1;
    for (std::size_t i = 0; i < n; i += stride) idx.push_back(i);
    if (idx.back() != n - 1) idx.push_back(n - 1);
    return idx;
  };
  if constexpr (!M::reads_ids)
    for (std::size_t i : indices(x.size())) record(dx[i], numeric(x[i]), "input[" + std::to_string(i) + "]");
  for (named_param const& t : M::parameter_table())
    for (std::size_t i : indices(t.size()))
      record(g[t.offset + i], numeric(p[t.offset + i]), t.name + "[" + std::to_string(i) + "]");
  rep.passed = rep.max_error <= o.tolerance;
  m.set_passes(pass + 1);
  return rep;
}

}  // namespace REMAT_NAMESPACE
