// The parameters of a model (runtime/model.hpp): the fp32 master weights in one flat buffer with
// their gradients, the 16-bit compute copy of a mixed-precision model (cast when stale, once per
// change of the weights), the running state (BatchNorm2d's statistics) and the copy a pass
// updates, their names (PyTorch's), the version a writable view moves, their relocation into a
// data-parallel wrapper's memory, and the stream a model's work goes to.
#pragma once

#include "../graph/walk.hpp"
#include "../kernels/evaluate.hpp"
#include "../memory/offload.hpp"
#include "../memory/system.hpp"
#include "../numeric/precision.hpp"
#include "../pass/step.hpp"
#include "link.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

// A model's seed: its initial parameters and every dropout mask are functions of it (and of the
// pass and the element), so two models with one seed train alike, bit for bit.
struct seed {
  std::uint64_t value = 0;  // any value; 0 is as good as another
};

// A parameter tensor of a model: its full name ("2.1.0.weight"), offset and shape.
struct named_param {
  std::string name;                 // PyTorch-style: layer indices and the tensor's name
  std::size_t offset;               // its first element in the model's flat buffer
  std::vector<std::size_t> shape;   // PyTorch's order (Linear's weight: out x in)
  std::size_t size() const { return shape_elements(shape); }  // its elements (the shape's product)
};

namespace detail {

// Names a graph's running-state buffers (and, given `init`, initialises them), each leaf that
// holds some in the walk's order: its buffers' offsets follow the last one's.
template <class T>
struct buffer_walker {
  using visits_buffers = void;
  std::vector<named_param>* names = nullptr;
  T* init = nullptr;
  std::size_t at = 0;
  template <class L>
  void layer(std::string const& prefix) {
    if (names)
      for (param_desc const& b : L::buffers()) names->push_back({prefix + b.name, at + b.offset, b.shape});
    if (init) L::init_buffers(init + at);
    at += L::buffer_count;
  }
};

// The gradients that a training pass begun on zero gradients writes over (the parameters of its
// layers with overwrites_gradients: Linear's), in order, adjacent ranges merged.
struct overwritten_gradients {
  using visits_layers = void;
  std::vector<param_range> ranges;
  template <class L>
  void layer(std::size_t offset) {
    if constexpr (requires { requires L::overwrites_gradients; }) {
      if (!ranges.empty() && ranges.back().end == offset)
        ranges.back().end += L::param_count;
      else
        ranges.push_back({offset, offset + L::param_count});
    }
  }
  // (a tensor named by a layer's own visit: not known to be written over)
  void operator()(std::string const&, std::size_t, std::vector<std::size_t> const&) {}
};

// The gradients of a graph's `stored` that a training pass begun on zero gradients adds onto:
// all but those of its layers with overwrites_gradients (and any room past its parameters), in
// order, adjacent ranges merged.
template <class Net>
std::vector<param_range> gradients_added_onto(std::size_t stored) {
  overwritten_gradients w;
  visit_params<Net>("", 0, w);
  std::vector<param_range> out;
  std::size_t at = 0;
  for (param_range const r : w.ranges) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (stored > at) out.push_back({at, stored});
  return out;
}

// The stream a model's work goes to: none on the host; on the GPU one stream per model, current
// while the model runs (so a step issues everything without waiting, and two models on two host
// threads run side by side).
// Offloaded<S>'s copies go to a second stream of the model's, beside the compute.
template <class Device>
struct model_stream {
  struct scope_type {};
  scope_type scope() { return {}; }
  void synchronize() {}
  void attach(offload_channel<Device>&) {}
};
#if REMAT_HAS_CUDA
template <>
struct model_stream<cuda> {
  owned_cuda_stream stream;
  owned_cuda_stream copies{cudaStreamNonBlocking};
  cuda_stream_scope scope() { return cuda_stream_scope(stream.get()); }
  void synchronize() { stream.synchronize(); }
  void attach(offload_channel<cuda>& c) { c.side = copies.get(); }
};
#endif

}  // namespace detail

// Where a mixed-precision model's fp32 master weights live from its construction on: host memory
// of `allocator` (tag parameters), never the device's (model::master_on_host()). The model is
// then trained by OffloadedAdamW (offload_options::master_weights), which updates them there. The
// allocator must outlive the model.
struct host_master_weights {
  memory::caching_allocator<host>& allocator;  // where they are allocated
};

