// Model weights (and optimizer state) as safetensors files, the format PyTorch users exchange:
// an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian data. Loading checks everything against the model before it
// changes a single parameter. Saving is atomic: a save that fails (a full disk, no permission)
// leaves the previous file as it was, and no temporary file behind.
#pragma once

#include "../error.hpp"
#include "../runtime/model.hpp"
#include "../train/optimizers.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <vector>

// Atomic, durable saves through POSIX (open, fsync, rename); elsewhere through the C++ library
// (rename without fsync).
#if __has_include(<unistd.h>) && __has_include(<fcntl.h>)
#define REMAT_POSIX_FILES 1
#include <fcntl.h>
#include <unistd.h>
#else
#define REMAT_POSIX_FILES 0
#endif

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

inline std::string json_escape(std::string const& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out;
}

// A reader for the JSON subset safetensors headers use: objects, arrays, strings, integers.
class json_reader {
 public:
  explicit json_reader(std::string const& s) : s_(s) {}

  file parse_header() {
    file f;
    skip();
    expect('{');
    skip();
    if (peek() == '}') return ++i_, f;
    for (;;) {
      std::string const key = string();
      skip();
      expect(':');
      skip();
      if (key == "__metadata__") {
        expect('{');
        skip();
        if (peek() != '}')
          for (;;) {
            std::string k = string();
            skip();
            expect(':');
            skip();
            f.metadata[k] = string();
            skip();
            if (peek() == ',') { ++i_; skip(); continue; }
            break;
          }
        expect('}');
      } else {
        if (f.tensors.count(key)) fail("tensor '" + key + "' appears twice");
        f.tensors[key] = tensor_entry(key);
      }
      skip();
      if (peek() == ',') { ++i_; skip(); continue; }
      expect('}');
      break;
    }
    return f;
  }

 private:
  tensor_info tensor_entry(std::string const& name) {
    tensor_info t;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    expect('{');
    skip();
    for (;;) {
      std::string const k = string();
      skip();
      expect(':');
      skip();
      if (k == "dtype") t.dtype = string(), has_dtype = true;
      else if (k == "shape") t.shape = integers(), has_shape = true;
      else if (k == "data_offsets") {
        auto o = integers();
        if (o.size() != 2) fail("data_offsets of '" + name + "' must hold two numbers");
        t.begin = o[0], t.end = o[1], has_offsets = true;
      } else fail("unexpected field '" + k + "' in tensor '" + name + "'");
      skip();
      if (peek() == ',') { ++i_; skip(); continue; }
      expect('}');
      break;
    }
    if (!has_dtype || !has_shape || !has_offsets) fail("tensor '" + name + "' lacks dtype, shape or data_offsets");
    return t;
  }
  std::vector<std::size_t> integers() {
    std::vector<std::size_t> v;
    expect('[');
    skip();
    if (peek() == ']') return ++i_, v;
    for (;;) {
      std::size_t n = 0;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative integer");
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        std::size_t const d = std::size_t(s_[i_++] - '0');
        if (n > (std::size_t(-1) - d) / 10) fail("integer too large");
        n = n * 10 + d;
      }
      v.push_back(n);
      skip();
      if (peek() == ',') { ++i_; skip(); continue; }
      expect(']');
      return v;
    }
  }
  std::string string() {
    expect('"');
    std::string out;
    while (peek() != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        char e = peek();
        ++i_;
        if (e == 'u') {
          std::uint32_t v = hex4();
          if (v >= 0xdc00 && v < 0xe000) fail("a \\u escape holds a low surrogate without a high one");
          if (v >= 0xd800 && v < 0xdc00) {  // a high surrogate: a low one must follow (JSON's UTF-16 pair)
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              fail("a \\u escape holds a high surrogate without a low one");
            i_ += 2;
            std::uint32_t const lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("a \\u escape holds a high surrogate without a low one");
            v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
          }
          if (v < 0x80) out += char(v);
          else if (v < 0x800) out += char(0xc0 | (v >> 6)), out += char(0x80 | (v & 0x3f));
          else if (v < 0x10000)
            out += char(0xe0 | (v >> 12)), out += char(0x80 | ((v >> 6) & 0x3f)), out += char(0x80 | (v & 0x3f));
          else
            out += char(0xf0 | (v >> 18)), out += char(0x80 | ((v >> 12) & 0x3f)),
                out += char(0x80 | ((v >> 6) & 0x3f)), out += char(0x80 | (v & 0x3f));
        } else if (e == 'n') out += '\n';
        else if (e == 't') out += '\t';
        else if (e == 'r') out += '\r';
        else if (e == 'b') out += '\b';
        else if (e == 'f') out += '\f';
        else if (e == '"' || e == '\\' || e == '/') out += e;
        else fail(std::string("an unknown escape '\\") + e + "'");
      } else if (static_cast<unsigned char>(c) < 0x20) {
        --i_;
        fail("a control character inside a string");
      } else {
        out += c;
      }
    }
    ++i_;
    return out;
  }
  // The four hex digits after a backslash-u escape.
  std::uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("a \\u escape needs four hex digits");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char const h = s_[i_];
      std::uint32_t d;
      if (h >= '0' && h <= '9') d = std::uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') d = std::uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') d = std::uint32_t(h - 'A' + 10);
      else fail(std::string("a \\u escape needs four hex digits, found '") + h + "'");
      v = v * 16 + d;
      ++i_;
    }
    return v;
  }
  char peek() {
    if (i_ >= s_.size()) fail("unexpected end of header");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found '" + s_[i_] + "'");
    ++i_;
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  [[noreturn]] void fail(std::string const& what) const {
    REMAT_NAMESPACE::detail::raise<io_error>("safetensors header: ", what, " at byte ", i_);
  }
  std::string const& s_;
  std::size_t i_ = 0;
};

