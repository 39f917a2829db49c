// tensor<T, Device, Width>: an owning, typed buffer of rows x cols elements, row-major, whose
// rows (the batch) are a run-time value and whose width is a compile-time constant where the
// model knows it (dynamic_width otherwise). Memory always comes from a tagged caching allocator.
// tensor_view is the non-owning counterpart: a pointer and a shape.
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "../memory/allocator.hpp"

#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

// A tensor's Width when the width is known at run time only (the default).
inline constexpr std::size_t dynamic_width = std::numeric_limits<std::size_t>::max();

namespace detail {

inline std::size_t checked_extent(index_t n, char const* what) {
  if (n <= 0) raise<argument_error>("tensor ", what, ": expected a positive size, found ", n);
  return static_cast<std::size_t>(n);
}

// The width: stored when dynamic, a constant (and no bytes) when static.
template <std::size_t Width>
struct width_holder {
  constexpr width_holder() = default;
  constexpr explicit width_holder(std::size_t) {}
  static constexpr std::size_t value() { return Width; }
};
template <>
struct width_holder<dynamic_width> {
  std::size_t w = 0;
  constexpr width_holder() = default;
  constexpr explicit width_holder(std::size_t c) : w(c) {}
  constexpr std::size_t value() const { return w; }
};

}  // namespace detail

// A non-owning view of rows x cols elements of type T (const for read-only), row-major, in
// Device's memory; copied by value. Width fixes the column count at compile time (a mismatch
// throws shape_error at construction), or is dynamic_width.
template <class T, class Device = host, std::size_t Width = dynamic_width>
class tensor_view {
  static_assert(is_device_v<Device>, "tensor_view: Device must be remat::host or remat::cuda");
  static_assert(std::is_trivially_copyable_v<T>, "tensor_view: elements must be trivially copyable");
  static_assert(Width > 0, "tensor_view: a compile-time width must be positive");

 public:
  using element_type = T;                  // T as given (const for a read-only view)
  using value_type = std::remove_cv_t<T>;  // T without const
  using device_type = Device;              // host or cuda
  static constexpr std::size_t static_width = Width;  // the compile-time width, or dynamic_width

  constexpr tensor_view() = default;
  // rows x Width elements at data (a compile-time width).
  constexpr tensor_view(T* data, std::size_t rows)
    requires(Width != dynamic_width)
      : data_(data), rows_(rows) {}
  // rows x cols elements at data; with a compile-time width, cols must equal it (shape_error).
  tensor_view(T* data, std::size_t rows, std::size_t cols) : data_(data), rows_(rows), cols_(cols) {
    if constexpr (Width != dynamic_width)
      if (cols != Width)
        detail::raise<shape_error>("tensor_view: expected a width of ", Width, ", found ", cols);
  }

  // T -> T const, and a static width -> dynamic_width, convert implicitly.
  template <class U, std::size_t W>
    requires((std::is_same_v<U, T> || std::is_same_v<U const, T>) && (W == Width || Width == dynamic_width) &&
             !(std::is_same_v<U, T> && W == Width))
  constexpr tensor_view(tensor_view<U, Device, W> other) : data_(other.data()), rows_(other.rows()), cols_(other.cols()) {}

  constexpr T* data() const { return data_; }                          // the first element
  constexpr std::size_t rows() const { return rows_; }                 // the batch's rows
  constexpr std::size_t cols() const { return cols_.value(); }         // elements per row
  constexpr std::size_t size() const { return rows_ * cols(); }        // rows x cols
  constexpr std::size_t bytes() const { return size() * sizeof(T); }   // size() x sizeof(T)
  constexpr bool empty() const { return size() == 0; }                 // no elements

  // Rows [first, first + count).
  tensor_view row_range(std::size_t first, std::size_t count) const {
    if (first > rows_ || count > rows_ - first)
      detail::raise<shape_error>("tensor_view::row_range: expected rows within [0, ", rows_, "), found [", first,
                                 ", ", first + count, ")");
    return tensor_view(data_ + first * cols(), count, cols());
  }

