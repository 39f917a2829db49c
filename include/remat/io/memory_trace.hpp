// remat::memory_trace(timeline, path): a memory::timeline in the Chrome trace event format
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), which
// Perfetto (ui.perfetto.dev) and chrome://tracing open:
//
//   - a counter track "memory" with the bytes in use per tag after every allocation and free;
//   - one span per leaf layer call (thread "layers"), named by its path ("2.3.1 Linear"), its
//     category the phase (forward, recomputation, backward);
//   - one instant event per allocation and free (thread "allocations") with its bytes, tag, layer
//     and phase.
//
// Timestamps are microseconds since the recording started. bench/plot_memory_trace.py draws the
// counter track as a PNG.
#pragma once

#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "../memory/trace.hpp"

#include <cstdio>
#include <fstream>
#include <string>

namespace REMAT_NAMESPACE {

namespace detail {

inline std::string json_string(std::string const& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace detail

// The trace as text.
inline std::string memory_trace_json(memory::timeline const& t) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"remat memory\"}},\n";
  out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": \"layers\"}},\n";
  out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"args\": {\"name\": \"allocations\"}}";
  char buf[512];
  auto const& paths = t.paths();
  for (auto const& e : t.events()) {
    out += ",\n{\"name\": \"memory\", \"ph\": \"C\", \"pid\": 1, \"ts\": ";
    std::snprintf(buf, sizeof buf, "%.3f", e.time_us);
    out += buf;
    out += ", \"args\": {";
    for (std::size_t i = 0; i < memory::tag_count; ++i) {
      std::snprintf(buf, sizeof buf, "%s\"%s\": %zu", i ? ", " : "", memory::name(memory::all_tags[i]),
                    e.in_use_by_tag[i]);
      out += buf;
    }
    out += "}},\n";
    std::string const layer = paths[e.path].empty() ? std::string("(outside layers)") : paths[e.path];
    std::snprintf(buf, sizeof buf,
                  "{\"name\": \"%s %s\", \"cat\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": 1, \"tid\": 2, "
                  "\"ts\": %.3f, \"args\": {\"bytes\": %lld, \"tag\": \"%s\", \"phase\": \"%s\", \"in_use\": %zu, "
                  "\"layer\": ",
                  e.bytes > 0 ? "alloc" : "free", memory::name(memory::all_tags[e.tag]), memory::name(e.when),
                  e.time_us, static_cast<long long>(e.bytes), memory::name(memory::all_tags[e.tag]),
                  memory::name(e.when), e.in_use);
    out += buf;
    out += detail::json_string(layer) + "}}";
  }
  for (auto const& s : t.spans()) {
    out += ",\n{\"name\": " + detail::json_string(paths[s.path]);
    std::snprintf(buf, sizeof buf,
                  ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": 1, \"ts\": %.3f, \"dur\": %.3f}",
                  memory::name(s.when), s.begin_us, s.end_us - s.begin_us);
    out += buf;
  }
  out += "\n]}\n";
  return out;
}

// Writes the trace to `path` (io_error when it cannot). The file is written whole or not at all
// under its name: to a temporary beside it, then renamed.
inline void memory_trace(memory::timeline const& t, std::string const& path) {
  std::string const text = memory_trace_json(t);
  std::string const tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) detail::raise<io_error>("memory_trace: cannot open '", tmp, "' for writing");
    out.write(text.data(), std::streamsize(text.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      detail::raise<io_error>("memory_trace: writing '", tmp, "' failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    detail::raise<io_error>("memory_trace: cannot rename '", tmp, "' to '", path, "'");
  }
}

}  // namespace REMAT_NAMESPACE
