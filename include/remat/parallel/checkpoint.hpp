// The files of a data-parallel run: the model's parameters saved from rank 0 and loaded on rank 0
// and broadcast (ZeRO-3: gathered first), an optimizer's state saved gathered to rank 0 in the
// format of remat::save (so it loads on any number of ranks, sharded or not), and per-rank files of
// a sharded optimizer's state (each rank its own shard, reloaded on the same number of ranks).
// The only part of parallel/ that reads and writes files (io/).
#pragma once

#include "../error.hpp"
#include "../io/checkpoint.hpp"
#include "data_parallel.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {

// Saves the model's parameters from rank 0 only (every rank calls it; an error on rank 0 is
// thrown on every rank). With options::shard_parameters the shards are gathered first, and let
// go again after.
template <class Model, class Transport>
void save(data_parallel<Model, Transport>& dp, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  struct let_go {
    data_parallel<Model, Transport>& dp;
    ~let_go() { dp.release_parameters(); }
  } const after{dp};
  dp.gather_parameters();
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::save(dp.model(), path, metadata);
  });
}

namespace detail {

// Throws argument_error naming `who` unless the optimizer is over this rank's shard.
template <class Model, class Transport, class Opt>
void require_shard(data_parallel<Model, Transport> const& dp, Opt const& opt, char const* who) {
  param_range const r = dp.shard(), o = opt.range();
  if (o != r)
    REMAT_NAMESPACE::detail::raise<argument_error>(who, ": the optimizer is over parameters [", o.begin, ", ", o.end,
                                                   ") but this rank's shard is [", r.begin, ", ", r.end, ")");
}

}  // namespace detail

// Saves an optimizer's state (AdamW on either device, OffloadedAdamW, SGD) from rank 0 in the
// format of remat::save(opt), so a sharded run's file loads into an unsharded optimizer and the
// other way round: the shards' state tensors are gathered. Every rank calls it; an error on rank 0
// is thrown on every rank.
template <class Model, class Transport, class Opt>
  requires REMAT_NAMESPACE::detail::stateful_optimizer<Opt>
void save(data_parallel<Model, Transport>& dp, Opt const& opt, std::string const& path,
          std::map<std::string, std::string> metadata = {}) {
  auto values = REMAT_NAMESPACE::detail::state_to_host(opt);
  auto const states = const_cast<Opt&>(opt).state_tensors();  // (read only)
  for (std::size_t i = 0; i < values.size(); ++i)
    if (states[i].tensor) values[i] = dp.gather_shards(values[i]);  // (the same tensors on every rank)
  dp.agree("dist::save", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::detail::write_state(values, opt, path, std::move(metadata));
  });
}

// Loads parameters on rank 0 and broadcasts them (an error on rank 0 is thrown on every rank and
// changes nothing anywhere).
template <class Model, class Transport>
void load(data_parallel<Model, Transport>& dp, std::string const& path) {
  dp.gather_parameters();  // (ZeRO-3: rank 0 writes them all, into memory that holds them)
  dp.agree("dist::load", [&] {
    if (dp.rank() == 0) REMAT_NAMESPACE::detail::load_parameters(dp.model(), path);
  });
  dp.broadcast_parameters();
}

// Loads a state saved by either save() (AdamW's format from AdamW or OffloadedAdamW; SGD's;
// whole or sharded, on any number of ranks) on every rank, each keeping its shard: every rank reads and checks the
// file before any applies it, so an error on any rank is thrown on every rank and changes no
// optimizer.
template <class Model, class Transport, class Opt>
  requires REMAT_NAMESPACE::detail::stateful_optimizer<Opt>
void load(data_parallel<Model, Transport>& dp, Opt& opt, std::string const& path) {
  std::optional<decltype(REMAT_NAMESPACE::detail::read_state(opt, path, 0, 0))> read;
  dp.agree("dist::load", [&] {
    detail::require_shard(dp, opt, "dist::load");
    read = REMAT_NAMESPACE::detail::read_state(opt, path, Model::parameter_count, dp.shard().begin);
  });
  REMAT_NAMESPACE::detail::apply_state(opt, *read);
}

// ---- per-rank files of a sharded optimizer (each rank writes and reads its own shard)

// The file of `rank`'s shard among `ranks`: path + ".rank<rank>-of-<ranks>".
inline std::string shard_file(std::string const& path, int rank, int ranks) {
  return path + ".rank" + std::to_string(rank) + "-of-" + std::to_string(ranks);
}

