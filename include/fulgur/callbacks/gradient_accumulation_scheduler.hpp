#pragma once
// GradientAccumulationScheduler: Lightning's callback of that name — the number of batches whose
// gradients add up to one optimizer step changes by epoch ({epoch: factor}; epoch 0 is 1 unless
// given). It sets the Trainer's accumulate_grad_batches at each training epoch's start; the loops
// read the factor at each batch, so a change costs nothing per step, and a checkpoint taken inside
// an accumulation window resumes with the factor of its epoch.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string_view>
#include <utility>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/concepts/training_module.hpp"

namespace fulgur {

class GradientAccumulationScheduler {
 public:
  /// {epoch: factor}: from that epoch on (0-based), `factor` batches per optimizer step. Refuses an
  /// empty schedule, an epoch below 0 and a factor below 1 with Lightning's messages.
  explicit GradientAccumulationScheduler(std::map<std::int64_t, std::int64_t> scheduling);
  /// GradientAccumulationScheduler({{4, 2}}): one entry, as a map's braces would be ambiguous there.
  GradientAccumulationScheduler(std::initializer_list<std::pair<const std::int64_t, std::int64_t>> scheduling)
      : GradientAccumulationScheduler(std::map<std::int64_t, std::int64_t>(scheduling)) {}

  /// The factor in force at `epoch` (Lightning's get_accumulate_grad_batches).
  std::int64_t accumulate_grad_batches(std::int64_t epoch) const;
  /// Whether any epoch accumulates (a factor above 1).
  bool going_to_accumulate_grad_batches() const;
  const std::map<std::int64_t, std::int64_t>& scheduling() const { return scheduling_; }

  /// Lightning's refusals: manual optimization, a Trainer accumulate_grad_batches other than 1.
  template <class Module>
  void on_train_start(TrainerView& trainer, Module&) {
    check(trainer, detail::automatic_optimization_of<Module>());
  }
  void on_train_epoch_start(TrainerView& trainer);
  /// Gives the Trainer its own factor (1) back at the fit's end or failure, so that a later fit
  /// starts as configured (Lightning leaves the last epoch's factor on the Trainer).
  void teardown(TrainerView& trainer);

 private:
  void check(TrainerView& trainer, bool automatic_optimization);
  std::map<std::int64_t, std::int64_t> scheduling_;
  bool changed_ = false;  // this fit set the Trainer's factor
};

}  // namespace fulgur