namespace detail {

template <class Model>
class pass_rollback;  // (runtime/pass_transaction.hpp)

template <class Net, class Device, class Precision>
class model_parameters {
  template <class>
  friend class pass_rollback;  // (a failed pass restores the gradients)

 public:
  using value_type = typename Precision::master;     // parameters, gradients and what the caller sees
  using compute_type = typename Precision::compute;  // activations and the weights layers read
  using T = value_type;                              // (short for value_type)
  using C = compute_type;                            // (short for compute_type)
  // Whether the model keeps fp32 master weights beside a 16-bit compute copy.
  static constexpr bool mixed_precision = is_mixed_v<Precision>;
  static constexpr std::size_t parameter_count = Net::param_count;  // trained values, in all
  // Running state beside the parameters (BatchNorm2d's statistics): not trained, no gradients;
  // updated once by each training pass, whatever its storage policies recompute.
  static constexpr std::size_t buffer_count = buffer_count_v<Net>;
  using allocator_type = memory::caching_allocator<Device>;  // what activations come from

  // The fp32 master weights. Handing out a writable view marks the compute copy (mixed precision)
  // stale, so the next pass casts it again; after writing through a view kept from earlier, call
  // parameters_changed(). Optimizers update both copies in one pass.
  tensor_view<T, Device> parameters() {
    compute_stale_ = true;
    ++parameter_version_;
    return params_.view().row_range(0, parameter_count);
  }
  // Marks the compute copy stale after the master weights were written through a kept view.
  void parameters_changed() {
    compute_stale_ = true;
    ++parameter_version_;
  }
  // After the master weights and every value of their compute copy were written to agree (a
  // data-parallel wrapper gathers both when the master weights live in host memory: each rank's
  // optimizer wrote its part of the copy as it updated): the weights have changed, and the copy
  // is current, not cast again.
  void parameters_changed_with_copy() {
    ++parameter_version_;
    if constexpr (mixed_precision) {
      compute_stale_ = false;
      gradient_sync const* const sync = link_.gradient_sync();
      compute_cast_ = sync ? sync->kept_parameters(stored_count()) : param_range{0, stored_count()};
    }
  }
  // Casts the compute copy (mixed precision) where it is stale, as the next pass would: a
  // data-parallel wrapper that keeps the master weights' shard only does it while they are whole.
  void refresh_compute_copy() const {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    (void)weights();
  }
  // Counts the writable views of the master weights handed out and the parameters_changed()
  // calls: an optimizer with a copy of the weights elsewhere (OffloadedAdamW) reads it again when
  // this has moved since its own update.
  std::uint64_t parameter_version() const { return parameter_version_; }
  // The weights in the compute type that layers read (empty unless mixed precision), for an
  // optimizer that writes them in its update.
  tensor_view<C, Device> compute_parameters() {
    if constexpr (mixed_precision)
      return compute_params_.view().row_range(0, parameter_count);
    else
      return {};
  }
  // The running state (buffer_count elements; empty when the model has none), in the order of
  // buffer_table(). Written through this view, it is what the next inference forward reads.
  tensor_view<T, Device> buffers() { return buffers_.view(); }
  tensor_view<T const, Device> buffers() const { return buffers_.view(); }
  // The master weights, read-only (the compute copy stays valid). Under a ZeRO-3 wrapper with
  // more than one rank they hold this rank's shard only (the rest read as zero) unless
  // parameters_whole(): see remat::dist::data_parallel::gather_parameters.
  tensor_view<T const, Device> parameters() const { return params_.view().row_range(0, parameter_count); }
  // Whether this process holds the value of every parameter: false while a data-parallel wrapper
  // with shard_parameters (ZeRO-3) on more than one rank keeps this rank's shard only, or after
  // such a wrapper went without gathering them (link().partial_parameters()).
  bool parameters_whole() const {
    if (gradient_sync const* s = link_.gradient_sync()) return s->parameters_whole();
    return !link_.partial_parameters();
  }
  // Sets the gradients to zero (after a data-parallel wrapper's reductions in flight finish):
  // what a step of gradient accumulation starts with. train_step does it itself.
  void zero_grad() {
    [[maybe_unused]] auto const on_stream = this->stream_.scope();
    detail::gradient_sync* const sync = this->link_.gradient_sync();
    if (sync) sync->zeroing_gradients();
    if (!sync || !sync->clear_gradients()) evaluate(this->grads_, expr::to_expr(0.0));
    this->grads_zero_ = true;
  }

