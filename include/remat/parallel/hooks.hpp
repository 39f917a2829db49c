// What a remat::dist::data_parallel plugs into its model (pass/gradient_sync.hpp): the model's
// passes and the optimizers built from it call these hooks, which drive the wrapper's parts (the
// buckets, the gradients' and the parameters' shards) and make the ranks agree on how each pass
// ended. A data_parallel holds one as a member object.
#pragma once

#include "../pass/gradient_sync.hpp"
#include "agreement.hpp"
#include "buckets.hpp"
#include "gradient_shard.hpp"
#include "parameter_shard.hpp"
#include "state.hpp"

#include <cstddef>
#include <exception>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

template <class Model, class Transport>
class model_hooks final : public REMAT_NAMESPACE::detail::gradient_sync {
 public:
  using state = dp_state<Model, Transport>;
  model_hooks(state& s, gradient_buckets<Model, Transport>& b, gradient_shard<Model, Transport>& g,
              parameter_shard<Model, Transport>& p)
      : s_(s), buckets_(b), grads_(g), params_(p) {}

  void check_pass() const override {
    if (!s_.inside)
      REMAT_NAMESPACE::detail::raise<argument_error>(
          "model: this model is wrapped in a remat::dist::data_parallel; train it through the wrapper "
          "(dp.accumulate or dp.train_step) so that every rank takes part");
  }
  // A pass started by the wrapper begins: its buckets start afresh.
  void pass_starting() override {
    before_ = {s_.pending, s_.started, buckets_.next(), s_.step};
    s_.pending = true;
    buckets_.pass_starting();
    params_.pass_starting();
    params_.release();  // (ZeRO-3: parameters made whole for a while are let go)
    params_.release_kept();
    grads_.pass_starting();  // (the GPU: mapped before backward writes them)
    if (s_.overlap) s_.started = true;
  }
  // Backward reports the gradients from `offset` to the end final: when the pass reduces, the
  // buckets they complete start (ZeRO-2: with the gradients' memory measured and given back
  // before, and the next span's taken after).
  void gradients_ready(std::size_t offset) override {
    ++params_.taken;
    if (!s_.overlap) return;
    grads_.before_launch(buckets_.in_flight_low());
    buckets_.launch_ready(offset);
    grads_.after_launch(offset);
    s_.transport->progress();
    if (s_.gathers && s_.gathers->busy()) s_.gathers->progress();  // (a prefetch in flight)
  }
  // Agrees with the other ranks on how the pass ended; see gradient_sync::pass_ended.
  void pass_ended(std::exception_ptr failed) override {
    // A rank that failed starts the buckets the others start as their backward ends (its values
    // are discarded), so that no rank waits for it.
    if (failed && s_.overlap) {
      if (s_.opts.shard_parameters && !timed_out(failed)) take_part(params_.training_events());
      grads_.before_late_launch();
      buckets_.launch_ready(0);
    }
    if (!failed || !timed_out(failed)) params_.finish_gathers();  // (none is left in flight when the pass follows its plan)
    try {
      s_.c.agree("data_parallel: a training pass", [&] {
        if (failed) std::rethrow_exception(failed);
      });
      grads_.pass_succeeded();
      params_.pass_succeeded();
      params_.release_kept();
    } catch (...) {
      // Every rank undoes the pass: once the reductions are done with the gradients, the model
      // restores them, and the wrapper is as before the pass.
      if (s_.transport->busy()) s_.transport->join("a failed pass's reductions");
      grads_.pass_failed();
      params_.release_kept();
      s_.pending = before_.pending;
      s_.started = before_.started;
      buckets_.restart(before_.next);
      s_.step = before_.moved;
      throw;
    }
  }
  // Waits for reductions in flight (they write the gradients) and forgets the step's state.
  void zeroing_gradients() override {
    if (s_.transport->busy()) s_.transport->join("the gradients' reduction");
    s_.pending = s_.reduced = s_.started = false;
    buckets_.restart();
  }
  // ZeRO-2: between passes only this rank's shard of the gradients holds values (none when they
  // go to the host: the sink keeps them, and restores them after a failed pass).
  param_range kept_gradients(std::size_t count) const override {
    if (grads_.sink()) return {0, 0};
    return s_.opts.shard_gradients ? s_.shard() : param_range{0, count};
  }
  bool gradients_elsewhere() const override { return grads_.sink() != nullptr; }
  // ZeRO-2 only: the shard's reduced gradients go to `sink` (OffloadedAdamW's on the host).
  bool attach_gradient_sink(REMAT_NAMESPACE::detail::gradient_sink* sink) override {
    if (!s_.opts.shard_gradients) return false;
    grads_.set_sink(sink, buckets_);
    return true;
  }
  bool clear_gradients() override { return grads_.clear(); }
  param_range shard() const override { return s_.shard(); }
  // Before an optimizer's step: starts what is left (passes kept local) and waits for all of it.
  void finish() override {
    if (s_.pending && buckets_.left()) buckets_.launch_ready(0);  // passes left local (reduce::later): reduce them now
    s_.transport->join("the gradients' reduction");
    if (s_.pending) s_.reduced = true;
    s_.pending = false;
  }
  void step_prepared(std::exception_ptr failed) override {
    s_.c.agree("data_parallel: an optimizer's step", [&] {
      if (failed) std::rethrow_exception(failed);
    });
  }
  double agree_squares(double local) override {
    // Sharded: the parts add up. Whole: every rank holds the same gradients; the maximum makes the
    // decision one even if an MPI sums in different orders on different ranks.
    return s_.c.all_reduce(local, s_.opts.shard_optimizer ? MPI_SUM : MPI_MAX, "the gradient norm's agreement");
  }
  // After an optimizer's step: a sharded optimizer's updated parts go to every rank (ZeRO-3: they
  // stay in their shards).
  void after_update(bool stepped) override {
    s_.last = s_.step;
    s_.step = {};
    if (!stepped || !s_.opts.shard_optimizer) return;
    if (s_.opts.shard_parameters) {  // (a gathered layer, and parameters made whole, are stale)
      params_.release();
      // (master weights in host memory: the optimizer wrote the shard's compute copy as it updated,
      // which the next pass would otherwise cast again on the host and copy up)
      if constexpr (Model::mixed_precision)
        if (s_.model.master_on_host()) return s_.model.parameters_changed_with_copy();
      return s_.model.parameters_changed();
    }
    std::size_t const others = s_.n - s_.shard().size();
    s_.last.gathered = 0;
    if constexpr (Model::mixed_precision) {
      if (s_.model.master_on_host() || s_.shards_master_only()) {
        // The compute copy, which each rank's optimizer wrote for its part as it updated, on the
        // device; the copy is then current, not cast again (from the host, or from master
        // weights this rank holds the shard of only). Beside it the master weights where they
        // live (on a GPU: host memory, through MPI), unless each rank keeps its shard only.
        s_.transport->follow();
        s_.transport->all_gather(const_cast<typename Model::compute_type*>(s_.compute_base()), s_.shards.all());
        if (!s_.shards_master_only()) {
          s_.with_master_transport([&](auto& t) {
            t.all_gather(s_.parameter_base(), s_.shards.all());
            t.join("the master weights' all-gather");
          });
          s_.last.gathered += others * sizeof(typename Model::value_type);
        }
        s_.transport->join("the compute weights' all-gather");
        s_.last.gathered += others * sizeof(typename Model::compute_type);
        return s_.model.parameters_changed_with_copy();
      }
    }
    s_.last.gathered = others * sizeof(typename Model::value_type);
    s_.transport->follow();
    s_.transport->all_gather(s_.model.parameters().data(), s_.shards.all());
    s_.transport->join("the parameters' all-gather");
    s_.model.parameters_changed();
  }

