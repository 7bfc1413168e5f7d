// detail::atomic_write (include/fulgur/detail/atomic_file.hpp): temporary file, fsync, rename, fsync
// of the folder.
#include "fulgur/detail/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "fulgur/detail/files.hpp"

namespace fulgur::detail {
namespace {

struct Target {
  std::string path;
  std::string what;  // "checkpoint"
};

/// step: what failed, naming the file it failed on.
[[noreturn]] void write_error(const Target& target, const std::string& step, int error) {
  throw FileWriteError("fulgur: cannot save " + target.what + " '" + target.path + "': " + step + ": " +
                       std::strerror(error) + "; nothing was replaced (a " + target.what +
                       " already at the destination is intact). Free space, fix the folder's permissions, or save "
                       "elsewhere.");
}

void write_all(int fd, std::string_view bytes, const Target& target, const std::string& temporary) {
  const char* data = bytes.data();
  std::size_t size = bytes.size();
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      write_error(target, "cannot write '" + temporary + "'", errno);
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

std::string file_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// ".name.tmp.<pid>" -> pid; 0 for any other name.
pid_t temporary_owner(const std::string& entry, const std::string& prefix) {
  if (entry.size() <= prefix.size() || entry.size() > prefix.size() + 9 || entry.compare(0, prefix.size(), prefix) != 0)
    return 0;
  pid_t pid = 0;
  for (std::size_t i = prefix.size(); i < entry.size(); ++i) {
    if (entry[i] < '0' || entry[i] > '9') return 0;
    pid = pid * 10 + (entry[i] - '0');
  }
  return pid;
}

/// Removes the temporary files that writers killed mid-write left for this path. One is stale when
/// its process is gone and nobody holds the lock every writer keeps on its temporary file (a
/// writer in another PID namespace that shares the folder keeps its own).
void remove_stale_temporaries(const std::string& folder, const std::string& name) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  const std::string prefix = "." + name + ".tmp.";
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    const pid_t pid = temporary_owner(entry->d_name, prefix);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(folder + "/" + entry->d_name);
  }
  ::closedir(dir);
  for (const std::string& path : stale) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
    ::close(fd);
  }
}

// The temporary file's name has the process's id only: two threads writing one path would write
// into the same file.
std::mutex writes_in_this_process;

}  // namespace

void atomic_write(const std::string& path, std::string_view bytes, std::string_view what) {
  const Target target{path, std::string(what)};
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0 && S_ISDIR(existing.st_mode))
    throw FileWriteError("fulgur: cannot save " + target.what + " '" + path + "': it is a folder; give the path of "
                         "a file (e.g. '" + path + "/" + (what == "checkpoint" ? "last.ckpt" : "name") + "'). "
                         "Nothing was written.");
  const std::string folder = parent_folder(path);
  try {
    make_directories(folder);
  } catch (const Error& e) {
    throw FileWriteError(std::string(e.what()) + " (while saving '" + path + "'; nothing was written).");
  }
  const std::lock_guard<std::mutex> one_at_a_time(writes_in_this_process);
  // First, so that the space a killed writer's file holds is free for this one.
  remove_stale_temporaries(folder, file_name(path));
  const std::string temporary = folder + "/." + file_name(path) + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) write_error(target, "cannot create '" + temporary + "'", errno);
  ::flock(fd, LOCK_EX | LOCK_NB);  // held until close: "a writer is alive" (best effort, see above)
  int error = 0;
  try {
    write_all(fd, bytes, target, temporary);
    if (::fsync(fd) != 0) write_error(target, "cannot fsync '" + temporary + "'", errno);
  } catch (...) {
    ::unlink(temporary.c_str());
    ::close(fd);
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(temporary.c_str());
  }
  ::close(fd);
  if (error != 0) write_error(target, "cannot rename '" + temporary + "' onto it", error);
  // The rename is durable only once the folder's entry is on disk.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace fulgur::detail
