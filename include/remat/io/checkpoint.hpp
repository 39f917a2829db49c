// A model's and an optimizer's files, in the safetensors format (io/safetensors.hpp): the
// model's parameters (and running statistics) under the names of model::parameter_table(), and an
// optimizer's state through the list of named state tensors each optimizer gives
// (state_tensors(): train/), so a new optimizer gets its files without touching io/. Loading
// checks everything against the model or optimizer before it changes a single value; saving is
// atomic.
#pragma once

#include "../error.hpp"
#include "../runtime/model.hpp"
#include "../train/loss_scale.hpp"
#include "safetensors.hpp"

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {

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

// An optimizer whose state files can hold: it names its state (state_tensors(), state_kind) and
// has a step count and (maybe) a loss scale.
template <class Opt>
concept stateful_optimizer = requires(Opt& o) {
  o.state_tensors();
  { Opt::state_kind } -> std::convertible_to<char const*>;
  o.steps();
  o.scaler();
};

// The element type of an optimizer's state.
template <class Opt>
using state_value_t = typename std::remove_pointer_t<decltype(std::declval<Opt&>().state_tensors()[0].tensor)>::value_type;

// An optimizer's state, each tensor's values on the host (empty for a tensor it keeps none of).
template <class Opt>
std::vector<std::vector<state_value_t<Opt>>> state_to_host(Opt const& opt) {
  std::vector<std::vector<state_value_t<Opt>>> values;
  for (auto const& s : const_cast<Opt&>(opt).state_tensors())  // (read only)
    values.push_back(s.tensor ? tensor_to_host(std::as_const(*s.tensor).view()) : std::vector<state_value_t<Opt>>{});
  return values;
}

// Writes an optimizer's state (`values`: each state tensor's, as state_to_host gives them, of the
// whole model or of a shard), its step count and its model's loss scale, as save(opt, path) does.
template <class Opt, class T>
void write_state(std::vector<std::vector<T>> const& values, Opt const& opt, std::string const& path,
                 std::map<std::string, std::string> metadata) {
  std::vector<safetensors::entry> entries;
  std::size_t i = 0;
  for (auto const& s : const_cast<Opt&>(opt).state_tensors()) {
    std::vector<T> const& v = values[i++];
    if (s.tensor) entries.push_back({s.name, safetensors::dtype_name<T>(), {v.size()}, v.data(), v.size() * sizeof(T)});
  }
  optimizer_metadata(opt, Opt::state_kind, metadata);
  safetensors::write(path, entries, metadata);
}

// An optimizer's state read from a file and checked against it, not applied yet.
template <class T>
struct state_read {
  optimizer_state state;
  std::vector<std::vector<T>> values;  // each state tensor's part for this optimizer (empty: none kept)
};

// Reads a saved state of `total` parameters for an optimizer over [offset, offset + its size) of
// them and checks it (its kind, every tensor's presence, dtype and size, no tensor it does not
// know, the loss scale) without changing the optimizer. (f: the file read from path.)
template <class Opt>
state_read<state_value_t<Opt>> read_state(Opt const& opt, safetensors::file const& f, std::string const& path,
                                          std::size_t total, std::size_t offset) {
  using T = state_value_t<Opt>;
  char const* const kind = Opt::state_kind;
  char const* const article = (kind[0] == 'A' || kind[0] == 'E' || kind[0] == 'I' || kind[0] == 'O' || kind[0] == 'S') ? "an " : "a ";
  state_read<T> r{optimizer_state_of(f, path, kind), {}};
  auto const states = const_cast<Opt&>(opt).state_tensors();  // (read only)
  std::size_t known = 0;
  for (auto const& s : states) {
    auto const it = f.tensors.find(s.name);
    r.values.emplace_back();
    if (!s.tensor) {
      if (it != f.tensors.end())
        raise<io_error>("load '", path, "': expected ", article, kind, " state without ", s.absent, " (this ", kind,
                        " has none), found a tensor '", s.name, "'");
      continue;
    }
    ++known;
    if (it == f.tensors.end())
      raise<io_error>("load '", path, "': expected ", article, kind, " state with a tensor '", s.name, "', found none");
    safetensors::tensor_info const& t = it->second;
    if (t.dtype != safetensors::dtype_name<T>() || t.shape != std::vector<std::size_t>{total})
      raise<io_error>("load '", path, "': tensor '", s.name, "' expected ", safetensors::dtype_name<T>(), " [", total,
                      "], found ", t.dtype, " with ", t.end - t.begin, " bytes");
    std::size_t const n = s.tensor->size();
    r.values.back().resize(n);
    std::memcpy(r.values.back().data(), f.data.data() + t.begin + offset * sizeof(T), n * sizeof(T));
  }
  if (f.tensors.size() != known)
    for (auto const& [name, t] : f.tensors) {
      bool ours = false;
      for (auto const& s : states) ours = ours || (s.tensor && name == s.name);
      if (!ours) raise<io_error>("load '", path, "': expected ", article, kind, " state, found a tensor '", name, "'");
    }
  if (opt.scaler() && r.state.scale) {  // (the scale's own checks, on a copy)
    loss_scaler check = *opt.scaler();
    check.set_state(*r.state.scale, r.state.tracker.value_or(0), r.state.skipped.value_or(0));
  }
  return r;
}
template <class Opt>
auto read_state(Opt const& opt, std::string const& path, std::size_t total, std::size_t offset) {
  return read_state(opt, safetensors::read(path), path, total, offset);
}

// Applies what read_state read and checked.
template <class Opt, class T>
void apply_state(Opt& opt, state_read<T> const& r) {
  r.state.apply(opt);
  std::size_t i = 0;
  for (auto const& s : opt.state_tensors()) {
    std::vector<T> const& v = r.values[i++];
    if (s.tensor) tensor_from_host(s.tensor->view(), std::span<T const>(v));
  }
}

}  // namespace detail

// An optimizer's state: its tensors under the names of PyTorch's state dict (AdamW's "exp_avg" and
// "exp_avg_sq", SGD's "momentum_buffer", none without momentum) and, in the metadata, its kind, step
// count and the loss scale of the model it serves (value, growth tracker, skipped steps), so a run
// with a dynamic loss scale resumes where it stopped. OffloadedAdamW writes AdamW's format.
template <class Opt>
  requires detail::stateful_optimizer<Opt>
void save(Opt const& opt, std::string const& path, std::map<std::string, std::string> metadata = {}) {
  detail::write_state(detail::state_to_host(opt), opt, path, std::move(metadata));
}

// Restores what save(opt, path) wrote (for OffloadedAdamW and AdamW, either's), all or nothing: a
// file of another optimizer or model (kind, tensors, sizes, dtype), of an SGD with or without
// momentum where this one differs, or a corrupt one throws io_error and leaves the optimizer and
// its loss scale as they were.
template <class Opt>
  requires detail::stateful_optimizer<Opt>
void load(Opt& opt, std::string const& path) {
  std::size_t const n = opt.range().size();
  detail::apply_state(opt, detail::read_state(opt, path, n, 0));
}

}  // namespace REMAT_NAMESPACE
