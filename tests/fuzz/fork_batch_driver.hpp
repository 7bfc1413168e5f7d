// The driver that the seeded mutation fuzzers share (tests/checkpoint/fuzz.cpp, tests/fuzz/readers.cpp).
// Inputs 0, 1, 2, ... run in batches of about a second, each batch in a forked child: a crash or a hang
// costs that child, not the run. The failing input is reported, and the run goes on from the next one.
// The child hands its counts back through a block of memory shared with it.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <type_traits>

namespace fuzzing {

/// What a batch's child shares with the driver: the fuzzer's own counts (`Counts`, its base: plain
/// numbers that `+=` adds up over batches), the input being run, and why it failed.
template <class Counts>
struct SharedBlock : Counts {
  std::uint64_t current = 0;  // the input being run
  std::uint64_t done = 0;     // the batch's inputs that finished
  char message[1024] = {};    // why `current` failed

  /// Records why the input failed; returns 1, what a run_one returns for a failed input.
  int fail(const std::string& why) {
    std::snprintf(message, sizeof message, "%s", why.c_str());
    return 1;
  }
};

struct Summary {
  std::uint64_t inputs = 0;    // inputs run, failed ones included
  std::uint64_t failures = 0;  // inputs that failed, crashed or hung
  double seconds = 0;
};

/// Writes a failing input to <name>-fuzz-<seed>-<n>.bin in $FULGUR_FUZZ_ARTIFACTS (or the current
/// folder), for --replay; returns the path.
inline std::string write_artifact(const std::string& name, std::uint64_t seed, std::uint64_t n, const char* data,
                                  std::size_t size) {
  const char* folder = std::getenv("FULGUR_FUZZ_ARTIFACTS");
  const std::string path = std::string(folder ? folder : ".") + "/" + name + "-fuzz-" + std::to_string(seed) + "-" +
                           std::to_string(n) + ".bin";
  std::ofstream(path, std::ios::binary).write(data, static_cast<std::streamsize>(size));
  return path;
}

/// Runs inputs 0, 1, 2, ... for `seconds`. run_one(n, block) returns 0 when input n was read or refused
/// as it should be, else block.fail(why). A child that dies by a signal or whose batch runs past
/// `hang_after` fails at the input it was running. on_failure(n, why) reports each failed input;
/// `totals` gets every batch's counts. Fork after whatever the children should share is built.
template <class Counts, class RunOne, class OnFailure>
Summary run_fork_batches(double seconds, std::chrono::seconds hang_after, Counts& totals, RunOne&& run_one,
                         OnFailure&& on_failure) {
  static_assert(std::is_trivially_copyable_v<SharedBlock<Counts>>, "the counts cross a fork: plain numbers only");
  using Block = SharedBlock<Counts>;
  using Clock = std::chrono::steady_clock;
  void* memory = ::mmap(nullptr, sizeof(Block), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("fuzz: mmap of the block shared with the batches");
    std::exit(2);
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  Summary summary;
  std::uint64_t next = 0;
  while (Clock::now() < deadline) {
    Block* const shared = new (memory) Block{};
    const std::uint64_t first = next;
    std::fflush(nullptr);  // what the parent printed is not printed again by a child
    const pid_t child = ::fork();
    if (child < 0) {
      std::perror("fuzz: fork of a batch");
      std::exit(2);
    }
    if (child == 0) {  // a batch: about a second of inputs, or until one fails
      const Clock::time_point batch_end = std::min<Clock::time_point>(deadline, Clock::now() + std::chrono::seconds(1));
      for (std::uint64_t n = first; Clock::now() < batch_end; ++n) {
        shared->current = n;
        if (run_one(n, *shared) != 0) ::_exit(3);
        ++shared->done;
      }
      ::_exit(0);
    }
    int status = 0;
    const Clock::time_point batch_deadline = Clock::now() + hang_after;
    bool hung = false;
    while (::waitpid(child, &status, WNOHANG) == 0) {
      if (Clock::now() > batch_deadline) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        hung = true;
        break;
      }
      ::usleep(2000);
    }
    totals += static_cast<const Counts&>(*shared);
    next = first + shared->done;
    if (hung || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      const std::uint64_t n = shared->current;
      std::string why;
      if (hung) why = "hung (killed after " + std::to_string(hang_after.count()) + " s)";
      else if (WIFSIGNALED(status)) why = std::string("crashed: ") + ::strsignal(WTERMSIG(status));
      else if (WEXITSTATUS(status) == 3) why = shared->message;
      else why = "exited with status " + std::to_string(WEXITSTATUS(status)) + " " + shared->message;
      on_failure(n, why);
      ++summary.failures;
      next = n + 1;
    }
  }
  summary.inputs = next;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ::munmap(memory, sizeof(Block));
  return summary;
}

}  // namespace fuzzing
