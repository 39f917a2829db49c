// The pass-state vocabulary: everything a layer, a composite or a storage policy may ask of the
// state of one forward/backward pass, and nothing else. Two states implement it on one base, so
// the activation plan follows exactly the rules a training step follows: pass_state (pass/step.hpp)
// computes, planning::state (plan/state.hpp) only counts bytes at compile time.
//
// What a layer may call (see layers/layer.hpp for the contract):
//   s.make(rows, cols)               a new activation
//   s.save(a) / s.restore()          keep a tensor for backward / take it back (last in, first out)
//   s.save_counter(v) / restore_counter()   the same for a number (a dropout offset)
//   s.reuse_or_make(dy, cols)        dy's own memory for dx when nobody else holds it
//   s.gradient_for(x, dy, cols)      the same, or hollow when nobody wants x's gradient
//   s.draw(n), s.random(offset)      n elements of the pass's dropout stream, and that stream
//   s.product(rows, cols, compute)   a matrix product's output (captured and replayed by Selective)
//   s.training(), s.keeps(), s.recomputing(), s.sequence_length(), s.token_ids()
//   s.needs_gradient(x)              false for the pass's input when no input gradient is wanted
//   s.gradients_zero()               the parameter gradients are zero: write over them, not onto
//   s.buffers(n), s.updates_buffers()  a layer's running state (BatchNorm2d's statistics), taken
//                                    in each forward that is not a recomputation, and whether
//                                    this forward updates it (S::buffer_ptr; see pass/step.hpp)
//   s.hollow(rows, cols), S::is_hollow(a), S::computes
// What composites and policies use besides:
//   s.need_input(), s.keep_nothing(), s.recompute_from(offset), s.capture_products(list),
//   s.replay_products(list), s.count_products(c), s.skip_products_from(n), s.count_recomputed(n),
//   s.rng_offset(), s.peek(), s.peek_counter(), s.saved_mark(), s.offload_since(mark),
//   s.bring_back_offloaded(), s.grads_ready(g)
#pragma once

#include "../config.hpp"
#include "offload.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

// Whether a training pass computes the gradient with respect to its input (accumulate's `dx`;
// the activation plan: plan/activation.hpp).
enum class input_gradient : bool { none = false, wanted = true };

// One matrix-product output that a selective policy keeps, and whether its recomputation needs it.
template <class A>
struct captured_product {
  A value;      // the product's output
  bool needed;  // whether the recomputation reads it (else it is dropped)
};

// Where a pass's dropout masks come from: element i of a draw at `offset` is
// philox(seed, stream, offset + i). A pure function of these, so a mask is never stored.
struct random_draw {
  std::uint64_t seed = 0;    // the model's seed
  std::uint64_t stream = 0;  // the pass's stream (its pass count and replica)
  std::uint64_t offset = 0;  // the draw's first element in the stream
};

// The token ids of a pass (for a model whose first layer reads ids).
struct token_ids {
  std::int32_t const* data = nullptr;  // in the model's device memory
  std::size_t count = 0;               // ids in all (batch x sequence)
};

// How a pass starts.
struct pass_options {
  bool training = false;  // dropout on, batch statistics (a training pass, or its loss)
  // False: a training-mode forward that keeps nothing for a backward (a loss without gradients).
  bool keep = true;
  std::uint64_t seed = 0;    // the model's seed
  std::uint64_t stream = 0;  // the dropout stream of this pass
  // Rows of a sequence batch: row r is position r % length of sequence r / length (1: no sequences).
  std::size_t sequence_length = 1;
  token_ids ids{};  // the pass's token ids (a model reading ids)
  // False: nobody reads the gradient with respect to the pass's input (a training step; a loss
  // gradient without an input gradient), so the layer that takes the input skips computing it.
  bool input_gradient = true;
  // True: the gradients are zero as the pass begins (after zero_grad), so a layer may write its
  // gradients over rather than add onto the zeros (s.gradients_zero()).
  bool gradients_zero = false;
};

