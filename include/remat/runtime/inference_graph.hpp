// remat::inference_graph<Model>: a model's inference for one input shape, captured once and
// replayed. On the GPU the forward (every kernel and product of model::forward(x, out)) is
// recorded as a CUDA graph on the model's stream and each call is one cudaGraphLaunch; on the host
// a replay runs the same forward in the same arena (so code written for the GPU runs everywhere).
//
// Every address the graph records stays valid while it lives: the input and output are staging
// tensors of the graph's own (run() copies the caller's into and out of them), the activations lie
// in the arena model::reserve_inference holds, and the kernels' scratch (cuBLASLt's workspace,
// CUB's temporary storage) is taken during capture from an allocator of the graph's own, which
// keeps it. When what the model's forward reads moves (the arena grew for a larger training pass,
// a new reserve_inference, a mixed-precision model's weights, the running state swapped by a
// training pass), the next replay captures again; train between replays as usual.
//
//   m.reserve_inference(1024);
//   remat::inference_graph g(m, 1024);   // (captures)
//   for (;;) g.run(x, y);                // or: write g.input(), g.replay(), read g.output()
#pragma once

#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "model.hpp"

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

namespace REMAT_NAMESPACE {

template <class Model>
class inference_graph {
 public:
  using device = typename Model::device;                // where it runs
  using value_type = typename Model::value_type;        // the output's element
  using input_element = typename Model::input_element;  // the input's element (features or token ids)
  using input_view = typename Model::input_view;        // a batch of inputs
  // Whether replays are CUDA graph launches (the GPU) or the forward run again (the host).
  static constexpr bool captured = !std::is_same_v<device, host>;

  // Captures m's forward for inputs of rows x cols (cols: the model's input width unless it reads
  // token ids, whose columns are the sequence length, or features of any width). m must have
  // reserved inference for this shape (reserve_inference) and must outlive the graph. Runs the
  // forward twice (once to make the products' plans, once captured) on a zeroed input.
  // argument_error: no reservation, a model under a data-parallel wrapper, or no cols where the
  // model does not fix them; shape_error: a shape beyond the reservation; nothing changed.
  inference_graph(Model const& m, std::size_t rows, std::size_t cols = 0)
      : m_(&m), alloc_(std::make_unique<memory::caching_allocator<device>>()) {
    if (m.link().gradient_sync())
      detail::raise<argument_error>(
          "inference_graph: expected a model trained alone, found one under a data-parallel wrapper");
    detail::pass_shape const* r = m.arenas_.inference_shape();
    if (!r) detail::raise<argument_error>("inference_graph: expected a model with reserve_inference done, found none");
    if (cols == 0) {
      if constexpr (Model::reads_ids)
        cols = Model::sequence_model ? r->sequence : 1;
      else if constexpr (Model::in_width != any_width)
        cols = Model::in_width;
      else
        detail::raise<argument_error>("inference_graph: expected the input's columns for a model of any width");
    }
    if (rows == 0) detail::raise<argument_error>("inference_graph: expected a positive number of rows, found 0");
    in_ = tensor<input_element, device>(index_t(rows), index_t(cols), memory::tag::workspace, *alloc_);
    input_view const x = in_.view();
    out_ = tensor<value_type, device>(index_t(inputs::out_rows(x)), index_t(inputs::out_cols(x)),
                                      memory::tag::workspace, *alloc_);
    m.check_inference_shape(x, out_.view());
    [[maybe_unused]] auto const on_stream = m.stream_scope();
    zero(in_.data(), in_.bytes());
    capture();
  }

  inference_graph(inference_graph const&) = delete;
  inference_graph& operator=(inference_graph const&) = delete;
  // Moves the graph (its staging tensors and scratch stay where they are, so it stays valid).
  inference_graph(inference_graph&& o) noexcept
      : m_(o.m_), alloc_(std::move(o.alloc_)), in_(std::move(o.in_)), out_(std::move(o.out_)), key_(o.key_),
        exec_(std::exchange(o.exec_, nullptr)), captures_(o.captures_) {}
  inference_graph& operator=(inference_graph&&) = delete;
  // Destroys the CUDA graph; its staging tensors and scratch go back to the system.
  ~inference_graph() { drop(); }

  // The staging input: write a batch here (on the model's device), then replay().
  tensor_view<input_element, device> input() { return in_.view(); }
  // The staging output replay() writes (rows x the model's output width; a model reading token
  // ids: a row per id).
  tensor_view<value_type const, device> output() const { return out_.view(); }

  // Runs the forward on input() into output(): one graph launch on the model's stream (the host
  // does not wait). The input is not checked (token ids out of range read outside the table): run()
  // checks as model::forward does. Captures again first when what the forward reads has moved.
  // While another pass of the model holds its arena (another thread), the forward runs outside
  // the arena instead, as model::forward would.
  void replay() {
    [[maybe_unused]] auto const on_stream = m_->stream_scope();
    if (key() != key_) capture();
    if constexpr (captured) {
#if REMAT_HAS_CUDA
      detail::arena_busy& busy = m_->arenas_.busy();
      if (!busy.try_take()) {
        m_->forward_into(in_.view(), out_.view(), false);
        return;
      }
      struct give_back {
        detail::arena_busy& b;
        ~give_back() { b.give_back(); }
      } const held{busy};
      REMAT_CUDA_CHECK(cudaGraphLaunch(exec_, current_cuda_stream()));
#endif
    } else {
      m_->forward_into(in_.view(), out_.view(), false);
    }
  }