inline std::size_t dtype_size(std::string const& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

// A file written whole or not at all: the bytes go to a temporary file beside the target (same
// directory, so the same file system), which is flushed to the disk (fsync) and then renamed over
// the target (rename is atomic); the directory is synced so the rename survives a crash. On any
// failure (a full disk, no permission, an exception before commit) the temporary file is removed
// and the target is left as it was: the previous file, byte for byte, or none.
class atomic_file {
 public:
  explicit atomic_file(std::string path) : path_(std::move(path)) {
    static std::atomic<unsigned> counter{0};
#if REMAT_POSIX_FILES
    tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      int const e = errno;
      std::string const t = std::exchange(tmp_, std::string());  // (not ours to remove)
      fail("cannot create '", t, "' beside it: ", std::strerror(e));
    }
#else
    tmp_ = path_ + ".tmp-" + std::to_string(counter++);
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) {
      std::string const t = std::exchange(tmp_, std::string());
      fail("cannot create '", t, "' beside it");
    }
#endif
  }
  atomic_file(atomic_file const&) = delete;
  atomic_file& operator=(atomic_file const&) = delete;
  ~atomic_file() { discard(); }

  void write(void const* data, std::size_t bytes) {
#if REMAT_POSIX_FILES
    char const* p = static_cast<char const*>(data);
    while (bytes > 0) {
      ::ssize_t const w = ::write(fd_, p, std::min<std::size_t>(bytes, std::size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("writing failed after ", written_, " bytes: ", w < 0 ? std::strerror(errno) : "no progress");
      p += w;
      bytes -= std::size_t(w);
      written_ += std::size_t(w);
    }
#else
    out_.write(static_cast<char const*>(data), std::streamsize(bytes));
    if (!out_) fail("writing failed after ", written_, " bytes");
    written_ += bytes;
#endif
  }

  // Makes the file the target's content (durably, where the system allows).
  void commit() {
#if REMAT_POSIX_FILES
    if (::fsync(fd_) != 0) fail("fsync failed: ", std::strerror(errno));
    int const fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("closing failed: ", std::strerror(errno));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming it over the target failed: ", std::strerror(errno));
    tmp_.clear();
    std::string const dir = path_.find('/') == std::string::npos ? "." : path_.substr(0, path_.rfind('/') + 1);
    int const d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {  // (best effort: the data are in place either way)
      (void)::fsync(d);
      ::close(d);
    }
#else
    out_.close();
    if (!out_) fail("closing failed");
    std::remove(path_.c_str());
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming it over the target failed");
    tmp_.clear();
#endif
  }

 private:
  void discard() noexcept {
#if REMAT_POSIX_FILES
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
#else
    if (out_.is_open()) out_.close();
#endif
    if (!tmp_.empty()) std::remove(tmp_.c_str());
    tmp_.clear();
  }
  template <class... Parts>
  [[noreturn]] void fail(Parts const&... parts) {
    discard();
    REMAT_NAMESPACE::detail::raise<io_error>("safetensors: writing '", path_, "': ", parts...,
                                             "; the file is left as it was");
  }

  std::string path_, tmp_;
  std::size_t written_ = 0;
#if REMAT_POSIX_FILES
  int fd_ = -1;
#else
  std::ofstream out_;
#endif
};

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
  file f = detail::json_reader(header).parse_header();
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

// The model's parameters, one safetensors tensor per parameter tensor, named as in
// model::parameter_table() ("0.weight", "2.1.0.bias", ...). Metadata records the model. A model
// that holds one rank's shard of its parameters only (ZeRO-3: model::parameters_whole() is false)
// is refused with argument_error, and no file is written: save it with remat::dist::save.
template <class Net, class Device, class Precision>
void save(model<Net, Device, Precision> const& m, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  using T = typename Precision::master;
  if (!m.parameters_whole())
    detail::raise<argument_error>(
        "save '", path, "': expected a model that holds every parameter, found one rank's shard of them only (a "
        "remat::dist::data_parallel with shard_parameters, ZeRO-3; the rest read as zero); save it with "
        "remat::dist::save(dp, path), which gathers them, or call dp.gather_parameters() on every rank first");
  std::vector<T> host = tensor_to_host(m.parameters());
  std::vector<safetensors::entry> entries;
  for (named_param const& p : m.parameter_table())
    entries.push_back({p.name, safetensors::dtype_name<T>(), p.shape, host.data() + p.offset, p.size() * sizeof(T)});
  std::vector<T> buffers;
  if constexpr (model<Net, Device, Precision>::buffer_count > 0) {
    buffers = tensor_to_host(m.buffers());
    for (named_param const& b : m.buffer_table())
      entries.push_back(
          {b.name, safetensors::dtype_name<T>(), b.shape, buffers.data() + b.offset, b.size() * sizeof(T)});
  }
  metadata["format"] = "pt";
  metadata["remat.parameters"] = std::to_string(m.parameter_count);
  safetensors::write(path, entries, metadata);
}

namespace detail {

// load()'s work, without its refusal of a model whose parameters a ZeRO-3 wrapper shards
// (dist::load reads the file on rank 0 with it, then keeps each rank's shard).
template <class Net, class Device, class Precision>
void load_parameters(model<Net, Device, Precision>& m, std::string const& path) {
  using T = typename Precision::master;
  constexpr bool has_buffers = model<Net, Device, Precision>::buffer_count > 0;
  safetensors::file const f = safetensors::read(path);
  auto const table = m.parameter_table();
  auto const buffer_table = m.buffer_table();
  // Every tensor of `names` read into `into` (checked first; nothing is written before all are).
  auto gather = [&](std::vector<named_param> const& names, std::vector<T>& into) {
    for (named_param const& p : names) {
      auto it = f.tensors.find(p.name);
      if (it == f.tensors.end())
        detail::raise<io_error>("load '", path, "': expected a tensor '", p.name, "' for this model, found none (",
                                f.tensors.size(), " tensors in the file: a file for another model?)");
      safetensors::tensor_info const& t = it->second;
      if (t.dtype != safetensors::dtype_name<T>())
        detail::raise<io_error>("load '", path, "': tensor '", p.name, "' expected dtype ",
                                safetensors::dtype_name<T>(), ", found ", t.dtype);
      if (t.shape != p.shape) {
        std::string want, got;
        for (auto d : p.shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
        for (auto d : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
        detail::raise<io_error>("load '", path, "': tensor '", p.name, "' expected shape [", want, "], found [", got,
                                "]");
      }
      std::memcpy(into.data() + p.offset, f.data.data() + t.begin, t.end - t.begin);
    }
  };
  std::vector<T> host(m.parameter_count), buffers(m.buffer_count);
  gather(table, host);
  gather(buffer_table, buffers);
  if (f.tensors.size() != table.size() + buffer_table.size())
    for (auto const& [name, t] : f.tensors) {
      bool known = false;
      for (auto const& p : table) known = known || p.name == name;
      for (auto const& p : buffer_table) known = known || p.name == name;
      if (!known)
        detail::raise<io_error>("load '", path, "': the file has a tensor '", name,
                                "' that this model does not (a file for another model?)");
    }
  tensor_from_host(m.parameters(), std::span<T const>(host));
  m.link().set_partial_parameters(false);  // (every parameter is written)
  if constexpr (has_buffers) tensor_from_host(m.buffers(), std::span<T const>(buffers));
}

}  // namespace detail

// Loads parameters saved by save() (or by PyTorch with the same names, shapes and dtype). Any
// difference (a missing or extra tensor, another shape or dtype, a corrupt or truncated file)
// throws io_error and leaves the model as it was. A model whose parameters a ZeRO-3 wrapper
// shards across more than one rank is refused with argument_error (each rank would hold the
// whole file's values, and the ranks might load different files): load it with remat::dist::load.
template <class Net, class Device, class Precision>
void load(model<Net, Device, Precision>& m, std::string const& path) {
  if (detail::gradient_sync const* s = m.link().gradient_sync(); s && s->gathers_parameters())
    detail::raise<argument_error>(
        "load '", path, "': this model's parameters are sharded across the ranks of a remat::dist::data_parallel "
        "with shard_parameters (ZeRO-3); load them with remat::dist::load(dp, path) on every rank, which reads the "
        "file on rank 0 and keeps each rank's shard");
  detail::load_parameters(m, path);
}

namespace detail {

// The metadata an optimizer's file carries beside its tensors: its kind, step count and the loss
// scale of the model it serves, read and checked (a counter is decimal digits that fit in 64 bits,
// a scale a finite positive number) before anything is changed.
struct optimizer_state {
  std::uint64_t step = 0;
  std::optional<double> scale;
  std::optional<std::uint64_t> tracker, skipped;
  // Checks the scale against the optimizer's loss scale on a copy, then sets the loss scale and the
  // step count (all or nothing).
  template <class O>
  void apply(O& opt) const {
    if (opt.scaler() && scale) {
      loss_scaler check = *opt.scaler();
      check.set_state(*scale, tracker.value_or(0), skipped.value_or(0));
      *opt.scaler() = check;
    }
    opt.set_steps(step);
  }
};

inline optimizer_state optimizer_state_of(safetensors::file const& f, std::string const& path, char const* kind) {
  auto text = [&](char const* key, bool required) -> std::optional<std::string> {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) {
      if (required) raise<io_error>("load '", path, "': expected metadata '", key, "', found none");
      return std::nullopt;
    }
    return it->second;
  };
  // Counters: decimal digits that fit in 64 bits (save writes them so), nothing else.
  auto counter = [&](char const* key, bool required) -> std::optional<std::uint64_t> {
    auto const t = text(key, required);
    if (!t) return std::nullopt;
    std::uint64_t x = 0;
    auto const [end, ec] = std::from_chars(t->data(), t->data() + t->size(), x);
    if (t->empty() || ec != std::errc() || end != t->data() + t->size())
      raise<io_error>("load '", path, "': metadata '", key, "' expected a whole number below 2^64, found '", *t, "'");
    return x;
  };
  if (auto const k = text("remat.optimizer", false); k && *k != kind)
    raise<io_error>("load '", path, "': expected the state of ", kind, ", found the state of ", *k);
  auto const step = counter("remat.step", true);
  auto const tracker = counter("remat.loss_scale_growth_tracker", false);
  auto const skipped = counter("remat.loss_scale_skipped_steps", false);
  std::optional<double> scale;
  if (auto const t = text("remat.loss_scale", false)) {
    char* end = nullptr;
    double const x = std::strtod(t->c_str(), &end);
    if (t->empty() || *end != '\0' || !std::isfinite(x) || !(x > 0))
      raise<io_error>("load '", path, "': metadata 'remat.loss_scale' expected a finite positive number, found '",
                      *t, "'");
    scale = x;
  }
  return {*step, scale, tracker, skipped};
}

// The metadata save writes for an optimizer: its kind, step count and its model's loss scale.
template <class O>
void optimizer_metadata(O const& opt, char const* kind, std::map<std::string, std::string>& metadata) {
  metadata["remat.optimizer"] = kind;
  metadata["remat.step"] = std::to_string(opt.steps());
  if (loss_scaler const* s = opt.scaler()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", s->scale());
    metadata["remat.loss_scale"] = buf;
    metadata["remat.loss_scale_growth_tracker"] = std::to_string(s->growth_tracker());
    metadata["remat.loss_scale_skipped_steps"] = std::to_string(s->skipped_steps());
  }
}

// Writes an AdamW state (moments of the whole model, step, loss scale) as save(opt, path) does
// (opt: an AdamW or an OffloadedAdamW).
template <class T, class Opt>
void save_adamw(std::vector<T> const& m, std::vector<T> const& v, Opt const& opt, std::string const& path,
                std::map<std::string, std::string> metadata) {
  std::vector<safetensors::entry> entries{
      {"exp_avg", safetensors::dtype_name<T>(), {m.size()}, m.data(), m.size() * sizeof(T)},
      {"exp_avg_sq", safetensors::dtype_name<T>(), {v.size()}, v.data(), v.size() * sizeof(T)}};
  optimizer_metadata(opt, "AdamW", metadata);
  safetensors::write(path, entries, metadata);
}

// An AdamW state read from a file and checked against an optimizer, not applied yet.
template <class T>
struct adamw_read {
  optimizer_state state;
  std::vector<T> m, v;  // the optimizer's part of the moments
};

// Reads a saved AdamW state of `total` parameters for an optimizer over [offset, offset + its
// size) of them and checks it (loss scale included) without changing the optimizer.
// (f: the file read from path.)
template <class Opt>
auto read_adamw(Opt const& opt, safetensors::file const& f, std::string const& path, std::size_t total,
                std::size_t offset) {
  using T = typename std::remove_cvref_t<decltype(opt.exp_avg())>::value_type;
  adamw_read<T> r{optimizer_state_of(f, path, "AdamW"), {}, {}};
  std::size_t const n = opt.exp_avg().size();
  r.m.resize(n);
  r.v.resize(n);
  for (auto [name, out] : {std::pair<char const*, std::vector<T>*>{"exp_avg", &r.m}, {"exp_avg_sq", &r.v}}) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end())
      raise<io_error>("load '", path, "': expected an AdamW state with a tensor '", name, "', found none");
    safetensors::tensor_info const& t = it->second;
    if (t.dtype != safetensors::dtype_name<T>() || t.shape != std::vector<std::size_t>{total})
      raise<io_error>("load '", path, "': tensor '", name, "' expected ", safetensors::dtype_name<T>(), " [", total,
                      "], found ", t.dtype, " with ", t.end - t.begin, " bytes");
    std::memcpy(out->data(), f.data.data() + t.begin + offset * sizeof(T), n * sizeof(T));
  }
  if (opt.scaler() && r.state.scale) {  // (the scale's own checks, on a copy)
    loss_scaler check = *opt.scaler();
    check.set_state(*r.state.scale, r.state.tracker.value_or(0), r.state.skipped.value_or(0));
  }
  return r;
}
template <class Opt>
auto read_adamw(Opt const& opt, std::string const& path, std::size_t total, std::size_t offset) {
  return read_adamw(opt, safetensors::read(path), path, total, offset);
}

// Applies what read_adamw read and checked.
template <class Opt, class T>
void apply_adamw(Opt& opt, adamw_read<T> const& r) {
  r.state.apply(opt);
  tensor_from_host(opt.exp_avg().view(), std::span<T const>(r.m));
  tensor_from_host(opt.exp_avg_sq().view(), std::span<T const>(r.v));
}

// Reads a saved AdamW state of `total` parameters into an optimizer over [offset, offset + its
// size) of them: all or nothing.
template <class Opt>
void load_adamw(Opt& opt, std::string const& path, std::size_t total, std::size_t offset) {
  apply_adamw(opt, read_adamw(opt, path, total, offset));
}

}  // namespace detail

