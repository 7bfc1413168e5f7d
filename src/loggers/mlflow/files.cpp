#include "files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace fulgur::loggers::mlflow::files {
namespace {
[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(error));
}

void write_all(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail("cannot write", path, error);
    }
    done += static_cast<std::size_t>(n);
  }
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
  if (!is_directory(folder)) fail("cannot create the folder", folder, ENOTDIR);
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::vector<Entry> list(const std::string& folder) {
  std::vector<Entry> entries;
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return entries;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info {};
    if (::stat(join(folder, name).c_str(), &info) != 0) continue;
    entries.push_back({name, S_ISDIR(info.st_mode), S_ISREG(info.st_mode)});
  }
  ::closedir(dir);
  return entries;
}

std::string absolute(const std::string& path) {
  std::string full = path;
  if (full.empty() || full.front() != '/') {
    char cwd[4096];
    full = std::string(::getcwd(cwd, sizeof cwd) != nullptr ? cwd : ".") + "/" + path;
  }
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= full.size();) {
    const std::size_t end = std::min(full.find('/', start), full.size());
    const std::string part = full.substr(start, end - start);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = end + 1;
  }
  std::string out;
  for (const std::string& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

std::string join(const std::string& folder, const std::string& name) {
  if (folder.empty()) return name;
  return folder.back() == '/' ? folder + name : folder + "/" + name;
}

std::string parent(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string file_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string stem(const std::string& path) {
  const std::string name = file_name(path);
  const std::size_t dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

std::optional<std::string> read(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return std::nullopt;
  std::string text;
  char buffer[65536];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

void write_atomically(const std::string& path, const std::string& text) {
  make_directories(parent(path));
  const std::string temporary = path + ".tmp-fulgur";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write", temporary, errno);
  write_all(fd, text, temporary);
  if (::close(fd) != 0) fail("cannot write", temporary, errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) fail("cannot rename to", path, errno);
}

void append(const std::string& path, const std::string& text) {
  make_directories(parent(path));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write", path, errno);
  write_all(fd, text, path);
  if (::close(fd) != 0) fail("cannot write", path, errno);
}

void copy_file(const std::string& from, const std::string& to) {
  const std::optional<std::string> text = read(from);
  if (!text) fail("cannot read", from, errno);
  write_atomically(to, *text);
}

void remove_tree(const std::string& path) {
  if (!exists(path)) return;
  ::nftw(
      path.c_str(), [](const char* name, const struct stat*, int, FTW*) { return ::remove(name) == 0 ? 0 : -1; }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string temp_folder() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

std::optional<std::int64_t> modified_ns(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  return static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec;
}

std::string program_path() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string("fulgur");
}

}  // namespace fulgur::loggers::mlflow::files
