// A model's input checks (runtime/model.hpp): the shape (rows, features or token ids per row,
// whole sequences), the values (finite, within half's range; token ids within the vocabulary:
// reduced on the device and read with one wait), the rows a Budget was planned for, and whole
// parameters. Every check runs before anything changes.
#pragma once

#include "../error.hpp"
#include "../graph/walk.hpp"
#include "../kernels/evaluate.hpp"
#include "../kernels/reduce.hpp"
#include "arena_cache.hpp"
#include "link.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace detail {

template <class Net, class Device, class Precision>
struct model_inputs {
  using T = typename Precision::master;
  using C = typename Precision::compute;
  static constexpr bool reads_ids = reads_ids_v<Net>;
  static constexpr bool sequence_model = is_sequence_model_v<Net>;
  static constexpr std::size_t max_sequence = max_sequence_v<Net>;
  static constexpr std::size_t in_width = Net::in_width;
  static constexpr std::size_t out_width = Net::out_width;
  using input_element = std::conditional_t<reads_ids, std::int32_t, T>;
  using input_view = tensor_view<input_element const, Device>;

  // The batch, features and sequence length a pass on x plans for (seq_len: a sequence model
  // reading features, its rows per sequence).
  static pass_shape shape_of(input_view x, std::size_t seq_len) {
    std::size_t const seq = reads_ids ? (sequence_model ? x.cols() : 1) : (sequence_model ? seq_len : 1);
    return {(reads_ids ? x.size() : x.rows()) / seq, reads_ids ? in_width : x.cols(), seq};
  }
  static std::size_t out_cols(input_view x) { return out_width == any_width ? x.cols() : out_width; }
  // One output row per token id (batch x seq ids give batch * seq rows), or per input row.
  static std::size_t out_rows(input_view x) { return reads_ids ? x.size() : x.rows(); }

  // The device side of the input check: the first token id out of range, or the largest |x| (NaN
  // or inf when there is one), reduced on the device and read by raise_if_bad.
  struct input_verdict {
    kernels::pending_scalar<Device> found;
    input_view x;
    void raise_if_bad() const {
      double const v = found.get();
      if constexpr (reads_ids) {
        using E = first_layer_t<Net>;
        if (v < double(x.size()))
          raise<argument_error>("model input: expected token ids in [0, ", E::vocabulary, "), found ",
                                        kernels::read_element(Device{}, x.data() + std::size_t(v)), " at element ",
                                        std::size_t(v));
      } else {
        if (!std::isfinite(v)) raise<argument_error>("model input: expected finite values, found NaN or inf");
        if (std::is_same_v<C, half> && v > 65504.0)
          raise<argument_error>(
              "model input: expected values within half's range (|x| <= 65504) for a "
              "mixed<half> model, found ",
              v);
      }
    }
  };

  // A model left with one rank's shard of its parameters (link().partial_parameters()) runs only
  // under a wrapper.
  static void check_whole_parameters(model_link const& link) {
    if (link.partial_parameters() && !link.gradient_sync())
      raise<argument_error>(
          "model: expected whole parameters, found one rank's shard of them only: its remat::dist::data_parallel "
          "with shard_parameters (ZeRO-3) went without gathering them; call dp.gather_parameters() on every rank "
          "before the wrapper goes, or load the parameters from a file");
  }

  // validate's checks, and for a training pass the rows a Budget was planned for.
  template <class Loss>
  static void check(input_view x, typename Loss::template target_type<T, Device> target, bool training, std::size_t seq_len,
                    model_link const& link) {
    check_whole_parameters(link);
    input_verdict const verdict = check_input(x, seq_len);
    try {
      Loss::template validate<T, Device>(out_rows(x), out_cols(x), target);
    } catch (...) {
      verdict.raise_if_bad();
      throw;
    }
    verdict.raise_if_bad();
    if (training) check_planned_rows(x, seq_len);
  }

  // A training pass keeps what a Budget was planned for (inference takes any batch): checked before
  // anything changes, as the Budget's own forward checks it again.
  static void check_planned_rows(input_view x, std::size_t seq_len) {
    if constexpr (planned_rows_v<Net> != std::size_t(-1)) {
      std::size_t const seq = shape_of(x, seq_len).sequence;
      if (out_rows(x) > planned_rows_v<Net> || seq > planned_sequence_v<Net>)
        raise<argument_error>("model input: expected a training pass of at most ",
                                      planned_rows_v<Net> / planned_sequence_v<Net>, " x ", planned_sequence_v<Net>,
                                      " rows (batch x sequence: what this model's remat::Budget was planned for), "
                                      "found ",
                                      out_rows(x) / seq, " x ", seq);
    } else {
      (void)x, (void)seq_len;
    }
  }

  static input_verdict check_input(input_view x, std::size_t seq_len) {
    if (x.rows() == 0) raise<argument_error>("model input: expected a batch of at least one row, found 0 rows");
    if constexpr (sequence_model && reads_ids) {
      if (x.cols() == 0)
        raise<argument_error>("model input: expected sequences of at least one token, found length 0");
      if (x.cols() > max_sequence)
        raise<argument_error>("model input: expected sequences of at most ", max_sequence,
                                      " tokens (the positional table), found ", x.cols());
    }
    if constexpr (sequence_model && !reads_ids) {
      if (seq_len == 0)
        raise<argument_error>(
            "model input: expected a sequence length for this sequence model reading features (call "
            "set_sequence_length first), found none");
      if (x.rows() % seq_len != 0)
        raise<shape_error>("model input: expected whole sequences of ", seq_len, " rows, found ", x.rows(),
                                   " rows");
    }
    std::size_t const want = reads_ids ? (sequence_model ? x.cols() : 1) : in_width;
    if (want != any_width && x.cols() != want)
      raise<shape_error>("model input: expected ", want, reads_ids ? " token id" : " features",
                                 " per row, found ", x.cols());
    require_device_memory<Device>(x.data(), "model input");
    if constexpr (reads_ids) {
      using E = first_layer_t<Net>;
      return {kernels::first_out_of_range_pending(Device{}, x.data(), x.size(), 0, E::vocabulary), x};
    } else {
      return {max_of_pending(abs(to_expr(x))), x};  // one pass: NaN wins the maximum, inf is the largest
    }
  }

};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
