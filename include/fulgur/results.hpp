#pragma once
// What fit, validate and test return. Values are host numbers read once, at the end (or at the
// log cadence): the step loop itself never waits for them.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fulgur {

using Metrics = std::map<std::string, double>;

struct EpochSummary {
  std::int64_t epoch = 0;
  std::int64_t global_step = 0;             ///< after the epoch
  std::optional<double> train_loss{};       ///< the epoch's last read loss (per micro-batch, as returned)
  std::optional<double> val_loss{};         ///< batch-size-weighted mean over the validation data
  std::int64_t skipped_optimizer_steps = 0; ///< steps a loss scaler skipped on inf/NaN gradients
  Metrics metrics{};                        ///< callback metrics at the epoch's end
};

struct FitResult {
  std::vector<EpochSummary> epochs{};
  std::int64_t global_step = 0;  ///< optimizer steps taken or skipped, as Lightning counts them
  std::int64_t skipped_optimizer_steps = 0;
  /// Lightning's trainer.callback_metrics at the end: every logged value under its name (and its
  /// `_step`/`_epoch` form when logged both ways), plus train_loss and val_loss.
  Metrics metrics{};
  Metrics logged_metrics{};        ///< Lightning's trainer.logged_metrics: what a logger received last
  Metrics progress_bar_metrics{};  ///< the values logged with prog_bar = true
  std::string stop_reason{};       ///< e.g. "max_epochs=3 reached", "max_steps=100 reached"
  bool interrupted = false;        ///< fit stopped on SIGINT (Ctrl-C) after finishing the step under way
  /// fit stopped on SIGTERM/SIGUSR1 after a batch and wrote checkpoint_path, which resumes exactly
  /// (only seen with TrainerConfig::preemption.exit_process = false; interrupted is set too).
  bool preempted = false;
  std::string checkpoint_path{};
  std::vector<std::string> warnings{};  ///< also printed on global rank 0 (a NaN validation loss, ...)
};

/// What validate and test return: Lightning's list of logged metrics, for the one loader.
struct EvaluationResult {
  Metrics metrics{};          ///< every value logged on epoch level, plus val_loss / test_loss
  std::optional<double> loss{};  ///< batch-size-weighted mean of what the step returned, if it returned a loss
  std::vector<std::string> warnings{};
};

}  // namespace fulgur
