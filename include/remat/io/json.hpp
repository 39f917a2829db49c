// The JSON a file format needs (safetensors' header): a string escaped for writing, and a reader of
// the subset such headers use (objects, arrays of non-negative integers, strings with every
// escape, surrogate pairs included). Every error is an io_error naming the byte where it was met.
#pragma once

#include "../error.hpp"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace REMAT_NAMESPACE {
namespace safetensors {
namespace detail {

// `s` as the inside of a JSON string: quotes and backslashes escaped, control characters as \u00XX.
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

// A reader of JSON text; `context` begins its errors ("safetensors header").
class json_reader {
 public:
  json_reader(std::string const& s, char const* context) : s_(s), context_(context) {}

  // Reads an object (after any white space): for each member, its key, then f(key) with the
  // reader at the value, which f reads.
  template <class F>
  void members(F&& f) {
    skip();
    expect('{');
    skip();
    if (peek() == '}') return void(++i_);
    for (;;) {
      std::string const key = string();
      skip();
      expect(':');
      skip();
      f(key);
      skip();
      if (peek() == ',') {
        ++i_;
        skip();
        continue;
      }
      expect('}');
      return;
    }
  }
  // An array of non-negative integers, each below 2^64.
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
  // A string, its escapes decoded (\\u escapes as UTF-8).
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
  // The next character (the end of the text fails).
  char peek() {
    if (i_ >= s_.size()) fail("unexpected end of header");
    return s_[i_];
  }
  // Consumes c, or fails.
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found '" + s_[i_] + "'");
    ++i_;
  }
  // Skips white space.
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  // Fails: io_error with the reader's context and position.
  [[noreturn]] void fail(std::string const& what) const {
    REMAT_NAMESPACE::detail::raise<io_error>(context_, ": ", what, " at byte ", i_);
  }
 private:
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
  std::string const& s_;
  char const* context_;
  std::size_t i_ = 0;
};

}  // namespace detail
}  // namespace safetensors
}  // namespace REMAT_NAMESPACE