  // ---- ZeRO-3
  bool shards_parameters() const override { return s_.shards_master(); }
  bool gathers_parameters() const override { return s_.gathers_parameters(); }
  bool parameters_whole() const override { return !params_.partial() || params_.whole(); }
  void const* parameters_needed(std::size_t offset, std::size_t count) override { return params_.needed(offset, count); }
  void parameters_done() noexcept override { params_.layer_done(); }
  // In mixed precision a pass casts this rank's shard of the compute copy only: under ZeRO-3 each
  // layer's is gathered from the shards of all ranks; with the master weights' shard only, the
  // rest of the copy is current (gathered after each step, cast while they were whole).
  param_range kept_parameters(std::size_t count) const override {
    return s_.gathers_parameters() || (params_.partial() && !params_.whole()) ? s_.shard() : param_range{0, count};
  }
  void release_parameters() noexcept override { params_.release(); }
  // A pass outside training starts; its gathers are counted (see collective_pass_ended).
  void collective_pass_starting(bool training) override {
    params_.collective = training ? 1 : 0;
    params_.taken = 0;
  }
  // A rank whose pass outside training failed takes its part in the gathers that the others'
  // forward still makes (the plan's, from where its own stopped); then the ranks agree on how it
  // ended, and parameters made whole for a while are let go.
  void collective_pass_ended(std::exception_ptr failed) override {
    struct end {
      parameter_shard<Model, Transport>& p;
      ~end() {
        p.collective = -1;
        p.release();
        p.release_kept();
      }
    } const after{params_};
    if (failed && !timed_out(failed)) take_part(params_.forward_events(params_.collective));
    if (!failed || !timed_out(failed)) params_.finish_gathers();
    s_.c.agree("data_parallel: a pass outside training (model.forward, loss or training_loss)", [&] {
      if (failed) std::rethrow_exception(failed);
    });
  }

 private:
  // A rank whose pass failed takes part in the gathers and reports of `events` (the plan's) that
  // the other ranks' pass still makes, from the first it has not taken part in; the values it
  // gathers go unread.
  void take_part(std::vector<REMAT_NAMESPACE::detail::pass_event> const& events) {
    using kind = REMAT_NAMESPACE::detail::pass_event::kind;
    std::size_t seen = 0;
    std::size_t const from = params_.taken;
    for (auto const& e : events) {
      if (e.what == kind::done || seen++ < from) continue;
      if (e.what == kind::report) {
        gradients_ready(e.range.begin);
        continue;
      }
      parameters_needed(e.range.begin, e.range.size());
      parameters_done();
    }
  }

  state& s_;
  gradient_buckets<Model, Transport>& buckets_;
  gradient_shard<Model, Transport>& grads_;
  parameter_shard<Model, Transport>& params_;
  pass_start before_;  // what a failed pass restores
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
