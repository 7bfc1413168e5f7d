// Profilers' report files (fulgur/profilers/report_file.hpp).
#include "fulgur/profilers/report_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "fulgur/detail/files.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::profiling {

std::string report_file_name(const ProfilerSetup& setup, std::string_view filename, std::string_view extension,
                             std::string_view action) {
  std::string base(to_string(setup.stage));
  if (!filename.empty()) base += "-" + std::string(filename);
  if (setup.world_size > 1) base += "-" + std::to_string(setup.global_rank);
  if (!action.empty()) base += "-" + std::string(action);
  // Lightning: re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", base), then runs of '_' made one.
  std::string clean;
  for (char c : base) {
    const bool bad = std::strchr("\\/:*?\"<>|\n\r\t", c) != nullptr && c != '\0';
    const char out = bad ? '_' : c;
    if (out == '_' && !clean.empty() && clean.back() == '_') continue;
    clean += out;
  }
  return (clean.empty() ? std::string("profile") : clean) + std::string(extension);
}

std::string open_report_file(const std::string& dir, const std::string& name, std::string_view option) {
  const std::string folder = dir.empty() ? std::string(".") : dir;
  detail::require_creatable_folder(folder, "the profiler's folder (" + std::string(option) + ")");
  try {
    detail::make_directories(folder);
  } catch (const std::exception& e) {  // e names the folder, the OS's reason and what to check
    throw MisconfigurationError(std::string(e.what()) + " (the profiler's folder: " + std::string(option) + ")");
  }
  const std::string path = folder + "/" + name;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "a"), &std::fclose);
  if (!file)
    throw MisconfigurationError("fulgur: the profiler cannot write its report '" + path + "' (" + std::string(option) +
                                "): " + std::strerror(errno) + ". Point it at a folder this process can write.");
  return path;
}

std::string folder_origin(bool dirpath_set, std::string_view dirpath_option) {
  if (dirpath_set) return std::string(dirpath_option);
  return std::string(dirpath_option) + " unset: the first logger's log_dir, else " +
         detail::trainer_setting("default_root_dir");
}

void append_report(const std::string& path, const std::string& text) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "a"), &std::fclose);
  if (!file || std::fwrite(text.data(), 1, text.size(), file.get()) != text.size() || std::fflush(file.get()) != 0)
    throw Error("fulgur: the profiler could not write its report to '" + path + "': " + std::strerror(errno) + ".");
}

}  // namespace fulgur::profiling
