#pragma once
// TorchProfiler: LibTorch's Kineto profiler driven from C++ over the steps a schedule selects
// (torch.profiler.schedule's skip_first / wait / warmup / active / repeat), fulgur's actions recorded
// as record_function ranges with Lightning's names, one Chrome-trace JSON per recorded cycle and rank
// (Perfetto and chrome://tracing open it; on CUDA it holds the kernels), and at the end of the stage
// the operator table sorted by self time (torch's key_averages().table()).
//
//   fulgur::TorchProfiler({.filename = "perf", .schedule = {.wait = 1, .warmup = 1, .active = 3}})
//
// The schedule steps once per training batch in fit (after "run_training_batch") and once per step in
// validate, test and predict. Traces: <dirpath>/<stage>-<filename>[-<rank>].<cycle>.pt.trace.json.
// Outside the recorded steps it costs a vector look-up per action; with emit_nvtx, every action is
// also an NVTX range (Nsight Systems), recorded or not. The header is torch-free (the Kineto parts
// live in libfulgur).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgur/profilers/action.hpp"
#include "fulgur/profilers/profiler.hpp"

namespace fulgur {

/// torch.profiler.schedule: after skip_first steps, cycles of `wait` idle steps, `warmup` steps with
/// the profiler started but not recording, then `active` recorded steps, whose trace is written at the
/// cycle's end; `repeat` cycles (0: as long as the stage runs). Lightning's default is
/// schedule(wait=1, warmup=1, active=3); fulgur's stops after one cycle (repeat = 1), so that a long
/// fit writes one trace, not one every five steps.
struct ProfilerSchedule {
  std::int64_t skip_first = 0;
  std::int64_t wait = 1;
  std::int64_t warmup = 1;
  std::int64_t active = 3;
  std::int64_t repeat = 1;
};

struct TorchProfilerOptions {
  /// Where traces (and the table, with a filename) go; empty: the first logger's log_dir, else
  /// default_root_dir.
  std::string dirpath{};
  /// The table's file base name (".txt"; the traces take it too); empty: the table is only printed, and
  /// the traces are named after the stage (fit.0.pt.trace.json), as Lightning's.
  std::string filename{};
  ProfilerSchedule schedule{};
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  /// Every action also as an NVTX range, for Nsight Systems (`nsys profile ./app`).
  bool emit_nvtx = false;
  /// The table's order: "self_cpu_time_total" (the default without CUDA), "self_cuda_time_total" (with
  /// CUDA), "cpu_time_total", "cuda_time_total" or "count".
  std::string sort_by_key{};
  /// Rows in the table (-1: all).
  std::int64_t row_limit = 20;
};

class TorchProfiler {
 public:
  explicit TorchProfiler(TorchProfilerOptions options = {});
  ~TorchProfiler();
  TorchProfiler(TorchProfiler&&) noexcept;
  TorchProfiler& operator=(TorchProfiler&&) noexcept;

  void start(Action action);
  void stop(Action action) noexcept;
  /// A stage starts: the folder is made and checked; the schedule starts from step 0.
  void set_up(const ProfilerSetup& setup);
  /// The stage ended: a cycle under way is written, the table printed (global rank 0) and written.
  void describe();

  /// One operator or range, over every step recorded in this stage.
  struct OperatorRow {
    std::string name;
    std::int64_t calls = 0;
    std::int64_t self_cpu_ns = 0, cpu_total_ns = 0;
    std::int64_t self_device_ns = 0, device_total_ns = 0;  ///< kernels on the GPU (0 on CPU)
    std::int64_t flops = 0;                                ///< with_flops
  };
  /// The operators and ranges recorded in this stage, in the table's order (all of them).
  std::vector<OperatorRow> operators() const;
  /// The table (torch's key_averages().table(), as far as Kineto's events tell).
  std::string summary() const;
  /// The trace files written so far (every stage).
  const std::vector<std::string>& trace_files() const;
  const TorchProfilerOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fulgur
