#pragma once
// LearningRateMonitor: sends each optimizer's learning rate (and optionally momentum and weight
// decay) to the loggers, as Lightning's does: under `lr-<Optimizer>` (`/pg<i>` per parameter
// group when there are several, `-<n>` for a repeated optimizer type), at the log cadence for
// optimizers whose scheduler steps per batch, at each epoch's start for those stepped per epoch,
// and both for optimizers without a scheduler. The values also become callback metrics.
#include <optional>
#include <string>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/results.hpp"

namespace fulgur {

struct LearningRateMonitorOptions {
  std::optional<SchedulerInterval> logging_interval{};  ///< unset: each scheduler's own interval
  bool log_momentum = false;
  bool log_weight_decay = false;
};

class LearningRateMonitor {
 public:
  /// A Trainer without a logger refuses it at compile time (concepts/callback.hpp, assert_loggers_for);
  /// inside an AnyCallback it is refused when fit starts.
  static constexpr bool needs_logger = true;

  explicit LearningRateMonitor(LearningRateMonitorOptions options = {}) : options_(options) {}

  void on_train_start(TrainerView& trainer);
  void on_train_batch_start(TrainerView& trainer);
  void on_train_epoch_start(TrainerView& trainer);

  /// The values of the last report, by name (what the loggers received).
  const Metrics& last_values() const { return last_; }

 private:
  enum class Which { step, epoch, any };
  Metrics extract(TrainerView& trainer, Which which);

  LearningRateMonitorOptions options_;
  std::vector<std::string> names_;  // per optimizer, "lr-Adam", "lr-Adam-1", ...
  Metrics last_;
};

}  // namespace fulgur
