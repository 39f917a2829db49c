// The safetensors file format, the one PyTorch users exchange weights in: an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
// then the raw little-endian data. read() checks everything (header, offsets, sizes) before it
// returns; write() is atomic (io/atomic_file.hpp): a failed write leaves the previous file as it
// was. A model's and an optimizer's files are io/checkpoint.hpp's.
#pragma once

#include "../error.hpp"
#include "../numeric/small_float.hpp"
#include "atomic_file.hpp"
#include "json.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace safetensors {

static_assert(std::endian::native == std::endian::little,
              "remat::safetensors: files are little-endian; this reader maps them directly");

// One tensor of a file read: its dtype, shape and bytes (read() has checked that the bytes are
// the shape's elements of the dtype, and lie in the data section).
struct tensor_info {
  std::string dtype;               // "F32", "BF16", "I64", ... (the format's names)
  std::vector<std::size_t> shape;  // row-major, outermost first; {} for a scalar
  std::size_t begin = 0;           // its first byte within the data section
  std::size_t end = 0;             // one past its last byte within the data section
};

// A whole safetensors file, as read(): its tensors by name, the header's "__metadata__" and the
// data section.
struct file {
  std::map<std::string, tensor_info> tensors;   // by name
  std::map<std::string, std::string> metadata;  // string to string, as the format allows
  std::vector<char> data;                       // the data section, which tensors index
};

// The format's dtype name of T ("F32" for float, "BF16" for bfloat16, ...).
template <class T>
constexpr char const* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "I32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "I64";
  else if constexpr (std::is_same_v<T, half>) return "F16";
  else if constexpr (std::is_same_v<T, bfloat16>) return "BF16";
  else static_assert(sizeof(T) == 0, "safetensors: unsupported element type");
}

namespace detail {

inline std::size_t dtype_size(std::string const& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

// The header's JSON: "__metadata__" (string to string) and each tensor's dtype, shape and
// data_offsets, nothing else.
inline file parse_header(std::string const& header) {
  file f;
  json_reader j(header, "safetensors header");
  j.members([&](std::string const& key) {
    if (key == "__metadata__") return j.members([&](std::string const& k) { f.metadata[k] = j.string(); });
    if (f.tensors.count(key)) j.fail("tensor '" + key + "' appears twice");
    tensor_info& t = f.tensors[key];
    bool has_dtype = false, has_shape = false, has_offsets = false;
    j.members([&](std::string const& k) {
      if (k == "dtype") {
        t.dtype = j.string(), has_dtype = true;
      } else if (k == "shape") {
        t.shape = j.integers(), has_shape = true;
      } else if (k == "data_offsets") {
        auto const o = j.integers();
        if (o.size() != 2) j.fail("data_offsets of '" + key + "' must hold two numbers");
        t.begin = o[0], t.end = o[1], has_offsets = true;
      } else {
        j.fail("unexpected field '" + k + "' in tensor '" + key + "'");
      }
    });
    if (!has_dtype || !has_shape || !has_offsets) j.fail("tensor '" + key + "' lacks dtype, shape or data_offsets");
  });
  return f;
}

}  // namespace detail

// One tensor to write: name, dtype, shape and host bytes.
struct entry {
  std::string name;                // unique in the file
  std::string dtype;               // the format's name (dtype_name<T>())
  std::vector<std::size_t> shape;  // row-major, outermost first
  void const* data;                // host memory, read while write() runs
  std::size_t bytes;               // the shape's elements times the dtype's size
};

// Writes `entries` (their data in the order given) and `metadata` to `path` atomically:
// into a temporary file beside it, flushed, synced and renamed over it, so a failure leaves the
// previous file as it was and no temporary behind; io_error says what failed.
inline void write(std::string const& path, std::vector<entry> const& entries,
                  std::map<std::string, std::string> const& metadata = {}) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (auto const& [k, v] : metadata) {
      if (!first) h += ",";
      first = false;
      h += "\"" + detail::json_escape(k) + "\":\"" + detail::json_escape(v) + "\"";
    }
    h += "}";
  }
  std::size_t offset = 0;
  for (entry const& e : entries) {
    if (h.size() > 1) h += ",";
    h += "\"" + detail::json_escape(e.name) + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < e.shape.size(); ++i) h += (i ? "," : "") + std::to_string(e.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.bytes) + "]}";
    offset += e.bytes;
  }
  h += "}";
  while (h.size() % 8) h += ' ';  // the data section starts 8-byte aligned
  std::uint64_t const n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  detail::atomic_file out(path);
  out.write(len, 8);
  out.write(h.data(), h.size());
  for (entry const& e : entries) out.write(e.data, e.bytes);
  out.commit();
}

// Reads and checks a whole file: header well formed, offsets contiguous and within the data,
// sizes consistent with dtype and shape.
inline file read(std::string const& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) REMAT_NAMESPACE::detail::raise<io_error>("safetensors: cannot open '", path, "'");
  std::size_t const size = std::size_t(in.tellg());
  in.seekg(0);
  if (size < 8)
    REMAT_NAMESPACE::detail::raise<io_error>("safetensors: '", path, "' is ", size,
                                             " bytes, expected at least the 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(len[i]) << (8 * i);
  if (n > size - 8 || n > (std::uint64_t(100) << 20))
    REMAT_NAMESPACE::detail::raise<io_error>("safetensors: '", path, "' announces a header of ", n,
                                             " bytes, but only ", size - 8, " follow (truncated or not safetensors)");
  std::string header(n, '\0');
  in.read(header.data(), std::streamsize(n));
  file f = detail::parse_header(header);
  f.data.resize(size - 8 - n);
  in.read(f.data.data(), std::streamsize(f.data.size()));
  if (!in) REMAT_NAMESPACE::detail::raise<io_error>("safetensors: reading '", path, "' failed");
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (auto const& [name, t] : f.tensors) {
    std::size_t const es = detail::dtype_size(t.dtype);
    if (es == 0) REMAT_NAMESPACE::detail::raise<io_error>("safetensors: tensor '", name, "' has unknown dtype '", t.dtype, "'");
    std::size_t count = 1;
    for (auto d : t.shape) {
      if (d != 0 && count > std::size_t(-1) / es / d)
        REMAT_NAMESPACE::detail::raise<io_error>("safetensors: tensor '", name, "' has a shape whose ", t.dtype,
                                                 " bytes do not fit in 64 bits");
      count *= d;
    }
    if (t.end < t.begin || t.end - t.begin != count * es)
      REMAT_NAMESPACE::detail::raise<io_error>("safetensors: tensor '", name, "' of ", count, " ", t.dtype,
                                               " elements expected ", count * es, " bytes, its offsets give ",
                                               t.end - t.begin);
    if (t.end > f.data.size())
      REMAT_NAMESPACE::detail::raise<io_error>("safetensors: tensor '", name, "' ends at byte ", t.end,
                                               " of a data section of ", f.data.size(), " bytes (truncated file?)");
    ranges.push_back({t.begin, t.end});
  }
  std::sort(ranges.begin(), ranges.end());
  std::size_t at = 0;
  for (auto [b, e] : ranges) {
    if (b != at) REMAT_NAMESPACE::detail::raise<io_error>("safetensors: tensor data overlaps or leaves a gap at byte ", at);
    at = e;
  }
  if (at != f.data.size())
    REMAT_NAMESPACE::detail::raise<io_error>("safetensors: ", f.data.size() - at, " bytes after the last tensor");
  return f;
}

}  // namespace safetensors
}  // namespace REMAT_NAMESPACE
