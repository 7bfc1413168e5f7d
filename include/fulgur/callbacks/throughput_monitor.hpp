#pragma once
// ThroughputMonitor: Lightning's callback of that name. Per stage it feeds a Throughput
// (callbacks/throughput.hpp) the time since the stage started, the batches, samples, items and
// FLOPs seen, and sends its metrics to the loggers, prefixed by the stage: `train/samples_per_sec`
// style names — `train/device/batches_per_sec`, `train/device/samples_per_sec`,
// `train/device/items_per_sec`, `train/device/flops_per_sec`, `train/device/mfu`, `train/time`,
// `train/batches`, `train/samples`, `train/lengths` (the `device/` rates divided by the world size
// give the job's rates, which are logged without `device/` when world_size > 1); `validate/`,
// `test/`, `predict/` for the other loops. When, as Lightning:
//
//   training    after each batch that ends an accumulation, at the log cadence (log_every_n_steps
//               optimizer steps, or a stop), at the logging step, with `epoch`
//   evaluation  after each batch at the log cadence of the evaluation loop, at the step that counts
//               that loop's batches (across its runs; inside fit, per training epoch); not during the
//               sanity check
//
// Validation inside fit does not count as training time: the training clock is moved past it.
// Samples per batch: batch_size_fn, else Lightning's batch-size rule (data::extract_batch_size);
// items: length_fn (none: no items). FLOPs per batch: the module's `flops_per_batch` (a member or a
// member function, read each batch, as Lightning reads the attribute), else the option (see
// fulgur::measure_flops to count them once); neither: a warning, and no FLOP rates. MFU divides by
// the device's peak for the precision's compute dtype (accelerators/peak_flops.hpp): none on the CPU
// unless `available_flops` is given.
//
// Cost: on CUDA each batch end waits for the device (Lightning's torch.cuda.synchronize(), without
// which the host clock measures the launch of kernels, not their run): one host sync per batch, on
// global rank 0, where Lightning has it. On the CPU, none. All hooks run on global rank 0 only.
#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>

#include "fulgur/callbacks/throughput.hpp"
#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/results.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

struct ThroughputMonitorOptions {
  /// Samples in a batch (Lightning's batch_size_fn); unset: the first dimension of the first tensor.
  std::function<std::int64_t(const data::Batch&)> batch_size_fn{};
  /// Items in a batch, e.g. tokens (Lightning's length_fn); unset: no `lengths` nor `items_per_sec`.
  std::function<std::int64_t(const data::Batch&)> length_fn{};
  /// FLOPs of one batch on one device, forward and backward; the module's `flops_per_batch` wins.
  std::optional<std::int64_t> flops_per_batch{};
  /// The device's peak FLOP/s for MFU; unset: the table's (accelerators/peak_flops.hpp), none on the CPU.
  std::optional<double> available_flops{};
  int window_size = 100;        ///< Throughput's window (at least 2)
  std::string separator = "/";  ///< Throughput's separator
  /// The clock, in seconds (Lightning: time.perf_counter); a test may give its own.
  std::function<double()> time{};
};

class ThroughputMonitor {
 public:
  /// Refuses window_size < 2 (Lightning's assertion), naming the value.
  explicit ThroughputMonitor(ThroughputMonitorOptions options = {});

