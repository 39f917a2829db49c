// A C interface for one model type, compiled into a library of its own: REMAT_EXPORT_C_MODEL(name,
// Net, Device, Precision, Optimizer, Loss) in one C++ source defines, with C linkage, the functions
// `name_create`, `name_train_step`, ... that the header remat_add_model_library generates
// (cmake/remat_model_library.h.in) declares. What crosses the boundary is C: an opaque handle,
// `float` data (a bf16 or fp64 model converts inside), status codes. No C++ exception crosses it:
// each function catches what it throws, returns its kind (remat_status) and keeps its message for
// `name_last_error()` (per thread), and a failed call leaves the model and optimizer as they were,
// as the C++ calls promise.
//
// Data: a batch is `batch` rows of the model's input width, row-major (a Fortran array of shape
// (features, batch) without a copy). On a GPU model the pointers may be host or device memory:
// device memory is used where it lies, host memory copied through a staging buffer.
//
// Data parallelism: export_mpi.hpp's REMAT_EXPORT_C_MODEL_MPI adds `name_create_distributed`.
// Not yet: token-id inputs (Embedding-first models), losses other than MSE.
#pragma once

#include "../io/checkpoint.hpp"
#include "../plan/forward.hpp"
#include "../plan/step.hpp"
#include "../runtime/model.hpp"
#include "../train/optimizers.hpp"
#include "remat_c.h"

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {
namespace capi {

// The last failure's message on this thread (empty after a call that succeeded).
inline std::string& last_message() {
  thread_local std::string message;
  return message;
}

// f(), its exception turned into a status and a message.
template <class F>
int guarded(F&& f) noexcept {
  try {
    f();
    last_message().clear();
    return REMAT_OK;
  } catch (shape_error const& e) {
    last_message() = e.what();
    return REMAT_ERROR_SHAPE;
  } catch (argument_error const& e) {
    last_message() = e.what();
    return REMAT_ERROR_ARGUMENT;
  } catch (out_of_memory const& e) {
    last_message() = e.what();
    return REMAT_ERROR_MEMORY;
  } catch (io_error const& e) {
    last_message() = e.what();
    return REMAT_ERROR_IO;
  } catch (cuda_error const& e) {
    last_message() = e.what();
    return REMAT_ERROR_DEVICE;
  } catch (dist_error const& e) {
    last_message() = e.what();
    return REMAT_ERROR_DISTRIBUTED;
  } catch (std::bad_alloc const&) {
    last_message() = "out of host memory";
    return REMAT_ERROR_MEMORY;
  } catch (std::exception const& e) {
    last_message() = e.what();
    return REMAT_ERROR_OTHER;
  } catch (...) {
    last_message() = "an exception that is not a std::exception";
    return REMAT_ERROR_OTHER;
  }
}

// Whether Optimizer is SGD (else AdamW: static_assert in exported).
template <template <class, class, class> class Optimizer>
inline constexpr bool is_sgd_v = std::is_same_v<Optimizer<float, host, float>, SGD<float, host, float>>;
// Whether Optimizer is AdamW.
template <template <class, class, class> class Optimizer>
inline constexpr bool is_adamw_v = std::is_same_v<Optimizer<float, host, float>, AdamW<float, host, float>>;

// remat's defaults for Optimizer, as remat_options.
template <template <class, class, class> class Optimizer>
remat_options default_options() {
  adamw_options const a{};
  sgd_options const s{};
  remat_options o{};
  o.seed = seed{}.value;
  o.learning_rate = is_sgd_v<Optimizer> ? s.lr : a.lr;
  o.beta1 = a.beta1;
  o.beta2 = a.beta2;
  o.eps = a.eps;
  o.weight_decay = is_sgd_v<Optimizer> ? s.weight_decay : a.weight_decay;
  o.momentum = s.momentum;
  return o;
}

// Optimizer's own options from remat_options.
template <template <class, class, class> class Optimizer>
auto optimizer_options(remat_options const& o) {
  if constexpr (is_sgd_v<Optimizer>)
    return sgd_options{.lr = o.learning_rate, .momentum = o.momentum, .weight_decay = o.weight_decay};
  else
    return adamw_options{
        .lr = o.learning_rate, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
}

// How an exported model's passes run: on this process alone (export_mpi.hpp's mpi_parallel runs
// them through remat::dist::data_parallel when the model was made with a communicator).
template <class Model>
struct no_parallel {
  explicit no_parallel(Model&) {}  // (nothing to hold)
  // m's train_step.
  template <class Loss, class X, class Target, class Optimizer>
  double train_step(Model& m, X x, Target t, Optimizer& opt) {
    return m.template train_step<Loss>(x, t, opt);
  }
  // m's accumulate.
  template <class Loss, class X, class Target>
  double accumulate(Model& m, X x, Target t, double weight) {
    return m.template accumulate<Loss>(x, t, weight);
  }
};

// One exported model: the model, its optimizer and the staging for data that does not lie where
// or as the model reads it.
template <class Net, class Device, class Precision, template <class, class, class> class Optimizer, class Loss,
          template <class> class Parallel = no_parallel>
class exported {
 public:
  using model_type = REMAT_NAMESPACE::model<Net, Device, Precision>;  // the model
  using T = typename model_type::value_type;                          // its master type
  using optimizer_type = Optimizer<T, Device, typename model_type::compute_type>;  // its optimizer
  static_assert(!model_type::reads_ids,
                "remat C interface: the model reads token ids (an Embedding first); the C interface takes "
                "float features only for now");
  static_assert(std::is_same_v<Loss, MSE>, "remat C interface: only MSE (float targets) is exported for now");
  static_assert(is_sgd_v<Optimizer> || is_adamw_v<Optimizer>,
                "remat C interface: the optimizer must be remat::AdamW or remat::SGD");
  static constexpr std::size_t in = model_type::in_width;    // features per input row
  static constexpr std::size_t out = model_type::out_width;  // features per output row

  // The model and optimizer in an allocator of their own, so that what it measures is theirs
  // alone (the staging of data that must be converted or copied comes from the default one).
  // (`parallel` goes to Parallel's constructor after the model's: a communicator, or nothing. The
  // optimizer is made last, after a data-parallel wrapper, as the wrapper asks.)
  template <class... A>
  explicit exported(remat_options const& o, A... parallel)
      : model_(seed{o.seed}, alloc_), parallel_(model_, parallel...), optimizer_(model_, optimizer_options<Optimizer>(o)) {}
  exported(exported const&) = delete;  // (the optimizer holds the model)
  exported& operator=(exported const&) = delete;

  // One training step on `batch` rows of x and target; the loss.
  double train_step(float const* x, float const* target, std::int64_t batch) {
    std::size_t const rows = rows_of(batch);
    auto const xv = input(x, rows, in, x_staging_, "x");
    auto const tv = input(target, rows, out, t_staging_, "target");
    return parallel_.template train_step<Loss>(model_, xv, tv, optimizer_);
  }
  // A micro-batch's gradients, scaled by weight, added to the model's; its loss.
  double accumulate(float const* x, float const* target, std::int64_t batch, double weight) {
    std::size_t const rows = rows_of(batch);
    auto const xv = input(x, rows, in, x_staging_, "x");
    auto const tv = input(target, rows, out, t_staging_, "target");
    return parallel_.template accumulate<Loss>(model_, xv, tv, weight);
  }
  void zero_grad() { model_.zero_grad(); }  // gradients to zero (before accumulating)
  void step() { optimizer_.step(); }        // the optimizer's step on what was accumulated
  // The learning rate of the next steps (finite and >= 0, else the optimizer's argument_error).
  void set_learning_rate(double lr) { optimizer_.set_lr(lr); }
  // model::reserve_inference for up to max_batch rows.
  void reserve_inference(std::int64_t max_batch) { model_.reserve_inference(rows_of(max_batch)); }
  // y (batch x out floats, host or device memory) = the model's output for x.
  void forward(float const* x, std::int64_t batch, float* y) {
    std::size_t const rows = rows_of(batch);
    if (!y) detail::raise<argument_error>("forward: expected an output pointer, found NULL");
    auto const xv = input(x, rows, in, x_staging_, "x");
    if constexpr (std::is_same_v<T, float>) {
      if (lies_on_model_device(y)) return model_.forward(xv, tensor_view<float, Device>(y, rows, out));
    }
    if (y_staging_.rows() != rows) y_staging_ = tensor<T, Device>(rows, out);
    model_.forward(xv, y_staging_.view());
    std::vector<T> const h = tensor_to_host(y_staging_.view());
    if constexpr (is_cuda) {
      if (lies_on_model_device(y)) {
        std::vector<float> f(h.begin(), h.end());
        memory::system<Device>::copy_from_host(y, f.data(), f.size() * sizeof(float));
        return;
      }
    }
    for (std::size_t i = 0; i < h.size(); ++i) y[i] = float(h[i]);
  }
  // The model's file, and the optimizer's unless optimizer_path is null.
  void save(char const* model_path, char const* optimizer_path) const {
    if (!model_path) detail::raise<argument_error>("save: expected a path for the model's file, found NULL");
    REMAT_NAMESPACE::save(model_, model_path);
    if (optimizer_path) REMAT_NAMESPACE::save(optimizer_, optimizer_path);
  }
  // All or nothing: the optimizer's file is read and checked first, then the model's is loaded
  // (which checks everything before it changes a value), then the optimizer's state applied.
  void load(char const* model_path, char const* optimizer_path) {
    if (!model_path) detail::raise<argument_error>("load: expected a path for the model's file, found NULL");
    if (!optimizer_path) return REMAT_NAMESPACE::load(model_, model_path);
    auto const state = detail::read_state(optimizer_, optimizer_path, optimizer_.range().size(), 0);
    REMAT_NAMESPACE::load(model_, model_path);
    detail::apply_state(optimizer_, state);
  }
  // The allocator's peaks per tag since the model was made, in the plan's fields, and what it
  // reserved: to set beside plan(). (inference_arena: the arena the model holds, one for training
  // and inference, as large as the largest layout of the passes it ran.)
  remat_memory_plan measured() const {
    memory::statistics const st = alloc_.stats();
    remat_memory_plan r{};
    r.parameters = st[memory::tag::parameters].peak;
    r.gradients = st[memory::tag::gradients].peak;
    r.optimizer_state = st[memory::tag::optimizer_state].peak;
    r.activations = st[memory::tag::activations].peak;
    r.workspace = st[memory::tag::workspace].peak;
    r.step_peak = st.total.peak;
    r.step_reserved = st.total.reserved;
    r.inference_arena = st.arena;
    return r;
  }
  model_type& wrapped_model() { return model_; }              // the model itself
  optimizer_type& wrapped_optimizer() { return optimizer_; }  // its optimizer

  // The plan of a training step and of inference for `batch` rows, before anything is allocated.
  static remat_memory_plan plan(remat_options const& o, std::int64_t batch) {
    std::size_t const rows = rows_of(batch);
    auto const p = memory_plan<Net, Precision, Optimizer, Loss>(rows, {.momentum = o.momentum > 0, .arena = true});
    remat_memory_plan r{};
    r.parameters = p.parameters();
    r.gradients = p.gradients;
    r.optimizer_state = p.optimizer_state;
    r.activations = p.activations.peak_bytes;
    r.workspace = p.workspace;
    r.step_peak = p.peak;
    r.step_reserved = p.reserved;
    r.inference_arena = inference_plan<Net, Precision>(rows).bytes;
    return r;
  }

 private:
  static constexpr bool is_cuda = !std::is_same_v<Device, host>;

  static std::size_t rows_of(std::int64_t batch) {
    if (batch <= 0) detail::raise<argument_error>("expected a batch of at least 1 row, found ", batch);
    return std::size_t(batch);
  }
  static bool lies_on_model_device([[maybe_unused]] void const* p) {
#if REMAT_HAS_CUDA
    if constexpr (is_cuda) return detail::device_accessible(p);
#endif
    return true;
  }

  // A view of `rows` x `cols` floats at p as the model reads them: p itself where it already is
  // (float data on the model's device), else converted and copied into `staging`.
  tensor_view<T const, Device> input(float const* p, std::size_t rows, std::size_t cols, tensor<T, Device>& staging,
                                     char const* what) {
    if (!p) detail::raise<argument_error>(what, ": expected a pointer to ", rows, " x ", cols, " floats, found NULL");
    if constexpr (std::is_same_v<T, float>) {
      if (lies_on_model_device(p)) return tensor_view<float const, Device>(p, rows, cols);
    }
    std::vector<float> host_copy;
    float const* h = p;
    if constexpr (is_cuda) {
      if (lies_on_model_device(p)) {
        host_copy.resize(rows * cols);
        memory::system<Device>::copy_to_host(host_copy.data(), p, rows * cols * sizeof(float));
        h = host_copy.data();
      }
    }
    std::vector<T> values(h, h + rows * cols);
    if (staging.rows() != rows || staging.cols() != cols) staging = tensor<T, Device>(rows, cols);
    tensor_from_host(staging.view(), std::span<T const>(values));
    return staging.view();
  }

  memory::caching_allocator<Device> alloc_;
  model_type model_;
  Parallel<model_type> parallel_;
  optimizer_type optimizer_;
  tensor<T, Device> x_staging_, t_staging_, y_staging_;
};

}  // namespace capi
}  // namespace REMAT_NAMESPACE

// A C function the library exports (a library built with -fvisibility=hidden, as
// remat_add_model_library builds it, exports these and nothing of remat's C++).
#define REMAT_C_EXPORT __attribute__((visibility("default")))

// Defines the C interface of `name` (an identifier: the functions' prefix) for
// model<Net, Device, Precision> trained with Optimizer (AdamW or SGD) on Loss (MSE). Use once, in
// one C++ source of a shared library, at global scope; the declarations are those of the header
// remat_add_model_library generates from cmake/remat_model_library.h.in.
#define REMAT_EXPORT_C_MODEL(name, Net, Device, Precision, Optimizer, Loss) \
  REMAT_EXPORT_C_MODEL_WITH(name, Net, Device, Precision, Optimizer, Loss, ::REMAT_NAMESPACE::capi::no_parallel)

// (REMAT_EXPORT_C_MODEL with the way passes run: no_parallel, or export_mpi.hpp's mpi_parallel.)
#define REMAT_EXPORT_C_MODEL_WITH(name, Net, Device, Precision, Optimizer, Loss, Parallel)                    \
  struct name##_model {                                                                                      \
    ::REMAT_NAMESPACE::capi::exported<Net, Device, Precision, Optimizer, Loss, Parallel> impl;                         \
  };                                                                                                         \
  extern "C" {                                                                                               \
  REMAT_C_EXPORT remat_options name##_default_options(void) { return ::REMAT_NAMESPACE::capi::default_options<Optimizer>(); } \
  REMAT_C_EXPORT int64_t name##_in_features(void) { return int64_t(::REMAT_NAMESPACE::model<Net, Device, Precision>::in_width); } \
  REMAT_C_EXPORT int64_t name##_out_features(void) {                                                                        \
    return int64_t(::REMAT_NAMESPACE::model<Net, Device, Precision>::out_width);                             \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_create(name##_model** out, remat_options const* options) {                                     \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      if (!out) ::REMAT_NAMESPACE::detail::raise<::REMAT_NAMESPACE::argument_error>(#name "_create: expected " \
                                                                                   "a pointer to a handle, found NULL"); \
      *out = nullptr;                                                                                        \
      remat_options const o = options ? *options : name##_default_options();                                 \
      *out = new name##_model{::REMAT_NAMESPACE::capi::exported<Net, Device, Precision, Optimizer, Loss, Parallel>(o)}; \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT void name##_destroy(name##_model* m) { delete m; }                                                        \
  REMAT_C_EXPORT int name##_train_step(name##_model* m, float const* x, float const* target, int64_t batch, double* loss) { \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      double const l = REMAT_CAPI_HANDLE(name, m).train_step(x, target, batch);                              \
      if (loss) *loss = l;                                                                                   \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_zero_grad(name##_model* m) {                                                                    \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).zero_grad(); });               \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_accumulate(name##_model* m, float const* x, float const* target, int64_t batch, double weight,  \
                        double* loss) {                                                                      \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      double const l = REMAT_CAPI_HANDLE(name, m).accumulate(x, target, batch, weight);                      \
      if (loss) *loss = l;                                                                                   \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_step(name##_model* m) {                                                                         \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).step(); });                    \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_set_learning_rate(name##_model* m, double lr) {                                                 \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).set_learning_rate(lr); });     \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_reserve_inference(name##_model* m, int64_t max_batch) {                                         \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).reserve_inference(max_batch); }); \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_forward(name##_model* m, float const* x, int64_t batch, float* y) {                             \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).forward(x, batch, y); });      \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_save(name##_model const* m, char const* model_path, char const* optimizer_path) {               \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      REMAT_CAPI_HANDLE(name, const_cast<name##_model*>(m)).save(model_path, optimizer_path);                \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_load(name##_model* m, char const* model_path, char const* optimizer_path) {                     \
    return ::REMAT_NAMESPACE::capi::guarded([&] { REMAT_CAPI_HANDLE(name, m).load(model_path, optimizer_path); }); \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_memory_plan(remat_options const* options, int64_t batch, remat_memory_plan* out) {            \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      if (!out) ::REMAT_NAMESPACE::detail::raise<::REMAT_NAMESPACE::argument_error>(#name "_memory_plan: "  \
                                                                                   "expected a pointer, found NULL"); \
      remat_options const o = options ? *options : name##_default_options();                                 \
      *out = ::REMAT_NAMESPACE::capi::exported<Net, Device, Precision, Optimizer, Loss, Parallel>::plan(o, batch); \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT int name##_memory_measured(name##_model const* m, remat_memory_plan* out) {                               \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                            \
      if (!out) ::REMAT_NAMESPACE::detail::raise<::REMAT_NAMESPACE::argument_error>(#name "_memory_measured: " \
                                                                                   "expected a pointer, found NULL"); \
      *out = REMAT_CAPI_HANDLE(name, const_cast<name##_model*>(m)).measured();                               \
    });                                                                                                      \
  }                                                                                                          \
  REMAT_C_EXPORT char const* name##_last_error(void) { return ::REMAT_NAMESPACE::capi::last_message().c_str(); }           \
  }

// (The handle's model, or an argument_error for a null handle.)
#define REMAT_CAPI_HANDLE(name, m)                                                                               \
  ((m) ? (m)->impl                                                                                               \
       : (::REMAT_NAMESPACE::detail::raise<::REMAT_NAMESPACE::argument_error>(#name ": expected a model handle, " \
                                                                                    "found NULL"),               \
          (m)->impl))
