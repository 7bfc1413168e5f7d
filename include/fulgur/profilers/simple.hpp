#pragma once
// SimpleProfiler: the wall time of every action the loops run, reported at the end of each stage as
// Lightning's SimpleProfiler table (action, mean duration, calls, total, percentage of the time since
// the profiler was made), per rank under DDP. Torch-free.
//
//   fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision,
//                   fulgur::SimpleProfiler> trainer(config, fulgur::SimpleProfiler({.filename = "perf"}));
//
// With a filename, each stage's report goes to <dirpath>/<stage>-<filename>[-<rank>].txt (appended,
// as Lightning does; the rank under DDP); it is printed on global rank 0 as well (unless print = false). Timing an action is two steady_clock reads and a slot update: no
// allocation per step, no lock.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "fulgur/profilers/action.hpp"
#include "fulgur/profilers/profiler.hpp"

namespace fulgur {

struct SimpleProfilerOptions {
  /// Where the report file goes; empty: the first logger's log_dir, else default_root_dir (Lightning).
  std::string dirpath{};
  /// The report file's base name (".txt" added); empty: the report is only printed.
  std::string filename{};
  /// Lightning's `extended`: the calls and percentage columns (and a Total row).
  bool extended = true;
  /// The report on stdout at each stage's end (global rank 0); false: only the file (and rows()).
  bool print = true;
};

class SimpleProfiler {
 public:
  explicit SimpleProfiler(SimpleProfilerOptions options = {});

  void start(Action action) {
    if (action.id() >= slots_.size()) grow(action.id());
    Slot& slot = slots_[action.id()];
    if (slot.depth++ == 0) slot.started = Clock::now();
  }
  void stop(Action action) noexcept {
    if (action.id() >= slots_.size()) return;  // never started
    Slot& slot = slots_[action.id()];
    if (slot.depth == 0) return;
    if (--slot.depth == 0) {
      slot.total += Clock::now() - slot.started;
      ++slot.calls;
    }
  }

  /// A stage starts: the report file is opened now, so that a folder that cannot be written is an
  /// error before any training is lost.
  void set_up(const ProfilerSetup& setup);
  /// The stage ended: the report goes to the file and (global rank 0) to stdout.
  void describe();

  /// One row of the report.
  struct Row {
    std::string action;
    std::int64_t calls = 0;
    std::chrono::nanoseconds total{};
    double mean_seconds() const { return calls ? std::chrono::duration<double>(total).count() / static_cast<double>(calls) : 0.0; }
  };
  /// Every action timed so far (across stages, as Lightning keeps them), in first-use order.
  std::vector<Row> rows() const;
  /// Lightning's report text for what was timed so far, "<STAGE> Profiler Report" first.
  std::string summary() const;
  /// The same for given rows and total time (what summary() prints; tests compare it with Lightning's).
  static std::string format_report(const std::vector<Row>& rows, std::chrono::nanoseconds total,
                                   std::string_view stage, bool extended);
  /// Adds one timed call of `action` without the clock (tests, and profilers that time elsewhere).
  void record(Action action, std::chrono::nanoseconds duration);
  /// The per-action slots held (one per action named so far, at most twice that after growing).
  std::size_t slot_count() const { return slots_.size(); }
  /// The file the last stage's report went to (empty: printed only).
  const std::string& report_path() const { return report_path_; }
  const SimpleProfilerOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    Clock::time_point started{};
    Clock::duration total{};
    std::int64_t calls = 0;
    int depth = 0;  // an action started again inside itself is timed once, outermost
  };
  void grow(std::uint32_t id);

  SimpleProfilerOptions options_;
  Clock::time_point created_;
  std::vector<Slot> slots_;
  ProfilerSetup setup_{};
  std::string report_path_;
  bool ready_ = false;  // set up for a stage that has not reported yet
};

}  // namespace fulgur
