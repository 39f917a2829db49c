// Selective<S>: keeps S's input and the outputs of its matrix products that the recomputation
// needs (a Linear fused with an activation keeps its pre-activation; a plain product's output is
// kept when a later layer of S needs its input); backward re-runs S's forward taking those
// products back instead of multiplying, so it recomputes only the point-wise work: norms,
// activations, dropout masks. Megatron-LM's selective recompute, decided per layer by the pass:
// every layer that multiplies through s.product (pass/vocabulary.hpp) takes part. For the block
// Residual<Seq<LayerNorm, Linear, GELU, Linear>> it keeps 2 of the 4 tensors of the block's width
// that storing keeps, and recomputes one norm and one activation.
#pragma once

#include "wraps.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

template <class S>
struct Selective : wraps<S> {
  static_assert(not_a_segment<Selective, S>::ok);

  // Runs S keeping nothing of its own but the products the recomputation needs, and S's input
  // and dropout offset.
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    using A = typename St::act_type;
    return Selective::forward_keeping(s, p, std::move(x), [&](A in) {
      std::uint64_t const offset = s.rng_offset();
      std::vector<captured_product<A>> products;
      A y;
      {
        auto const capturing = s.capture_products(products);
        auto const none = s.keep_nothing();
        y = S::forward(s, p, in);
      }
      for (auto& c : products) {  // (not `needed ? value : A()`: GCC 12 miscounts that at compile time)
        if (!c.needed) c.value.reset();
        s.save(std::move(c.value));
      }
      std::uint64_t const count = products.size();
      products.clear();
      s.save(std::move(in));
      s.save_counter(count);
      s.save_counter(offset);
      return y;
    });
  }

  // Runs S's forward again taking the kept products back (only point-wise work is redone), then
  // S's backward.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    using A = typename St::act_type;
    std::uint64_t const offset = s.restore_counter();
    std::size_t const count = s.restore_counter();
    A x = s.restore();
    std::vector<A> products(count);
    for (std::size_t i = count; i-- > 0;) products[i] = s.restore();
    {
      auto const replaying = s.replay_products(products);
      auto const again = s.recompute_from(offset);
      S::forward(s, p, std::move(x)).reset();
    }
    products.clear();
    return Selective::backward_recomputed(s, p, g, std::move(dy));
  }
};

}  // namespace REMAT_NAMESPACE