  void setup(TrainerView& trainer, torch::nn::Module& module, Stage stage);
  void on_train_start(TrainerView& trainer) { start(trainer, Running::train); }
  template <class Module, class Output, class Batch>
  void on_train_batch_end(TrainerView& trainer, Module& module, const Output&, const Batch& batch, std::int64_t) {
    if (!trainer.is_global_zero()) return;
    update(trainer, Running::train, counts(module, batch));
    train_batch_logged(trainer);
  }
  /// Lightning counts the validation batches inside fit per training epoch (the step their metrics go to).
  void on_train_epoch_start() { of(Running::validate).fit_total_batches = 0; }
  void on_validation_start(TrainerView& trainer) {
    if (!trainer.sanity_checking()) start(trainer, Running::validate);
  }
  template <class Module, class Output, class Batch>
  void on_validation_batch_end(TrainerView& trainer, Module& module, const Output&, const Batch& batch, std::int64_t) {
    if (!trainer.is_global_zero() || trainer.sanity_checking()) return;
    evaluation_batch_end(trainer, Running::validate, counts(module, batch));
  }
  void on_validation_end(TrainerView& trainer);
  void on_test_start(TrainerView& trainer) { start(trainer, Running::test); }
  template <class Module, class Output, class Batch>
  void on_test_batch_end(TrainerView& trainer, Module& module, const Output&, const Batch& batch, std::int64_t) {
    if (trainer.is_global_zero()) evaluation_batch_end(trainer, Running::test, counts(module, batch));
  }
  void on_predict_start(TrainerView& trainer) { start(trainer, Running::predict); }
  template <class Module, class Output, class Batch>
  void on_predict_batch_end(TrainerView& trainer, Module& module, const Output&, const Batch& batch, std::int64_t) {
    if (trainer.is_global_zero()) evaluation_batch_end(trainer, Running::predict, counts(module, batch));
  }

  /// The metrics last sent to the loggers for a loop ("train", "validate", "test", "predict"), prefixed.
  const Metrics& last_metrics(std::string_view running_stage) const;
  /// The stage's Throughput (null before its setup).
  const Throughput* throughput(std::string_view running_stage) const;

  /// What one batch adds (samples, items, FLOPs).
  struct BatchCounts {
    std::int64_t samples = 0;
    std::optional<std::int64_t> lengths{};
    std::optional<std::int64_t> flops{};
    bool module_has_flops = false;
  };

 private:
  enum class Running { train, validate, test, predict };
  struct PerStage {
    std::optional<Throughput> throughput{};
    double t0 = 0.0;
    std::int64_t lengths = 0, samples = 0, batches = 0;
    bool counted = false;              // Lightning: `stage in self._samples`
    std::int64_t run_batches = 0;      // the evaluation loop's batch_progress.current.ready
    std::int64_t total_batches = 0;    // ... and .total.ready, the step evaluation metrics are logged at
    std::int64_t fit_total_batches = 0;  // validation inside fit has a loop (and a count) of its own
    Metrics last{};
  };

  template <class Module, class Batch>
  BatchCounts counts(Module& module, const Batch& batch) const {
    BatchCounts c;
    if constexpr (std::is_same_v<Batch, data::Batch>) {
      c.samples = options_.batch_size_fn ? options_.batch_size_fn(batch) : data::extract_batch_size(batch);
      if (options_.length_fn) c.lengths = options_.length_fn(batch);
    } else {
      if (options_.batch_size_fn || options_.length_fn) refuse_batch_functions();
      c.samples = data::extract_batch_size(batch);
    }
    if constexpr (requires { module.flops_per_batch(); }) {
      c.flops = static_cast<std::int64_t>(module.flops_per_batch());
      c.module_has_flops = true;
    } else if constexpr (requires { module.flops_per_batch; }) {
      c.flops = static_cast<std::int64_t>(module.flops_per_batch);
      c.module_has_flops = true;
    } else {
      c.flops = options_.flops_per_batch;
    }
    return c;
  }
  [[noreturn]] static void refuse_batch_functions();
  PerStage& of(Running running) { return stages_[static_cast<std::size_t>(running)]; }
  void start(TrainerView& trainer, Running running);
  void update(TrainerView& trainer, Running running, const BatchCounts& batch);
  void train_batch_logged(TrainerView& trainer);
  void evaluation_batch_end(TrainerView& trainer, Running running, const BatchCounts& batch);
  void log(TrainerView& trainer, Running running, std::int64_t step, bool with_epoch);

  ThroughputMonitorOptions options_;
  std::array<PerStage, 4> stages_{};
  std::optional<double> available_flops_{};
  bool synchronize_ = false;  // the training device is a GPU
  bool fitting_ = false;
  bool warned_flops_ = false;
};

}  // namespace fulgur