  // model::forward(x, out) through the graph: x (at most rows() rows of cols() columns) is checked
  // as forward checks it and copied into input(), the graph replays, and out (x's output rows)
  // gets the first rows of output(). Rows beyond x's are computed on what input() held and not
  // returned (rows are independent in inference). shape_error for shapes that do not fit, nothing
  // written.
  void run(input_view x, tensor_view<value_type, device> out) {
    if (x.cols() != in_.cols() || x.rows() > in_.rows())
      detail::raise<shape_error>("inference_graph::run: expected at most ", in_.rows(), " rows of ", in_.cols(),
                                 " columns, found ", x.rows(), " x ", x.cols());
    std::size_t const rows = inputs::out_rows(x);
    if (out.rows() != rows || out.cols() != out_.cols())
      detail::raise<shape_error>("inference_graph::run: expected an output of ", rows, " x ", out_.cols(),
                                 ", found ", out.rows(), " x ", out.cols());
    [[maybe_unused]] auto const on_stream = m_->stream_scope();
    inputs::check_input(x, m_->seq_len_).raise_if_bad();
    copy(in_.data(), x.data(), x.bytes());
    replay();
    copy(out.data(), out_.data(), out.bytes());
  }

  std::size_t rows() const { return in_.rows(); }  // the input rows it was captured for
  std::size_t cols() const { return in_.cols(); }  // the input columns
  // Device memory the graph holds of its own: the staging tensors and the scratch its captured
  // kernels use (the activations are in the model's arena).
  std::size_t bytes() const { return alloc_->stats().total.reserved; }
  // Captures so far: 1, plus one for each time what the forward reads moved.
  std::size_t captures() const { return captures_; }

 private:
  using inputs = detail::model_inputs<typename Model::net, device, typename Model::precision>;

  // The addresses a captured forward read.
  struct capture_key {
    void const* arena = nullptr;
    std::size_t arena_bytes = 0;
    std::size_t reserved_batch = 0, reserved_sequence = 0;
    void const* weights = nullptr;
    void const* buffers = nullptr;
    bool operator==(capture_key const&) const = default;
  };
  // The key now (casting a mixed-precision model's compute weights if stale, outside any capture).
  capture_key key() const {
    detail::pass_shape const* r = m_->arenas_.inference_shape();
    return {m_->arenas_.base(), m_->arenas_.bytes(), r ? r->batch : 0, r ? r->sequence : 0, m_->weights(),
            m_->buffers().data()};
  }

  // Runs the forward once (the products' plans, first-use scratch), then records it (the GPU), with
  // the kernels' scratch taken from alloc_, on the model's stream (current).
  void capture() {
    if (!m_->arenas_.inference_shape())
      detail::raise<argument_error>("inference_graph: the model's reserve_inference is gone (its arena was turned off)");
    memory::scratch_scope<device> const scratch(*alloc_);
    key_ = key();
    m_->forward_into(in_.view(), out_.view(), true);
#if REMAT_HAS_CUDA
    if constexpr (captured) {
      cudaStream_t const s = current_cuda_stream();
      REMAT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
      cudaGraph_t g = nullptr;
      try {
        m_->forward_into(in_.view(), out_.view(), true);
      } catch (...) {
        (void)cudaStreamEndCapture(s, &g);
        if (g) (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        throw;
      }
      REMAT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t e = nullptr;
      cudaError_t const made = cudaGraphInstantiate(&e, g, 0);
      (void)cudaGraphDestroy(g);
      REMAT_CUDA_CHECK(made);
      drop();
      exec_ = e;
    }
#endif
    ++captures_;
  }

  void drop() noexcept {
#if REMAT_HAS_CUDA
    if (exec_) (void)cudaGraphExecDestroy(exec_);
#endif
    exec_ = nullptr;
  }

  // bytes from src to dst, both on the device, ordered on the current stream.
  static void copy(void* dst, void const* src, std::size_t bytes) {
    if (!bytes || dst == src) return;
#if REMAT_HAS_CUDA
    if constexpr (captured) {
      REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current_cuda_stream()));
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  static void zero(void* dst, std::size_t bytes) {
#if REMAT_HAS_CUDA
    if constexpr (captured) {
      REMAT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_cuda_stream()));
      return;
    }
#endif
    std::memset(dst, 0, bytes);
  }

  Model const* m_;
  std::unique_ptr<memory::caching_allocator<device>> alloc_;  // the staging tensors and captured scratch
  tensor<input_element, device> in_;
  tensor<value_type, device> out_;
  capture_key key_{};
#if REMAT_HAS_CUDA
  cudaGraphExec_t exec_ = nullptr;
#else
  void* exec_ = nullptr;
#endif
  std::size_t captures_ = 0;
};

}  // namespace REMAT_NAMESPACE
