// Host products through oneDNN's matmul (kernels/gemm.hpp decides which products come here): one
// primitive per shape, made once for the process (oneDNN's descriptors cost tens of
// microseconds), and per thread the memory objects bound to it, made once and pointed at each
// call's operands, so a call makes only oneDNN's own execution records on the heap (6 per call,
// against 32 when the memory objects were made per call). The scratchpad is the caller's (from
// remat's default allocator, which keeps it). Builds with oneDNN 2.x (Debian 12's 2.6) or 3.x: the
// two differ in how a primitive descriptor is made and in how alpha scales the product. Host C++
// only: nvcc's front end fails on oneDNN's headers.
#pragma once

#include "../../config.hpp"

#if defined(REMAT_HAS_ONEDNN) && !defined(__CUDACC__)
#include "../../error.hpp"
#include "../../memory/allocator.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

// A matmul's primitive descriptor for these operands, in oneDNN 2.x's terms or 3.x's.
inline dnnl::matmul::primitive_desc onednn_matmul_desc(dnnl::engine const& eng, dnnl::memory::desc const& a,
                                                       dnnl::memory::desc const& b, dnnl::memory::desc const& c,
                                                       dnnl::primitive_attr const& attr = dnnl::primitive_attr()) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(eng, a, b, c, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
#endif
}

// A product's shape, layouts, scaling and types: what one primitive serves.
struct onednn_key {
  index_t m, n, k, lda, ldb, ldc;
  bool ta, tb, out32;
  float alpha, beta;
  bool in32 = false;  // fp32 inputs (else bf16)
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, ta, tb, out32, alpha, beta, in32); }
  bool operator<(onednn_key const& o) const { return tie() < o.tie(); }
};

// The process's engine and primitives (under a mutex: primitives themselves may run on several
// threads at once).
struct onednn_context {
  struct entry {
    dnnl::matmul prim;
    std::size_t pad_bytes;  // its scratchpad
    dnnl::memory::desc a, b, c;
  };
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<onednn_key, entry> cache;

  static onednn_context& get() {
    static onednn_context c;
    return c;
  }
  // The calling thread's stream (a stream is not to be shared between threads).
  static dnnl::stream& stream() {
    thread_local dnnl::stream s{get().eng};
    return s;
  }
};

// A thread's memory objects for one primitive: the operands' and the scratchpad's, re-pointed at
// each call (a memory object is not to be shared between threads that set its handle).
struct onednn_bound {
  dnnl::matmul prim;
  dnnl::memory a, b, c, pad;
  std::size_t pad_bytes = 0;
  // oneDNN 3.x takes alpha at execution, as the source's scale (2.x's output scale is in the
  // primitive): the scale and, under 3.x, a memory object over it (made once the entry is in place).
  float alpha = 1.0f;
  dnnl::memory scale;
};

