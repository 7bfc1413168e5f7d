#pragma once
// What configure_optimizers may return, and the learning-rate schedulers that come with it.
//
//   std::unique_ptr<torch::optim::Optimizer>            one optimizer
//   fulgur::OptimizerConfig{optimizer, scheduler, ...}  one optimizer with a scheduler
//   std::vector<fulgur::OptimizerConfig>                several (manual optimization only, as in Lightning)
//
// A scheduler is one of fulgur::optim's (Python's schedulers, step for step: StepLR, OneCycleLR,
// SequentialLR, ReduceLROnPlateau, ...), or LibTorch's own torch::optim::LRScheduler (StepLR) or
// ReduceLROnPlateauScheduler. A ReduceLROnPlateau steps on a monitored metric
// (OptimizerConfig::monitor, e.g. "val_loss").
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/optim/lr_scheduler.hpp"

namespace fulgur {

enum class SchedulerInterval { epoch, step };

/// A learning-rate scheduler of fulgur::optim or of LibTorch, stepwise or on a plateau, or none.
class AnyLRScheduler {
 public:
  AnyLRScheduler() = default;
  template <std::derived_from<optim::LRScheduler> S>
  AnyLRScheduler(std::unique_ptr<S> scheduler) : exact_(std::move(scheduler)) {}
  AnyLRScheduler(std::unique_ptr<optim::ReduceLROnPlateau> scheduler) : exact_plateau_(std::move(scheduler)) {}
  template <std::derived_from<torch::optim::LRScheduler> S>
  AnyLRScheduler(std::unique_ptr<S> scheduler) : stepwise_(std::move(scheduler)) {}
  AnyLRScheduler(std::unique_ptr<torch::optim::ReduceLROnPlateauScheduler> scheduler) : plateau_(std::move(scheduler)) {}

  explicit operator bool() const { return exact_ || exact_plateau_ || stepwise_ || plateau_; }
  bool reduce_on_plateau() const { return plateau_ != nullptr || exact_plateau_ != nullptr; }
  /// A stepwise scheduler's step.
  void step() {
    if (exact_) return exact_->step();
    if (!stepwise_)
      throw MisconfigurationError(reduce_on_plateau() ? "AnyLRScheduler::step(): a ReduceLROnPlateau scheduler steps "
                                                        "on a value: call step(monitored)."
                                                      : "AnyLRScheduler::step(): no scheduler was given for this "
                                                        "optimizer.");
    stepwise_->step();
  }
  /// The step PyTorch's LRScheduler takes in its constructor and LibTorch's does not: without
  /// it, LibTorch's StepLR(step_size = 1) would first decay at its second step() instead of its
  /// first. The loops take it once, when configure_optimizers hands the scheduler over; fulgur::optim's
  /// schedulers took it in their constructor, as Python's do.
  void initial_step() {
    if (stepwise_) stepwise_->step();
  }
  /// ReduceLROnPlateau's step on the monitored value.
  void step(double monitored) {
    if (exact_plateau_) return exact_plateau_->step(monitored);
    if (!plateau_)
      throw MisconfigurationError(*this ? "AnyLRScheduler::step(value): only ReduceLROnPlateau steps on a value; "
                                          "call step()."
                                        : "AnyLRScheduler::step(value): no scheduler was given for this optimizer.");
    plateau_->step(static_cast<float>(monitored));
  }

  optim::LRScheduler* exact() const { return exact_.get(); }
  optim::ReduceLROnPlateau* exact_plateau() const { return exact_plateau_.get(); }
  torch::optim::LRScheduler* stepwise() const { return stepwise_.get(); }
  torch::optim::ReduceLROnPlateauScheduler* plateau() const { return plateau_.get(); }

 private:
  std::unique_ptr<optim::LRScheduler> exact_;
  std::unique_ptr<optim::ReduceLROnPlateau> exact_plateau_;
  std::unique_ptr<torch::optim::LRScheduler> stepwise_;
  std::unique_ptr<torch::optim::ReduceLROnPlateauScheduler> plateau_;
};

/// An optimizer and, optionally, its scheduler with Lightning's lr_scheduler dict keys.
struct OptimizerConfig {
  std::unique_ptr<torch::optim::Optimizer> optimizer{};
  AnyLRScheduler lr_scheduler{};                              ///< optional
  SchedulerInterval interval = SchedulerInterval::epoch;  ///< when the scheduler steps
  std::int64_t frequency = 1;                              ///< every `frequency` intervals
  std::string monitor{};                                   ///< the metric ReduceLROnPlateau steps on
  bool strict = true;  ///< a monitor that was never logged is an error (false: the step is skipped, with a warning)
};

namespace detail {

/// configure_optimizers' result as a list of OptimizerConfig (a value: fit refuses a reference).
template <class R>
std::vector<OptimizerConfig> to_optimizer_configs(R&& returned) {
  static_assert(!std::is_lvalue_reference_v<R>, "fulgur: configure_optimizers' result is taken over, not copied");
  using T = std::remove_cvref_t<R>;
  std::vector<OptimizerConfig> configs;
  if constexpr (std::is_same_v<T, std::vector<OptimizerConfig>>) {
    configs = std::forward<R>(returned);
  } else if constexpr (std::is_same_v<T, OptimizerConfig>) {
    configs.push_back(std::forward<R>(returned));
  } else if constexpr (requires { returned.optimizer; }) {
    configs.push_back(OptimizerConfig{std::forward<R>(returned).optimizer});
  } else {
    configs.push_back(OptimizerConfig{std::forward<R>(returned)});
  }
  return configs;
}

}  // namespace detail
}  // namespace fulgur
