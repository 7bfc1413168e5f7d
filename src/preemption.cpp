#include "fulgur/preemption.hpp"

#include <dirent.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

extern char** environ;

namespace fulgur::detail {
namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

/// n of "hpc_ckpt_{n}.ckpt"; -1 for any other name.
long long hpc_number(const std::string& name) {
  static const std::string prefix = "hpc_ckpt_", suffix = ".ckpt";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

}  // namespace

std::string hpc_checkpoint(const std::string& folder, bool next) {
  long long highest = -1;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* entry = ::readdir(dir)) highest = std::max(highest, hpc_number(entry->d_name));
    ::closedir(dir);
  }
  if (!next && highest < 0) return "";
  return folder + "/hpc_ckpt_" + std::to_string(next ? std::max(highest, 0LL) + 1 : highest) + ".ckpt";
}

bool in_slurm_batch_job() {
  const std::string name = variable("SLURM_JOB_NAME");
  return !variable("SLURM_JOB_ID").empty() && name != "bash" && name != "interactive";
}

std::string requeue_slurm_job() {
  std::string job = variable("SLURM_JOB_ID");
  if (const std::string array = variable("SLURM_ARRAY_JOB_ID"); !array.empty())
    job = array + "_" + variable("SLURM_ARRAY_TASK_ID");
  if (job.empty() || job.find_first_not_of("0123456789_") != std::string::npos)
    return "not requeued: SLURM_JOB_ID/SLURM_ARRAY_* give no job id (\"" + job + "\")";
  char scontrol[] = "scontrol", requeue[] = "requeue";
  char* argv[] = {scontrol, requeue, job.data(), nullptr};
  pid_t pid = 0;
  if (const int error = ::posix_spawnp(&pid, "scontrol", nullptr, nullptr, argv, environ); error != 0)
    return "requeuing SLURM job " + job + " failed: cannot run scontrol (" + std::strerror(error) + ")";
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "requeued SLURM job " + job;
  return "requeuing SLURM job " + job + " failed: scontrol requeue " + job + " ended with status " +
         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace fulgur::detail
