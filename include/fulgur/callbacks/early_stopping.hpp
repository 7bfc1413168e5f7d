#pragma once
// EarlyStopping: stops fit when a monitored metric stops improving (Lightning's EarlyStopping,
// with its options, checks and messages). It checks at the end of each training epoch when
// validation runs once per epoch at its end, else after each validation run
// (check_on_train_epoch_end overrides), and asks every rank to stop when any rank decides to.
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

enum class MonitorMode { min, max };

struct EarlyStoppingOptions {
  std::string monitor;            ///< a callback metric, e.g. "val_loss"
  double min_delta = 0.0;         ///< the least change that counts as an improvement
  std::int64_t patience = 3;      ///< checks without improvement before stopping
  bool verbose = false;           ///< print why on global rank 0 at each check
  MonitorMode mode = MonitorMode::min;
  bool strict = true;             ///< a monitor never logged is an error (false: skip the check)
  bool check_finite = true;       ///< a NaN/inf monitor stops at once
  std::optional<double> stopping_threshold{};    ///< stop once the monitor is better than this
  std::optional<double> divergence_threshold{};  ///< stop once the monitor is worse than this
  std::optional<bool> check_on_train_epoch_end{};
};

/// Why EarlyStopping stopped (Lightning's EarlyStoppingReason).
enum class EarlyStoppingReason { not_stopped, stopping_threshold, divergence_threshold, patience_exhausted, non_finite_metric };

class EarlyStopping {
 public:
  static constexpr bool monitoring = true;

  explicit EarlyStopping(EarlyStoppingOptions options);
  /// EarlyStopping{"val_loss"}: the defaults otherwise.
  /// A template so that a braced list, EarlyStopping({.monitor = "m", .patience = 1}), never matches it
  /// (GCC 12 finds a plain std::string parameter as viable as the options and calls it ambiguous).
  template <class Text>
    requires std::convertible_to<const Text&, std::string>
  explicit EarlyStopping(const Text& monitor) : EarlyStopping(EarlyStoppingOptions{.monitor = std::string(monitor)}) {}

  void setup(TrainerView& trainer, Stage stage);
  void on_train_epoch_end(TrainerView& trainer);
  void on_validation_end(TrainerView& trainer);

  /// Lightning's state_key and state: "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}" ->
  /// wait_count, stopped_epoch, best_score, patience (a resumed fit goes on counting).
  std::string state_key() const;
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  const EarlyStoppingOptions& options() const { return options_; }
  std::int64_t wait_count() const { return wait_count_; }
  /// The epoch it stopped in (0 if it did not).
  std::int64_t stopped_epoch() const { return stopped_epoch_; }
  double best_score() const { return best_score_; }
  EarlyStoppingReason stopping_reason() const { return reason_; }
  /// The message of the check that stopped fit (empty if none did).
  const std::string& stopping_reason_message() const { return reason_message_; }

 private:
  bool skip(const TrainerView& trainer) const;
  void check(TrainerView& trainer);
  bool better(double current, double reference) const;

  EarlyStoppingOptions options_;
  bool check_on_train_epoch_end_ = true;
  std::int64_t wait_count_ = 0;
  std::int64_t stopped_epoch_ = 0;
  double best_score_;
  EarlyStoppingReason reason_ = EarlyStoppingReason::not_stopped;
  std::string reason_message_;
};

}  // namespace fulgur
