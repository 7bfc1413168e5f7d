#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace fulgur::detail {
namespace {
[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw Error("fulgur: " + what + " " + path + ": " + std::strerror(error) +
                           "; check the path and its permissions.");
}
}  // namespace

void make_directories(const std::string& folder) {
  std::size_t next = 0;
  while (next != std::string::npos) {
    next = folder.find('/', next + 1);
    const std::string prefix = folder.substr(0, next);
    if (prefix.empty() || ::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST) continue;
    fail("cannot create the folder", prefix, errno);
  }
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) fail("cannot create the folder", folder, ENOTDIR);
}

std::vector<std::string> subdirectories(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info {};
    if (::stat((folder + "/" + name).c_str(), &info) == 0 && S_ISDIR(info.st_mode)) names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot rename " + from + " to", to, errno);
}

void remove_tree(const std::string& path) {
  if (!path_exists(path)) return;
  ::nftw(
      path.c_str(), [](const char* file, const struct stat*, int, FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string absolute_path(const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  std::string cwd;
  for (std::size_t size = 256;; size *= 2) {
    cwd.resize(size);
    if (::getcwd(cwd.data(), size) != nullptr) break;
    if (errno != ERANGE) fail("cannot tell the current directory for", path, errno);
  }
  cwd.resize(std::char_traits<char>::length(cwd.c_str()));
  std::string rest = path;
  while (rest.rfind("./", 0) == 0) rest.erase(0, 2);
  if (rest.empty() || rest == ".") return cwd;
  if (rest.size() >= 2 && rest.compare(rest.size() - 2, 2, "/.") == 0) rest.resize(rest.size() - 2);
  return cwd == "/" ? "/" + rest : cwd + "/" + rest;
}

bool path_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

std::string blocking_file(const std::string& folder) {
  std::string part = folder;
  while (!part.empty()) {
    struct stat info {};
    if (::stat(part.c_str(), &info) == 0) return S_ISDIR(info.st_mode) ? std::string() : part;
    const std::string parent = parent_folder(part);
    if (parent == part) break;
    part = parent;
  }
  return {};
}

void require_creatable_folder(const std::string& folder, const std::string& whose) {
  const std::string file = blocking_file(folder);
  if (file.empty()) return;
  throw MisconfigurationError("fulgur: " + whose + " '" + folder + "' cannot be created: '" + file +
                              "' is a file, not a folder. Point it at a folder (or a path that does not exist yet).");
}

std::string parent_folder(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string newest_file(const std::vector<std::string>& folders, const std::string& prefix, const std::string& suffix) {
  std::string newest;
  struct timespec newest_time {};
  for (const std::string& folder : folders) {
    DIR* dir = ::opendir(folder.c_str());
    if (dir == nullptr) continue;
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name.size() < prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string path = folder + "/" + name;
      struct stat info {};
      if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
      const auto& t = info.st_mtim;
      if (newest.empty() || t.tv_sec > newest_time.tv_sec ||
          (t.tv_sec == newest_time.tv_sec && t.tv_nsec > newest_time.tv_nsec)) {
        newest = path;
        newest_time = t;
      }
    }
    ::closedir(dir);
  }
  return newest;
}

}  // namespace fulgur::detail