// The vocabulary, written once for every pass state. A is the activation handle (shared_ptr-like:
// copies share, the last one frees). Self supplies make, hollow, is_hollow, owns, copy_off,
// copy_back and offload_target; Record is what one Offloaded forward moved (pass/offload.hpp).
template <class A, class Self, class Record>
class pass_vocabulary {
  struct skipping {
    bool active = false;
    std::size_t from = 0, seen = 0;
  };

 public:
  // A pass started as `o` says.
  constexpr explicit pass_vocabulary(pass_options const& o = {})
      : training_(o.training),
        keep_(o.keep),
        seed_(o.seed),
        stream_(o.stream),
        seq_len_(o.sequence_length),
        ids_(o.ids),
        input_gradient_(o.input_gradient),
        gradients_zero_(o.gradients_zero) {}

  // ---- what a layer may ask

  constexpr bool training() const { return training_; }
  // Whether layers keep what their backward needs (false in inference, and inside a forward whose
  // policy keeps nothing).
  constexpr bool keeps() const { return training_ && keep_; }
  // A forward whose side effects already happened once (a policy recomputing): a layer that
  // updates state in forward (a counter, a running statistic) does so only when this is false.
  constexpr bool recomputing() const { return recomputing_; }
  // Rows per sequence (1: the rows are not sequences).
  constexpr std::size_t sequence_length() const { return seq_len_; }
  // The pass's token ids (empty unless the model reads ids).
  constexpr token_ids ids() const { return ids_; }
  // Whether backward must compute the gradient with respect to `x` (a layer's saved input): false
  // only for the pass's own input when nobody asked for its gradient. A layer that skips it
  // returns s.hollow(rows, cols) as its input gradient, and the layers around pass that on.
  constexpr bool needs_gradient(A const& x) const { return input_gradient_ || !self().is_pass_input(x); }
  // Whether the parameter gradients are zero as this pass begins: a layer then writes its
  // contribution over them (a product with beta = 0) rather than adding it onto zeros. The same
  // values either way; a zero's sign aside (-0 written over, +0 added onto).
  constexpr bool gradients_zero() const { return gradients_zero_; }

  // Keeps `a` for backward; a forward that keeps nothing drops it (and, when capturing products,
  // notes that every product captured so far is needed to recompute it).
  constexpr void save(A a) {
    if (keeps())
      saved_.push_back(static_cast<A&&>(a));
    else
      need_input();
  }
  // Takes back the newest tensor kept (last in, first out).
  constexpr A restore() {
    A a = static_cast<A&&>(saved_.back());
    saved_.pop_back();
    return a;
  }
  // Keeps a number for backward (a dropout offset), as save keeps a tensor.
  constexpr void save_counter(std::uint64_t v) {
    if (keeps()) counters_.push_back(v);
  }
  // Takes back the newest number kept.
  constexpr std::uint64_t restore_counter() {
    std::uint64_t const v = counters_.back();
    counters_.pop_back();
    return v;
  }
  // A tensor for dx: dy's own memory if nobody else holds it.
  constexpr A reuse_or_make(A& dy, std::size_t cols) {
    if (dy.use_count() == 1 && dy->cols() == cols) return dy;
    return self().make(dy->rows(), cols);
  }
  // A tensor for the gradient of x (a layer's saved input): reuse_or_make(dy, cols) when it is
  // wanted (needs_gradient), hollow when nobody asked for it (the layer then writes none).
  constexpr A gradient_for(A const& x, A& dy, std::size_t cols) {
    if (needs_gradient(x)) return reuse_or_make(dy, cols);
    return self().hollow(dy->rows(), cols);
  }

  // The offset of n new elements of the pass's dropout stream (a recomputation draws the same).
  constexpr std::uint64_t draw(std::size_t n) {
    std::uint64_t const offset = rng_offset_;
    rng_offset_ += n;
    return offset;
  }
  // The draw of the pass's stream at `offset` (what draw(n) returned): a dropout mask's source.
  constexpr random_draw random(std::uint64_t offset) const { return {seed_, stream_, offset}; }

