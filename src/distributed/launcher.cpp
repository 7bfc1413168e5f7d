// The supervisor of fulgur's built-in launcher (see the header).
#include "src/distributed/launcher.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/preemption.hpp"

extern char** environ;

namespace fulgur::distributed {

namespace {
constexpr int kMaxWorkers = 1024;
std::atomic<pid_t> workers[kMaxWorkers];  // read by the signal handler: atomics, no allocation
std::atomic<int> worker_count{0};
std::atomic<int> forwarded_signal{0};
constexpr const char* kLaunchVariables[] = {"RANK",           "LOCAL_RANK",  "WORLD_SIZE",
                                            "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                            "MASTER_PORT",    "TORCHELASTIC_USE_AGENT_STORE",
                                            "TORCHELASTIC_RESTART_COUNT", "ROLE_RANK", "ROLE_WORLD_SIZE",
                                            "FULGUR_FAILURE_REPORT", "FULGUR_LAUNCHER"};

void signal_workers(int signal) {
  for (int i = 0; i < worker_count.load(); ++i)
    if (const pid_t pid = workers[i].load(); pid > 0) ::kill(pid, signal);
}

void forward_signal(int signal) {
  forwarded_signal.store(signal);
  signal_workers(signal);
}

bool is_launch_variable(const char* entry) {
  for (const char* name : kLaunchVariables) {
    const std::size_t n = std::strlen(name);
    if (std::strncmp(entry, name, n) == 0 && entry[n] == '=') return true;
  }
  return false;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw DistributedError(std::string("fulgur launcher: cannot find a free port: ") + std::strerror(errno));
  const int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (std::size_t start = 0; start < raw.size();) {
    const std::size_t end = raw.find('\0', start);
    args.push_back(raw.substr(start, end - start));
    start = end == std::string::npos ? raw.size() : end + 1;
  }
  return args;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}
}  // namespace

namespace {

/// Where this node's workers meet: its rank among the nodes and the master's address and port.
struct Rendezvous {
  int node_rank = 0;
  std::string address;
  std::string port;
  std::string reports{};  ///< a directory: a worker that finds a peer stuck writes rank<r> there
  int attempt = 0;        ///< 0, then 1..max_restarts: TORCHELASTIC_RESTART_COUNT
};

Rendezvous rendezvous_for(const LaunchPlan& plan) {
  const char* node_rank_text = std::getenv("NODE_RANK");
  const char* master_addr = std::getenv("MASTER_ADDR");
  const char* master_port = std::getenv("MASTER_PORT");
  if (plan.num_nodes > 1 && (!node_rank_text || !master_addr || !master_port))
    throw MisconfigurationError("fulgur launcher: num_nodes=" + std::to_string(plan.num_nodes) +
                                " needs NODE_RANK, MASTER_ADDR and MASTER_PORT set on every node (or start the "
                                "program with torchrun / srun).");
  return {node_rank_text ? std::atoi(node_rank_text) : 0, master_addr ? master_addr : "127.0.0.1",
          master_port ? master_port : std::to_string(free_port())};
}

/// Each worker's environment: ours without stale launch variables, plus torchrun's for its rank.
std::vector<std::vector<std::string>> worker_environments(const LaunchPlan& plan, const Rendezvous& meeting) {
  const int world = plan.processes_per_node * plan.num_nodes;
  std::vector<std::vector<std::string>> environments(static_cast<std::size_t>(plan.processes_per_node));
  for (int local = 0; local < plan.processes_per_node; ++local) {
    auto& env = environments[static_cast<std::size_t>(local)];
    for (char** e = environ; *e; ++e)
      if (!is_launch_variable(*e)) env.emplace_back(*e);  // stale values would shadow the new ones
    const int rank = meeting.node_rank * plan.processes_per_node + local;
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"RANK", std::to_string(rank)},
             {"LOCAL_RANK", std::to_string(local)},
             {"WORLD_SIZE", std::to_string(world)},
             {"LOCAL_WORLD_SIZE", std::to_string(plan.processes_per_node)},
             {"GROUP_RANK", std::to_string(meeting.node_rank)},
             {"MASTER_ADDR", meeting.address},
             {"MASTER_PORT", meeting.port},
             {"TORCHELASTIC_RESTART_COUNT", std::to_string(meeting.attempt)},
             {"FULGUR_LAUNCHER", "1"}})
      env.push_back(k + "=" + v);
    if (!meeting.reports.empty()) env.push_back("FULGUR_FAILURE_REPORT=" + meeting.reports + "/rank" + std::to_string(rank));
  }
  return environments;
}

