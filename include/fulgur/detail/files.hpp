#pragma once
// Folders and files through POSIX, never std::filesystem: the torch wheel's libtorch.so exports
// its own (older) copy of std::filesystem's functions, which interposes on libstdc++'s in every
// program that links LibTorch, and some of them crash (remove_all on a tree). Torch-free.
#include <string>
#include <vector>

namespace fulgur::detail {

/// Creates the folder and its parents (mkdir -p); throws fulgur::Error naming the path and the OS error.
void make_directories(const std::string& folder);
/// The names of the sub-folders of `folder` (none if it does not exist).
std::vector<std::string> subdirectories(const std::string& folder);
/// rename(2): atomic on one file system; throws naming both paths.
void rename_path(const std::string& from, const std::string& to);
/// rm -rf; nothing if the path does not exist.
void remove_tree(const std::string& path);
bool path_exists(const std::string& path);
/// The first part of `folder` (itself, or a parent) that exists and is not a folder, so that the
/// folder cannot be created: "" when it can be (it exists, or every existing part is a folder).
std::string blocking_file(const std::string& folder);
/// Refuses, before a run writes anything, a folder that cannot be created because `blocking_file`
/// found a file on its way: a MisconfigurationError naming `whose` (e.g. "CSVLogger's save_dir"), the
/// folder and the file.
void require_creatable_folder(const std::string& folder, const std::string& whose);
/// The path from the root: a relative one is taken from the current directory (getcwd); "./" and a
/// trailing "/." are dropped. A path that is absolute stays as it is.
std::string absolute_path(const std::string& path);
/// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/".
std::string parent_folder(const std::string& path);
/// The most recently modified regular file named prefix*suffix in any of the folders ("" if none).
std::string newest_file(const std::vector<std::string>& folders, const std::string& prefix, const std::string& suffix);

}  // namespace fulgur::detail
