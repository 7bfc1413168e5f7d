#include "fulgur/callbacks/throughput_monitor.hpp"

#include <chrono>

#include "fulgur/accelerators/peak_flops.hpp"
#include "src/callbacks/policy_names.hpp"

#if FULGUR_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace fulgur {
namespace {

constexpr std::array<std::string_view, 4> kRunningNames{"train", "validate", "test", "predict"};

double perf_counter() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

c10::Device device_of(torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  for (const auto& b : module.buffers()) return b.device();
  return c10::Device(c10::kCPU);
}

}  // namespace

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options) : options_(std::move(options)) {
  if (options_.window_size < 2)
    throw MisconfigurationError("ThroughputMonitor: window_size must be at least 2 (Lightning asserts window_size > 1: "
                                "the rates compare the window's first and last batches), got " +
                                std::to_string(options_.window_size));
  if (!options_.time) options_.time = perf_counter;
}

void ThroughputMonitor::refuse_batch_functions() {
  throw MisconfigurationError(
      "ThroughputMonitor: batch_size_fn and length_fn take a fulgur::data::Batch, but this loop's batches are of "
      "another type: leave them unset (samples are then counted by the first dimension of the batch's first tensor) "
      "or give the loop data::Batch batches.");
}

void ThroughputMonitor::setup(TrainerView& trainer, torch::nn::Module& module, Stage stage) {
  const c10::Device device = device_of(module);
  synchronize_ = device.is_cuda();
  if (options_.available_flops) {
    available_flops_ = options_.available_flops;
  } else {
    const std::string precision = detail::precision_name(trainer);
    std::string why;
    available_flops_ = available_flops(device, compute_dtype(precision), &why);
    if (!available_flops_ && !why.empty() && trainer.is_global_zero()) trainer.warn("ThroughputMonitor: " + why);
  }
  const ThroughputOptions throughput{.available_flops = available_flops_,
                                     .world_size = trainer.world_size(),
                                     .window_size = options_.window_size,
                                     .separator = options_.separator};
  fitting_ = stage == Stage::fit;
  if (stage == Stage::fit) of(Running::validate).throughput.emplace(throughput);  // fit includes validation
  const Running running = stage == Stage::fit        ? Running::train
                          : stage == Stage::validate ? Running::validate
                          : stage == Stage::test     ? Running::test
                                                     : Running::predict;
  of(running).throughput.emplace(throughput);
}

void ThroughputMonitor::start(TrainerView& trainer, Running running) {
  if (!trainer.is_global_zero()) return;
  PerStage& s = of(running);
  if (fitting_ || !s.counted) {
    if (s.throughput) s.throughput->reset();
    s.lengths = s.samples = s.batches = 0;
    s.counted = true;
  }
  s.run_batches = 0;
  s.t0 = options_.time();
}

void ThroughputMonitor::update(TrainerView& trainer, Running running, const BatchCounts& batch) {
  PerStage& s = of(running);
  if (!s.throughput)
    throw MisconfigurationError("ThroughputMonitor: a batch ended before its setup(): the Trainer calls setup; a loop "
                                "of your own must too");
#if FULGUR_WITH_CUDA
  if (synchronize_) c10::cuda::device_synchronize();  // else the clock times the kernels' launch, not their run
#endif
  const double elapsed = options_.time() - s.t0;
  if (batch.lengths) s.lengths += *batch.lengths;
  if (!batch.module_has_flops && !batch.flops && !warned_flops_) {
    warned_flops_ = true;
    trainer.warn("When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property in "
                 "the module to compute the FLOPs (or give ThroughputMonitorOptions::flops_per_batch; "
                 "fulgur::measure_flops counts them).");
  }
  s.samples += batch.samples;
  s.batches += 1;
  s.throughput->update(elapsed, s.batches, s.samples, options_.length_fn ? std::optional(s.lengths) : std::nullopt,
                       batch.flops);
}

void ThroughputMonitor::train_batch_logged(TrainerView& trainer) {
  // Lightning logs once the accumulation is over, so that the optimizer step's time is included.
  const std::int64_t accumulate = trainer.config().accumulate_grad_batches;
  const std::int64_t batch = trainer.batch_idx() + 1;
  const bool last = trainer.num_training_batches() > 0 && batch >= trainer.num_training_batches();
  if (batch % accumulate != 0 && !last) return;
  const std::int64_t every = trainer.config().log_every_n_steps;
  if (every == 0 || ((trainer.logging_step() + 1) % every != 0 && !trainer.should_stop())) return;
  log(trainer, Running::train, trainer.logging_step(), /*with_epoch=*/true);
}

void ThroughputMonitor::evaluation_batch_end(TrainerView& trainer, Running running, const BatchCounts& batch) {
  PerStage& s = of(running);
  ++s.run_batches;
  const bool in_fit = running == Running::validate && trainer.stage() == Stage::fit;
  const std::int64_t total = in_fit ? ++s.fit_total_batches : ++s.total_batches;
  update(trainer, running, batch);
  const std::int64_t every = trainer.config().log_every_n_steps;
  if (every == 0 || (s.run_batches % every != 0 && !trainer.should_stop())) return;
  log(trainer, running, total, /*with_epoch=*/false);
}

void ThroughputMonitor::log(TrainerView& trainer, Running running, std::int64_t step, bool with_epoch) {
  PerStage& s = of(running);
  const Metrics computed = s.throughput->compute();
  Metrics metrics;
  const std::string prefix = std::string(kRunningNames[static_cast<std::size_t>(running)]) + options_.separator;
  for (const auto& [name, value] : computed) metrics[prefix + name] = value;
  if (metrics.empty()) return;
  s.last = metrics;
  if (with_epoch) metrics["epoch"] = static_cast<double>(trainer.current_epoch());  // Lightning adds it (step=None)
  trainer.log_metrics(metrics, step);
}

void ThroughputMonitor::on_validation_end(TrainerView& trainer) {
  if (!trainer.is_global_zero() || trainer.sanity_checking() || trainer.stage() != Stage::fit) return;
  PerStage& train = of(Running::train);
  const PerStage& val = of(Running::validate);
  const double train_elapsed = train.throughput ? train.throughput->last_time().value_or(0.0) : 0.0;
  const double val_elapsed = val.throughput ? val.throughput->last_time().value_or(0.0) : 0.0;
  // Lightning's arithmetic, term for term: validation time is not training time.
  const double training_finished = train.t0 + train_elapsed;
  const double time_between_train_and_val = val.t0 - training_finished;
  train.t0 += time_between_train_and_val + val_elapsed;
}

const Metrics& ThroughputMonitor::last_metrics(std::string_view running_stage) const {
  for (std::size_t i = 0; i < kRunningNames.size(); ++i)
    if (kRunningNames[i] == running_stage) return stages_[i].last;
  throw std::invalid_argument("ThroughputMonitor::last_metrics: no loop named '" + std::string(running_stage) +
                              "': use train, validate, test or predict");
}

const Throughput* ThroughputMonitor::throughput(std::string_view running_stage) const {
  for (std::size_t i = 0; i < kRunningNames.size(); ++i)
    if (kRunningNames[i] == running_stage) return stages_[i].throughput ? &*stages_[i].throughput : nullptr;
  throw std::invalid_argument("ThroughputMonitor::throughput: no loop named '" + std::string(running_stage) +
                              "': use train, validate, test or predict");
}

}  // namespace fulgur
