// A file written whole or not at all (POSIX: a temporary file beside the target, fsync, rename,
// and the directory synced; elsewhere a plain stream renamed into place).
#pragma once

#include "../error.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

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
namespace detail {

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
}  // namespace safetensors
}  // namespace REMAT_NAMESPACE