  // A matrix product's rows x cols output. `compute(out)` fills it: the product and whatever the
  // layer folds in before anyone reads it (a bias); only a state that computes calls it (its body
  // still compiles for every state: put it under `if constexpr (S::computes)`). Under
  // Selective the first forward captures the output and the recomputation takes it back instead
  // of multiplying again; one the recomputation does not need comes back hollow (a shape without
  // values). Call it after saving the layer's input (saving marks the products before it needed);
  // saving the product itself for backward marks it needed.
  //
  // In a recomputation whose output nobody reads (Checkpointed's, before its backward), the
  // products after the last one the segment needs come back hollow without being computed: the
  // last product of a residual branch, whose output the backward does not read (a product's
  // backward reads its input and its weights).
  //
  // `depth` is the product's inner dimension: rows x cols x depth multiply-adds, counted in the
  // pass's work (note_work) when the product is computed, not when it is skipped or taken back.
  template <class Compute>
  constexpr A product(std::size_t rows, std::size_t cols, Compute&& compute) {
    return product(rows, cols, 1, static_cast<Compute&&>(compute));
  }
  // The product of inner dimension `depth` (see above).
  template <class Compute>
  constexpr A product(std::size_t rows, std::size_t cols, std::size_t depth, Compute&& compute) {
    if (tally_) ++tally_->products;
    if (skip_.active && skip_.seen++ >= skip_.from) {
      if (replay_) ++replay_next_;
      A shape = self().hollow(rows, cols);
      if (capture_) capture_->push_back({shape, false});
      return shape;
    }
    if (replay_) {
      A kept = static_cast<A&&>((*replay_)[replay_next_++]);
      if (!kept) return self().hollow(rows, cols);
      return kept;
    }
    A y = self().make(rows, cols);
    note_work(std::uint64_t(rows) * cols * depth);
    if constexpr (Self::computes) compute(*y);
    if (capture_) capture_->push_back({y, false});
    return y;
  }

  // The work of a pass, in the cost model of the budget policy (policy/budget.hpp): a product's
  // multiply-adds, and what a layer that multiplies outside s.product notes itself (the attention
  // core's); the plan's state adds one per element of every tensor it makes. Only counted.
  constexpr void note_work(std::uint64_t n) { work_ += n; }
  constexpr std::uint64_t work() const { return work_; }  // the work noted so far

  // ---- what composites and storage policies use

  // Under a selective forward: everything captured so far is needed to recompute what follows
  // (called before a layer that cannot take a hollow input).
  constexpr void need_input() {
    if (capture_)
      for (auto& c : *capture_) c.needed = true;
    if (tally_) tally_->needed = tally_->products;
  }

  // Until the end of the returned scope (a forward that keeps nothing), counts into `c` the
  // products and how many of the first ones what follows them needs: `needed` products from the
  // start, as need_input marks every product made so far. A recomputation of the same forward may
  // skip the rest (skip_products_from).
  struct product_count {
    std::size_t products = 0;  // products made in the scope
    std::size_t needed = 0;    // of them, the first ones what follows needs
  };
  // (See product_count.)
  [[nodiscard]] constexpr auto count_products(product_count& c) { return restorer<product_count*>(tally_, &c); }

  // Until the end of the returned scope, the products from the n-th on (counted from the start of
  // the scope) come back hollow, uncomputed (a recomputation whose output nobody reads, and whose
  // forward found that only the first n products are needed).
  [[nodiscard]] constexpr auto skip_products_from(std::size_t n) {
    return restorer<skipping>(skip_, skipping{true, n, 0});
  }

  // Until the end of the returned scope, nothing is kept for backward.
  [[nodiscard]] constexpr auto keep_nothing() { return restorer<bool>(keep_, false); }