// An AdamW optimizer's state: its moments ("exp_avg", "exp_avg_sq", as in PyTorch's state dict)
// and, in the metadata, its step count and the loss scale of the model it serves (value, growth
// tracker, skipped steps), so a run with a dynamic loss scale resumes where it stopped.
template <class T, class D, class C>
void save(AdamW<T, D, C> const& opt, std::string const& path, std::map<std::string, std::string> metadata = {}) {
  detail::save_adamw(tensor_to_host(opt.exp_avg().view()), tensor_to_host(opt.exp_avg_sq().view()), opt, path,
                     std::move(metadata));
}

// Restores what save(opt, path) wrote, all or nothing: a file for another model (sizes, dtype)
// or a corrupt one throws io_error and leaves the optimizer and its loss scale as they were.
template <class T, class D, class C>
void load(AdamW<T, D, C>& opt, std::string const& path) {
  detail::load_adamw(opt, path, opt.exp_avg().size(), 0);
}

// An OffloadedAdamW's state, in AdamW's format: either optimizer loads what the other saved.
template <class Model>
void save(OffloadedAdamW<Model> const& opt, std::string const& path, std::map<std::string, std::string> metadata = {}) {
  detail::save_adamw(tensor_to_host(opt.exp_avg().view()), tensor_to_host(opt.exp_avg_sq().view()), opt, path,
                     std::move(metadata));
}

