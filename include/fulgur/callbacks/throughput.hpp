#pragma once
// Throughput: Lightning's lightning.fabric.utilities.throughput.Throughput, for a loop of your own
// (ThroughputMonitor uses it inside the Trainer). update() takes running totals (time, batches,
// samples, lengths) and the FLOPs of the latest batch; compute() gives Lightning's metrics:
//
//   time, batches, samples[, lengths]                     the latest totals
//   device/batches_per_sec, device/samples_per_sec         over the window (once it is full)
//   device/items_per_sec                                   the same, when lengths are given
//   device/flops_per_sec[, device/mfu]                     when FLOPs are given (MFU: with available_flops)
//   batches_per_sec, samples_per_sec, items_per_sec,
//   flops_per_sec                                          the whole job's (world_size > 1 only)
//
// The rates look at the window's first and last entries, so the window holds at least 2. Lightning's
// FLOP rate sums the window's FLOPs less its first entry; fulgur's equals it value for value.
// The windows are fixed rings sized once: an update allocates nothing.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/results.hpp"

namespace fulgur {

struct ThroughputOptions {
  std::optional<double> available_flops{};  ///< the device's peak FLOP/s (accelerators/peak_flops.hpp); none: no MFU
  int world_size = 1;                       ///< devices across hosts; the global metrics appear only above 1
  int window_size = 100;                    ///< updates the rates are averaged over (at least 2)
  std::string separator = "/";              ///< between "device" and the metric's name
};

class Throughput {
 public:
  /// Refuses window_size < 2 and world_size < 1, naming the value.
  explicit Throughput(ThroughputOptions options = {});

  /// time: seconds since the start (increasing); batches, samples: totals per device (increasing,
  /// samples >= batches); lengths: total items (>= samples), given on every update or never; flops:
  /// this device's FLOPs since the last update. A value that does not increase is refused, as Lightning does.
  void update(double time, std::int64_t batches, std::int64_t samples, std::optional<std::int64_t> lengths = {},
              std::optional<std::int64_t> flops = {});
  /// Lightning's compute(); empty before the first update.
  Metrics compute() const;
  void reset();

  const ThroughputOptions& options() const { return options_; }
  /// The latest time given to update() (none after reset()).
  std::optional<double> last_time() const;

 private:
  /// A ring of the last `capacity` values (Lightning's _MonotonicWindow / deque(maxlen=)).
  template <class T>
  struct Window {
    std::vector<T> values;
    std::size_t start = 0, size = 0;
    void append(T value);
    const T& front() const { return values[start]; }
    const T& back() const { return values[(start + size - 1) % values.size()]; }
    bool full() const { return size == values.size(); }
  };
  template <class T>
  static void append_increasing(Window<T>& window, T value);

  ThroughputOptions options_;
  Window<double> time_;
  Window<std::int64_t> batches_, samples_, lengths_, flops_;
};

}  // namespace fulgur
