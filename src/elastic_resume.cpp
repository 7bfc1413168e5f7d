// A restarted run's own resume point (include/fulgur/detail/elastic_resume.hpp).
#include "fulgur/detail/elastic_resume.hpp"

#include <ATen/core/ivalue.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <set>
#include <tuple>

#include "fulgur/checkpoint/format.hpp"
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::detail {
namespace {

std::optional<int> count_of(const std::optional<std::string>& text) {
  if (!text || text->empty() || text->size() > 9 || text->find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoi(*text);
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Candidate {
  std::string path;
  timespec written{};
};

/// The regular files named *.ckpt (or, with `prefix`, prefix*.ckpt) in `folder`; hidden ones (an
/// atomic write's temporary) are no checkpoints.
void add_candidates(const std::string& folder, const std::string& prefix, std::vector<Candidate>& out,
                    std::set<std::string>& seen) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.front() == '.' || !ends_with(name, ".ckpt") || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = folder + "/" + name;
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    if (seen.insert(path).second) out.push_back({path, info.st_mtim});
  }
  ::closedir(dir);
}

/// The training progress a checkpoint holds, or a CheckpointError saying why it cannot resume a fit.
std::int64_t progress_of(const StateDict& state) {
  if (!state.contains("global_step") || !state.at("global_step").isInt())
    throw CheckpointError("holds no global_step (not a training checkpoint)");
  if (!state.contains("optimizer_states")) throw CheckpointError("holds weights only (save_weights_only)");
  return state.at("global_step").toInt();
}

/// Reads every part that a format keeps beside the file (a sharded checkpoint's rank files): a
/// missing or damaged one is a CheckpointError, as it would be when fit restores it.
void check_parts(const c10::IValue& value) {
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    const bool tagged = std::any_of(dict.begin(), dict.end(), [](const auto& item) {
      return item.key().isString() && item.key().toStringRef() == "format";
    });
    if (tagged) {
      const StateDict part(dict);
      if (const checkpoint::Format* format = checkpoint::format_of(part)) {
        (void)format->inlined(part);
        return;
      }
    }
    for (const auto& item : dict) check_parts(item.value());
  } else if (value.isList()) {
    for (const auto& item : value.toListRef()) check_parts(item);
  } else if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements()) check_parts(item);
  }
}

/// An error's first line, without its closing full stop (the report goes on after it).
std::string error_summary(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '.' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

Restart restart_of_this_process(const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    if (lookup) return lookup(name);
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  if (const auto count = count_of(get("TORCHELASTIC_RESTART_COUNT")); count && *count > 0)
    return {*count, get("FULGUR_LAUNCHER") ? "fulgur launcher" : "torchrun"};
  if (const auto count = count_of(get("SLURM_RESTART_COUNT")); count && *count > 0) return {*count, "SLURM requeue"};
  return {};
}

ResumePoint newest_complete_checkpoint(const std::vector<std::string>& folders, const std::string& hpc_folder) {
  std::vector<Candidate> candidates;
  std::set<std::string> seen;
  for (const std::string& folder : folders) add_candidates(absolute_path(folder), "", candidates, seen);
  if (!hpc_folder.empty()) add_candidates(absolute_path(hpc_folder), "hpc_ckpt_", candidates, seen);

  struct Readable {
    std::int64_t step;
    timespec written;
    std::string path;
  };
  std::vector<Readable> readable;
  std::vector<std::pair<Candidate, std::string>> unreadable;  // with why
  for (const Candidate& candidate : candidates) {
    try {
      readable.push_back({progress_of(checkpoint::load(candidate.path)), candidate.written, candidate.path});
    } catch (const std::exception& e) {
      unreadable.emplace_back(candidate, error_summary(e.what()));
    }
  }
  auto later = [](const timespec& a, const timespec& b) {
    return std::tie(a.tv_sec, a.tv_nsec) > std::tie(b.tv_sec, b.tv_nsec);
  };
  // Most progress first; then the most recently written; then by name, so that every rank agrees.
  std::sort(readable.begin(), readable.end(), [&](const Readable& a, const Readable& b) {
    if (a.step != b.step) return a.step > b.step;
    if (later(a.written, b.written) || later(b.written, a.written)) return later(a.written, b.written);
    return a.path < b.path;
  });
  ResumePoint point;
  for (const Readable& r : readable) {
    try {
      check_parts(checkpoint::load(r.path).to_ivalue());
      point.path = r.path;
      point.global_step = r.step;
      break;
    } catch (const std::exception& e) {
      point.skipped.push_back(r.path + " (global step " + std::to_string(r.step) + "): " + error_summary(e.what()));
    }
  }
  // An unreadable file matters where it may have been the newest: written after the one chosen.
  const auto chosen =
      std::find_if(readable.begin(), readable.end(), [&](const Readable& r) { return r.path == point.path; });
  std::sort(unreadable.begin(), unreadable.end(),
            [&](const auto& a, const auto& b) { return later(a.first.written, b.first.written); });
  std::vector<std::string> newer;
  for (const auto& [candidate, why] : unreadable)
    if (point.path.empty() || later(candidate.written, chosen->written)) newer.push_back(candidate.path + ": " + why);
  point.skipped.insert(point.skipped.begin(), newer.begin(), newer.end());
  return point;
}

}  // namespace fulgur::detail
