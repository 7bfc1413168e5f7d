#pragma once
// Where profilers write their reports: Lightning's file names, checked at set-up. Torch-free.
#include <string>
#include <string_view>

#include "fulgur/profilers/profiler.hpp"

namespace fulgur::profiling {

/// Lightning's _prepare_filename: "<stage>-<filename>[-<rank>][-<action>]<extension>", with the
/// characters a file name cannot hold replaced by '_'. The rank (global) only under DDP.
std::string report_file_name(const ProfilerSetup& setup, std::string_view filename, std::string_view extension,
                             std::string_view action = {});

/// Makes `dir` (and its parents) and checks that `name` can be written in it, before any training;
/// returns the file's path. A folder that cannot be written is a MisconfigurationError naming it and
/// `option` (where the folder came from).
std::string open_report_file(const std::string& dir, const std::string& name, std::string_view option);

/// Where a profiler's folder came from, for open_report_file's `option`: `dirpath_option` when it is
/// set, else the fallback it was unset for (the first logger's log_dir, else default_root_dir).
std::string folder_origin(bool dirpath_set, std::string_view dirpath_option);

/// Appends `text` to the report file (Lightning opens it in "a" mode): an error says which file.
void append_report(const std::string& path, const std::string& text);

}  // namespace fulgur::profiling