  // (A writable view may be written: the gradients are no longer known to be zero.)
  tensor_view<T, Device> gradients() {
    grads_zero_ = false;
    return grads_.view().row_range(0, parameter_count);
  }
  tensor_view<T const, Device> gradients() const { return grads_.view().row_range(0, parameter_count); }
  // For a data-parallel wrapper that keeps a shard of the gradients of a GPU model (ZeRO-2): the
  // gradient buffer moves to `storage` (room for max(parameter_count, 1) values, owned by the wrapper and
  // alive until it moves the buffer back), its values copied there; with null it moves back into
  // memory from the model's allocator. The allocator's gradients tag no longer counts memory
  // the wrapper holds, and the block the gradients leave goes back to the device (every cached
  // block of the model's allocator does).
  void relocate_gradients(T* storage) { relocate(grads_, storage, memory::tag::gradients); }
  // The same for the parameters of a wrapper that keeps a shard of them (ZeRO-3, or of the master
  // weights: shard_master_weights): the master weights move to `master` and, in mixed precision,
  // the compute copy to `compute`; a null one moves back into memory from the model's allocator
  // (where it is already, unless moved before). Master weights in host memory (master_on_host())
  // stay there: the wrapper keeps their pages where they are.
  void relocate_parameters(T* master, C* compute) {
    if (!master_on_host()) relocate(params_, master, memory::tag::parameters);
    if constexpr (mixed_precision) relocate(compute_params_, compute, memory::tag::parameters);
  }
  // Whether the fp32 master weights live in host memory, apart from the model's device (built with
  // host_master_weights, or moved there by OffloadedAdamW's offload_options::master_weights):
  // parameters() views host memory then,
  // which the device's kernels do not read; the layers read the compute copy, cast on the host and
  // copied up when the master weights were written from outside.
  bool master_on_host() const { return master_host_.get() != nullptr; }
  // Moves the master weights (mixed precision only) into a block of `a` (tag parameters), kept
  // alive by `keep` (the allocator's owner, or null when the caller keeps `a` alive for the
  // model's life), and gives the model allocator's back to the device. They stay there for the
  // model's life. The compute copy is made current first.
  void place_master_on_host(memory::caching_allocator<host>& a, std::shared_ptr<void> keep) {
    static_assert(mixed_precision, "remat: only a mixed-precision model's master weights can live on the host");
    if (master_on_host()) return;
    (void)weights();  // (cast while the master weights are still where the cast runs)
    memory::held_block<host> b(a, stored_count() * sizeof(T), memory::tag::parameters);
    {
      [[maybe_unused]] auto const on_stream = stream_.scope();
      memory::system<Device>::copy_to_host(b.get(), params_.data(), stored_count() * sizeof(T));
    }
    master_keep_ = std::move(keep);
    params_ = tensor<T, Device>(tensor<T, Device>::borrowed, static_cast<T*>(b.get()), stored_count(), 1);
    master_host_ = std::move(b);
    alloc_->release_cached();  // (the device's copy goes back to the device)
  }
  // The allocator activations, gradients and parameters come from (given at construction).
  allocator_type& allocator() const { return *alloc_; }
  std::uint64_t seed_value() const { return seed_; }  // the seed it was built with
  // Makes the model's stream current until the end of the scope (on the GPU; nothing on the host):
  // work issued beside the model's own (a data-parallel wrapper's) is then ordered with it.
  [[nodiscard]] auto stream_scope() const { return stream_.scope(); }
  // What a data-parallel wrapper (remat::dist) and the optimizers plug into; a model trained alone
  // leaves it as it is.
  model_link& link() { return link_; }
  model_link const& link() const { return link_; }

