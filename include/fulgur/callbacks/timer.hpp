#pragma once
// Timer: how long each stage ran, and a time limit on training (Lightning's Timer). With a
// duration, it checks after every training batch (interval step) or epoch (interval epoch) and
// stops fit once training has run that long; under DDP the ranks agree (a collective at each check).
#include <chrono>
#include <optional>
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

enum class TimerInterval { step, epoch };

struct TimerOptions {
  std::optional<std::chrono::duration<double>> duration{};  ///< none: only measures
  TimerInterval interval = TimerInterval::step;
  bool verbose = true;  ///< say on global rank 0 when the limit is reached
};

class Timer {
 public:
  using clock = std::chrono::steady_clock;
  /// The stages it times; "train" is fit's training (its validation runs count as "validate").
  enum class Phase { train, validate, test, predict };

  explicit Timer(TimerOptions options = {});
  explicit Timer(std::chrono::duration<double> duration) : Timer(TimerOptions{.duration = duration}) {}

  void on_train_start(TrainerView&) { start(Phase::train); }
  void on_train_end(TrainerView&) { end(Phase::train); }
  void on_validation_start(TrainerView&) { start(Phase::validate); }
  void on_validation_end(TrainerView&) { end(Phase::validate); }
  void on_test_start(TrainerView&) { start(Phase::test); }
  void on_test_end(TrainerView&) { end(Phase::test); }
  void on_predict_start(TrainerView&) { start(Phase::predict); }
  void on_predict_end(TrainerView&) { end(Phase::predict); }
  void setup(TrainerView& trainer, Stage stage);
  void on_train_batch_end(TrainerView& trainer) {
    if (options_.duration && options_.interval == TimerInterval::step) check(trainer, options_.duration->count());
  }
  void on_train_epoch_end(TrainerView& trainer) {
    if (options_.duration && options_.interval == TimerInterval::epoch) check(trainer, options_.duration->count());
  }

  /// Lightning's state: {"time_elapsed": {"train", "validate", "test", "predict"}}; a resumed fit
  /// counts its training time on from there (the duration covers both runs).
  std::string state_key() const { return "Timer"; }
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  /// Seconds the phase ran: up to now while it runs, 0 before it started. Validation runs add up.
  double time_elapsed(Phase phase = Phase::train) const;
  /// Seconds left of the duration for training (none without a duration).
  std::optional<double> time_remaining() const;
  std::optional<clock::time_point> start_time(Phase phase) const { return times_[index(phase)].start; }
  std::optional<clock::time_point> end_time(Phase phase) const { return times_[index(phase)].end; }

 private:
  struct Times {
    std::optional<clock::time_point> start, end;
    double earlier = 0.0;  // seconds of finished runs (validation runs more than once)
  };
  static std::size_t index(Phase phase) { return static_cast<std::size_t>(phase); }
  void start(Phase phase);
  void end(Phase phase);
  void check(TrainerView& trainer, double limit_seconds);

  TimerOptions options_;
  Times times_[4];
};

}  // namespace fulgur