// The primitive of `key` with this thread's memory objects for it, made on first use.
inline onednn_bound& onednn_for(onednn_key const& key) {
  thread_local std::map<onednn_key, onednn_bound> bound;
  auto found = bound.find(key);
  if (found != bound.end()) return found->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  onednn_context& ctx = onednn_context::get();
  onednn_context::entry e;
  {
    std::lock_guard lock(ctx.mutex);
    auto it = ctx.cache.find(key);
    if (it == ctx.cache.end()) {
      dt const in = key.in32 ? dt::f32 : dt::bf16;
      dnnl::memory::desc const ad({key.m, key.k}, in, key.ta ? dims{1, key.lda} : dims{key.lda, 1});
      dnnl::memory::desc const bd({key.k, key.n}, in, key.tb ? dims{1, key.ldb} : dims{key.ldb, 1});
      dnnl::memory::desc const cd({key.m, key.n}, key.out32 ? dt::f32 : dt::bf16, dims{key.ldc, 1});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
      if (key.alpha != 1.0f) attr.set_scales_mask(DNNL_ARG_SRC, 0);
#else
      if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
#endif
      if (key.beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(key.beta);
        attr.set_post_ops(po);
      }
      dnnl::matmul::primitive_desc const pd = onednn_matmul_desc(ctx.eng, ad, bd, cd, attr);
      it = ctx.cache.emplace(key, onednn_context::entry{dnnl::matmul(pd), pd.scratchpad_desc().get_size(), ad, bd, cd})
               .first;
    }
    e = it->second;
  }
  dnnl::memory::desc const pd({index_t(e.pad_bytes)}, dt::u8, dims{1});
  onednn_bound b{e.prim, dnnl::memory(e.a, ctx.eng, DNNL_MEMORY_NONE), dnnl::memory(e.b, ctx.eng, DNNL_MEMORY_NONE),
                 dnnl::memory(e.c, ctx.eng, DNNL_MEMORY_NONE), dnnl::memory(pd, ctx.eng, DNNL_MEMORY_NONE), e.pad_bytes,
                 key.alpha, dnnl::memory()};
  onednn_bound& mine = bound.emplace(key, std::move(b)).first->second;
#if DNNL_VERSION_MAJOR >= 3
  if (key.alpha != 1.0f) mine.scale = dnnl::memory(dnnl::memory::desc({1}, dt::f32, dims{1}), ctx.eng, &mine.alpha);
#endif
  return mine;
}

// Whether oneDNN has a bf16 matmul for this processor, asked once by making one (oneDNN 2.6 has
// none without AVX-512: on an AVX2 processor the descriptor is refused, and bf16 products convert
// to fp32 for the BLAS instead).
inline bool onednn_bf16_matmul_here() {
  static bool const ok = [] {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    try {
      dnnl::memory::desc const in({4, 4}, dt::bf16, tag::ab);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      for (dt out : {dt::f32, dt::bf16})
        onednn_matmul_desc(onednn_context::get().eng, in, in, dnnl::memory::desc({4, 4}, out, tag::ab), attr);
      return true;
    } catch (dnnl::error const&) {
      return false;
    }
  }();
  return ok;
}

// The scratchpad block a primitive that needs `need` bytes takes: one size for every primitive,
// the largest power of two asked for so far and at least 256 KiB, so the allocator caches one
// block, and a steady inference loop that began at its largest batch asks the system for nothing
// even where oneDNN gives a smaller batch a larger scratchpad (its AMX kernels on a Xeon do).
inline std::size_t onednn_pad_bytes(std::size_t need) {
  static memory::growing_size most(std::size_t(1) << 18, true);
  return most(need);
}

// C = alpha * op(A) op(B) + beta * C for key's shape and layouts, on the calling thread's stream.
// Throws dnnl::error when oneDNN fails (gemm turns it into a remat::error).
inline void onednn_matmul(onednn_key const& key, void const* a, void const* b, void* c) {
  onednn_bound& m = onednn_for(key);
  memory::scratch_buffer<host> pad(onednn_pad_bytes(m.pad_bytes));
  m.a.set_data_handle(const_cast<void*>(a));
  m.b.set_data_handle(const_cast<void*>(b));
  m.c.set_data_handle(c);
  m.pad.set_data_handle(pad.get());
  dnnl::stream& stream = onednn_context::stream();
  // (the C call: the C++ one builds a map and a vector of the arguments on the heap every call)
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, m.a.get()},
                             {DNNL_ARG_WEIGHTS, m.b.get()},
                             {DNNL_ARG_DST, m.c.get()},
                             {DNNL_ARG_SCRATCHPAD, m.pad.get()},
                             {}};
  int count = 4;
#if DNNL_VERSION_MAJOR >= 3
  if (m.alpha != 1.0f) args[count++] = {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, m.scale.get()};
#endif
  dnnl::error::wrap_c_api(dnnl_primitive_execute(m.prim.get(), stream.get(), count, args),
                          "could not execute a matmul primitive");
  stream.wait();
}

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
