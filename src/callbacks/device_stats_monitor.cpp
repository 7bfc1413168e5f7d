#include "fulgur/callbacks/device_stats_monitor.hpp"

#include <unistd.h>

#include <array>
#include <cmath>
#include <optional>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "fulgur/errors.hpp"

#if FULGUR_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace fulgur {

Metrics cuda_memory_stats(int device) {
  Metrics out;
#if FULGUR_WITH_CUDA
  namespace alloc = c10::cuda::CUDACachingAllocator;
  if (alloc::get() == nullptr || !alloc::get()->initialized()) return out;  // torch.cuda.memory_stats: {} then
  const auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  // torch/csrc/cuda/Module.cpp's _cuda_memoryStats, flattened with '.' as torch.cuda.memory_stats does.
  auto stat = [&](const std::string& name, const c10::CachingAllocator::Stat& s) {
    out[name + ".current"] = static_cast<double>(s.current);
    out[name + ".peak"] = static_cast<double>(s.peak);
    out[name + ".allocated"] = static_cast<double>(s.allocated);
    out[name + ".freed"] = static_cast<double>(s.freed);
  };
  auto stat_array = [&](const std::string& name, const c10::CachingAllocator::StatArray& a) {
    constexpr std::array<const char*, 3> pools{"all", "small_pool", "large_pool"};
    for (std::size_t i = 0; i < pools.size(); ++i) stat(name + "." + pools[i], a[i]);
  };
  out["num_alloc_retries"] = static_cast<double>(stats.num_alloc_retries);
  out["num_ooms"] = static_cast<double>(stats.num_ooms);
  out["max_split_size"] = static_cast<double>(stats.max_split_size);
  out["num_sync_all_streams"] = static_cast<double>(stats.num_sync_all_streams);
  out["num_device_alloc"] = static_cast<double>(stats.num_device_alloc);
  out["num_device_free"] = static_cast<double>(stats.num_device_free);
  stat_array("allocation", stats.allocation);
  stat_array("segment", stats.segment);
  stat_array("active", stats.active);
  stat_array("inactive_split", stats.inactive_split);
  stat_array("allocated_bytes", stats.allocated_bytes);
  stat_array("reserved_bytes", stats.reserved_bytes);
  stat_array("active_bytes", stats.active_bytes);
  stat_array("inactive_split_bytes", stats.inactive_split_bytes);
  stat_array("requested_bytes", stats.requested_bytes);
  stat("oversize_allocations", stats.oversize_allocations);
  stat("oversize_segments", stats.oversize_segments);
#else
  (void)device;
#endif
  return out;
}

namespace {

/// The "Name:   value kB" fields of a /proc file, in bytes (or the raw number without a unit).
std::optional<double> proc_field(const char* file, std::string_view name) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, name.size(), name) != 0 || line.size() <= name.size() || line[name.size()] != ':') continue;
    std::istringstream fields(line.substr(name.size() + 1));
    double value = 0.0;
    std::string unit;
    fields >> value >> unit;
    return unit == "kB" ? value * 1024.0 : value;
  }
  return std::nullopt;
}

/// psutil.cpu_percent(interval=None): the busy share of the CPU times (all CPUs) since the last call.
double system_cpu_percent() {
  static std::mutex mutex;
  static double last_busy = -1.0, last_total = -1.0;
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;  // "cpu": the sum over all CPUs
  std::array<double, 10> t{};  // user nice system idle iowait irq softirq steal guest guest_nice
  for (double& v : t) in >> v;
  // psutil: guest and guest_nice are already in user and nice; idle is idle + iowait.
  const double total = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
  const double busy = total - t[3] - t[4];
  std::lock_guard lock(mutex);
  double percent = 0.0;
  if (last_total >= 0.0 && total > last_total) {
    percent = (busy - last_busy) / (total - last_total) * 100.0;
    percent = percent < 0.0 ? 0.0 : percent > 100.0 ? 100.0 : percent;
  }
  last_busy = busy;
  last_total = total;
  return percent;
}

}  // namespace

Metrics cpu_stats() {
  Metrics out;
  const auto mem_total = proc_field("/proc/meminfo", "MemTotal");
  const auto mem_available = proc_field("/proc/meminfo", "MemAvailable");
  if (mem_total && mem_available && *mem_total > 0.0)  // psutil: (total - available) / total, 1 decimal
    out["cpu_vm_percent"] = std::round((*mem_total - *mem_available) / *mem_total * 1000.0) / 10.0;
  out["cpu_percent"] = std::round(system_cpu_percent() * 10.0) / 10.0;
  const auto swap_total = proc_field("/proc/meminfo", "SwapTotal");
  const auto swap_free = proc_field("/proc/meminfo", "SwapFree");
  if (swap_total && swap_free)  // psutil: used / total, 0 without swap
    out["cpu_swap_percent"] =
        *swap_total > 0.0 ? std::round((*swap_total - *swap_free) / *swap_total * 1000.0) / 10.0 : 0.0;
  if (const auto rss = proc_field("/proc/self/status", "VmRSS")) out["cpu_rss_bytes"] = *rss;
  return out;
}

void DeviceStatsMonitor::setup(TrainerView& trainer, torch::nn::Module& module, Stage stage) {
  cuda_device_.reset();
  for (const auto& p : module.parameters()) {
    if (p.is_cuda()) cuda_device_ = p.device().index();
    break;
  }
  if (stage != Stage::fit) return;
  if (!trainer.has_loggers())
    throw MisconfigurationError("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`: add a logger "
                                "(fulgur::CSVLogger, fulgur::TensorBoardLogger) to the Trainer's arguments.");
}

void DeviceStatsMonitor::log(TrainerView& trainer, const char* hook, bool evaluation) {
  const std::int64_t every = trainer.config().log_every_n_steps;
  if (every == 0) return;
  // Lightning's should_update_logs: the training loop's next logging step, or the evaluation loop's batch count.
  const std::int64_t step = evaluation ? trainer.batch_idx() + 1 : trainer.logging_step() + 1;
  if (step % every != 0 && !trainer.should_stop()) return;
  const bool on_cpu = !cuda_device_.has_value();
  if (options_.cpu_stats == false && on_cpu) return;
  Metrics stats = on_cpu ? cpu_stats() : cuda_memory_stats(*cuda_device_);
  if (options_.cpu_stats == true && !on_cpu) stats.merge(cpu_stats());
  Metrics prefixed;
  const std::string prefix = std::string("DeviceStatsMonitor.") + hook + "/";
  for (const auto& [name, value] : stats) prefixed[prefix + name] = value;
  trainer.log_metrics(prefixed, trainer.logging_step());
  last_ = std::move(prefixed);
}

}  // namespace fulgur