/// Forks one worker per local rank, each re-executing this program. Everything the children need
/// is built before: between fork and exec only exec runs. The four forwarded signals wait while
/// the workers are forked (none is lost, none orphans a worker), and each worker dies with the
/// supervisor (PR_SET_PDEATHSIG), whatever ends it.
void fork_workers(const LaunchPlan& plan, std::vector<std::vector<std::string>>& environments) {
  const std::vector<std::string> args = own_command_line();
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::vector<char*>> envps(environments.size());
  for (std::size_t i = 0; i < environments.size(); ++i) {
    for (auto& entry : environments[i]) envps[i].push_back(entry.data());
    envps[i].push_back(nullptr);
  }
  sigset_t forwarded, previous;
  sigemptyset(&forwarded);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) sigaddset(&forwarded, sig);
  ::sigprocmask(SIG_BLOCK, &forwarded, &previous);
  ::signal(SIGCHLD, SIG_DFL);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) ::signal(sig, forward_signal);
  const pid_t supervisor = ::getpid();
  for (int local = 0; local < plan.processes_per_node; ++local) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != supervisor) std::_Exit(126);  // the supervisor is already gone
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) ::signal(sig, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &previous, nullptr);
      ::execve("/proc/self/exe", argv.data(), envps[static_cast<std::size_t>(local)].data());
      std::_Exit(127);
    }
    if (pid < 0) {
      const int error = errno;
      signal_workers(SIGKILL);
      for (int i = 0; i < worker_count.load(); ++i) ::waitpid(workers[i].load(), nullptr, 0);
      throw DistributedError(std::string("fulgur launcher: fork failed: ") + std::strerror(error));
    }
    workers[local].store(pid);
    worker_count.store(local + 1);
  }
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
}

/// The first worker that failed: its global rank and wait status.
struct Failure {
  int rank = -1;
  int status = 0;
};

int preempted = 0;  // workers that ended with preempted_exit_code