  // Every parameter tensor with a PyTorch-style name ("0.weight", "1.2.0.bias"), offset and shape.
  static std::vector<named_param> parameter_table() {
    std::vector<named_param> out;
    auto f = [&](std::string const& name, std::size_t offset, std::vector<std::size_t> const& shape) {
      out.push_back({name, offset, shape});
    };
    visit_params<Net>("", 0, f);
    return out;
  }
  // Every running-state tensor with a PyTorch-style name ("1.running_mean"), offset into
  // buffers() and shape.
  static std::vector<named_param> buffer_table() {
    std::vector<named_param> out;
    buffer_walker<T> w{&out};
    visit_params<Net>("", 0, w);
    return out;
  }

 private:

 protected:
  // zero_grad as train_step's pass begins: on a model trained alone, the gradients that the pass
  // writes over (gradients_added_onto's complement: Linear's) are left as they are, since the
  // pass writes them before anything reads them and a pass that fails has them all zeroed
  // (pass_rollback, or train_step through zero_grad_quietly); this saves a pass over the
  // gradients each step (PyTorch's zero_grad sets them to None for the same reason). Under a
  // wrapper (remat::dist, gradient offload): zero_grad. Returns whether it left any.
  bool zero_grad_before_pass() {
    if (link_.gradient_sync()) {
      zero_grad();
      return false;
    }
    std::vector<param_range> const& added = gradients_added_onto();
    for (param_range const r : added) evaluate(grads_.row_range(r.begin, r.size()), expr::to_expr(0.0));
    grads_zero_ = true;
    return !(added.size() == 1 && added[0].size() == stored_count());
  }
  // All gradients zero after a train_step's pass failed (a device that fails here has failed the
  // pass's error already).
  void zero_grad_quietly() noexcept {
    try {
      evaluate(grads_, expr::to_expr(0.0));
    } catch (...) {
    }
    grads_zero_ = true;
  }

  // The gradients a training pass begun on zero gradients adds onto: what train_step zeroes.
  static std::vector<param_range> const& gradients_added_onto() {
    static std::vector<param_range> const added = detail::gradients_added_onto<Net>(stored_count());
    return added;
  }
  // With `master` (mixed precision only), the master weights live in its host memory.
  model_parameters(seed s, allocator_type& alloc, memory::caching_allocator<host>* master = nullptr)
      : master_host_(master ? memory::held_block<host>(*master, stored_count() * sizeof(T), memory::tag::parameters)
                            : memory::held_block<host>()),
        alloc_(&alloc),
        params_(master ? tensor<T, Device>(tensor<T, Device>::borrowed, static_cast<T*>(master_host_.get()),
                                           stored_count(), 1)
                       : tensor<T, Device>(index_t(stored_count()), 1, memory::tag::parameters, alloc)),
        grads_(index_t(stored_count()), 1, memory::tag::gradients, alloc),
        seed_(s.value) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    if constexpr (mixed_precision) compute_params_ = tensor<C, Device>(index_t(stored_count()), 1, memory::tag::parameters, alloc);
    if constexpr (buffer_count > 0) {
      buffers_ = tensor<T, Device>(index_t(buffer_count), 1, memory::tag::parameters, alloc);
      staged_buffers_ = tensor<T, Device>(index_t(buffer_count), 1, memory::tag::parameters, alloc);
      std::vector<T> host_buffers(buffer_count, T(0));
      buffer_walker<T> w{nullptr, host_buffers.data()};
      visit_params<Net>("", 0, w);
      buffers_.copy_from(host_buffers);
    }
    if (master) {  // (initialised where they live)
      std::fill_n(params_.data(), stored_count(), T(0));
      Net::init(params_.data(), 0, seed_);
    } else {
      std::vector<T> host_params(stored_count(), T(0));
      Net::init(host_params.data(), 0, seed_);
      params_.copy_from(host_params);
    }
    compute_stale_ = true;
  }
  model_parameters(model_parameters const&) = delete;
  model_parameters& operator=(model_parameters const&) = delete;

  static constexpr std::size_t stored_count() { return parameter_count > 0 ? parameter_count : 1; }

