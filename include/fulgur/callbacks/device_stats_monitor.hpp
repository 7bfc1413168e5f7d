#pragma once
// DeviceStatsMonitor: Lightning's callback of that name. Around each training, validation and test
// batch, at the log cadence, it sends the device's statistics to the loggers under
// `DeviceStatsMonitor.<hook>/<name>` (hook: on_train_batch_start, on_train_batch_end,
// on_validation_batch_start, ...), at the logging step:
//
//   CUDA  the caching allocator's statistics under torch.cuda.memory_stats' names, as Lightning's
//         CUDAAccelerator.get_device_stats returns them: `allocated_bytes.all.current`,
//         `allocated_bytes.all.peak`, `reserved_bytes.all.current`, `active_bytes.large_pool.peak`,
//         `num_alloc_retries`, `num_ooms`, ... (read from the host: no device sync)
//   CPU   Lightning's psutil names, read from /proc: `cpu_percent` (system-wide, since the previous
//         reading), `cpu_vm_percent`, `cpu_swap_percent`; and fulgur's `cpu_rss_bytes` (this process)
//
// cpu_stats: unset, the CPU statistics on the CPU only; true, also beside a GPU's; false, never on
// the CPU. A Trainer without a logger refuses it, as Lightning does.
#include <cstdint>
#include <optional>
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/results.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

struct DeviceStatsMonitorOptions {
  std::optional<bool> cpu_stats{};
};

/// The CUDA caching allocator's statistics of `device`, flattened as torch.cuda.memory_stats flattens
/// them ("allocated_bytes.all.current", ...); empty in a build without CUDA or before CUDA is used.
Metrics cuda_memory_stats(int device);

/// Lightning's get_cpu_stats(), from /proc: cpu_percent (system-wide utilisation since this function's
/// previous call in the process, as psutil.cpu_percent(); 0 on the first), cpu_vm_percent, cpu_swap_percent;
/// and cpu_rss_bytes, this process's resident set.
Metrics cpu_stats();

class DeviceStatsMonitor {
 public:
  static constexpr bool needs_logger = true;

  explicit DeviceStatsMonitor(DeviceStatsMonitorOptions options = {}) : options_(options) {}

  void setup(TrainerView& trainer, torch::nn::Module& module, Stage stage);
  void on_train_batch_start(TrainerView& trainer) { log(trainer, "on_train_batch_start", false); }
  void on_train_batch_end(TrainerView& trainer) { log(trainer, "on_train_batch_end", false); }
  void on_validation_batch_start(TrainerView& trainer) { log(trainer, "on_validation_batch_start", true); }
  void on_validation_batch_end(TrainerView& trainer) { log(trainer, "on_validation_batch_end", true); }
  void on_test_batch_start(TrainerView& trainer) { log(trainer, "on_test_batch_start", true); }
  void on_test_batch_end(TrainerView& trainer) { log(trainer, "on_test_batch_end", true); }

  /// What the loggers last received (prefixed names).
  const Metrics& last_values() const { return last_; }

 private:
  void log(TrainerView& trainer, const char* hook, bool evaluation);

  DeviceStatsMonitorOptions options_;
  std::optional<int> cuda_device_{};  // the training device's index, when it is a GPU
  Metrics last_;
};

}  // namespace fulgur