// Restores what save(opt, path) wrote (from an AdamW or an OffloadedAdamW), all or nothing.
template <class Model>
void load(OffloadedAdamW<Model>& opt, std::string const& path) {
  detail::load_adamw(opt, path, opt.exp_avg().size(), 0);
}

// An SGD optimizer's state: its momentum buffer ("momentum_buffer", as in PyTorch's state dict;
// none without momentum) and, in the metadata, its step count and its model's loss scale.
template <class T, class D, class C>
void save(SGD<T, D, C> const& opt, std::string const& path, std::map<std::string, std::string> metadata = {}) {
  std::vector<T> const buf = opt.momentum_buffer().empty() ? std::vector<T>{} : opt.momentum_buffer().to_vector();
  std::vector<safetensors::entry> entries;
  if (!buf.empty())
    entries.push_back({"momentum_buffer", safetensors::dtype_name<T>(), {buf.size()}, buf.data(), buf.size() * sizeof(T)});
  detail::optimizer_metadata(opt, "SGD", metadata);
  safetensors::write(path, entries, metadata);
}

// Restores what save(sgd, path) wrote, all or nothing: a file of another optimizer, of an SGD with
// or without momentum where this one differs, of another size, or a corrupt one throws io_error
// and leaves the optimizer and its loss scale as they were.
template <class T, class D, class C>
void load(SGD<T, D, C>& opt, std::string const& path) {
  safetensors::file const f = safetensors::read(path);
  detail::optimizer_state const state = detail::optimizer_state_of(f, path, "SGD");
  auto const it = f.tensors.find("momentum_buffer");
  bool const momentum = !opt.momentum_buffer().empty();
  if (momentum && it == f.tensors.end())
    detail::raise<io_error>("load '", path, "': expected an SGD state with a tensor 'momentum_buffer' (this SGD has ",
                            "momentum ", opt.options().momentum, "), found none");
  if (!momentum && it != f.tensors.end())
    detail::raise<io_error>("load '", path, "': expected an SGD state without momentum (this SGD has none), found a ",
                            "tensor 'momentum_buffer'");
  std::size_t const n = opt.momentum_buffer().size();
  std::vector<T> buf(n);
  if (momentum) {
    safetensors::tensor_info const& t = it->second;
    if (t.dtype != safetensors::dtype_name<T>() || t.shape != std::vector<std::size_t>{n})
      detail::raise<io_error>("load '", path, "': tensor 'momentum_buffer' expected ", safetensors::dtype_name<T>(),
                              " [", n, "], found ", t.dtype, " with ", t.end - t.begin, " bytes");
    std::memcpy(buf.data(), f.data.data() + t.begin, n * sizeof(T));
  }
  if (f.tensors.size() != (momentum ? 1u : 0u))
    for (auto const& [name, t] : f.tensors)
      if (name != "momentum_buffer")
        detail::raise<io_error>("load '", path, "': expected an SGD state, found a tensor '", name, "'");
  state.apply(opt);
  if (momentum) tensor_from_host(opt.momentum_buffer().view(), std::span<T const>(buf));
}

}  // namespace REMAT_NAMESPACE