namespace detail {

// What load_shards says when this rank's file is missing: the shard files beside it, if any,
// name the number of ranks they were saved by.
inline std::string other_shard_files(std::string const& path, int rank) {
  namespace fs = std::filesystem;
  fs::path const p(path);
  fs::path const dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string const prefix = p.filename().string() + ".rank" + std::to_string(rank) + "-of-";
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::string const name = it->path().filename().string(); name.rfind(prefix, 0) == 0) found.push_back(name);
  if (found.empty()) return "no shard files of that name";
  std::sort(found.begin(), found.end());
  std::string s = "shard files for another number of ranks (";
  for (std::size_t i = 0; i < found.size(); ++i) s += (i ? ", " : "") + found[i];
  return s + "); per-rank files reload on the number of ranks that saved them only (dist::save and "
             "dist::load write and read one gathered file for any number)";
}

}  // namespace detail

// Saves this rank's part of an optimizer's state (AdamW, OffloadedAdamW, SGD) to a file of its own,
// shard_file(path, rank, ranks), with no gather to rank 0: the state tensors of the rank's shard, the
// step count and loss scale, and the shard's place (rank, ranks, first and last parameter, the
// model's parameter count). Every rank calls it; an error on any rank is thrown on every rank.
// load_shards reads the files back on the same number of ranks; dist::save writes one file that
// loads on any number.
template <class Model, class Transport, class Opt>
  requires REMAT_NAMESPACE::detail::stateful_optimizer<Opt>
void save_shards(data_parallel<Model, Transport>& dp, Opt const& opt, std::string const& path,
                 std::map<std::string, std::string> metadata = {}) {
  param_range const r = dp.shard();
  metadata["remat.shard.rank"] = std::to_string(dp.rank());
  metadata["remat.shard.ranks"] = std::to_string(dp.size());
  metadata["remat.shard.begin"] = std::to_string(r.begin);
  metadata["remat.shard.end"] = std::to_string(r.end);
  metadata["remat.shard.parameters"] = std::to_string(Model::parameter_count);
  dp.agree("dist::save_shards", [&] {
    detail::require_shard(dp, opt, "dist::save_shards");
    REMAT_NAMESPACE::detail::write_state(REMAT_NAMESPACE::detail::state_to_host(opt), opt,
                                         shard_file(path, dp.rank(), dp.size()), std::move(metadata));
  });
}

// Reads what save_shards wrote, each rank its own file, on the same number of ranks with the same
// shards: all or nothing on every rank (every file is read and checked before any is applied). A
// missing file (files saved by another number of ranks are named), a file of another rank, shard
// or model, or a corrupt one throws io_error on its rank and dist_error on the others, and
// changes no optimizer.
template <class Model, class Transport, class Opt>
  requires REMAT_NAMESPACE::detail::stateful_optimizer<Opt>
void load_shards(data_parallel<Model, Transport>& dp, Opt& opt, std::string const& path) {
  param_range const r = dp.shard();
  std::string const file = shard_file(path, dp.rank(), dp.size());
  std::optional<decltype(REMAT_NAMESPACE::detail::read_state(opt, file, 0, 0))> read;
  dp.agree("dist::load_shards", [&] {
    if (!std::filesystem::exists(file))
      REMAT_NAMESPACE::detail::raise<io_error>("dist::load_shards: expected '", file, "' (rank ", dp.rank(), " of ",
                                               dp.size(), "), found none; beside it: ",
                                               detail::other_shard_files(path, dp.rank()));
    detail::require_shard(dp, opt, "dist::load_shards");
    safetensors::file const f = safetensors::read(file);
    std::map<std::string, std::string> const& meta = f.metadata;
    auto const expect = [&](char const* key, std::string const& want, char const* what) {
      auto const it = meta.find(key);
      std::string const found = it == meta.end() ? std::string("none") : it->second;
      if (found != want)
        REMAT_NAMESPACE::detail::raise<io_error>("dist::load_shards '", file, "': expected ", what, " ", want,
                                                 " (metadata '", key, "'), found ", found);
    };
    expect("remat.shard.ranks", std::to_string(dp.size()), "a shard saved by a run of");
    expect("remat.shard.rank", std::to_string(dp.rank()), "the shard of rank");
    expect("remat.shard.parameters", std::to_string(Model::parameter_count), "a model of parameter count");
    expect("remat.shard.begin", std::to_string(r.begin), "a shard starting at parameter");
    expect("remat.shard.end", std::to_string(r.end), "a shard ending before parameter");
    read = REMAT_NAMESPACE::detail::read_state(opt, f, file, r.size(), 0);
  });
  REMAT_NAMESPACE::detail::apply_state(opt, *read);
}

}  // namespace dist
}  // namespace REMAT_NAMESPACE