  // Moves buffer t (stored_count() values) to `storage` (memory the caller owns), or back into
  // memory of the allocator when null; waits for the copy (the old memory may go right after).
  template <class U>
  void relocate(tensor<U, Device>& t, U* storage, memory::tag tag) {
    [[maybe_unused]] auto const on_stream = stream_.scope();
    if (storage == t.data() || (!storage && t.allocator())) return;
    tensor<U, Device> moved = storage ? tensor<U, Device>(tensor<U, Device>::borrowed, storage, stored_count(), 1)
                                      : tensor<U, Device>(index_t(stored_count()), 1, tag, *alloc_);
    evaluate(moved, to_expr(std::as_const(t)));
    stream_.synchronize();
    t = std::move(moved);
    // (the block it leaves goes back to the device, not into the allocator's cache, where it would
    // stay reserved beside the memory that took its place)
    if (storage) alloc_->release_cached();
  }

  // Copies the gradients in r (of the stored_count() values) to the failure backup (to_backup) or
  // back: on the host with the point-wise kernels' threads, to or from the GPU as one copy.
  void copy_gradients(T* backup, param_range r, bool to_backup) {
    std::size_t const count = r.size();
    if (count == 0) return;
    T* const g = grads_.data() + r.begin;
    if constexpr (std::is_same_v<Device, host>) {
      T* const to = to_backup ? backup : g;
      T const* const from = to_backup ? g : backup;
      evaluate(tensor_view<T, host>(to, index_t(count), 1), to_expr(tensor_view<T const, host>(from, index_t(count), 1)));
    } else if (to_backup) {
      memory::system<Device>::copy_to_host(backup, g, count * sizeof(T));
    } else {
      memory::system<Device>::copy_from_host(g, backup, count * sizeof(T));
    }
  }

  // The weights layers read: the master weights, or their compute copy cast when stale (once per
  // change of the weights, not per pass).
  // Under a wrapper that keeps a shard of the parameters (ZeRO-3), only the shard is cast: layers
  // read the rest gathered from the other ranks.
  C const* weights() const {
    if constexpr (mixed_precision) {
      gradient_sync const* const sync = link_.gradient_sync();
      param_range const want = sync ? sync->kept_parameters(stored_count()) : param_range{0, stored_count()};
      if (compute_stale_ || compute_cast_ != want) {
        if (!std::is_same_v<Device, host> && master_on_host())
          cast_on_host(want);
        else if (want.size() == stored_count())
          evaluate(compute_params_, to_expr(params_));
        else if (want.size())
          evaluate(compute_params_.view().row_range(want.begin, want.size()),
                   to_expr(params_.view().row_range(want.begin, want.size())));
        compute_cast_ = want;
        compute_stale_ = false;
      }
      return compute_params_.data();
    } else {
      return params_.data();
    }
  }

  // The compute copy of parameters r cast from master weights in host memory (master_on_host()
  // on a GPU): a chunk at a time on the host, the same rounding as the device's cast, and copied
  // up.
  void cast_on_host(param_range r) const {
    std::size_t const n = r.end, chunk = std::size_t(1) << 20;
    tensor<C, host> part(index_t(std::min(r.size(), chunk)), 1, memory::tag::workspace, memory::default_allocator<host>());
    [[maybe_unused]] auto const on_stream = stream_.scope();
    for (std::size_t at = r.begin; at < n; at += chunk) {
      std::size_t const len = std::min(chunk, n - at);
      tensor_view<C, host> const to(part.data(), index_t(len), 1);
      evaluate(to, to_expr(tensor_view<T const, host>(params_.data() + at, index_t(len), 1)));
      memory::system<Device>::copy_from_host(compute_params_.data() + at, part.data(), len * sizeof(C));
    }
  }

  // (master_on_host(): the owner of the host allocator, then the block; declared before the
  // tensors so that they go first)
  std::shared_ptr<void> master_keep_;
  memory::held_block<host> master_host_;
  mutable model_stream<Device> stream_;  // (declared first: the tensors' work is on it)
  allocator_type* alloc_;
  tensor<T, Device> params_;
  tensor<T, Device> grads_;
  mutable tensor<C, Device> compute_params_;    // mixed precision only
  tensor<T, Device> buffers_, staged_buffers_;  // running state (and the copy a pass updates)
  mutable bool compute_stale_ = true;
  mutable param_range compute_cast_{};   // the part of the compute copy cast last (see weights)
  std::uint64_t parameter_version_ = 0;  // (see parameter_version)
  bool grads_zero_ = false;              // the gradients are known to be zero (zero_grad, nothing since)
  std::uint64_t seed_;
  model_link link_;
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