  // Until the end of the returned scope the pass is a recomputation: from dropout offset `offset`,
  // with side effects off. restart_at(o) moves it to another offset (a schedule with many starts).
  class recomputation {
   public:
    // Starts a recomputation of s from dropout offset `offset`.
    constexpr recomputation(pass_vocabulary& s, std::uint64_t offset)
        : s_(s), offset_(s.rng_offset_), was_(s.recomputing_) {
      s.rng_offset_ = offset;
      s.recomputing_ = true;
    }
    recomputation(recomputation const&) = delete;
    recomputation& operator=(recomputation const&) = delete;
    constexpr ~recomputation() {
      s_.rng_offset_ = offset_;
      s_.recomputing_ = was_;
    }
    constexpr void restart_at(std::uint64_t offset) { s_.rng_offset_ = offset; }  // (see above)

   private:
    pass_vocabulary& s_;
    std::uint64_t offset_;
    bool was_;
  };
  // (See recomputation.)
  [[nodiscard]] constexpr recomputation recompute_from(std::uint64_t offset) { return recomputation(*this, offset); }

  // Until the end of the returned scope, products are captured into `list` (Selective's forward).
  [[nodiscard]] constexpr auto capture_products(std::vector<captured_product<A>>& list) {
    return restorer<std::vector<captured_product<A>>*>(capture_, &list);
  }
  // Until the end of the returned scope, products are taken from `list`, in order (Selective's
  // recomputation).
  class replay_scope {
   public:
    // Products of s come from `list`, in order, until the scope ends.
    constexpr replay_scope(pass_vocabulary& s, std::vector<A>& list) : s_(s), list_(s.replay_), next_(s.replay_next_) {
      s.replay_ = &list;
      s.replay_next_ = 0;
    }
    replay_scope(replay_scope const&) = delete;
    replay_scope& operator=(replay_scope const&) = delete;
    constexpr ~replay_scope() {
      s_.replay_ = list_;
      s_.replay_next_ = next_;
    }

   private:
    pass_vocabulary& s_;
    std::vector<A>* list_;
    std::size_t next_;
  };
  // (See replay_scope.)
  [[nodiscard]] constexpr replay_scope replay_products(std::vector<A>& list) { return replay_scope(*this, list); }

  // Where the dropout stream stands (what a policy keeps to recompute a segment).
  constexpr std::uint64_t rng_offset() const { return rng_offset_; }
  // The newest kept tensor and number, left in place (a schedule that restores a slot many times).
  constexpr A peek() const { return saved_.back(); }
  constexpr std::uint64_t peek_counter() const { return counters_.back(); }  // (see peek)
  // Block forwards run again by storage policies in this pass.
  constexpr void count_recomputed(std::uint64_t n) { recomputed_ += n; }
  constexpr std::uint64_t recomputed() const { return recomputed_; }  // (see count_recomputed)
  // Activation bytes in use when the forward ended, its output excluded (set by forward_done).
  constexpr std::size_t saved_bytes() const { return saved_bytes_; }

  // Offloaded<S>: what S's forward saved since `mark` goes to offloaded memory, and comes back for
  // its backward (pass/offload.hpp).
  constexpr std::size_t saved_mark() const { return saved_.size(); }

  // After S's forward pushed its saved tensors onto slots [mark, end): each tensor that only those
  // slots hold (not S's output, not a tensor an earlier layer also kept, not the caller's input)
  // is copied to offloaded memory and its slots get a hollow tensor of its shape. The device copy
  // stays held until the copy is known done: until the end of the next Offloaded forward (so the
  // copy overlaps that compute), or until its own backward if none follows (then it never needs
  // to come back).
  constexpr void offload_since(std::size_t mark) {
    Record rec;
    for (std::size_t i = mark; i < saved_.size(); ++i) {
      A& a = saved_[i];
      if (!a || Self::is_hollow(a) || !Self::owns(a)) continue;
      long holders = 0;
      for (std::size_t j = i; j < saved_.size(); ++j) holders += saved_[j] == a ? 1 : 0;
      if (holders != a.use_count()) continue;  // held outside S's slots too: moving it frees nothing
      if (rec.items.empty()) rec.fence.begin(self().offload_target());
      typename Record::item it;
      it.rows = a->rows();
      it.cols = a->cols();
      it.host = self().copy_off(a, rec.fence);
      for (std::size_t j = i; j < saved_.size(); ++j)
        if (saved_[j] == a) it.slots.push_back(j);
      it.device = a;
      A const shape = self().hollow(it.rows, it.cols);
      for (std::size_t j : it.slots) saved_[j] = shape;
      rec.items.push_back(static_cast<typename Record::item&&>(it));
    }
    if (!rec.items.empty()) rec.fence.end();
    // Earlier segments' copies are done before anything that follows uses their device memory.
    for (Record& r : offloads_) {
      if (!r.pending) continue;
      r.fence.wait();
      for (auto& it : r.items) it.device = nullptr;
      r.pending = false;
    }
    offloads_.push_back(static_cast<Record&&>(rec));
  }