  // Element access for host memory.
  T& operator[](std::size_t i) const
    requires std::is_same_v<Device, host>
  {
    return data_[i];
  }
  // The element of row r and column c (host memory).
  T& operator()(std::size_t r, std::size_t c) const
    requires std::is_same_v<Device, host>
  {
    return data_[r * cols() + c];
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  [[no_unique_address]] detail::width_holder<Width> cols_{};
};

// Owns rows x cols elements of type T in Device's memory, row-major, from a tagged caching
// allocator to which it gives them back; move-only. Width as tensor_view's.
template <class T, class Device = host, std::size_t Width = dynamic_width>
class tensor {
  static_assert(!std::is_const_v<T>, "tensor: the element type of an owning tensor cannot be const");

 public:
  using element_type = T;                                      // the elements' type
  using value_type = T;                                        // (the same)
  using device_type = Device;                                  // host or cuda
  using allocator_type = memory::caching_allocator<Device>;    // where the memory comes from
  using view_type = tensor_view<T, Device, Width>;             // a writable view of it
  using const_view_type = tensor_view<T const, Device, Width>; // a read-only view of it
  static constexpr std::size_t static_width = Width;  // the compile-time width, or dynamic_width

  tensor() = default;

  // rows x Width, for a compile-time width.
  explicit tensor(index_t rows, memory::tag tag = memory::tag::activations,
                  allocator_type& alloc = memory::default_allocator<Device>())
    requires(Width != dynamic_width)
      : tensor(unchecked{}, detail::checked_extent(rows, "rows"), Width, tag, alloc) {}

  // rows x cols, for a run-time width.
  tensor(index_t rows, index_t cols, memory::tag tag = memory::tag::activations,
         allocator_type& alloc = memory::default_allocator<Device>())
    requires(Width == dynamic_width)
      : tensor(unchecked{}, detail::checked_extent(rows, "rows"), detail::checked_extent(cols, "cols"), tag, alloc) {}

  // A tensor that has a shape and no memory: what a recomputation that needs no values passes on
  // (see Selective in graph/policies.hpp).
  struct shape_only_t {};
  static constexpr shape_only_t shape_only{};  // the tag of the constructor below
  // A shape without memory.
  tensor(shape_only_t, std::size_t rows, std::size_t cols)
    requires(Width == dynamic_width)
      : view_(nullptr, rows, cols) {}
  // A tensor over memory someone else owns (and frees): a training pass reads the caller's input
  // in place instead of copying it.
  struct borrowed_t {};
  static constexpr borrowed_t borrowed{};  // the tag of the constructor below
  // A tensor over rows x cols elements at data, which it does not free.
  tensor(borrowed_t, T* data, std::size_t rows, std::size_t cols)
    requires(Width == dynamic_width)
      : view_(data, rows, cols) {}

  // A tensor over a block `alloc` already handed out (allocate_at: a planned arena's), which it
  // gives back to `alloc` as any tensor does.
  struct adopted_t {};
  static constexpr adopted_t adopted{};  // the tag of the constructor below
  // A tensor that owns `data`, a block of `alloc` holding `tag`.
  tensor(adopted_t, T* data, std::size_t rows, std::size_t cols, memory::tag tag, allocator_type& alloc)
    requires(Width == dynamic_width)
      : view_(data, rows, cols), tag_(tag), alloc_(&alloc) {}

  // Takes o's memory; o is left empty.
  tensor(tensor&& o) noexcept : view_(std::exchange(o.view_, view_type{})), tag_(o.tag_), alloc_(o.alloc_) {}
  // Gives its memory back and takes o's; o is left empty.
  tensor& operator=(tensor&& o) noexcept {
    if (this != &o) {
      release();
      view_ = std::exchange(o.view_, view_type{});
      tag_ = o.tag_;
      alloc_ = o.alloc_;
    }
    return *this;
  }
  tensor(tensor const&) = delete;
  tensor& operator=(tensor const&) = delete;
  ~tensor() { release(); }