/// Waits for every worker. A failed worker's peers get a grace period to notice and report it
/// themselves (their lost-rank probe takes ~2.5 s), then SIGTERM, then SIGKILL; when the workers are
/// to be restarted (`restarting`), no grace: SIGTERM at once, SIGKILL 1 s later (a survivor blocked in a
/// collective or probing the lost peer does not end on SIGTERM, and its state is discarded anyway).
Failure supervise(const LaunchPlan& plan, int node_rank, bool restarting) {
  using clock = std::chrono::steady_clock;
  Failure failure;
  int running = plan.processes_per_node;
  auto terminate_at = clock::time_point::max(), kill_at = clock::time_point::max();
  while (running > 0) {
    bool reaped = false;
    for (int local = 0; local < plan.processes_per_node; ++local) {
      const pid_t pid = workers[local].load();
      if (pid <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      reaped = true;
      workers[local].store(-1);
      --running;
      if (done < 0) status = -1;  // not ours to reap any more: count it as failed
      const bool exited = done > 0 && WIFEXITED(status);
      if (exited && WEXITSTATUS(status) == preempted_exit_code) ++preempted;
      // A preempted rank saved with the others and ends before them: not a failure.
      const bool failed = !(exited && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == preempted_exit_code));
      if (!failed || failure.rank >= 0 || forwarded_signal.load() != 0) continue;
      failure = {node_rank * plan.processes_per_node + local, status};
      if (running > 0) {
        std::fprintf(stderr, "fulgur launcher: rank %d (pid %d) failed with %s; stopping the other ranks.\n",
                     failure.rank, pid, describe_status(status).c_str());
        terminate_at = clock::now() + std::chrono::seconds(restarting ? 0 : 5);
        kill_at = terminate_at + (restarting ? std::chrono::seconds(1) : std::chrono::seconds(10));
      }
    }
    const auto now = clock::now();
    if (now > kill_at) {
      signal_workers(SIGKILL);
      kill_at = clock::time_point::max();
    } else if (now > terminate_at) {
      signal_workers(SIGTERM);
      terminate_at = clock::time_point::max();
    }
    if (running > 0 && !reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failure;
}

/// What a worker wrote on finding a peer stuck: "rank 1 is stuck (alive, ...); rank 0 reported: ...",
/// or empty. The reports are removed, and their directory.
std::string stuck_report(const std::string& dir, int first_rank, int count) {
  std::string found;
  for (int rank = first_rank; rank < first_rank + count && !dir.empty(); ++rank) {
    const std::string file = dir + "/rank" + std::to_string(rank);
    std::ifstream in(file);
    std::string stuck, why;
    if (in && std::getline(in, stuck) && std::getline(in, why) && found.empty())
      found = (stuck.find(',') == std::string::npos ? "rank " : "ranks ") + stuck +
              " stuck (alive, but not where the others are): " + why;
    in.close();
    ::unlink(file.c_str());
  }
  if (!dir.empty()) ::rmdir(dir.c_str());
  return found;
}

}  // namespace

void launch_local_workers(const LaunchPlan& plan) {
  if (plan.processes_per_node > kMaxWorkers)
    throw MisconfigurationError("fulgur launcher: at most " + std::to_string(kMaxWorkers) + " processes per node.");
  if (plan.max_restarts > 0 && plan.num_nodes > 1)
    throw MisconfigurationError(
        "fulgur launcher: max_restarts=" + std::to_string(plan.max_restarts) + " restarts the workers of one node; "
        "with num_nodes=" + std::to_string(plan.num_nodes) + " the other nodes' workers would not restart with them. "
        "Start the program with torchrun --nnodes=" + std::to_string(plan.num_nodes) + " --max-restarts=" +
        std::to_string(plan.max_restarts) + " (or a SLURM job with --requeue), or set max_restarts = 0.");
  const int world = plan.processes_per_node * plan.num_nodes;
  for (int attempt = 0;; ++attempt) {
    Rendezvous meeting = rendezvous_for(plan);  // one node: a fresh port each attempt (the last one's may linger)
    meeting.attempt = attempt;
    char reports[] = "/tmp/fulgur_run_XXXXXX";
    if (::mkdtemp(reports) != nullptr) meeting.reports = reports;
    auto environments = worker_environments(plan, meeting);
    std::fprintf(stderr, "fulgur launcher: starting %d processes on node %d (ranks %d-%d of %d, master %s:%s)\n",
                 plan.processes_per_node, meeting.node_rank, meeting.node_rank * plan.processes_per_node,
                 (meeting.node_rank + 1) * plan.processes_per_node - 1, world, meeting.address.c_str(),
                 meeting.port.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    preempted = 0;
    fork_workers(plan, environments);
    const bool restarts_left = attempt < plan.max_restarts;
    const Failure failure = supervise(plan, meeting.node_rank, restarts_left);
    const std::string stuck = stuck_report(meeting.reports, meeting.node_rank * plan.processes_per_node,
                                           plan.processes_per_node);
    if (failure.rank >= 0) {
      // The cause is the stuck rank, if any, not the one that saw it and ended first.
      const std::string why = !stuck.empty() ? stuck
                                             : "rank " + std::to_string(failure.rank) + " ended with " +
                                                   describe_status(failure.status) + ".";
      if (restarts_left && forwarded_signal.load() == 0) {
        std::fprintf(stderr, "fulgur launcher: %s Restarting all %d local ranks (restart %d of %d); they resume from "
                             "the newest complete checkpoint.\n",
                     why.c_str(), plan.processes_per_node, attempt + 1, plan.max_restarts);
        continue;
      }
      if (plan.max_restarts > 0)
        std::fprintf(stderr, "fulgur launcher: the run failed after %d restart(s) (max_restarts = %d): %s\n", attempt,
                     plan.max_restarts, why.c_str());
      else
        std::fprintf(stderr, "fulgur launcher: the run failed: %s\n", why.c_str());
      std::exit(1);
    }
    break;
  }
  if (preempted == plan.processes_per_node) {
    std::fprintf(stderr, "fulgur launcher: the ranks were preempted and wrote a checkpoint to resume from; exit "
                         "code %d.\n", preempted_exit_code);
    std::exit(preempted_exit_code);
  }
  if (const int signal = forwarded_signal.load()) {
    std::fprintf(stderr, "fulgur launcher: stopped by signal %d.\n", signal);
    std::exit(128 + signal);
  }
  std::exit(0);
}

}  // namespace fulgur::distributed