  // Before the newest Offloaded segment's backward: its tensors back in their slots, and the
  // next one's on their way (copied under this backward); waits for the newest only.
  constexpr void bring_back_offloaded() {
    std::size_t const n = offloads_.size();
    fetch(offloads_[n - 1]);
    if (n >= 2) fetch(offloads_[n - 2]);
    offloads_[n - 1].fence.wait();
    offloads_.pop_back();
  }

 protected:
  constexpr void set_saved_bytes(std::size_t b) { saved_bytes_ = b; }  // (see saved_bytes)

 private:
  // Sets `slot` to `value` until the end of the scope.
  template <class V>
  class restorer {
   public:
    constexpr restorer(V& slot, V value) : slot_(slot), was_(slot) { slot = value; }
    restorer(restorer const&) = delete;
    restorer& operator=(restorer const&) = delete;
    constexpr ~restorer() { slot_ = was_; }

   private:
    V& slot_;
    V was_;
  };

  constexpr Self& self() { return static_cast<Self&>(*this); }
  constexpr Self const& self() const { return static_cast<Self const&>(*this); }

  // Puts a record's tensors back into their slots: the device copies if still held, else copies
  // from offloaded memory into new device memory (issued now, waited for by the record's backward).
  constexpr void fetch(Record& r) {
    if (r.fetched) return;
    r.fetched = true;
    if (!r.pending && !r.items.empty()) r.fence.begin(self().offload_target());
    for (auto& it : r.items) {
      A a;  // (not `pending ? device : copy_back(...)`: GCC 12 miscounts that at compile time)
      if (r.pending)
        a = static_cast<A&&>(it.device);
      else
        a = self().copy_back(it, r.fence);
      it.device = nullptr;
      it.host = {};
      for (std::size_t j : it.slots) saved_[j] = a;
    }
    if (!r.pending && !r.items.empty()) r.fence.end();
    r.pending = false;
  }

  bool training_ = false;
  bool keep_ = true;
  bool recomputing_ = false;
  std::uint64_t seed_ = 0;
  std::uint64_t stream_ = 0;
  std::uint64_t rng_offset_ = 0;  // elements of the stream drawn so far
  std::uint64_t recomputed_ = 0;
  std::uint64_t work_ = 0;
  std::size_t saved_bytes_ = 0;
  std::size_t seq_len_ = 1;
  token_ids ids_{};
  bool input_gradient_ = true;
  bool gradients_zero_ = false;
  std::vector<A> saved_;                 // tensors the forward kept, popped in reverse by backward
  std::vector<std::uint64_t> counters_;  // the same for numbers (dropout offsets, RNG states)
  std::vector<captured_product<A>>* capture_ = nullptr;
  std::vector<A>* replay_ = nullptr;
  std::size_t replay_next_ = 0;
  product_count* tally_ = nullptr;  // a checkpointed forward counting its products
  skipping skip_{};                 // its recomputation skipping the products nobody needs
  std::vector<Record> offloads_;  // Offloaded<S>: the records of what went (last, first restored)
};

}  // namespace REMAT_NAMESPACE