  // The first element (null when empty).
  T* data() { return view_.data(); }
  T const* data() const { return view_.data(); }
  std::size_t rows() const { return view_.rows(); }     // the batch's rows
  std::size_t cols() const { return view_.cols(); }     // elements per row
  std::size_t size() const { return view_.size(); }     // rows x cols
  std::size_t bytes() const { return view_.bytes(); }   // size() x sizeof(T)
  bool empty() const { return view_.empty(); }          // no elements
  memory::tag tag() const { return tag_; }              // what the allocator counts it as
  allocator_type* allocator() const { return alloc_; }  // where it gives its memory back (null: nowhere)

  // A view of all of it.
  view_type view() { return view_; }
  const_view_type view() const { return view_; }
  operator view_type() { return view_; }               // (view(), implicitly)
  operator const_view_type() const { return view_; }   // (view(), implicitly)
  // Rows [first, first + count), as a view (shape_error past the end).
  view_type row_range(std::size_t first, std::size_t count) { return view_.row_range(first, count); }
  const_view_type row_range(std::size_t first, std::size_t count) const {
    return const_view_type(view_).row_range(first, count);
  }

  // Element i in row-major order (host memory).
  T& operator[](std::size_t i)
    requires std::is_same_v<Device, host>
  {
    return view_[i];
  }
  T const& operator[](std::size_t i) const
    requires std::is_same_v<Device, host>
  {
    return view_[i];
  }
  // The element of row r and column c (host memory).
  T& operator()(std::size_t r, std::size_t c)
    requires std::is_same_v<Device, host>
  {
    return view_(r, c);
  }
  T const& operator()(std::size_t r, std::size_t c) const
    requires std::is_same_v<Device, host>
  {
    return view_(r, c);
  }

  // A copy of the elements in host memory.
  std::vector<T> to_vector() const {
    std::vector<T> out(size());
    if (size()) memory::system<Device>::copy_to_host(out.data(), data(), bytes());
    return out;
  }

  // Overwrites every element from host memory; the sizes must match.
  void copy_from(std::span<T const> values) {
    if (values.size() != size())
      detail::raise<shape_error>("tensor::copy_from: expected ", size(), " values (", rows(), " x ", cols(),
                                 "), found ", values.size());
    if (size()) memory::system<Device>::copy_from_host(data(), values.data(), bytes());
  }

 private:
  struct unchecked {};
  tensor(unchecked, std::size_t rows, std::size_t cols, memory::tag tag, allocator_type& alloc)
      : tag_(tag), alloc_(&alloc) {
    if (rows > std::numeric_limits<std::size_t>::max() / sizeof(T) / cols)
      detail::raise<argument_error>("tensor: ", rows, " x ", cols, " elements of ", sizeof(T),
                                    " bytes do not fit in memory's address range");
    void* p = alloc.allocate(rows * cols * sizeof(T), tag);
    view_ = view_type(static_cast<T*>(p), rows, cols);
  }

  void release() noexcept {
    if (alloc_ && view_.data()) alloc_->deallocate(view_.data());
    view_ = view_type{};
  }

  view_type view_{};
  memory::tag tag_ = memory::tag::activations;
  allocator_type* alloc_ = nullptr;
};

// The elements of a view, copied to host memory.
template <class T, class Device, std::size_t Width>
std::vector<std::remove_cv_t<T>> tensor_to_host(tensor_view<T, Device, Width> v) {
  std::vector<std::remove_cv_t<T>> out(v.size());
  if (v.size()) memory::system<Device>::copy_to_host(out.data(), v.data(), v.bytes());
  return out;
}

// Overwrites a view's elements from host memory; the sizes must match.
template <class T, class Device, std::size_t Width>
void tensor_from_host(tensor_view<T, Device, Width> v, std::span<T const> values) {
  if (values.size() != v.size())
    detail::raise<shape_error>("tensor_from_host: expected ", v.size(), " values, found ", values.size());
  if (v.size()) memory::system<Device>::copy_from_host(v.data(), values.data(), v.bytes());
}

}  // namespace REMAT_NAMESPACE
